//! The overload manager (issue 34): whatever one tenant does to a shared
//! transport pool, another tenant watching is still served. Each case runs
//! the gateway binary at `server.max_connections = 64` with a second
//! tenant measuring: anonymous HTTP/2 peers with a zero window that never
//! answer a PING (team and admin listeners), one team's zero-window streams
//! against another team's HTTP/2 answers and charges, a team churning
//! connections at the cap, and silent sockets under a low `ulimit -n`.

use super::h2::frame;
use crate::support::client::Client;
use crate::support::conn::{on_new_connection, KeptAlive};
use crate::support::gateway::{ChildGateway, Setup, ALPHA, BETA};
use crate::support::probe::metrics_text;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, SimConfig};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CAP: usize = 64;

fn at_the_cap() -> Setup {
    Setup::new().with(|c| {
        c.server.max_connections = CAP;
        c.server.admin_max_connections = CAP;
    })
}

/// A literal HPACK string (no Huffman), under 127 bytes.
fn hpack_string(out: &mut Vec<u8>, s: &str) {
    out.push(u8::try_from(s.len()).expect("short string"));
    out.extend_from_slice(s.as_bytes());
}

/// The bytes a hostile HTTP/2 peer sends: the preface, SETTINGS with
/// `SETTINGS_INITIAL_WINDOW_SIZE = 0` (no answer body can ever be sent to
/// it), then one token-less `GET path`. It never writes again: the server's
/// SETTINGS and PINGs are never acknowledged.
fn hostile_preface(path: &str) -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[0, 4, 0, 0, 0, 0]));
    // :method GET, :scheme http (static table), :path and :authority as
    // literals with indexed names.
    let mut block = vec![0x82, 0x86, 0x04];
    hpack_string(&mut block, path);
    block.push(0x01);
    hpack_string(&mut block, "gateway");
    // END_STREAM | END_HEADERS on stream 1.
    out.extend(frame(0x1, 0x5, 1, &block));
    out
}

/// One anonymous hostile peer: a connection as [`hostile_preface`] says,
/// reopened as soon as the gateway closes it, until `stop`. Counts the
/// connections it opened.
async fn hostile_h2(addr: SocketAddr, path: &'static str, stop: Arc<AtomicBool>, opened: Arc<AtomicUsize>) {
    let bytes = hostile_preface(path);
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            tokio::task::yield_now().await;
            continue;
        };
        if s.write_all(&bytes).await.is_err() {
            continue;
        }
        opened.fetch_add(1, Ordering::Relaxed);
        // Reading is not acknowledging: frames are taken off the socket to
        // see it close, and nothing is ever written back.
        let mut buf = [0u8; 4096];
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                _ => {}
            }
        }
    }
}

/// `n` hostile peers against `addr`; their stop flag and counter.
fn hostile_peers(
    addr: SocketAddr,
    path: &'static str,
    n: usize,
) -> (Arc<AtomicBool>, Arc<AtomicUsize>, Vec<tokio::task::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let tasks = (0..n)
        .map(|_| tokio::spawn(hostile_h2(addr, path, stop.clone(), opened.clone())))
        .collect();
    (stop, opened, tasks)
}

/// Waits until the peers opened `n` connections in all (the attack is on).
async fn attack_under_way(opened: &Arc<AtomicUsize>, n: usize) {
    crate::support::wait::eventually("the attack is under way", Duration::from_secs(20), || {
        let now = opened.load(Ordering::Relaxed);
        async move {
            if now >= n {
                Ok(())
            } else {
                Err(now)
            }
        }
    })
    .await;
}

async fn stop_all(stop: Arc<AtomicBool>, tasks: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("attacker task");
    }
}

