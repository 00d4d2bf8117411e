//! The log never holds a request (issue 34, case f): with the gateway's
//! stderr not read at all (the pipe full, every write to it blocked) and a
//! token-less flood of one access line per request, a team's cache hits
//! stay fast, lines are dropped and counted instead, and the team's own
//! lines are kept over the anonymous ones. And one team's flood of hits
//! costs it its own lines, not another team's (issue 50, point 3).

use crate::support::conn::KeptAlive;
use crate::support::gateway::{ChildGateway, Setup, ALPHA, BETA};
use crate::support::probe::scrape;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited};
use crate::support::wait::eventually;
use http::StatusCode;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A small queue, so that the flood fills it in a second or two.
const QUEUE_LINES: usize = 1024;
/// The flood's raw requests, written out as bytes.
const PATH: &str = "/v2/meta/release";
const DROPPED: &str = "gateway_log_lines_dropped_total";
const TEAM_DROPPED: &str = "gateway_log_team_lines_dropped_total";
/// Requests each flooding connection has in flight.
const DEPTH: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_log_and_a_token_less_flood_leave_a_teams_hits_fast() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().with(|c| c.log.queue_lines = QUEUE_LINES);
    let mut gw = ChildGateway::spawn_stalled(&setup, &sim.base_url(), sim.api_key());
    let admin = gw.admin_url();
    let release = Query::meta_release();
    let mut alpha = KeptAlive::open(gw.addr).await.expect("connects");
    // The miss that fills the entry, then a hit.
    alpha.get(&release, ALPHA.1).await.expect("answered");
    assert_eq!(alpha.get(&release, ALPHA.1).await.expect("answered").1, "HIT");

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let flood: Vec<_> = (0..4)
        .map(|_| tokio::spawn(flood(gw.addr, None, stop.clone(), answered.clone())))
        .collect();
    // The pipe is full and the queue too: anonymous lines are being dropped.
    eventually("anonymous log lines dropped", Duration::from_secs(60), || {
        let admin = admin.clone();
        async move {
            let dropped = scrape(&admin).await.sum(DROPPED, &[("kind", "anonymous")]);
            (dropped > 0.0).then_some(())
        }
    })
    .await;

    let before = answered.load(Ordering::Relaxed);
    let mut took = Vec::with_capacity(200);
    for _ in 0..200 {
        let start = Instant::now();
        let (status, cache) = alpha.get(&release, ALPHA.1).await.expect("answered");
        took.push(start.elapsed());
        assert_eq!((status, cache.as_str()), (StatusCode::OK, "HIT"));
    }
    let flooded = answered.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        let _ = f.await;
    }
    took.sort();
    let (p50, p99, max) = (took[99], took[197], took[199]);
    eprintln!("team hits under a stalled log: p50 {p50:?} p99 {p99:?} max {max:?}; {flooded} flood answers meanwhile");
    assert!(flooded > 0, "the flood went on while the team was measured");
    // A hit that waited on the stalled log would wait for as long as it
    // stalls (the test holds it for the whole measurement): the slowest
    // hit is bounded far above a loaded machine's tail, far below that.
    assert!(max < Duration::from_secs(2), "max {max:?} (p50 {p50:?}, p99 {p99:?})");

    // Only anonymous lines were dropped: every team line is still queued.
    let metrics = scrape(&admin).await;
    assert!(metrics.sum(DROPPED, &[("kind", "anonymous")]) > 0.0);
    assert_eq!(metrics.get(DROPPED, &[("kind", "team")]), Some(0.0));
    gw.resume_logs();
    let hits = eventually(
        "the team's 202 access lines, once stderr is read",
        Duration::from_secs(30),
        || {
            let hits = gw
                .access_lines()
                .iter()
                .filter(|l| l["team"] == ALPHA.0 && l["status"] == 200 && l["refresh"].is_null())
                .count();
            async move { (hits >= 202).then_some(hits) }
        },
    )
    .await;
    assert_eq!(hits, 202);
}

