//! W3C trace context (`traceparent`, `tracestate`) of one request: read
//! from the client before `admit`, its trace id put in the access log, and
//! sent on to the upstream with every call (`forward`).
//!
//! What the upstream receives:
//! - spans exported (`tracing.otlp_endpoint` set): the context of the
//!   gateway's `upstream` span, a child of the client's span, so the trace
//!   reads app → gateway → upstream;
//! - no export: the client's `traceparent` and `tracestate` unchanged (the
//!   gateway records nothing, so it does not pose as a parent);
//! - no (valid) `traceparent` from the client: a trace the gateway starts,
//!   with a new trace id (the one in the access log) and, without export,
//!   the sampled flag off (no span of it was recorded).
//!
//! A `tracestate` longer than [`MAX_TRACESTATE`] is dropped as it is read:
//! not forwarded, and not copied into any span.

use crate::http_util::random_id;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;
use opentelemetry_http::HeaderInjector;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// A name known at compile time: looked up without parsing a `&str`.
pub(crate) const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
const TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");

/// The longest `tracestate` passed on, its values joined by commas: the
/// length W3C asks a vendor to propagate at least. Longer ones are a
/// client's bytes on every upstream call and in every span, so they are
/// dropped whole (W3C allows dropping the list when it cannot be trimmed).
pub(crate) const MAX_TRACESTATE: usize = 512;

/// The headers as the propagator sees them: a `tracestate` over
/// [`MAX_TRACESTATE`] bytes is absent.
struct Bounded<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for Bounded<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        if key == TRACESTATE.as_str() && tracestate_len(self.0) > MAX_TRACESTATE {
            return None;
        }
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The `tracestate` header's length as one list (every field line joined
/// by a comma).
fn tracestate_len(headers: &http::HeaderMap) -> usize {
    let (n, bytes) = headers
        .get_all(TRACESTATE)
        .iter()
        .fold((0, 0), |(n, bytes), v| (n + 1, bytes + v.len()));
    bytes + n.max(1) - 1
}

/// The trace one request belongs to.
#[derive(Debug, Clone)]
pub(crate) struct Trace {
    /// The client's span (remote), or the root the gateway made up.
    parent: SpanContext,
    /// The client sent none: the gateway started this trace.
    started: bool,
}

impl Trace {
    /// The client's context, or a new trace when it sent none or an invalid
    /// one (the W3C rule: an invalid `traceparent` is ignored).
    #[cfg(test)]
    pub(crate) fn from_headers(headers: &http::HeaderMap) -> Trace {
        Trace::of(headers.contains_key(TRACEPARENT), headers)
    }

    /// [`from_headers`](Trace::from_headers) when whether the request has a
    /// `traceparent` is known already.
    pub(crate) fn of(traceparent: bool, headers: &http::HeaderMap) -> Trace {
        if !traceparent {
            return Trace::start();
        }
        let cx = TraceContextPropagator::new().extract(&Bounded(headers));
        let parent = cx.span().span_context().clone();
        if parent.is_valid() {
            Trace { parent, started: false }
        } else {
            Trace::start()
        }
    }

    fn start() -> Trace {
        let (trace, span) = (random_id(), random_id() as u64);
        let trace_id = TraceId::from_bytes(trace.max(1).to_be_bytes());
        let span_id = SpanId::from_bytes(span.max(1).to_be_bytes());
        let parent = SpanContext::new(trace_id, span_id, TraceFlags::NOT_SAMPLED, false, TraceState::NONE);
        Trace { parent, started: true }
    }

    /// The trace id for the access log.
    pub(crate) fn trace_id(&self) -> TraceId {
        self.parent.trace_id()
    }

    /// Makes `span` (the request's, when spans are exported) the child of
    /// the client's span; a trace the gateway started takes the id the
    /// exporter's span got, so the access log names the exported trace.
    pub(crate) fn attach(&mut self, span: &tracing::Span) {
        if span.is_disabled() {
            return;
        }
        if !self.started {
            let parent = Context::new().with_remote_span_context(self.parent.clone());
            let _ = span.set_parent(parent);
            return;
        }
        let own = span.context().span().span_context().clone();
        if own.is_valid() {
            self.parent = own;
        }
    }

