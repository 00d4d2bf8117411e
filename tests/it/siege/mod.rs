//! The front door under hostile load (issue 26): eviction at the cap cannot
//! be aimed at teams ([`anonymous_one_head_churn_at_a_small_cap_fails_no_team_request`],
//! [`one_address_holds_at_most_its_share_of_the_connections`]), HTTP/2
//! readers that never open their window cannot make the gateway hold
//! memory ([`zero_window`]), and one team cannot pin every slot
//! ([`pinning`], [`a_team_past_its_requests_in_flight_gets_429_while_another_is_served`]).

mod control_frames;
mod every_frame;
mod h2;
mod newcomer;
mod overload;
mod pinning;
mod zero_window;

use crate::support::client::Client;
use crate::support::conn::{anonymous_head, on_new_connection, KeptAlive};
use crate::support::gateway::{Setup, ALPHA, BETA};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, SimConfig};
use http::StatusCode;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// An anonymous peer: opens connections, sends one token-less head (a free
/// 404), reads the answer and keeps the socket (the last `keep` of them).
async fn churn(addr: SocketAddr, keep: usize, stop: Arc<AtomicBool>, heads: Arc<AtomicUsize>) {
    let mut kept = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok((s, answered)) = anonymous_head(addr).await else {
            continue;
        };
        if answered {
            heads.fetch_add(1, Ordering::Relaxed);
        }
        kept.push_back(s);
        if kept.len() > keep {
            kept.pop_front();
        }
    }
}

#[tokio::test]
async fn anonymous_one_head_churn_at_a_small_cap_fails_no_team_request() {
    const CAP: usize = 16;
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| {
            c.server.max_connections = CAP;
            c.server.max_connections_per_peer = CAP;
        })
        .start(&sim)
        .await;
    let path = Query::meta_release();
    let warm = Client::new(gw.base_url(), ALPHA.1).get(&path).await;
    assert_eq!(warm.status, StatusCode::OK);
    let mut kept_alive = KeptAlive::open(gw.addr).await.expect("connects");
    assert_eq!(
        kept_alive.get(&path, ALPHA.1).await.expect("answered").0,
        StatusCode::OK
    );
    let stop = Arc::new(AtomicBool::new(false));
    let heads = Arc::new(AtomicUsize::new(0));
    let attackers: Vec<_> = (0..4)
        .map(|_| tokio::spawn(churn(gw.addr, 2 * CAP, stop.clone(), heads.clone())))
        .collect();
    // The attack is under way before the team starts.
    crate::support::wait::eventually("the churn runs", Duration::from_secs(10), || {
        let heads = heads.load(Ordering::Relaxed);
        async move {
            if heads > 4 * CAP {
                Ok(())
            } else {
                Err(heads)
            }
        }
    })
    .await;
    let started = Instant::now();
    let (mut failures, mut served) = (Vec::new(), 0);
    for i in 0..60 {
        let fresh = on_new_connection(gw.addr, &path, ALPHA.1).await;
        let kept = kept_alive.get(&path, ALPHA.1).await;
        for (how, r) in [("new connection", fresh), ("kept-alive", kept)] {
            match r {
                Ok((StatusCode::OK, _)) => served += 1,
                other => failures.push(format!("{i} on a {how}: {other:?}")),
            }
        }
        // Idle a little between requests, as real clients do: idle is when
        // a keep-alive connection could be chosen.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.await.expect("attacker task");
    }
    let heads = heads.load(Ordering::Relaxed);
    eprintln!(
        "churn: {heads} anonymous heads ({:.0}/s) at a cap of {CAP}; team: {served} served, {} failed in {elapsed:?}",
        heads as f64 / elapsed.as_secs_f64().max(0.001),
        failures.len()
    );
    assert!(failures.is_empty(), "team requests failed: {failures:?}");
    assert_eq!(served, 120);
    assert!(heads > 10 * CAP, "the churn was too weak to test anything: {heads}");
    assert_eq!(sim.stats().requests_total, 1, "one fetch, then hits");
}

