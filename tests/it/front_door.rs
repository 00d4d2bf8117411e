//! The front door: no connection holds its place past its deadline, and
//! sockets that never send, or never read, cannot lock real clients out of
//! either listener, even beyond `server.max_connections`.

use crate::support::client::Client;
use crate::support::gateway::{Setup, ALPHA};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited};
use http::StatusCode;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Header-read, idle and write timeouts of these tests, in seconds.
const T: u64 = 1;

fn short_timeouts() -> Setup {
    Setup::new().with(|c| {
        c.server.header_read_timeout_secs = T;
        c.server.idle_timeout_secs = T;
        c.server.write_timeout_secs = T;
    })
}

/// A big cached answer: pipelined copies of it overflow any socket buffer.
fn big() -> Query {
    Query::permit_search("CA").window("2020-01-01", "2024-12-31").size(100)
}

/// Reads until the server closes the socket (EOF or reset), or `limit`.
/// Returns whether it closed in time.
async fn closes_within<R: AsyncReadExt + Unpin>(read: &mut R, limit: Duration) -> bool {
    let deadline = (std::time::Instant::now() + limit).into();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout_at(deadline, read.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

async fn silent(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(TcpStream::connect(addr).await.expect("connect"));
    }
    out
}

/// A client that pipelines `n` requests for a big answer and never reads:
/// a tiny receive buffer, so the gateway's writes stall early. Returns the
/// read half, to check later that the gateway closed it.
async fn never_reading(addr: SocketAddr, n: usize) -> tokio::net::tcp::OwnedReadHalf {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let stream = socket.connect(addr).await.expect("connect");
    let (read, mut write) = stream.into_split();
    let one = format!("GET {} HTTP/1.1\r\nHost: x\r\nX-API-Key: {}\r\n\r\n", big(), ALPHA.1);
    let all = one.repeat(n);
    // The gateway stops reading once its writes stall: write from a task.
    tokio::spawn(async move {
        let _ = write.write_all(all.as_bytes()).await;
        // Kept open (not shut down) until the gateway closes the socket.
        let _ = tokio::time::timeout(Duration::from_secs(30), std::future::pending::<()>()).await;
        drop(write);
    });
    read
}

#[tokio::test]
async fn connections_that_send_nothing_or_stall_are_closed_on_time() {
    let sim = start_sim(unlimited()).await;
    let gw = short_timeouts().start(&sim).await;
    let warm = Client::new(gw.base_url(), ALPHA.1).get(big()).await;
    assert_eq!(warm.status, StatusCode::OK);
    assert!(warm.body.len() > 10_000, "the big answer is {} bytes", warm.body.len());
    let limit = Duration::from_secs(T + 2);
    let mut team_silent = silent(gw.addr, 3).await;
    let mut admin_silent = silent(gw.admin_addr, 3).await;
    // Half an HTTP/2 preface, then nothing: stuck in protocol detection.
    let mut half_preface = TcpStream::connect(gw.addr).await.expect("connect");
    half_preface.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
    // One request on keep-alive, then silence (raw bytes: the socket is
    // what is watched).
    let mut kept_alive = TcpStream::connect(gw.addr).await.expect("connect");
    let req = format!(
        "GET /v2/meta/release HTTP/1.1\r\nHost: x\r\nX-API-Key: {}\r\n\r\n",
        ALPHA.1
    );
    kept_alive.write_all(req.as_bytes()).await.expect("write");
    let mut stuck = never_reading(gw.addr, 400).await;
    let started = Instant::now();
    for (i, s) in team_silent.iter_mut().chain(admin_silent.iter_mut()).enumerate() {
        assert!(closes_within(s, limit).await, "silent socket {i} still open");
    }
    assert!(
        closes_within(&mut half_preface, limit).await,
        "half a preface kept its socket"
    );
    assert!(
        closes_within(&mut kept_alive, limit).await,
        "an idle keep-alive socket stayed open"
    );
    assert!(
        closes_within(&mut stuck, Duration::from_secs(3 * T + 5)).await,
        "a client that never reads kept its socket"
    );
    assert!(started.elapsed() < Duration::from_secs(3 * T + 5));
    // The warm-up and the keep-alive request; the stuck client's 400 were hits.
    assert_eq!(sim.stats().requests_total, 2);
}

#[tokio::test]
async fn an_idle_http2_connection_gets_goaway() {
    use http_body_util::Empty;
    let sim = start_sim(unlimited()).await;
    let gw = short_timeouts().start(&sim).await;
    let tcp = TcpStream::connect(gw.addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tcp))
            .await
            .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let req = http::Request::get(Query::meta_release().to_string())
        .header("x-api-key", ALPHA.1)
        .body(Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = sender.send_request(req).await.expect("answered");
    assert_eq!(resp.status(), StatusCode::OK);
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(2 * T + 3), conn)
        .await
        .expect("the idle HTTP/2 connection was never closed")
        .expect("task")
        .ok();
    assert!(
        started.elapsed() >= Duration::from_millis(T * 1000 - 100),
        "closed before it was idle"
    );
}

#[tokio::test]
async fn silent_and_never_reading_sockets_beyond_max_connections_lock_nobody_out() {
    let sim = start_sim(unlimited()).await;
    let gw = short_timeouts()
        .with(|c| c.server.max_connections = 4)
        .start(&sim)
        .await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    assert_eq!(alpha.get(big()).await.status, StatusCode::OK);
    // Twice the limit of each kind, on the team listener; silent ones on admin.
    let mut team_silent = silent(gw.addr, 8).await;
    let mut stuck = Vec::new();
    for _ in 0..8 {
        stuck.push(never_reading(gw.addr, 400).await);
    }
    let mut admin_silent = silent(gw.admin_addr, 8).await;
    let answered_within = Duration::from_secs(T + 2);
    let started = Instant::now();
    let r = tokio::time::timeout(answered_within, alpha.get(big()))
        .await
        .expect("a valid request was locked out of the team listener");
    assert_eq!(r.status, StatusCode::OK);
    let healthz = Client::anonymous(gw.admin_url()).get("/healthz");
    let health = tokio::time::timeout(answered_within, healthz.into_future())
        .await
        .expect("a valid request was locked out of the admin listener");
    assert_eq!(health.status, StatusCode::OK);
    assert!(started.elapsed() <= answered_within);
    let limit = Duration::from_secs(2 * T + 3);
    for (i, s) in team_silent.iter_mut().chain(admin_silent.iter_mut()).enumerate() {
        assert!(closes_within(s, limit).await, "silent socket {i} still open");
    }
    for (i, s) in stuck.iter_mut().enumerate() {
        assert!(closes_within(s, limit).await, "never-reading socket {i} still open");
    }
    assert_eq!(sim.stats().requests_total, 1, "hits only after the first fetch");
}
