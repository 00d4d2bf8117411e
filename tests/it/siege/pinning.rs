//! One team pinning every slot it may (issue 26, point 3): free calls that
//! queue and followers of one shared slow call keep the team at its
//! in-flight cap, while another team's cache hits stay fast.

use crate::support::client::Client;
use crate::support::conn::{header, on_new_connection, KeptAlive};
use crate::support::gateway::{ChildGateway, Setup, Team, ALPHA, BETA, SMALL};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, Sim, SimConfig};
use http::StatusCode;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the pinning clients got: every answer, and the 429s among them.
#[derive(Default)]
struct Pinned {
    answered: AtomicUsize,
    refused: AtomicUsize,
}

/// One client of the pinning team on its own connection: free searches
/// that queue, and one shared slow search that followers pile onto. A
/// well-behaved attacker: after a 429 it waits the `Retry-After` the
/// gateway asked for (pacing the load, not synchronising the test), then
/// comes back for the slot, so the team stays at its in-flight cap without
/// spinning on refusals.
async fn pin(addr: SocketAddr, token: &'static str, n: usize, stop: Arc<AtomicBool>, pinned: Arc<Pinned>) {
    let mut conn = None;
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let query = match i % 2 {
            0 => Query::text_search("cities", format!("pin{n}x{i}")),
            _ => Query::text_search("cities", "shared"),
        };
        if conn.is_none() {
            conn = KeptAlive::open(addr).await.ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        match c.head_of(&query, token).await {
            Ok(head) => {
                pinned.answered.fetch_add(1, Ordering::Relaxed);
                if head.status == StatusCode::TOO_MANY_REQUESTS {
                    pinned.refused.fetch_add(1, Ordering::Relaxed);
                    let secs = header(&head, "retry-after").and_then(|v| v.parse().ok()).unwrap_or(1);
                    tokio::time::sleep(Duration::from_secs(secs)).await;
                }
            }
            // Evicted for another team's newcomer: connect again.
            Err(_) => conn = None,
        }
    }
}

/// The listener's connections in these sieges.
const CAP: usize = 64;

/// A slow upstream (300 ms a call, 60 calls a minute) behind a gateway of
/// `setup` taking [`CAP`] connections, in a process of its own (the
/// pinning clients' work is not the gateway's); beta's hit is cached. The
/// simulator (held for the test's length), the gateway, its address and
/// the hit.
async fn slow_upstream_siege(setup: Setup) -> (Sim, ChildGateway, SocketAddr, Query) {
    let sim = start_sim(SimConfig {
        latency_ms: 300,
        ..unlimited()
    })
    .await;
    let setup = setup.with(|c| {
        c.server.max_connections = CAP;
        c.upstream.requests_per_minute = 60;
    });
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let addr: SocketAddr = gw.base_url().trim_start_matches("http://").parse().expect("addr");
    let hit = Query::meta_release();
    let warm = Client::new(gw.base_url(), BETA.1).get(&hit).await;
    assert_eq!(warm.status, StatusCode::OK);
    (sim, gw, addr, hit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_team_pinning_with_free_calls_and_followers_leaves_another_teams_hits_fast() {
    let (_sim, _gw, addr, hit) = slow_upstream_siege(Setup::new()).await;
    let quiet = measured_hits(addr, hit.clone()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let pinned = Arc::new(Pinned::default());
    // Three quarters of the connections the listener takes (more makes it a
    // test of eviction, which conns.rs's tests cover).
    let pinners: Vec<_> = (0..CAP * 3 / 4)
        .map(|n| tokio::spawn(pin(addr, ALPHA.1, n, stop.clone(), pinned.clone())))
        .collect();
    // Pinned: the team is at its in-flight cap (16, a quarter of the
    // connections), its other clients refused.
    crate::support::wait::eventually("the pinning runs", Duration::from_secs(20), || {
        let (n, refused) = (
            pinned.answered.load(Ordering::Relaxed),
            pinned.refused.load(Ordering::Relaxed),
        );
        async move {
            if n > 2 * CAP && refused > CAP {
                Ok(())
            } else {
                Err(format!("{n} answers, {refused} refused"))
            }
        }
    })
    .await;
    let refused_before = pinned.refused.load(Ordering::Relaxed);
    let during = measured_hits(addr, hit).await;
    let refused_during = pinned.refused.load(Ordering::Relaxed) - refused_before;
    stop.store(true, Ordering::Relaxed);
    for p in pinners {
        p.abort();
    }
    eprintln!(
        "pinning: {} pinning answers ({refused_during} refused while measured); the other team's hits, quiet: {quiet}; while pinned: {during}",
        pinned.answered.load(Ordering::Relaxed),
    );
    assert!(refused_during > 0, "the team was not at its cap while measured");
    assert!(
        quiet.failures.is_empty() && during.failures.is_empty(),
        "hits failed: {during}"
    );
    // Medians only, far above what a hit takes (1-3 ms) and far below the
    // 1.3 s median of issue 26: a tail on a loaded 2-core machine is the
    // machine's, not the gateway's (the tail is measured in bench/).
    assert!(during.kept_alive.p50 < Duration::from_millis(100), "{during}");
    assert!(during.new_connections.p50 < Duration::from_millis(100), "{during}");
}

/// Two more teams for the four-team siege.
const GAMMA: Team = ("gamma", "tok-gamma-2468ace013579bdf");
const DELTA: Team = ("delta", "tok-delta-fedcba9876543210");

/// Issue 50, point 1: four teams (not one) with calls waiting on a slow
/// upstream, a quarter of the connections each: every slot is taken by a
/// connection with a call in flight, which used to make none of them a
/// victim (the issue measured another team's hits at 21 in 20 s, p99
/// 7.4 s). Busy connections count against their team's share, so a
/// newcomer of another team takes the place of a team's past its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_teams_waiting_on_a_slow_upstream_leave_another_teams_hits_fast() {
    let setup = Setup::new().teams(&[ALPHA, BETA, SMALL, GAMMA, DELTA]);
    let (_sim, gw, addr, hit) = slow_upstream_siege(setup).await;
    let stop = Arc::new(AtomicBool::new(false));
    let pinned = Arc::new(Pinned::default());
    let waiting: Vec<_> = [ALPHA, SMALL, GAMMA, DELTA]
        .iter()
        .enumerate()
        .flat_map(|(k, team)| (0..CAP / 4).map(move |n| (team.1, k * CAP + n)))
        .map(|(token, n)| tokio::spawn(pin(addr, token, n, stop.clone(), pinned.clone())))
        .collect();
    // Every slot taken: the waiting clients' answers keep coming (the
    // followers of each team's shared search, a call a second).
    crate::support::wait::eventually("four teams hold the slots", Duration::from_secs(30), || {
        let n = pinned.answered.load(Ordering::Relaxed);
        async move { (n > 2 * CAP).then_some(()).ok_or(format!("{n} answers")) }
    })
    .await;
    let during = measured_hits(addr, hit).await;
    stop.store(true, Ordering::Relaxed);
    for w in waiting {
        w.abort();
    }
    let made_room = super::overload::overload_actions(&gw, "action=\"team_over_share_busy\"").await;
    eprintln!(
        "four teams waiting on a slow upstream ({} answers, {} refused): the fifth team's hits: {during}; {made_room} busy connections made room",
        pinned.answered.load(Ordering::Relaxed),
        pinned.refused.load(Ordering::Relaxed),
    );
    assert!(made_room > 0, "the slots were never full: the test measured nothing");
    assert!(during.failures.is_empty(), "hits failed: {during}");
    assert!(during.kept_alive.p50 < Duration::from_millis(100), "{during}");
    assert!(during.new_connections.p50 < Duration::from_millis(100), "{during}");
}

#[derive(Debug)]
struct Latencies {
    p50: Duration,
    p99: Duration,
}

impl Latencies {
    fn of(mut took: Vec<Duration>) -> Latencies {
        took.sort();
        Latencies {
            p50: took[took.len() / 2],
            p99: took[took.len() * 99 / 100],
        }
    }
}

/// The other team's cache hits: latencies on its kept-alive connection
/// (after a warm-up), latencies on new connections, and every failure.
#[derive(Debug)]
struct Hits {
    kept_alive: Latencies,
    new_connections: Latencies,
    failures: Vec<String>,
}

impl std::fmt::Display for Hits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (k, n) = (&self.kept_alive, &self.new_connections);
        write!(
            f,
            "kept-alive p50 {:?} p99 {:?}; new connections p50 {:?} p99 {:?}; {} failed",
            k.p50,
            k.p99,
            n.p50,
            n.p99,
            self.failures.len()
        )
    }
}

