//! Issue 60, point 3: four teams each holding its share of the connection
//! slots with uncached calls in flight on a slow upstream (together every
//! slot) made a fifth team with no open connection wait 5.0 s for its
//! first answer: a newcomer is not yet a tenant, so no team was over its
//! share and no connection could go. Now it takes one of a small reserve
//! of slots (`server::overload::reserve`).

use crate::support::conn::{on_new_connection, KeptAlive};
use crate::support::gateway::{ChildGateway, Setup, Team, ALPHA, BETA, SMALL};
use crate::support::probe::scrape;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, SimConfig};
use http::StatusCode;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const GAMMA: Team = ("gamma", "tok-gamma-2468ace013579bdf");
const DELTA: Team = ("delta", "tok-delta-fedcba9876543210");

/// The listener's connections; a quarter is a team's in-flight share.
const CAP: usize = 64;

/// A TCP relay between the gateway and the simulator that counts the
/// request heads that reached the upstream (the simulator counts a request
/// only once its latency has passed).
async fn counting_relay(upstream: SocketAddr) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay binds");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let heads = Arc::new(AtomicUsize::new(0));
    let counted = heads.clone();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let heads = counted.clone();
            tokio::spawn(async move {
                let Ok(up) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut down_rd, mut down_wr) = down.into_split();
                let (mut up_rd, mut up_wr) = up.into_split();
                let back = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut up_rd, &mut down_wr).await;
                });
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n @ 1..) = down_rd.read(&mut buf).await {
                    // The gateway writes each call's head in one piece.
                    let calls = buf[..n].windows(8).filter(|w| w == b"GET /v2/").count();
                    heads.fetch_add(calls, Ordering::Relaxed);
                    if up_wr.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                back.abort();
            });
        }
    });
    (url, heads)
}

/// One request on a new connection from another address (127.0.0.2: the
/// siege's address holds its whole share); the answer's status line.
async fn from_elsewhere(addr: SocketAddr, target: &Query, token: &str) -> Result<String, String> {
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
    socket
        .bind("127.0.0.2:0".parse().expect("addr"))
        .map_err(|e| e.to_string())?;
    let mut s = socket.connect(addr).await.map_err(|e| e.to_string())?;
    let head = format!("GET {target} HTTP/1.1\r\nHost: gateway\r\nx-api-key: {token}\r\nConnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&got);
    text.lines()
        .next()
        .map(str::to_string)
        .ok_or_else(|| "closed without an answer".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifth_team_beside_four_teams_at_their_in_flight_share_is_answered_first() {
    let sim = start_sim(SimConfig {
        latency_ms: 3000,
        ..unlimited()
    })
    .await;
    let (relay, heads) = counting_relay(sim.addr()).await;
    let setup = Setup::new().teams(&[ALPHA, BETA, SMALL, GAMMA, DELTA]).with(|c| {
        c.server.max_connections = CAP;
        c.server.max_connections_per_peer = CAP;
    });
    let gw = ChildGateway::spawn(&setup, &relay, sim.api_key());
    // The fifth team's answer is a cache hit, bought (by another team, on
    // a connection closed since) before the siege.
    let hit = Query::meta_release();
    let warm = on_new_connection(gw.addr, &hit, ALPHA.1).await;
    assert_eq!(warm.expect("answered").0, StatusCode::OK);
    assert_eq!(heads.load(Ordering::Relaxed), 1);
    // Its connection gone: no slot is held but the siege's.
    let admin = gw.admin_url();
    crate::support::wait::eventually("the warm-up connection is gone", Duration::from_secs(10), || {
        let admin = admin.clone();
        async move {
            let open = scrape(&admin).await.sum("gateway_open_connections", &[]);
            (open == 0.0).then_some(()).ok_or(open)
        }
    })
    .await;
    // Four teams, a quarter of the slots each, every one an uncached call
    // in flight: together every slot, each team exactly at its share.
    let colluders: Vec<_> = [ALPHA, SMALL, GAMMA, DELTA]
        .iter()
        .flat_map(|team| (0..CAP / 4).map(move |n| (team.1, n)))
        .map(|(token, n)| {
            let addr = gw.addr;
            tokio::spawn(async move {
                let mut c = KeptAlive::open(addr).await?;
                let answered = c
                    .get(Query::text_search("cities", format!("slow{token}{n}")), token)
                    .await;
                answered.map(|(status, _)| (status, Instant::now()))
            })
        })
        .collect();
    crate::support::wait::eventually("every slot holds a call in flight", Duration::from_secs(20), || {
        let n = heads.load(Ordering::Relaxed);
        async move { (n > CAP).then_some(()).ok_or(format!("{n} calls at the upstream")) }
    })
    .await;
    assert_eq!(sim.stats().requests_total, 1, "the calls are still in flight");
    let started = Instant::now();
    let fifth = tokio::time::timeout(Duration::from_secs(10), from_elsewhere(gw.addr, &hit, BETA.1))
        .await
        .expect("the fifth team is answered before the siege's calls return");
    let answered = Instant::now();
    eprintln!(
        "a fifth team beside four at their share: answered in {:?}",
        answered - started
    );
    assert_eq!(fifth.expect("answered"), "HTTP/1.1 200 OK");
    let mut first_colluder = None;
    let mut statuses = Vec::new();
    for c in colluders {
        if let Ok(Ok((status, at))) = c.await {
            statuses.push(status.as_u16());
            first_colluder = Some(first_colluder.map_or(at, |f: Instant| f.min(at)));
        }
    }
    eprintln!("the colluders' answers: {statuses:?}");
    // The order, not a latency: the fifth team did not wait for the calls
    // holding the slots to return.
    if let Some(first) = first_colluder {
        assert!(answered < first, "the fifth team waited for the colluders' answers");
    }
    // Its hit cost no upstream call.
    assert_eq!(heads.load(Ordering::Relaxed), CAP + 1);
}