#[tokio::test]
async fn a_team_past_its_requests_in_flight_gets_429_while_another_is_served() {
    let sim = start_sim(SimConfig {
        latency_ms: 500,
        ..unlimited()
    })
    .await;
    let gw = Setup::new().with(|c| c.server.team_max_in_flight = 2).start(&sim).await;
    let (alpha, beta) = (Client::new(gw.base_url(), ALPHA.1), Client::new(gw.base_url(), BETA.1));
    let warm = beta.get(Query::meta_release()).await;
    assert_eq!(warm.status, StatusCode::OK);
    // Six slow misses at once, two distinct and four followers of them:
    // followers count as requests in flight too.
    let calls: Vec<_> = (0..6)
        .map(|i| {
            alpha
                .get(Query::text_search("cities", format!("slow{}", i % 2)))
                .spawn()
        })
        .collect();
    let other = beta.get(Query::meta_release()).await;
    assert_eq!(other.status, StatusCode::OK, "another team is not limited");
    let mut statuses = Vec::new();
    for c in calls {
        let r = c.await.expect("task");
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            assert!(r.header_u64("retry-after").is_some_and(|s| s >= 1), "no Retry-After");
            assert_eq!(r.json()["detail"], "Rate limit exceeded for this team");
        }
        statuses.push(r.status.as_u16());
    }
    let refused = statuses.iter().filter(|s| **s == 429).count();
    // Two in flight for half a second: the other four come meanwhile (one
    // may come late on a loaded machine, after the first two ended).
    assert!(refused >= 3, "more than two in flight at a time: {statuses:?}");
    // The upstream's own answer (a 404 for an unknown city) or the 429.
    assert!(statuses.iter().all(|s| *s == 404 || *s == 429), "{statuses:?}");
    assert!(sim.stats().requests_total <= 3, "one warm-up and at most two calls");
}

#[tokio::test]
async fn one_address_holds_at_most_its_share_of_the_connections() {
    const PER_PEER: usize = 4;
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| {
            c.server.max_connections = 32;
            c.server.max_connections_per_peer = PER_PEER;
        })
        .start(&sim)
        .await;
    let release = Query::meta_release();
    let mut kept_alive = KeptAlive::open(gw.addr).await.expect("connects");
    assert_eq!(
        kept_alive.get(&release, ALPHA.1).await.expect("answered").0,
        StatusCode::OK
    );
    // Another loopback address opens 40 silent connections.
    let mut theirs = Vec::new();
    for _ in 0..40 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.2:0".parse().expect("addr"))
            .expect("binds 127.0.0.2");
        theirs.push(socket.connect(gw.addr).await.expect("connect"));
    }
    let theirs = Arc::new(tokio::sync::Mutex::new(theirs));
    let open = crate::support::wait::eventually("all but its share closed", Duration::from_secs(10), || {
        let theirs = theirs.clone();
        async move {
            let mut still = 0;
            for s in theirs.lock().await.iter_mut() {
                let mut b = [0u8; 1];
                // A closed socket reads EOF (or a reset) at once; an open
                // silent one has nothing to read.
                if tokio::time::timeout(Duration::from_millis(1), s.read(&mut b))
                    .await
                    .is_err()
                {
                    still += 1;
                }
            }
            if still <= PER_PEER {
                Ok(still)
            } else {
                Err(still)
            }
        }
    })
    .await;
    eprintln!("per-peer cap {PER_PEER}: {open} of 40 connections of 127.0.0.2 left open");
    // The other address's clients never noticed.
    for _ in 0..10 {
        assert_eq!(
            kept_alive.get(&release, ALPHA.1).await.expect("answered").0,
            StatusCode::OK
        );
        let fresh = on_new_connection(gw.addr, &release, ALPHA.1).await;
        assert_eq!(fresh.expect("answered").0, StatusCode::OK);
    }
}
