//! A small HTTP client for tests: one request, the whole answer in memory.
//! Tests send requests through `super::client`, which builds on `send`.
//!
//! Built on hyper-util's pooled client so tests exercise real sockets without
//! pulling a second TLS stack into the test binary.

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::sync::OnceLock;

/// What a test reads back from a request.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The URL asked, for failure messages.
    pub url: String,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// The reply itself when its status is `want`; otherwise fails the test
    /// with the URL asked and the body the server gave instead.
    #[track_caller]
    pub fn expect_status<S>(self, want: S) -> Reply
    where
        StatusCode: PartialEq<S>,
        S: std::fmt::Debug,
    {
        assert!(
            self.status == want,
            "{}: expected status {want:?}, got {}: {}",
            self.url,
            self.status,
            self.text()
        );
        self
    }

    /// `X-Cache`: how the gateway answered (`HIT`, `MISS`, `STALE`, `BYPASS`).
    pub fn x_cache(&self) -> Option<&str> {
        self.header("x-cache")
    }

    /// `X-Credits-Request`: what this request cost the team.
    pub fn credits_request(&self) -> Option<u64> {
        self.header_u64("x-credits-request")
    }

    /// The body parsed as JSON; panics with the raw body when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// A header as text, or None.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A header parsed as an integer; panics when present but not a number.
    pub fn header_u64(&self, name: &str) -> Option<u64> {
        self.header(name)
            .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: {v} is not a number")))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn client() -> &'static Client<HttpConnector, Full<Bytes>> {
    static CLIENT: OnceLock<Client<HttpConnector, Full<Bytes>>> = OnceLock::new();
    CLIENT.get_or_init(|| Client::builder(TokioExecutor::new()).build_http())
}

/// Sends one request with the given headers and an optional body.
pub async fn send(method: Method, url: &str, headers: &[(&str, &str)], body: Bytes) -> Reply {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body)).expect("request builds");
    let resp = client()
        .request(req)
        .await
        .unwrap_or_else(|e| panic!("request to {url} failed: {e}"));
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body reads").to_bytes();
    let reply = Reply {
        url: url.to_string(),
        status: parts.status,
        headers: parts.headers,
        body,
    };
    let mut seen = reply.text();
    for (k, v) in &reply.headers {
        seen.push_str(&format!("\n{k}: {}", String::from_utf8_lossy(v.as_bytes())));
    }
    super::secrets::assert_clean(&seen, &format!("the reply of {url}"));
    reply
}
