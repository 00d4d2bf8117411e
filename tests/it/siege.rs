//! The front door under hostile load (issue 26): eviction at the cap cannot
//! be aimed at teams, HTTP/2 readers that never open their window cannot
//! make the gateway hold memory, and one team cannot pin every slot.

use crate::support::gateway::{ChildGateway, Setup, ALPHA, BETA};
use crate::support::http::get;
use crate::support::sim::{start_sim, unlimited, SimConfig};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A kept-alive HTTP/1.1 connection of one client.
struct KeptAlive(http1::SendRequest<Empty<Bytes>>);

impl KeptAlive {
    async fn open(addr: SocketAddr) -> Result<KeptAlive, String> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let (send, conn) = http1::handshake(TokioIo::new(tcp)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(KeptAlive(send))
    }

    /// One GET; the status and the `X-Cache` header, or why it failed.
    async fn get(&mut self, path: &str, token: &str) -> Result<(StatusCode, String), String> {
        let req = Request::get(path)
            .header("host", "gateway")
            .header("x-api-key", token)
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        self.0.ready().await.map_err(|e| e.to_string())?;
        let resp = self.0.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let cache = resp
            .headers()
            .get("x-cache")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        resp.into_body().collect().await.map_err(|e| e.to_string())?;
        Ok((status, cache))
    }
}

/// One GET on a connection of its own.
async fn on_new_connection(addr: SocketAddr, path: &str, token: &str) -> Result<(StatusCode, String), String> {
    KeptAlive::open(addr).await?.get(path, token).await
}

/// An anonymous peer: opens connections, sends one token-less head (a free
/// 404), reads the answer and keeps the socket (the last `keep` of them).
async fn churn(addr: SocketAddr, keep: usize, stop: Arc<AtomicBool>, heads: Arc<AtomicUsize>) {
    let mut kept = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            continue;
        };
        if s.write_all(b"GET /v2/zz HTTP/1.1\r\nHost: x\r\n\r\n").await.is_err() {
            continue;
        }
        let mut buf = [0u8; 2048];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
            // A token-less head: a free 4xx.
            if buf[..n].starts_with(b"HTTP/1.1 4") {
                heads.fetch_add(1, Ordering::Relaxed);
            }
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
        .with(
            "server",
            format!("max_connections = {CAP}\nmax_connections_per_peer = {CAP}"),
        )
        .start(&sim)
        .await;
    let path = "/v2/meta/release";
    let warm = get(&format!("{}{path}", gw.base_url()), &[("x-api-key", ALPHA.1)]).await;
    assert_eq!(warm.status, StatusCode::OK);
    let mut kept_alive = KeptAlive::open(gw.addr).await.expect("connects");
    assert_eq!(kept_alive.get(path, ALPHA.1).await.expect("answered").0, StatusCode::OK);
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
        let fresh = on_new_connection(gw.addr, path, ALPHA.1).await;
        let kept = kept_alive.get(path, ALPHA.1).await;
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

