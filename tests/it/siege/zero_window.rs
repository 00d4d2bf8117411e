//! HTTP/2 readers that never open their flow-control window (issue 26,
//! point 2): ten h2c connections with `SETTINGS_INITIAL_WINDOW_SIZE = 0`
//! and every stream a connection may open, against the gateway binary
//! (its RSS is the measure). The answers held for them stay within the
//! documented worst case (`server::worst_case_bytes`), and each stalled
//! connection is closed at the stall deadline.

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA, BETA};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, SimConfig};
use bytes::Bytes;
use http::{Request, StatusCode};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// VmRSS and VmHWM of a process, in bytes.
fn rss_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or_else(|| panic!("{name} in {status}"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// One HTTP/2 connection that never opens a stream's window, with `streams`
/// lookups in flight. Returns when each stream got its answer's head (the
/// statuses, and when the last came) and a task resolving when the gateway
/// closed the connection.
async fn zero_window(
    addr: SocketAddr,
    paths: Vec<String>,
) -> (
    Vec<Option<StatusCode>>,
    Instant,
    tokio::task::JoinHandle<Instant>,
    Vec<http::Response<h2::RecvStream>>,
) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, Bytes>(tcp)
        .await
        .expect("h2 handshake");
    let closed = tokio::spawn(async move {
        let _ = conn.await;
        Instant::now()
    });
    let mut pending = Vec::new();
    for path in paths {
        let req = Request::get(format!("http://{addr}{path}"))
            .header("x-api-key", ALPHA.1)
            .body(())
            .expect("request");
        send = send.ready().await.expect("ready");
        let (resp, _) = send.send_request(req, true).expect("stream opens");
        pending.push(tokio::spawn(resp));
    }
    let (mut statuses, mut kept) = (Vec::new(), Vec::new());
    for p in pending {
        // The head is not flow-controlled: it comes, the body never can;
        // or the stall deadline closed the connection first (`None`).
        match p.await.expect("task") {
            Ok(resp) => {
                statuses.push(Some(resp.status()));
                // Kept (never read) until the gateway closes the connection.
                kept.push(resp);
            }
            Err(_) => statuses.push(None),
        }
    }
    (statuses, Instant::now(), closed, kept)
}

/// The 50 ids of a search page `alpha` buys: records held from then on.
async fn held_ids(alpha: &Client, sim: &permit_api_sim::Sim) -> Vec<String> {
    let found = alpha.get(Query::state_permits(&sim.samples()).size(50)).await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.text());
    let ids: Vec<String> = found.json()["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(ids.len(), 50);
    ids
}

/// The `n`th of 500 distinct lookups of held records (0 credits): each
/// answer is assembled on its own, none shares another's bytes.
fn lookup_of(ids: &[String], n: usize) -> Query {
    let mut ids = ids.to_vec();
    ids.rotate_left(n % 50);
    Query::permits_by_id(&ids[..50 - (n / 50) % 10])
}

/// What ten zero-window HTTP/2 connections did to a gateway.
struct Siege {
    /// RSS growth while they were stalled, and its peak (VmHWM), in MiB.
    growth: f64,
    peak_growth: f64,
    /// The documented worst case for these connections
    /// (`server::worst_case_bytes`, docs/operations.md), in MiB.
    bound: f64,
    /// Streams answered (200), refused at the buffer budget (503), and cut
    /// by the stall deadline before their head came.
    ok: usize,
    refused: usize,
    cut: usize,
    /// The latest a connection was closed after its last answer's head.
    slowest_close: Duration,
    /// `server.write_timeout_secs`: the stall deadline.
    stall: Duration,
}

impl std::fmt::Display for Siege {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} answered / {} refused / {} cut by the stall deadline; RSS +{:.1} MiB held, peak +{:.1} MiB (formula {:.1} MiB); closed at most {:?} after the last head (deadline {:?})",
            self.ok,
            self.refused,
            self.cut,
            self.growth,
            self.peak_growth,
            self.bound,
            self.slowest_close,
            self.stall
        )
    }
}