    /// Writes `traceparent` (and `tracestate`) for an upstream call made
    /// inside `span`.
    pub(crate) fn inject(&self, span: &tracing::Span, headers: &mut http::HeaderMap) {
        let own = (!span.is_disabled())
            .then(|| span.context())
            .filter(|cx| cx.span().span_context().is_valid());
        let cx = own.unwrap_or_else(|| Context::new().with_remote_span_context(self.parent.clone()));
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
        // The propagator writes an empty `tracestate` when there is none.
        if headers.get("tracestate").is_some_and(|v| v.is_empty()) {
            headers.remove("tracestate");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn injected(trace: &Trace) -> HeaderMap {
        let mut out = HeaderMap::new();
        trace.inject(&tracing::Span::none(), &mut out);
        out
    }

    #[test]
    fn a_clients_context_travels_unchanged_without_export() {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_static(PARENT));
        headers.insert("tracestate", HeaderValue::from_static("vendor=abc,other=x"));
        let trace = Trace::from_headers(&headers);
        assert_eq!(trace.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let out = injected(&trace);
        assert_eq!(out["traceparent"], PARENT);
        assert_eq!(out["tracestate"], "vendor=abc,other=x");
    }

    /// A valid `tracestate` of exactly `len` bytes: members of at most 250
    /// bytes (a value may have 256), so that only its length is at issue.
    fn tracestate(len: usize) -> String {
        let mut members = Vec::new();
        let mut left = len;
        while left > 0 {
            let comma = usize::from(!members.is_empty());
            let key = format!("k{}=", members.len());
            let member = (left - comma).min(250);
            members.push(format!("{key}{}", "x".repeat(member - key.len())));
            left -= member + comma;
        }
        members.join(",")
    }

    #[test]
    fn a_tracestate_over_512_bytes_is_dropped() {
        for (len, kept) in [
            (300, true),
            (MAX_TRACESTATE, true),
            (MAX_TRACESTATE + 1, false),
            (7_000, false),
        ] {
            let state = tracestate(len);
            assert_eq!(state.len(), len);
            let mut headers = HeaderMap::new();
            headers.insert("traceparent", HeaderValue::from_static(PARENT));
            headers.insert("tracestate", HeaderValue::from_str(&state).expect("ascii"));
            let out = injected(&Trace::from_headers(&headers));
            assert_eq!(out["traceparent"], PARENT, "the context itself is kept ({len})");
            assert_eq!(out.get("tracestate").is_some(), kept, "{len} bytes");
        }
        // Two field lines are one list: their joined length counts.
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_static(PARENT));
        let half = tracestate(300);
        headers.append("tracestate", HeaderValue::from_str(&half).expect("ascii"));
        headers.append("tracestate", HeaderValue::from_str(&half).expect("ascii"));
        assert!(!injected(&Trace::from_headers(&headers)).contains_key("tracestate"));
    }

    #[test]
    fn a_missing_or_invalid_context_starts_a_new_trace() {
        let mut bad = HeaderMap::new();
        bad.insert(
            "traceparent",
            HeaderValue::from_static("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        );
        for headers in [HeaderMap::new(), bad] {
            let trace = Trace::from_headers(&headers);
            assert_ne!(trace.trace_id(), TraceId::INVALID);
            let out = injected(&trace);
            let sent = out["traceparent"].to_str().expect("ascii");
            assert_eq!(sent, format!("00-{}-{}-00", trace.trace_id(), trace.parent.span_id()));
            assert!(!out.contains_key("tracestate"));
        }
        assert_ne!(
            Trace::from_headers(&HeaderMap::new()).trace_id(),
            Trace::from_headers(&HeaderMap::new()).trace_id()
        );
    }
}