/// Hits timed on the kept-alive connection, and on new connections.
const KEPT_ALIVE_HITS: usize = 300;
const NEW_CONNECTION_HITS: usize = 50;
/// The timed hits come at most one per this (a client's pace, not a
/// synchronisation): 300 take at least 3 s, so the measurement spans
/// several of the pinning clients' one-second `Retry-After` cycles and
/// samples the siege in its steady state, not one burst.
const HIT_EVERY: Duration = Duration::from_millis(10);

/// Team beta's cache hits, from a client on a thread and runtime of its
/// own, so that the time measured is the gateway's, not the wait for a
/// worker of the test's runtime that the pinning clients keep busy: 20
/// warm-up hits, then [`KEPT_ALIVE_HITS`] timed (paced by [`HIT_EVERY`]) on one kept-alive
/// connection (the < 50 ms p99 of issue 26), then [`NEW_CONNECTION_HITS`]
/// on new connections (they must all be answered; their time includes a
/// TCP connect on a loaded machine, so only their median is bounded).
async fn measured_hits(addr: SocketAddr, query: Query) -> Hits {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _ = tx.send(rt.block_on(hits(addr, &query)));
    });
    rx.await.expect("the measuring thread")
}

async fn hits(addr: SocketAddr, query: &Query) -> Hits {
    let mut failures = Vec::new();
    let mut check = |what: String, r: Result<(StatusCode, String), String>| match r {
        Ok((StatusCode::OK, cache)) if cache == "HIT" => {}
        other => failures.push(format!("{what}: {other:?}")),
    };
    let mut kept_alive = KeptAlive::open(addr).await.expect("connects");
    for i in 0..20 {
        check(format!("warm-up {i}"), kept_alive.get(query, BETA.1).await);
    }
    let mut pace = tokio::time::interval(HIT_EVERY);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut took = Vec::with_capacity(KEPT_ALIVE_HITS);
    for i in 0..KEPT_ALIVE_HITS {
        pace.tick().await;
        let started = Instant::now();
        let r = kept_alive.get(query, BETA.1).await;
        took.push(started.elapsed());
        check(format!("kept-alive {i}"), r);
    }
    let kept_alive = Latencies::of(took);
    let mut took = Vec::with_capacity(NEW_CONNECTION_HITS);
    for i in 0..NEW_CONNECTION_HITS {
        pace.tick().await;
        let started = Instant::now();
        let r = on_new_connection(addr, query, BETA.1).await;
        took.push(started.elapsed());
        check(format!("new connection {i}"), r);
    }
    Hits {
        kept_alive,
        new_connections: Latencies::of(took),
        failures,
    }
}
