//! Hostile input: every shape gets a clear 4xx (in the upstream's body shape
//! where our handler sees it) and the gateway keeps serving afterwards.

use crate::support::client::Client;
use crate::support::gateway::{Setup, ALPHA};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited};
use http::{Method, StatusCode};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes raw bytes, reads until the server closes (bounded), returns text.
async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(response: &str) -> u16 {
    response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The gateway still answers a normal request.
async fn still_serving(base: &str) {
    let r = Client::new(base, ALPHA.1).get(Query::meta_release()).await;
    assert_eq!(r.status, StatusCode::OK, "the gateway stopped serving: {}", r.text());
}

#[tokio::test]
async fn oversized_heads_uris_and_queries_get_4xx() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let base = gw.base_url();
    let alpha = Client::new(&base, ALPHA.1);
    let big = "x".repeat(20_000);
    let r = alpha.get(Query::meta_release()).header("x-padding", &big).await;
    assert_eq!(r.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(r.json()["detail"], "Request headers too large");
    // Far past the read buffer: hyper refuses it before our handler.
    let huge = format!(
        "GET /v2/meta/release HTTP/1.1\r\nHost: x\r\nX-Padding: {}\r\n\r\n",
        "y".repeat(300_000)
    );
    let status = status_of(&raw(gw.addr, huge.as_bytes()).await);
    assert!(status == 431 || status == 400 || status == 0, "huge head: {status}");
    let long = Query::new("/v2/permits/search").param("permit_q", "a".repeat(9_000));
    let r = alpha.get(long).await;
    assert_eq!(r.status, StatusCode::URI_TOO_LONG);
    assert!(r.json()["detail"].is_string());
    let many = (0..1_500).fold(Query::new("/v2/permits/search"), |q, _| q.param("a", 1));
    let r = alpha.get(many).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["detail"], "Too many query parameters");
    assert_eq!(sim.stats().requests_total, 0, "none of it reached the upstream");
    still_serving(&base).await;
}

#[tokio::test]
async fn bad_encodings_and_traversal_get_4xx_in_the_upstream_shape() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let base = gw.base_url();
    let alpha = Client::new(&base, ALPHA.1);
    // Written out: each malformed spelling is a case.
    for (path, status) in [
        ("/v2/%C3%28/search", StatusCode::BAD_REQUEST),
        ("/v2/contractors/%FF%FE/permits", StatusCode::BAD_REQUEST),
        ("/v2/a%00b", StatusCode::BAD_REQUEST),
        ("/v2/%2e%2e/%2e%2e/admin/teams", StatusCode::NOT_FOUND),
        ("/v2/..%2f..%2fadmin", StatusCode::BAD_REQUEST),
        ("/v2/%ZZ", StatusCode::NOT_FOUND),
    ] {
        let r = alpha.get(path).await;
        assert_eq!(r.status, status, "{path}: {}", r.text());
        assert!(r.json()["detail"].is_string(), "{path}");
    }
    // Undecodable query values are the upstream's to judge (a 422), and
    // never share a cache entry with another spelling (written out: the
    // bytes are the case).
    let r = alpha.get("/v2/counties?geo_id=%FF").await;
    assert!(r.status.is_client_error(), "{}", r.status);
    still_serving(&base).await;
}

#[tokio::test]
async fn control_characters_and_smuggling_shapes_are_refused() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let key = ALPHA.1;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("NUL in a header value", format!("GET /v2/meta/release HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Bad: a\0b\r\n\r\n").into_bytes()),
        ("bare CR in a header value", format!("GET /v2/meta/release HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Bad: a\rb\r\n\r\n").into_bytes()),
        (
            "CL and TE together",
            format!("GET /v2/meta/release HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /v2/usage HTTP/1.1\r\nHost: x\r\n\r\n").into_bytes(),
        ),
        (
            "two different Content-Lengths",
            format!("GET /v2/meta/release HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab").into_bytes(),
        ),
        ("a space before the colon", format!("GET /v2/meta/release HTTP/1.1\r\nHost: x\r\nX-API-Key : {key}\r\n\r\n").into_bytes()),
    ];
    for (what, bytes) in cases {
        let response = raw(gw.addr, &bytes).await;
        let statuses: Vec<u16> = response
            .match_indices("HTTP/1.1 ")
            .map(|(i, _)| status_of(&response[i..]))
            .collect();
        assert!(!statuses.is_empty(), "{what}: no answer");
        assert!(statuses[0] >= 400 && statuses[0] < 500, "{what}: answered {statuses:?}");
        assert_eq!(
            statuses.len(),
            1,
            "{what}: a second request was smuggled through: {statuses:?}"
        );
    }
    assert_eq!(sim.stats().requests_total, 0);
    still_serving(&gw.base_url()).await;
}

