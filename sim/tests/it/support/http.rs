//! A small HTTP client for tests: one request, the whole answer in memory.
//!
//! Built on hyper-util's pooled client so tests exercise real sockets. Like
//! the gateway suite's client (`tests/it/support/http.rs`), it fails a test
//! whose reply carries the upstream key; the team tokens that client also
//! looks for are the gateway's.

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
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
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
        status: parts.status,
        headers: parts.headers,
        body,
    };
    let key = permit_api_sim::SimConfig::default().api_key;
    let mut seen = reply.text();
    for (k, v) in &reply.headers {
        seen.push_str(&format!("\n{k}: {}", String::from_utf8_lossy(v.as_bytes())));
    }
    assert!(!seen.contains(&key), "the reply of {url} carries the upstream key");
    reply
}

/// GET with headers.
pub async fn get(url: &str, headers: &[(&str, &str)]) -> Reply {
    send(Method::GET, url, headers, Bytes::new()).await
}

/// POST a JSON body.
pub async fn post_json(url: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut h = headers.to_vec();
    h.push(("content-type", "application/json"));
    send(Method::POST, url, &h, Bytes::from(body.to_string())).await
}