#[tokio::test]
async fn zero_window_http2_readers_cannot_make_the_gateway_hold_memory() {
    const CONNS: usize = 10;
    const STREAMS: usize = 128;
    const STALL: u64 = 2;
    let sim = start_sim(SimConfig {
        credit_limit: Some(100_000_000),
        ..unlimited()
    })
    .await;
    let setup = Setup::new().with(
        "server",
        format!("write_timeout_secs = {STALL}\nhttp2_max_concurrent_streams = {STREAMS}\nhttp2_max_buffered_bytes = 8388608"),
    );
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let base = gw.base_url();
    let s = sim.samples();
    let search = format!(
        "/v2/permits/search?geo_id={}&permit_from={}&permit_to={}&size=50",
        s.state, s.permit_from, s.permit_to
    );
    let found = get(&format!("{base}{search}"), &[("x-api-key", ALPHA.1)]).await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.text());
    let ids: Vec<String> = found.json()["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(ids.len(), 50);
    // Distinct lookups of the held records (0 credits): each answer is
    // assembled on its own, none shares another's bytes.
    let lookup = |n: usize| {
        let mut ids = ids.clone();
        ids.rotate_left(n % 50);
        let q: Vec<String> = ids[..50 - (n / 50) % 10].iter().map(|i| format!("id={i}")).collect();
        format!("/v2/permits?{}", q.join("&"))
    };
    let one = get(&format!("{base}{}", lookup(0)), &[("x-api-key", ALPHA.1)]).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text());
    let upstream_before = sim.stats().requests_total;
    let pid = gw.child.id();
    let (before, _) = rss_of(pid);
    let addr: SocketAddr = base.trim_start_matches("http://").parse().expect("addr");
    let mut conns = Vec::new();
    for c in 0..CONNS {
        let paths = (0..STREAMS).map(|s| lookup(c * STREAMS + s)).collect();
        conns.push(tokio::spawn(zero_window(addr, paths)));
    }
    let mut stalled = Vec::new();
    for c in conns {
        stalled.push(c.await.expect("connection task"));
    }
    let (held, peak) = rss_of(pid);
    let growth = held.saturating_sub(before) as f64 / 1048576.0;
    let peak_growth = peak.saturating_sub(before) as f64 / 1048576.0;
    let statuses: Vec<Option<StatusCode>> = stalled.iter().flat_map(|(s, _, _, _)| s.clone()).collect();
    let count = |want: Option<StatusCode>| statuses.iter().filter(|s| **s == want).count();
    let (ok, refused, cut) = (
        count(Some(StatusCode::OK)),
        count(Some(StatusCode::SERVICE_UNAVAILABLE)),
        count(None),
    );
    assert_eq!(ok + refused + cut, CONNS * STREAMS, "only 200s and 503s: {statuses:?}");
    let mut closed_after = Vec::new();
    for (_, last_head, closed, _kept) in stalled {
        let at = tokio::time::timeout(Duration::from_secs(STALL + 10), closed)
            .await
            .expect("a stalled connection was never closed")
            .expect("task");
        closed_after.push(at.saturating_duration_since(last_head));
    }
    let slowest = closed_after.iter().max().copied().unwrap_or_default();
    eprintln!(
        "zero-window h2: {CONNS}x{STREAMS} streams, {ok} answered / {refused} refused / {cut} cut by the stall deadline; RSS +{growth:.1} MiB held, peak +{peak_growth:.1} MiB; closed at most {slowest:?} after the last head"
    );
    assert!(growth <= 32.0, "RSS grew {growth:.1} MiB while stalled");
    // The documented worst case for these connections (docs/operations.md).
    let cfg = setup.config(&sim);
    let limits = permit_gateway::server::Limits::from_config(&cfg.server);
    let bound =
        permit_gateway::server::worst_case_bytes(&limits, CONNS, cfg.upstream.max_response_bytes) as f64 / 1048576.0;
    assert!(
        peak_growth <= bound,
        "RSS peaked {peak_growth:.1} MiB above the start, past the formula's {bound:.1} MiB"
    );
    assert!(peak_growth <= 32.0, "RSS peaked {peak_growth:.1} MiB above the start");
    assert!(
        // The deadline, plus scheduling on a loaded test machine.
        slowest <= Duration::from_secs(STALL + 3),
        "a stalled connection stayed {slowest:?}"
    );
    assert!(ok > 0, "nothing was answered at all");
    assert_eq!(
        sim.stats().requests_total,
        upstream_before,
        "held records: nothing bought"
    );
    // And a normal client is served all along.
    let r = get(&format!("{base}/v2/meta/release"), &[("x-api-key", BETA.1)]).await;
    assert_eq!(r.status, StatusCode::OK);
}