/// The stall deadline a test allows: the deadline itself, a second time
/// for the driver's look at it and the client noticing the close while the
/// machine is loaded (4.4 s was measured for a 2 s deadline at load 10),
/// and 4 s more. Still well short of anything else that would close such a
/// connection (streams in flight are never idle; before issue 26 one stayed
/// 44 s).
fn close_bound(stall: Duration) -> Duration {
    stall * 2 + Duration::from_secs(4)
}

/// Ten h2c connections with `SETTINGS_INITIAL_WINDOW_SIZE = 0`, each with
/// as many lookups of held records (0 credits) as the gateway lets one
/// connection open, against the gateway binary started with `setup`.
async fn zero_window_siege(setup: Setup) -> Siege {
    const CONNS: usize = 10;
    let sim = start_sim(SimConfig {
        credit_limit: Some(100_000_000),
        ..unlimited()
    })
    .await;
    let cfg = setup.config(&sim);
    let streams = cfg.server.http2_max_concurrent_streams as usize;
    let stall = Duration::from_secs(cfg.server.write_timeout_secs);
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let base = gw.base_url();
    let alpha = Client::new(&base, ALPHA.1);
    let ids = held_ids(&alpha, &sim).await;
    let lookup = |n: usize| lookup_of(&ids, n);
    let one = alpha.get(lookup(0)).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text());
    let upstream_before = sim.stats().requests_total;
    let pid = gw.child.id();
    let (before, _) = rss_of(pid);
    let addr: SocketAddr = base.trim_start_matches("http://").parse().expect("addr");
    let mut conns = Vec::new();
    for c in 0..CONNS {
        let paths = (0..streams).map(|s| lookup(c * streams + s).to_string()).collect();
        conns.push(tokio::spawn(zero_window(addr, paths)));
    }
    let mut stalled = Vec::new();
    for c in conns {
        stalled.push(c.await.expect("connection task"));
    }
    let (held, peak) = rss_of(pid);
    let mib = |b: u64| b as f64 / 1048576.0;
    let statuses: Vec<Option<StatusCode>> = stalled.iter().flat_map(|(s, _, _, _)| s.clone()).collect();
    let count = |want: Option<StatusCode>| statuses.iter().filter(|s| **s == want).count();
    let (ok, refused, cut) = (
        count(Some(StatusCode::OK)),
        count(Some(StatusCode::SERVICE_UNAVAILABLE)),
        count(None),
    );
    assert_eq!(ok + refused + cut, CONNS * streams, "only 200s and 503s: {statuses:?}");
    let mut closed_after = Vec::new();
    for (_, last_head, closed, _kept) in stalled {
        // Far past the bound asserted below: a connection never closed
        // fails here, a late one there, with its time.
        let at = tokio::time::timeout(close_bound(stall) * 3, closed)
            .await
            .expect("a stalled connection was never closed")
            .expect("task");
        closed_after.push(at.saturating_duration_since(last_head));
    }
    let limits = permit_gateway::server::Limits::from_config(&cfg.server);
    let bound = permit_gateway::server::worst_case_bytes(&limits, CONNS, cfg.upstream.max_response_bytes);
    assert_eq!(
        sim.stats().requests_total,
        upstream_before,
        "held records: nothing bought"
    );
    // And a normal client is served all along.
    let r = Client::new(&base, BETA.1).get(Query::meta_release()).await;
    assert_eq!(r.status, StatusCode::OK);
    Siege {
        growth: mib(held.saturating_sub(before)),
        peak_growth: mib(peak.saturating_sub(before)),
        bound: mib(bound),
        ok,
        refused,
        cut,
        slowest_close: closed_after.iter().max().copied().unwrap_or_default(),
        stall,
    }
}

/// What every zero-window siege must show: RSS within the documented
/// worst case, something answered, each connection closed on time.
fn assert_bounded(siege: &Siege) {
    assert!(
        siege.peak_growth <= siege.bound,
        "RSS peaked past the documented worst case: {siege}"
    );
    assert!(siege.ok > 0, "nothing was answered at all: {siege}");
    assert!(
        siege.slowest_close <= close_bound(siege.stall),
        "a stalled connection stayed past {:?}: {siege}",
        close_bound(siege.stall)
    );
}