#[tokio::test]
async fn methods_other_than_get_and_head_get_405() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    for method in [
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::OPTIONS,
        Method::TRACE,
    ] {
        let r = alpha.send(method.clone(), Query::meta_release()).body("x").await;
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
        assert_eq!(r.json()["detail"], "Method Not Allowed");
    }
    assert_eq!(sim.stats().requests_total, 0);
}

/// A slowloris: the start of a head, then a header line every 100 ms
/// (for at most 4 s) until the gateway stops taking them.
async fn drip_a_head<W: AsyncWriteExt + Unpin>(slow: &mut W) {
    if slow
        .write_all(b"GET /v2/meta/release HTTP/1.1\r\nHost: x\r\n")
        .await
        .is_err()
    {
        return;
    }
    for _ in 0..40 {
        if slow.write_all(b"X-Drip: 1\r\n").await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn slowloris_clients_are_cut_off_while_others_are_served() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| c.server.header_read_timeout_secs = 1)
        .start(&sim)
        .await;
    let mut slow = TcpStream::connect(gw.addr).await.expect("connect");
    let started = Instant::now();
    let dripping = drip_a_head(&mut slow);
    // Meanwhile a normal client is served.
    let base = gw.base_url();
    tokio::join!(dripping, still_serving(&base));
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the slow client was never cut off");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cut off after {:?}",
        started.elapsed()
    );
}

/// Reads one answer off a raw HTTP/1.1 connection: its head, then as many
/// body bytes as its `Content-Length` says. The status.
async fn read_answer(stream: &mut TcpStream) -> u16 {
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed before its answer: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("a content-length");
        if got.len() >= end + 4 + length {
            return status_of(&head);
        }
    }
}

/// After an answer, a kept-alive connection has `header_read_timeout` for
/// its next head: one that drips it is closed on time (the connection
/// driver's deadline, not hyper's per-request timer), and one that sends
/// it within the time is answered.
#[tokio::test]
async fn a_kept_alive_connection_dripping_its_next_head_is_cut_off() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| c.server.header_read_timeout_secs = 1)
        .start(&sim)
        .await;
    let request = format!(
        "GET /v2/meta/release HTTP/1.1\r\nHost: x\r\nX-API-Key: {}\r\n\r\n",
        ALPHA.1
    );
    let mut prompt = TcpStream::connect(gw.addr).await.expect("connect");
    let mut slow = TcpStream::connect(gw.addr).await.expect("connect");
    for stream in [&mut prompt, &mut slow] {
        stream.write_all(request.as_bytes()).await.expect("write");
        assert_eq!(read_answer(stream).await, 200);
    }
    let answered = Instant::now();
    let (mut slow_read, mut slow_write) = slow.into_split();
    let dripping = drip_a_head(&mut slow_write);
    // The moment the gateway closes the dripping connection.
    let mut rest = Vec::new();
    let closing = async {
        let read = tokio::time::timeout(Duration::from_secs(6), slow_read.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the dripping kept-alive connection was never cut off");
        answered.elapsed()
    };
    // Meanwhile the prompt connection asks again within its time, twice.
    let prompt_asks = async {
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(400)).await;
            prompt.write_all(request.as_bytes()).await.expect("write");
            assert_eq!(read_answer(&mut prompt).await, 200, "a prompt next head was answered");
        }
    };
    let ((), took, ()) = tokio::join!(dripping, closing, prompt_asks);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "cut off {took:?} after its answer (header_read_timeout 1 s)"
    );
    assert!(
        rest.is_empty(),
        "the dripped head was answered: {}",
        String::from_utf8_lossy(&rest)
    );
}

#[tokio::test]
async fn http2_header_lists_beyond_the_limit_are_refused() {
    use http_body_util::Empty;
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let client = crate::support::probe::h2c_client();
    let req = http::Request::get(format!("{}{}", gw.base_url(), Query::meta_release()))
        .header("x-api-key", ALPHA.1)
        .header("x-padding", "z".repeat(100_000))
        .body(Empty::new())
        .expect("request");
    // Either a 4xx, or the stream or connection is refused: never a 200.
    if let Ok(resp) = client.request(req).await {
        assert!(
            resp.status().is_client_error(),
            "accepted a 100 KB header list: {}",
            resp.status()
        );
    }
    still_serving(&gw.base_url()).await;
}
