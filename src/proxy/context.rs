//! The request context: what the phases of one request learn about it (its
//! id, team, route, cache state, credits, fault), shared by the phases of
//! `proxy::pipeline` and closed by [`RequestContext::finish`] with the
//! request's metrics and its one access-log line. Holds no secret: the
//! team's name, never its token.

use crate::error::Fault;
use crate::metrics::Metrics;
use crate::route::Route;
use crate::telemetry::trace::Trace;
use http::{Method, StatusCode};
use std::time::Duration;

/// How the cache took part in an answer (the `X-Cache` header and the
/// `cache` metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    Hit,
    Miss,
    Stale,
    Bypass,
}

impl CacheState {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheState::Hit => "hit",
            CacheState::Miss => "miss",
            CacheState::Stale => "stale",
            CacheState::Bypass => "bypass",
        }
    }

    /// The `X-Cache` header value.
    pub fn header(self) -> &'static str {
        match self {
            CacheState::Hit => "HIT",
            CacheState::Miss => "MISS",
            CacheState::Stale => "STALE",
            CacheState::Bypass => "BYPASS",
        }
    }
}

/// Label used for requests that never reached authentication.
pub const NO_TEAM: &str = "unauthenticated";

/// What the phases of one request learned about it.
#[derive(Debug)]
pub struct RequestContext {
    pub request_id: String,
    /// The W3C trace: its id goes in the access-log line.
    pub trace: Trace,
    pub team: Option<String>,
    pub route: Option<Route>,
    pub cache: CacheState,
    /// Credits charged to the team for this answer.
    pub credits: u64,
    pub fault: Option<Fault>,
}

impl RequestContext {
    pub fn new(request_id: String, trace: Trace) -> RequestContext {
        RequestContext {
            request_id,
            trace,
            team: None,
            route: None,
            cache: CacheState::Bypass,
            credits: 0,
            fault: None,
        }
    }

    /// Records the request's metrics and writes its access-log line.
    pub fn finish(&self, metrics: &Metrics, method: &Method, status: StatusCode, took: Duration) {
        let team = self.team.as_deref().unwrap_or(NO_TEAM);
        // Refused before routing (a 405, a path outside /v2): "other", so the
        // label stays inside the contract's route names.
        let route = self.route.unwrap_or(Route::Other);
        let cache = self.cache.as_str();
        metrics.request(team, route, status, cache, took);
        let route = route.as_str();
        let duration_ms = took.as_secs_f64() * 1000.0;
        macro_rules! access {
            ($level:ident) => {
                tracing::$level!(
                    target: "access",
                    request_id = %self.request_id,
                    trace_id = %self.trace.trace_id(),
                    team,
                    method = %method,
                    route,
                    status = status.as_u16(),
                    cache,
                    credits = self.credits,
                    duration_ms,
                    "request"
                )
            };
        }
        match self.fault {
            Some(Fault::Internal) => access!(error),
            Some(Fault::Upstream) => access!(warn),
            _ => access!(info),
        }
    }

    /// The access-log line of a background refresh (stale-while-revalidate):
    /// no client waits for it and no request metric counts it, but its
    /// credits are the team's and must be visible.
    pub fn log_refresh(&self, status: StatusCode, took: Duration) {
        tracing::info!(
            target: "access",
            request_id = %self.request_id,
            trace_id = %self.trace.trace_id(),
            team = self.team.as_deref().unwrap_or(NO_TEAM),
            method = "GET",
            route = self.route.unwrap_or(Route::Other).as_str(),
            status = status.as_u16(),
            cache = self.cache.as_str(),
            credits = self.credits,
            duration_ms = took.as_secs_f64() * 1000.0,
            refresh = true,
            "request"
        );
    }
}
