//! What the phases of a request share: [`Ask`], what it asks for once it
//! is known who asks (built by `cache_key`); [`Job`], the fetch it would
//! start (`fetch`), owned so that the fetch can outlive the request;
//! and [`RequestContext`], what the phases learn about it (its id, team,
//! route, cache state, credits, fault), closed by
//! [`RequestContext::finish`] with the request's metrics and its one
//! access-log line. Holds no secret: the team's name, never its token.
//!
//! Every file of `proxy/` may use these; this one uses none of them, so
//! the arrows between the phases' files run one way.

use super::answered::Answered;
use crate::auth::{Member, Team};
use crate::cache::control::Directives;
use crate::cache::months::Window;
use crate::cache::records::IdList;
use crate::error::Fault;
use crate::metrics::Metrics;
use crate::redis_backend::keys::Tag;
use crate::route::{Route, Target};
use crate::telemetry::{access, trace::Trace};
use http::{Method, Request, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use tracing::Level;

/// What a valid request target means to the gateway (memoized by its raw
/// bytes in `parsed`).
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) target: Target,
    /// The normalized cache key; `None` for routes that are never cached.
    pub(crate) key: Option<String>,
    /// The key's L2 hash tag ([`Tag::of`] the key), when the target was
    /// memoized beside a Redis tier: a lookup that reads Redis formats its
    /// key from this, hashing nothing.
    pub(crate) tag: Option<Tag>,
    /// The held pieces it may be answered from (`reuse`), decided once:
    /// a page's hit never looks at the other kinds.
    pub(crate) pieces: Option<Pieces>,
}

/// The kinds of request answered from held pieces (`reuse`).
#[derive(Debug)]
pub(crate) enum Pieces {
    /// An id lookup, record by record (`cache.record_reuse`).
    Ids(IdList),
    /// A monthly-metrics window, month by month (`cache.month_reuse`).
    Window(Window),
}

/// What one request asks for, once it is known who asks.
pub(super) struct Ask<'r, B> {
    pub(super) req: &'r Request<B>,
    pub(super) trace: Trace,
    pub(super) directives: Directives,
    pub(super) team: Arc<Team>,
    /// The team's app whose token asks.
    pub(super) member: Arc<Member>,
    /// The target, its cache key and tag: on a repeated target the memo's
    /// own entry, shared, so a hit copies neither the key (an allocation)
    /// nor the target (two reference counts every core would write).
    pub(super) parsed: Arc<Parsed>,
}

impl<B> Ask<'_, B> {
    /// The fetch this request would start; built only on a miss.
    pub(super) fn job(&self, request_id: &str) -> Job {
        Job {
            team: self.team.clone(),
            member: self.member.clone(),
            target: self.parsed.target.clone(),
            key: self.parsed.key.clone(),
            // A client that bounds the age it accepts must not be answered
            // from the cache by the fetch either.
            no_cache: self.directives.no_cache || self.directives.max_age.is_some(),
            no_store: self.directives.no_store,
            request_id: request_id.to_string(),
            trace: self.trace.clone(),
            accept: self.req.headers().get(http::header::ACCEPT).cloned(),
            wait: prefer_wait(self.req.headers()),
        }
    }
}

/// What a fetch needs to know, owned so the fetch can outlive the request.
#[derive(Clone)]
pub(super) struct Job {
    pub(super) team: Arc<Team>,
    /// The app that asked: its budget and account, when its team names apps.
    pub(super) member: Arc<Member>,
    pub(super) target: Target,
    /// `None`: not cacheable, no coalescing.
    pub(super) key: Option<String>,
    /// The client said `no-cache`: the answer must come from the upstream.
    pub(super) no_cache: bool,
    /// The client said `no-store`.
    pub(super) no_store: bool,
    pub(super) request_id: String,
    /// The W3C trace the upstream call continues.
    pub(super) trace: Trace,
    pub(super) accept: Option<http::HeaderValue>,
    /// The wait at the gate the client accepts (`Prefer: wait=N`, RFC
    /// 7240), when it said one: its answer or its 429 comes within it.
    pub(super) wait: Option<Duration>,
}