/// One client of the pinning team on its own connection: free searches
/// that queue, and one shared slow search that followers pile onto.
async fn pin(addr: SocketAddr, n: usize, stop: Arc<AtomicBool>, answered: Arc<AtomicUsize>) {
    let mut conn = None;
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let path = match i % 2 {
            0 => format!("/v2/cities/search?q=pin{n}x{i}"),
            _ => "/v2/cities/search?q=shared".to_string(),
        };
        if conn.is_none() {
            conn = KeptAlive::open(addr).await.ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        match c.get(&path, ALPHA.1).await {
            Ok(_) => {
                answered.fetch_add(1, Ordering::Relaxed);
            }
            // Evicted for another team's newcomer: connect again.
            Err(_) => conn = None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_team_pinning_with_free_calls_and_followers_leaves_another_teams_hits_fast() {
    const CAP: usize = 64;
    let sim = start_sim(SimConfig {
        latency_ms: 300,
        ..unlimited()
    })
    .await;
    // A process of its own: the pinning clients' work is not the gateway's.
    let setup = Setup::new()
        .with("server", format!("max_connections = {CAP}"))
        .with("upstream", "requests_per_minute = 60");
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let addr: SocketAddr = gw.base_url().trim_start_matches("http://").parse().expect("addr");
    let hit = "/v2/meta/release";
    let warm = get(&format!("{}{hit}", gw.base_url()), &[("x-api-key", BETA.1)]).await;
    assert_eq!(warm.status, StatusCode::OK);
    let quiet = hits(addr, hit).await;
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    // Three quarters of the connections the listener takes (more makes it a
    // test of eviction, which conns.rs's tests cover).
    let pinners: Vec<_> = (0..CAP * 3 / 4)
        .map(|n| tokio::spawn(pin(addr, n, stop.clone(), answered.clone())))
        .collect();
    crate::support::wait::eventually("the pinning runs", Duration::from_secs(10), || {
        let n = answered.load(Ordering::Relaxed);
        async move {
            if n > 2 * CAP {
                Ok(())
            } else {
                Err(n)
            }
        }
    })
    .await;
    let pinned = hits(addr, hit).await;
    stop.store(true, Ordering::Relaxed);
    for p in pinners {
        p.abort();
    }
    eprintln!(
        "pinning: {} pinning answers; the other team's hits, quiet: {quiet}; while pinned: {pinned}",
        answered.load(Ordering::Relaxed),
    );
    assert!(
        quiet.failures.is_empty() && pinned.failures.is_empty(),
        "hits failed: {pinned:?}"
    );
    assert!(pinned.p99 < Duration::from_millis(50), "{pinned}");
}

#[derive(Debug)]
struct Latencies {
    p50: Duration,
    p99: Duration,
    failures: Vec<String>,
}

impl std::fmt::Display for Latencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:?} p99 {:?}, {} failed",
            self.p50,
            self.p99,
            self.failures.len()
        )
    }
}

/// 100 cache hits of team beta, half on a kept-alive connection and half
/// on new ones.
async fn hits(addr: SocketAddr, path: &str) -> Latencies {
    let mut kept_alive = KeptAlive::open(addr).await.expect("connects");
    let (mut took, mut failures) = (Vec::new(), Vec::new());
    for i in 0..100 {
        let started = Instant::now();
        let r = match i % 2 {
            0 => kept_alive.get(path, BETA.1).await,
            _ => on_new_connection(addr, path, BETA.1).await,
        };
        took.push(started.elapsed());
        match r {
            Ok((StatusCode::OK, cache)) if cache == "HIT" => {}
            other => failures.push(format!("{i}: {other:?}")),
        }
    }
    took.sort();
    Latencies {
        p50: took[took.len() / 2],
        p99: took[took.len() * 99 / 100],
        failures,
    }
}

#[tokio::test]
async fn a_team_past_its_requests_in_flight_gets_429_while_another_is_served() {
    let sim = start_sim(SimConfig {
        latency_ms: 500,
        ..unlimited()
    })
    .await;
    let gw = Setup::new().with("server", "team_max_in_flight = 2").start(&sim).await;
    let base = gw.base_url();
    let warm = get(&format!("{base}/v2/meta/release"), &[("x-api-key", BETA.1)]).await;
    assert_eq!(warm.status, StatusCode::OK);
    // Six slow misses at once, two distinct and four followers of them:
    // followers count as requests in flight too.
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let url = format!("{base}/v2/cities/search?q=slow{}", i % 2);
            tokio::spawn(async move { get(&url, &[("x-api-key", ALPHA.1)]).await })
        })
        .collect();
    let other = get(&format!("{base}/v2/meta/release"), &[("x-api-key", BETA.1)]).await;
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
        .with(
            "server",
            format!("max_connections = 32\nmax_connections_per_peer = {PER_PEER}"),
        )
        .start(&sim)
        .await;
    let mut kept_alive = KeptAlive::open(gw.addr).await.expect("connects");
    assert_eq!(
        kept_alive.get("/v2/meta/release", ALPHA.1).await.expect("answered").0,
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
            kept_alive.get("/v2/meta/release", ALPHA.1).await.expect("answered").0,
            StatusCode::OK
        );
        let fresh = on_new_connection(gw.addr, "/v2/meta/release", ALPHA.1).await;
        assert_eq!(fresh.expect("answered").0, StatusCode::OK);
    }
}
