//! The test client: one team's view of one gateway (or of the simulator,
//! asked directly). It knows the base URL and how to authenticate, so a
//! test says what it asks and what it expects, not how to spell a request:
//!
//! ```ignore
//! let alpha = Client::new(gw.base_url(), ALPHA.1);
//! let r = alpha.get(Query::state_permits(&s).size(7)).request_id("alpha-1").await;
//! let hit = alpha.get(&q).await.expect_status(StatusCode::OK);
//! assert_eq!(hit.x_cache(), Some("HIT"));
//! ```
//!
//! A request is a `Call`, sent when awaited; it owns what it sends, so it
//! can be moved into a spawned task. Replies are `http::Reply`: status,
//! headers, body, and `expect_status` for the status assertion.

use super::http::{send, Reply};
use super::sim::Sim;
use bytes::Bytes;
use http::{Method, StatusCode};
use std::fmt::Display;
use std::future::{Future, IntoFuture};
use std::pin::Pin;

/// A base URL and the headers every request of one caller carries (its
/// credentials). Cheap to clone: one per team, or per team and replica.
/// No `Debug`: the headers hold a token, which no test output may show.
#[derive(Clone)]
pub struct Client {
    base: String,
    headers: Vec<(String, String)>,
}

impl Client {
    /// A team calling `base` with its token in `X-API-Key`, as most
    /// clients of the vendor's API do.
    pub fn new(base: impl Into<String>, token: &str) -> Client {
        Client::anonymous(base).with_header("x-api-key", token)
    }

    /// A team calling `base` with its token as `Authorization: Bearer`.
    pub fn bearer(base: impl Into<String>, token: &str) -> Client {
        Client::anonymous(base).with_header("authorization", &format!("Bearer {token}"))
    }

    /// A caller with no credentials at all.
    pub fn anonymous(base: impl Into<String>) -> Client {
        Client {
            base: base.into(),
            headers: Vec::new(),
        }
    }

    /// The admin API of a gateway (`admin_url`) with the admin token.
    pub fn admin(admin_url: impl Into<String>) -> Client {
        Client::bearer(admin_url, super::gateway::ADMIN_TOKEN)
    }

    /// The simulator asked directly with the upstream key: what the vendor
    /// itself answers, and no team's request (no team is charged for it).
    pub fn upstream(sim: &Sim) -> Client {
        Client::new(sim.base_url(), sim.api_key())
    }

    /// The same credentials against another base URL (another replica).
    pub fn at(&self, base: impl Into<String>) -> Client {
        Client {
            base: base.into(),
            headers: self.headers.clone(),
        }
    }

    /// A header every request of this client carries.
    pub fn with_header(mut self, name: &str, value: &str) -> Client {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The full URL of `target` (a `Query` or a literal path and query).
    pub fn url(&self, target: impl Display) -> String {
        format!("{}{target}", self.base)
    }

    /// A GET of `target`, sent when awaited.
    pub fn get(&self, target: impl Display) -> Call {
        self.send(Method::GET, target)
    }

    /// A POST of `target` with no body, sent when awaited.
    pub fn post(&self, target: impl Display) -> Call {
        self.send(Method::POST, target)
    }

    /// A request of any method, sent when awaited.
    pub fn send(&self, method: Method, target: impl Display) -> Call {
        Call {
            method,
            url: self.url(target),
            headers: self.headers.clone(),
            body: Bytes::new(),
        }
    }

    /// Polls `target` with `only-if-cached` (which never reaches the
    /// upstream) until its entry is no longer fresh: a 504, or a STALE
    /// answer inside a stale-while-revalidate window.
    pub async fn wait_expired(&self, target: impl Display) {
        super::wait::eventually("the entry expires", std::time::Duration::from_secs(10), || async {
            let r = self.get(&target).cache_control("only-if-cached").await;
            r.status != StatusCode::OK || r.x_cache() == Some("STALE")
        })
        .await;
    }

    /// The team's `credits_used` from `GET /v2/usage`: its ledger, as the
    /// team itself sees it.
    pub async fn used(&self) -> u64 {
        let r = self
            .get(super::query::Query::usage())
            .await
            .expect_status(StatusCode::OK);
        r.json()["credits_used"].as_u64().expect("credits_used")
    }
}

/// One request, built up and then awaited.
#[must_use = "a call is sent only when awaited"]
pub struct Call {
    method: Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Bytes,
}

impl Call {
    /// One more header (repeating a name sends it twice).
    pub fn header(mut self, name: &str, value: &str) -> Call {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// `X-Request-Id`: the gateway forwards the id of the request that
    /// fetched, so tests name ids after the team to attribute the
    /// upstream's charge (`traffic::charged_to`).
    pub fn request_id(self, id: &str) -> Call {
        self.header("x-request-id", id)
    }

    /// `Cache-Control` of the request (`no-cache`, `only-if-cached`, …).
    pub fn cache_control(self, directives: &str) -> Call {
        self.header("cache-control", directives)
    }

    pub fn body(mut self, body: impl Into<Bytes>) -> Call {
        self.body = body.into();
        self
    }

    /// Sends the call in a task of its own (concurrent load, or a request
    /// left in flight while the test does something else).
    pub fn spawn(self) -> tokio::task::JoinHandle<Reply> {
        tokio::spawn(self.into_future())
    }

    /// Sends the call and asserts its status (see `Reply::expect_status`).
    pub async fn expect_status<S>(self, want: S) -> Reply
    where
        StatusCode: PartialEq<S>,
        S: std::fmt::Debug,
    {
        self.await.expect_status(want)
    }
}

impl IntoFuture for Call {
    type Output = Reply;
    type IntoFuture = Pin<Box<dyn Future<Output = Reply> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let headers: Vec<(&str, &str)> = self.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            send(self.method, &self.url, &headers, self.body).await
        })
    }
}

/// The replies of spawned calls ([`Call::spawn`]), in order: every call is
/// spawned (the iterator run to its end) before the first is awaited.
pub async fn replies(calls: impl IntoIterator<Item = tokio::task::JoinHandle<Reply>>) -> Vec<Reply> {
    let calls: Vec<_> = calls.into_iter().collect();
    let mut out = Vec::with_capacity(calls.len());
    for call in calls {
        out.push(call.await.expect("request task"));
    }
    out
}