/// `gateway_overload_actions_total` children of the gateway, summed by
/// `pool`/`action` substring.
pub(super) async fn overload_actions(gw: &ChildGateway, needle: &str) -> u64 {
    let text = metrics_text(&gw.admin_url()).await;
    text.lines()
        .filter(|l| l.starts_with("gateway_overload_actions_total{") && l.contains(needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn anonymous_zero_window_http2_peers_at_the_cap_lock_no_team_out() {
    let sim = start_sim(unlimited()).await;
    let gw = ChildGateway::spawn(&at_the_cap(), &sim.base_url(), sim.api_key());
    let release = Query::meta_release();
    let mut kept_alive = KeptAlive::open(gw.addr).await.expect("connects");
    assert_eq!(
        kept_alive.get(&release, ALPHA.1).await.expect("answered").0,
        StatusCode::OK
    );
    // Hand-built HTTP/2 frames: their target is written out.
    let (stop, opened, attackers) = hostile_peers(gw.addr, "/v2/meta/release", CAP);
    attack_under_way(&opened, 2 * CAP).await;
    let (mut slowest, mut served, mut failures) = (Duration::ZERO, 0, Vec::new());
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(15) {
        let t = Instant::now();
        let fresh = tokio::time::timeout(Duration::from_secs(5), on_new_connection(gw.addr, &release, ALPHA.1)).await;
        let took = t.elapsed();
        slowest = slowest.max(took);
        match fresh {
            Ok(Ok((StatusCode::OK, _))) if took <= Duration::from_secs(2) => served += 1,
            other => failures.push(format!("new connection after {took:?}: {other:?}")),
        }
        match kept_alive.get(&release, ALPHA.1).await {
            Ok((StatusCode::OK, _)) => served += 1,
            other => failures.push(format!("kept-alive: {other:?}")),
        }
    }
    let attacks = opened.load(Ordering::Relaxed);
    let closed = overload_actions(&gw, "action=\"anonymous\"").await;
    stop_all(stop, attackers).await;
    eprintln!(
        "{attacks} hostile h2 connections in 15 s at a cap of {CAP}; team: {served} served, {} failed, slowest new connection {slowest:?}; {closed} anonymous connections closed by the manager",
        failures.len()
    );
    assert!(failures.is_empty(), "team requests failed: {failures:?}");
    assert!(served > 20, "too few team requests to tell: {served}");
    assert!(attacks > 4 * CAP, "the attack was too weak to test anything: {attacks}");
    assert!(closed > 0, "the manager closed no anonymous connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn anonymous_zero_window_peers_on_the_admin_port_leave_healthz_answering() {
    let sim = start_sim(unlimited()).await;
    let gw = ChildGateway::spawn(&at_the_cap(), &sim.base_url(), sim.api_key());
    let (stop, opened, attackers) = hostile_peers(gw.admin_addr, "/healthz", 70);
    attack_under_way(&opened, 2 * 70).await;
    let mut took = Vec::new();
    let admin = Client::anonymous(gw.admin_url());
    for _ in 0..10 {
        let t = Instant::now();
        let probe = tokio::time::timeout(Duration::from_secs(5), admin.get("/healthz").into_future()).await;
        took.push(t.elapsed());
        assert_eq!(probe.expect("a probe locked out").status, StatusCode::OK);
    }
    stop_all(stop, attackers).await;
    eprintln!("70 hostile h2 peers on the admin port: /healthz took {took:?}");
    let slowest = took.iter().max().copied().unwrap_or_default();
    assert!(slowest <= Duration::from_secs(1), "a probe took {slowest:?}");
}

/// One HTTP/2 connection of `token` whose client never opens a window,
/// with `paths` in flight; reopened when the gateway closes it, until `stop`.
async fn zero_window_team(addr: SocketAddr, token: &'static str, paths: Arc<Vec<String>>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(tcp) = TcpStream::connect(addr).await else {
            continue;
        };
        let Ok((mut send, conn)) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake::<_, Bytes>(tcp)
            .await
        else {
            continue;
        };
        let conn = tokio::spawn(conn);
        let mut held = Vec::new();
        for path in paths.iter() {
            let req = Request::get(format!("http://{addr}{path}"))
                .header("x-api-key", token)
                .body(())
                .expect("request");
            let Ok(ready) = send.clone().ready().await else { break };
            send = ready;
            match send.send_request(req, true) {
                Ok((resp, _)) => held.push(resp),
                Err(_) => break,
            }
        }
        // Kept, never read, until the gateway closes the connection.
        while !conn.is_finished() && !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        conn.abort();
        drop(held);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_teams_zero_window_streams_cannot_take_another_teams_http2_answers_or_credits() {
    let sim = start_sim(SimConfig {
        credit_limit: Some(100_000_000),
        ..unlimited()
    })
    .await;
    let gw = ChildGateway::spawn(&at_the_cap(), &sim.base_url(), sim.api_key());
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let s = sim.samples();
    // Cached pages for alpha's streams (0 credits each once held).
    let pages: Vec<Query> = (1..=5).map(|i| Query::distinct(&s, 1000 + i).size(50)).collect();
    for p in &pages {
        alpha.get(p).await.expect_status(StatusCode::OK);
    }
    let paths: Arc<Vec<String>> = Arc::new((0..100).map(|i| pages[i % pages.len()].to_string()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let attackers: Vec<_> = (0..5)
        .map(|_| tokio::spawn(zero_window_team(gw.addr, ALPHA.1, paths.clone(), stop.clone())))
        .collect();
    // The budget is spent before beta starts: alpha's streams were refused.
    crate::support::wait::eventually("alpha holds the answer bytes", Duration::from_secs(20), || {
        let gw = &gw;
        async move {
            let refused = overload_actions(gw, "pool=\"answer_bytes\"").await;
            if refused > 0 {
                Ok(refused)
            } else {
                Err(refused)
            }
        }
    })
    .await;
    let beta_before = Client::new(gw.base_url(), BETA.1).used().await;
    let upstream_before = sim.stats().credits_total;
    // Beta over HTTP/2: cached pages and pages nobody bought yet.
    let tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    let (mut ok, mut other, mut records) = (0usize, Vec::new(), 0u64);
    for i in 0..200usize {
        let path = match i % 4 {
            0 => Query::distinct(&s, u32::try_from(i).expect("small")).size(3),
            _ => pages[i % pages.len()].clone(),
        };
        let req = Request::get(format!("http://{}{path}", gw.addr))
            .header("x-api-key", BETA.1)
            .body(Empty::<Bytes>::new())
            .expect("request");
        send.ready().await.expect("beta's connection is alive");
        let resp = send.send_request(req).await.expect("answered");
        let status = resp.status();
        let charged = resp
            .headers()
            .get("x-credits-request")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        if status == StatusCode::OK {
            ok += 1;
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            let n = v["items"].as_array().map_or(0, Vec::len) as u64;
            if charged.unwrap_or(0) > 0 {
                assert_eq!(charged, Some(n), "charged for what the page holds");
                records += n;
            }
        } else {
            other.push((status, charged));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.await.expect("attacker task");
    }
    let beta_charged = Client::new(gw.base_url(), BETA.1).used().await - beta_before;
    let closed = overload_actions(&gw, "pool=\"answer_bytes\",action=\"stalled\"").await;
    eprintln!(
        "alpha 5 zero-window h2 connections x 100 streams: beta {ok}/200 answered 200 ({other:?}); beta charged {beta_charged} for {records} records received; {closed} of alpha's connections closed for answer bytes"
    );
    assert!(ok >= 198, "beta's HTTP/2 requests were refused: {ok}/200, {other:?}");
    assert_eq!(beta_charged, records, "beta charged for answers it did not receive");
    assert_eq!(
        sim.stats().credits_total - upstream_before,
        records,
        "bought only what beta received"
    );
}

/// One team's client churning connections at the cap: opens connections
/// for hits and keeps the last `keep` of them, until `stop`.
async fn churn(addr: SocketAddr, keep: usize, stop: Arc<AtomicBool>, served: Arc<AtomicUsize>) {
    let mut kept = std::collections::VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut c) = KeptAlive::open(addr).await else {
            continue;
        };
        if let Ok((StatusCode::OK, _)) = c.get(Query::meta_release(), ALPHA.1).await {
            served.fetch_add(1, Ordering::Relaxed);
        }
        kept.push_back(c);
        if kept.len() > keep {
            kept.pop_front();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_team_churning_connections_at_the_cap_resets_no_other_teams_new_connection() {
    let sim = start_sim(unlimited()).await;
    let gw = ChildGateway::spawn(&at_the_cap(), &sim.base_url(), sim.api_key());
    let release = Query::meta_release();
    assert_eq!(
        on_new_connection(gw.addr, &release, BETA.1).await.expect("warm").0,
        StatusCode::OK
    );
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let churners: Vec<_> = (0..4)
        .map(|_| tokio::spawn(churn(gw.addr, CAP, stop.clone(), served.clone())))
        .collect();
    crate::support::wait::eventually("alpha churns past the cap", Duration::from_secs(20), || {
        let n = served.load(Ordering::Relaxed);
        async move {
            if n > 4 * CAP {
                Ok(())
            } else {
                Err(n)
            }
        }
    })
    .await;
    let mut failures = Vec::new();
    for i in 0..100 {
        match on_new_connection(gw.addr, &release, BETA.1).await {
            Ok((StatusCode::OK, _)) => {}
            other => failures.push(format!("{i}: {other:?}")),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for c in churners {
        c.await.expect("churner");
    }
    let evicted = overload_actions(&gw, "action=\"team_over_share\"").await;
    eprintln!(
        "alpha churned {} connections at a cap of {CAP}: beta's new connections {} of 100 failed; {evicted} of alpha's idle connections evicted as over its share",
        served.load(Ordering::Relaxed),
        failures.len()
    );
    assert!(failures.is_empty(), "beta's new connections failed: {failures:?}");
    assert!(evicted > 0, "the cap was never reached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_sockets_under_a_low_descriptor_limit_cost_no_upstream_call_its_descriptor() {
    let sim = start_sim(SimConfig {
        credit_limit: Some(100_000_000),
        ..unlimited()
    })
    .await;
    let gw = ChildGateway::spawn_limited(&Setup::new(), &sim.base_url(), sim.api_key(), 128);
    let warning = gw.clamp_warning();
    assert!(warning.contains("RLIMIT_NOFILE is 128"), "{warning}");
    let mut silent = Vec::new();
    for _ in 0..150 {
        silent.push(TcpStream::connect(gw.addr).await.expect("connect"));
    }
    let beta = Client::new(gw.base_url(), BETA.1);
    let s = sim.samples();
    let mut statuses = Vec::new();
    for i in 0..20usize {
        let q = Query::distinct(&s, u32::try_from(i).expect("small")).size(2);
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(10), beta.get(q)).await;
        statuses.push((r.map(|r| r.status.as_u16()).unwrap_or(0), t.elapsed()));
    }
    drop(silent);
    eprintln!("ulimit -n 128, 150 silent sockets: {statuses:?}; {warning}");
    assert!(statuses.iter().all(|(s, _)| *s == 200), "{statuses:?}");
    let slowest = statuses.iter().map(|(_, t)| *t).max().unwrap_or_default();
    assert!(slowest <= Duration::from_secs(2), "a call waited {slowest:?}");
}

/// One HTTP/2 connection of `token` that keeps an answer always moving
/// but slow: it asks for `path`, reads a chunk, gives the window back 16 KB
/// at a time every half second, and asks again when an answer ends; until
/// `stop` or the gateway closes it (then it opens another). `open` counts
/// its connections open now.
async fn trickle(addr: SocketAddr, token: &'static str, path: String, stop: Arc<AtomicBool>, open: Arc<AtomicUsize>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(tcp) = TcpStream::connect(addr).await else {
            continue;
        };
        let Ok((send, conn)) = h2::client::Builder::new()
            .initial_window_size(16 * 1024)
            .handshake::<_, Bytes>(tcp)
            .await
        else {
            continue;
        };
        let conn = tokio::spawn(conn);
        open.fetch_add(1, Ordering::Relaxed);
        'streams: while !stop.load(Ordering::Relaxed) && !conn.is_finished() {
            let req = Request::get(format!("http://{addr}{path}"))
                .header("x-api-key", token)
                .body(())
                .expect("request");
            let Ok(mut ready) = send.clone().ready().await else {
                break;
            };
            let Ok((resp, _)) = ready.send_request(req, true) else {
                break;
            };
            let Ok(resp) = resp.await else { break };
            let mut body = resp.into_body();
            while let Some(chunk) = body.data().await {
                let Ok(chunk) = chunk else { break 'streams };
                // The client's pace (not a test's synchronisation): a
                // window of 16 KB every half second.
                tokio::time::sleep(Duration::from_millis(500)).await;
                let _ = body.flow_control().release_capacity(chunk.len());
                if stop.load(Ordering::Relaxed) {
                    break 'streams;
                }
            }
        }
        open.fetch_sub(1, Ordering::Relaxed);
        conn.abort();
    }
}

/// Issue 50, point 1: team alpha holds every slot with HTTP/2 answers that
/// always move (slow readers, 16 KB every half second). A connection whose
/// answers move was never a victim, so beta's newcomers evicted beta's own
/// kept-alive connection (measured: 52 of 177 reset, the kept connection
/// dropped 26 times in 20 s). Busy connections now count against their
/// team's share: past it, alpha's newest busy one makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_team_trickling_answers_on_every_slot_leaves_another_team_its_connections() {
    let sim = start_sim(unlimited()).await;
    let gw = ChildGateway::spawn(&at_the_cap(), &sim.base_url(), sim.api_key());
    let s = sim.samples();
    let big = Query::distinct(&s, 7).size(100);
    Client::new(gw.base_url(), ALPHA.1)
        .get(&big)
        .await
        .expect_status(StatusCode::OK);
    let release = Query::meta_release();
    let mut kept = KeptAlive::open(gw.addr).await.expect("beta connects");
    assert_eq!(kept.get(&release, BETA.1).await.expect("answered").0, StatusCode::OK);
    let stop = Arc::new(AtomicBool::new(false));
    let open = Arc::new(AtomicUsize::new(0));
    let alpha: Vec<_> = (0..CAP)
        .map(|_| tokio::spawn(trickle(gw.addr, ALPHA.1, big.to_string(), stop.clone(), open.clone())))
        .collect();
    crate::support::wait::eventually("alpha's slow answers fill the cap", Duration::from_secs(20), || {
        let n = open.load(Ordering::Relaxed);
        async move { (n + 1 >= CAP).then_some(()).ok_or(n) }
    })
    .await;
    let (mut answered, mut slow, mut failures) = (0, Vec::new(), Vec::new());
    for i in 0..100 {
        let started = Instant::now();
        match tokio::time::timeout(Duration::from_secs(2), on_new_connection(gw.addr, &release, BETA.1)).await {
            Ok(Ok((StatusCode::OK, _))) => answered += 1,
            Ok(other) => failures.push(format!("{i}: {other:?}")),
            Err(_) => slow.push(i),
        }
        if started.elapsed() > Duration::from_secs(2) {
            slow.push(i);
        }
        // Beta's kept-alive connection is still there, every time.
        assert_eq!(
            kept.get(&release, BETA.1).await.map(|r| r.0),
            Ok(StatusCode::OK),
            "beta's kept-alive connection was dropped after new connection {i}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for a in alpha {
        a.abort();
    }
    let busy = overload_actions(&gw, "action=\"team_over_share_busy\"").await;
    eprintln!(
        "alpha trickling on {CAP} slots: beta's new connections {answered} of 100 answered within 2 s ({failures:?}, slow {slow:?}); {busy} of alpha's busy connections made room"
    );
    assert!(
        answered >= 99,
        "beta's new connections: {answered} of 100; {failures:?}; slow {slow:?}"
    );
    assert!(busy > 0, "alpha's busy connections were never the ones to go");
}

/// Half-open TLS handshakes: from source addresses `sources` (loopback),
/// each connection sends `first` (the 5 bytes of a TLS record header, or
/// the first bytes of a ClientHello) and stops; the last 16 of each task
/// are kept (eight tasks: twice the cap), the rest dropped; until `stop`.
async fn half_open_tls(
    addr: SocketAddr,
    first: &'static [u8],
    sources: Vec<std::net::Ipv4Addr>,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
) {
    let mut kept = std::collections::VecDeque::new();
    for source in sources.iter().cycle() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
            continue;
        };
        if socket.bind(SocketAddr::from((*source, 0))).is_err() {
            continue;
        }
        let Ok(mut s) = socket.connect(addr).await else {
            tokio::task::yield_now().await;
            continue;
        };
        let _ = s.write_all(first).await;
        opened.fetch_add(1, Ordering::Relaxed);
        kept.push_back(s);
        if kept.len() > 16 {
            kept.pop_front();
        }
    }
}

/// The 5 bytes of a TLS record header (a ClientHello of 512 bytes to come).
const RECORD_HEADER: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00];

/// 105 bytes of a ClientHello whose record says 512: the record header,
/// the handshake header, the version, the random and some of the rest.
const PART_OF_A_HELLO: &[u8] = &[
    0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0x20, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9,
    9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 0x00, 0x20, 0x13, 0x01, 0x13, 0x02, 0x13, 0x03, 0xc0, 0x2b, 0xc0, 0x2f, 0xc0,
    0x2c, 0xc0, 0x30, 0xcc, 0xa9, 0xcc, 0xa8, 0xc0, 0x13, 0xc0, 0x14, 0x00, 0x9c, 0x00, 0x9d, 0x00,
];

/// Issue 50, point 2: churn of TCP connections that send 5 bytes of a TLS
/// record and stop, from 200 loopback addresses, at the cap. The oldest
/// connection still in its handshake went first, real handshakes
/// included (measured: 9.8 % of another team's new TLS connections
/// failed). A connection that sent less than a ClientHello now goes before
/// one whose handshake makes progress.
///
/// Issue 60, point 4: then the churn sends 105 bytes of a ClientHello
/// (more than the 64 bytes that counted as progress) and then nothing: it
/// ranked with real handshakes (1.3 % to 4.9 % of another team's new TLS
/// connections failed). A TLS connection progresses only once its
/// ClientHello is complete. One test, the two churns one after the other:
/// two at once on a small machine measure the machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn half_open_tls_churn_from_many_addresses_fails_no_teams_new_tls_connection() {
    assert_eq!(PART_OF_A_HELLO.len(), 105);
    for (what, first) in [("half-open", RECORD_HEADER), ("progress-mimicking", PART_OF_A_HELLO)] {
        tls_churn_fails_no_teams_new_tls_connection(what, first).await;
    }
}

/// Churn of connections that each send `first` and stop, from 200 loopback
/// addresses at the cap, while team beta opens 100 new TLS connections
/// from clients 100 ms away: at most one may fail.
async fn tls_churn_fails_no_teams_new_tls_connection(what: &str, first: &'static [u8]) {
    let pki = crate::support::tls::TestPki::new();
    let sim = start_sim(unlimited()).await;
    let (cert, key) = (pki.cert_path(), pki.key_path());
    let setup = at_the_cap().with(move |c| {
        c.server.tls_cert_file = Some(cert.clone());
        c.server.tls_key_file = Some(key.clone());
    });
    let gw = setup.start(&sim).await;
    let release = Query::meta_release().to_string();
    let client = Arc::new(pki.client_config());
    let gw_addr = gw.addr;
    assert_eq!(far_tls_get(gw_addr, &client, &release).await, Ok(200), "warm");
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let attackers: Vec<_> = (0..8u8)
        .map(|t| {
            let sources = (0..25u8).map(|i| std::net::Ipv4Addr::new(127, 1, t, i + 1)).collect();
            tokio::spawn(half_open_tls(gw.addr, first, sources, stop.clone(), opened.clone()))
        })
        .collect();
    crate::support::wait::eventually("the half-open churn passes the cap", Duration::from_secs(20), || {
        let n = opened.load(Ordering::Relaxed);
        async move { (n > 4 * CAP).then_some(()).ok_or(n) }
    })
    .await;
    let before = opened.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut failures = Vec::new();
    for round in 0..10 {
        // New connections, new handshakes, from clients 100 ms away: ten at once.
        let calls: Vec<_> = (0..10)
            .map(|_| {
                let (client, release) = (client.clone(), release.clone());
                tokio::spawn(async move {
                    tokio::time::timeout(Duration::from_secs(5), far_tls_get(gw_addr, &client, &release)).await
                })
            })
            .collect();
        for (i, call) in calls.into_iter().enumerate() {
            match call.await.expect("a client") {
                Ok(Ok(200)) => {}
                Ok(other) => failures.push(format!("{round}.{i}: {other:?}")),
                Err(_) => failures.push(format!("{round}.{i}: no answer within 5 s")),
            }
        }
    }
    let rate = (opened.load(Ordering::Relaxed) - before) as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.await;
    }
    let metrics = metrics_text(&gw.admin_url()).await;
    let silent: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("gateway_overload_actions_total") && l.contains("action=\"silent\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum();
    eprintln!(
        "{what} TLS churn from 200 addresses at {rate:.0}/s: beta's new TLS connections {} of 100 failed ({failures:?}); {silent} of the churn's connections closed as silent",
        failures.len()
    );
    assert!(failures.len() <= 1, "beta's new TLS connections failed: {failures:?}");
    assert!(silent > 0, "the churn never reached the cap");
}

/// A client's round trip in [`far_tls_get`].
const FAR: Duration = Duration::from_millis(100);

/// A socket whose writes after the first wait [`FAR`]: a client far away
/// (its ClientHello leaves at once; its next flight comes a round trip
/// later), so its handshake is in progress for a while.
struct Far {
    inner: TcpStream,
    writes: usize,
    delay: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl tokio::io::AsyncRead for Far {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Far {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::future::Future;
        if self.writes > 0 {
            let delay = self.delay.get_or_insert_with(|| Box::pin(tokio::time::sleep(FAR)));
            std::task::ready!(delay.as_mut().poll(cx));
        }
        let written = std::task::ready!(std::pin::Pin::new(&mut self.inner).poll_write(cx, data));
        self.delay = None;
        self.writes += 1;
        std::task::Poll::Ready(written)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `GET path` as team beta over a new TLS connection from a [`Far`]
/// client: the answer's status.
async fn far_tls_get(addr: SocketAddr, config: &Arc<rustls::ClientConfig>, path: &str) -> Result<u16, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let far = Far {
        inner: tcp,
        writes: 0,
        delay: None,
    };
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, far)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {}\r\nConnection: close\r\n\r\n",
        BETA.1
    );
    tls.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    tls.flush().await.map_err(|e| format!("flush: {e}"))?;
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let status = String::from_utf8_lossy(answer.get(9..12).unwrap_or_default()).to_string();
    status
        .parse()
        .map_err(|_| format!("no status: {:?}", String::from_utf8_lossy(&answer)))
}