/// `Prefer: wait=N` (RFC 7240: preferences are comma-separated, a token
/// `=` a value, parameters after `;`; names are case-insensitive): the
/// seconds a client accepts to wait. Read on a miss only (a hit never
/// waits), so the hit path scans no more headers.
fn prefer_wait(headers: &http::HeaderMap) -> Option<Duration> {
    headers
        .get_all(http::header::HeaderName::from_static("prefer"))
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|pref| {
            let pref = pref.split(';').next()?.trim();
            let (name, value) = pref.split_once('=')?;
            name.trim().eq_ignore_ascii_case("wait").then_some(value)
        })
        .find_map(|value| value.trim().trim_matches('"').parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// Label used for requests that never reached authentication.
const NO_TEAM: &str = "unauthenticated";

/// What the phases of one request learned about it.
#[derive(Debug)]
pub(crate) struct RequestContext {
    pub(super) request_id: String,
    /// The W3C trace: its id goes in the access-log line.
    pub(super) trace: Trace,
    pub(super) team: Option<Arc<Team>>,
    /// The team's app, once authenticated.
    pub(super) member: Option<Arc<Member>>,
    pub(super) route: Option<Route>,
    /// How it was answered ([`Answered`]): `X-Cache`, the `cache` label,
    /// the access line's `answered`.
    pub(super) answered: Answered,
    /// Credits charged to the team for this answer: the sum of what every
    /// call it paid for billed ([`RequestContext::charge`]); its
    /// `X-Credits-Request` and its access line.
    pub(super) credits: u64,
    pub(super) fault: Option<Fault>,
    /// The request's span: built once the team is known, and only when
    /// spans are exported (`Span::none()` until then, and without export).
    pub(super) span: tracing::Span,
    /// The request sent `If-None-Match`: a held answer may be a 304.
    pub(super) conditional: bool,
    /// A budget refused it: that budget's figures, for its 402's budget
    /// headers and its access line.
    pub(super) refused_by: Option<Refused>,
    /// The data release a held answer came from (`cache::release`, a day
    /// number); 0: bought now (the current release) or none known.
    pub(super) release: u32,
}

/// The budget that refused a request (402), as its answer tells it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Refused {
    pub(super) limit: u64,
    /// What it had left: less than the call's worst case.
    pub(super) remaining: u64,
    /// Whose it was: `team`, `app` or `org` (`Spent::as_str`), the
    /// access line's `budget`.
    pub(super) budget: &'static str,
}

impl RequestContext {
    pub(super) fn new(request_id: String, trace: Trace, conditional: bool) -> RequestContext {
        RequestContext {
            request_id,
            trace,
            conditional,
            team: None,
            member: None,
            route: None,
            answered: Answered::Gateway,
            credits: 0,
            fault: None,
            span: tracing::Span::none(),
            refused_by: None,
            release: 0,
        }
    }

    /// Adds what one more call of this request cost its team.
    pub(super) fn charge(&mut self, credits: u64) {
        self.credits = self.credits.saturating_add(credits);
    }

    /// The team's name once authenticated, a fixed label before.
    pub(super) fn team_name(&self) -> &str {
        self.team.as_deref().map_or(NO_TEAM, |t| t.name.as_str())
    }

    /// The app's name, for a team that names its apps (a team of one token
    /// has none to tell: its access line and span carry none).
    pub(super) fn app_name(&self) -> Option<&str> {
        self.member
            .as_deref()
            .filter(|a| a.account.is_some())
            .map(|a| a.name.as_str())
    }

    /// Records the request's metrics and writes its access-log line.
    pub(super) fn finish(&self, metrics: &Metrics, method: &Method, status: StatusCode, took: Duration) {
        // Refused before routing (a 405, a path outside /v2): "other", so the
        // label stays inside the contract's route names.
        let route = self.route.unwrap_or(Route::Other);
        metrics.request(self.team_name(), route, status, self.answered.cache().as_str(), took);
        let level = match self.fault {
            Some(Fault::Internal) => Level::ERROR,
            Some(Fault::Upstream) => Level::WARN,
            _ => Level::INFO,
        };
        self.log(level, method.as_str(), status, took, false);
    }

    /// The access-log line of a background refresh (stale-while-revalidate):
    /// no client waits for it and no request metric counts it, but its
    /// credits are the team's and must be visible.
    pub(super) fn log_refresh(&self, status: StatusCode, took: Duration) {
        self.log(Level::INFO, "GET", status, took, true);
    }

    /// The access-log line (`telemetry::access`).
    fn log(&self, level: Level, method: &str, status: StatusCode, took: Duration, refresh: bool) {
        access::write(&access::Line {
            level,
            request_id: &self.request_id,
            trace_id: self.trace.trace_id().to_bytes(),
            team: self.team_name(),
            app: self.app_name(),
            method,
            route: self.route.unwrap_or(Route::Other).as_str(),
            status: status.as_u16(),
            answer: self.answered.names(),
            credits: self.credits,
            took,
            refresh,
            budget: self.refused_by.map(|r| r.budget),
            tenant: self.team.as_ref().map(|t| t.tenant),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefer(values: &[&'static str]) -> Option<Duration> {
        let mut h = http::HeaderMap::new();
        for v in values {
            h.append("prefer", http::HeaderValue::from_static(v));
        }
        prefer_wait(&h)
    }

    #[test]
    fn prefer_wait_is_read_as_rfc_7240_writes_it() {
        assert_eq!(prefer(&["wait=5"]), Some(Duration::from_secs(5)));
        assert_eq!(prefer(&["respond-async, Wait=2"]), Some(Duration::from_secs(2)));
        assert_eq!(
            prefer(&["handling=lenient", "wait=\"3\"; x=y"]),
            Some(Duration::from_secs(3))
        );
        assert_eq!(prefer(&["wait=soon"]), None);
        assert_eq!(prefer(&["return=minimal"]), None);
        assert_eq!(prefer(&[]), None);
    }
}