/// Issue 26's bound with 128 streams a connection (the default allows 100):
/// RSS growth ≤ 32 MB at the default 8 MiB budget.
#[tokio::test]
async fn zero_window_http2_readers_cannot_make_the_gateway_hold_memory() {
    let setup = Setup::new().with(|c| {
        c.server.write_timeout_secs = 2;
        c.server.http2_max_concurrent_streams = 128;
    });
    let siege = zero_window_siege(setup).await;
    eprintln!("zero-window h2, 10x128 streams, 8 MiB budget: {siege}");
    assert_bounded(&siege);
    assert!(siege.growth <= 32.0, "RSS grew past 32 MiB while stalled: {siege}");
    assert!(siege.peak_growth <= 32.0, "RSS peaked past 32 MiB: {siege}");
}

/// The same siege against the defaults (only the stall deadline shortened
/// to 2 s, to keep the test short: it bounds how long, not how much): 100
/// streams per connection, the 8 MiB budget. RSS stays within what
/// docs/operations.md's formula says ten connections can make it hold,
/// and within issue 26's 32 MB.
#[tokio::test]
async fn zero_window_http2_readers_at_the_default_limits_stay_within_the_documented_worst_case() {
    let setup = Setup::new().with(|c| c.server.write_timeout_secs = 2);
    let siege = zero_window_siege(setup).await;
    eprintln!("zero-window h2, 10x100 streams, default limits: {siege}");
    assert_bounded(&siege);
    assert!(siege.growth <= 32.0, "RSS grew past 32 MiB while stalled: {siege}");
    assert!(siege.peak_growth <= 32.0, "RSS peaked past 32 MiB: {siege}");
}

/// Issue 50, point 5: memory after attacks. Three rounds of zero-window
/// HTTP/2 connections (100 streams each of held-record lookups), each
/// round closed by the stall deadline; then the attack is over. RSS used
/// to level at 5–6 times its start and stay there ("returned only by
/// chance"); it must come back within 1.5× of its start within a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_taken_by_zero_window_rounds_is_returned_within_a_minute() {
    const CONNS: usize = 150;
    const ROUNDS: usize = 3;
    let sim = start_sim(SimConfig {
        credit_limit: Some(100_000_000),
        ..unlimited()
    })
    .await;
    let setup = Setup::new().with(|c| c.server.write_timeout_secs = 2);
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let ids = held_ids(&alpha, &sim).await;
    let lookup = |n: usize| lookup_of(&ids, n).to_string();
    // Every lookup once, so the rounds measure connections, not the cache.
    for n in 0..500 {
        assert_eq!(alpha.get(lookup(n)).await.status, StatusCode::OK);
    }
    let pid = gw.child.id();
    let (start, _) = rss_of(pid);
    let addr = gw.addr;
    let mut peak = 0;
    for _ in 0..ROUNDS {
        let conns: Vec<_> = (0..CONNS)
            .map(|c| tokio::spawn(zero_window(addr, (0..100).map(|s| lookup(c * 100 + s)).collect())))
            .collect();
        let mut closing = Vec::new();
        for c in conns {
            let (_, _, closed, kept) = c.await.expect("connection task");
            closing.push((closed, kept));
        }
        peak = peak.max(rss_of(pid).0);
        for (closed, kept) in closing {
            let _ = tokio::time::timeout(Duration::from_secs(30), closed).await;
            drop(kept);
        }
    }
    let mib = |b: u64| b as f64 / 1048576.0;
    let after = crate::support::wait::eventually(
        "RSS back within 1.5 times its start",
        Duration::from_secs(60),
        || async move {
            let now = rss_of(pid).0;
            match now as f64 <= start as f64 * 1.5 {
                true => Ok(now),
                false => Err(format!(
                    "{:.1} MiB (start {:.1} MiB, peak {:.1} MiB)",
                    mib(now),
                    mib(start),
                    mib(peak)
                )),
            }
        },
    )
    .await;
    eprintln!(
        "zero-window rounds: RSS {:.1} MiB at start, {:.1} MiB at the peak, {:.1} MiB after",
        mib(start),
        mib(peak),
        mib(after)
    );
    assert!(
        peak as f64 > start as f64 * 1.5,
        "the rounds took memory: the test measures something"
    );
}