/// Requests on one kept-alive connection (reopened when closed), [`DEPTH`]
/// pipelined at a time, until `stop`: token-less (each a 422 and an
/// anonymous access line), or with `token` (each a hit and a team's line).
/// A few in flight, not an unbounded pipeline: what is measured is the
/// log's hold on a hit, not how the server shares its workers among
/// connections that always have a request ready.
async fn flood(addr: SocketAddr, token: Option<&'static str>, stop: Arc<AtomicBool>, answered: Arc<AtomicUsize>) {
    let key = token.map(|t| format!("X-API-Key: {t}\r\n")).unwrap_or_default();
    let batch = format!("GET {PATH} HTTP/1.1\r\nHost: x\r\n{key}\r\n").repeat(DEPTH);
    let mut buf = vec![0u8; 64 * 1024];
    'connections: while !stop.load(Ordering::Relaxed) {
        let Ok(mut tcp) = TcpStream::connect(addr).await else {
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            if tcp.write_all(batch.as_bytes()).await.is_err() {
                continue 'connections;
            }
            let mut heads = 0;
            while heads < DEPTH {
                match tcp.read(&mut buf).await {
                    Ok(n @ 1..) => heads += buf[..n].windows(9).filter(|w| w == b"HTTP/1.1 ").count(),
                    _ => continue 'connections,
                }
            }
            answered.fetch_add(heads, Ordering::Relaxed);
        }
    }
}

/// Issue 50, point 3: team beta floods cached hits (pipelined, four
/// connections) while the gateway's stderr is not read. Before, every line
/// shared one queue: 0 of another team's 292 access lines reached the log.
/// Now the team holding the most of the queue loses its own oldest line:
/// alpha's 100 hits in the middle of the flood are all written once stderr
/// is read, beta's losses are counted under its name, alpha's are 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_teams_flood_against_a_stalled_log_keeps_another_teams_lines() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().with(|c| c.log.queue_lines = QUEUE_LINES);
    let mut gw = ChildGateway::spawn_stalled(&setup, &sim.base_url(), sim.api_key());
    let admin = gw.admin_url();
    // The release metadata is free and cached: every flood request a hit.
    let release = Query::meta_release();
    let mut alpha = KeptAlive::open(gw.addr).await.expect("connects");
    alpha.get(&release, ALPHA.1).await.expect("answered");
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let flood: Vec<_> = (0..4)
        .map(|_| tokio::spawn(flood(gw.addr, Some(BETA.1), stop.clone(), answered.clone())))
        .collect();
    eventually("beta's own lines dropped", Duration::from_secs(60), || {
        let admin = admin.clone();
        async move {
            let dropped = scrape(&admin).await.sum(TEAM_DROPPED, &[("team", BETA.0)]);
            (dropped > 0.0).then_some(())
        }
    })
    .await;
    for _ in 0..100 {
        let (status, _) = alpha.get(&release, ALPHA.1).await.expect("answered");
        assert_eq!(status, StatusCode::OK);
    }
    let flooded = answered.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        let _ = f.await;
    }
    let metrics = scrape(&admin).await;
    let beta_dropped = metrics.sum(TEAM_DROPPED, &[("team", BETA.0)]);
    assert_eq!(
        metrics.get(TEAM_DROPPED, &[("team", ALPHA.0)]),
        None,
        "alpha lost no line"
    );
    gw.resume_logs();
    let alphas = eventually(
        "alpha's 101 access lines, once stderr is read",
        Duration::from_secs(30),
        || {
            let n = gw.access_lines().iter().filter(|l| l["team"] == ALPHA.0).count();
            async move { (n >= 101).then_some(n) }
        },
    )
    .await;
    eprintln!(
        "beta's flood of {flooded} hits: {beta_dropped} of its lines dropped; alpha's lines written: {alphas} of 101"
    );
    assert_eq!(alphas, 101, "every alpha line (the issue asks at least 90 %)");
}
