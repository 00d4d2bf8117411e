//! Logs: human-readable or JSON lines on stderr, filtered by `log.level`.
//! The access log is the `access` target, one line per request, written by
//! `proxy::RequestContext::finish`, with the request's W3C trace id
//! (`trace_id`, see [`trace`]). Nothing secret is ever a field: team names,
//! never tokens; routes, never the upstream key. Except at a terminal in
//! text, the access line is preformatted by [`access`] in the same shape
//! (the per-request formatting of a `tracing` event was most of a hit's
//! cost at `info`).
//!
//! Lines go into a bounded queue drained by one writer thread ([`sink`]),
//! so a slow stderr never holds a request. When the queue is full, lines
//! are dropped, anonymous access lines first, and counted in
//! `gateway_log_lines_dropped_total`. This reverses an earlier choice
//! (requests waited rather than lines being dropped, for an audit trail
//! without holes): a reader that stalls, or a token-less flood of one line
//! per request, then held every team's requests, cache hits included,
//! for as long as stderr did (measured under a hostile load: p50 802 ms). The audit trail that
//! matters is a team's, which loses lines only after every anonymous one;
//! the drops are counted, so a hole is never silent.
//!
//! Spans: the request's phases open spans of target [`SPANS`] (request,
//! cache lookup, lease wait, reserve, upstream, settle), the request span
//! only once its team is authenticated, so a token-less request never makes
//! one (its `traceparent`, sampled or not, exports nothing). The sampler
//! decides by the trace id at `tracing.sample_ratio` (`otlp`). Only the OTLP
//! layer, installed when `tracing.otlp_endpoint` is set, takes them; the log
//! layer never does, so without an endpoint no subscriber is interested in
//! them and each `info_span!` of that target is a cached "never" at its
//! call site (no span is built, no id allocated).

pub(crate) mod access;
mod otlp;
mod sink;
pub(crate) mod trace;

use crate::config::{LogConfig, LogFormat, TracingConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::io::IsTerminal;
use tracing::Metadata;
use tracing_subscriber::filter::{filter_fn, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The target of every span exported over OTLP.
pub(crate) const SPANS: &str = "permit_gateway::spans";

/// Awaits a future inside a span, or, when the span is off (no export), as
/// a plain `.await`: `Instrumented` would move the whole future into its
/// wrapper, a copy of a few hundred bytes per request on the hit path
/// (measured with callgrind, BENCHMARKS.md).
macro_rules! in_span {
    ($span:expr, $fut:expr) => {{
        let span: ::tracing::Span = $span;
        if span.is_disabled() {
            $fut.await
        } else {
            ::tracing::Instrument::instrument($fut, span).await
        }
    }};
}
pub(crate) use in_span;

/// What must live as long as the process: the log writer thread and the
/// span exporter. [`Telemetry::shutdown`] flushes both.
pub struct Telemetry {
    _log_writer: sink::Guard,
    spans: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans still batched, then stops the exporter (call on the
    /// runtime, before it ends: the exports run on it).
    pub async fn shutdown(self) {
        if let Some(provider) = self.spans {
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }
}

/// Installs the global subscriber: the log layer, and the OTLP layer when
/// `tracing.otlp_endpoint` is set (inside a tokio runtime). An exporter
/// that cannot be built is an error; the logs are installed anyway so it
/// can be reported.
pub fn init(log: &LogConfig, tracing: &TracingConfig) -> Result<Telemetry, (Telemetry, String)> {
    // Reloadable: `log.level` changes with a reload (`set_level`).
    let (filter, handle) = tracing_subscriber::reload::Layer::new(log.level.filter());
    let _ = LEVEL.set(Box::new(move |level: &crate::config::LogLevel| {
        let reloaded = handle.reload(level.filter()).is_ok();
        access::levels_changed();
        reloaded
    }));
    let (sink, guard) = sink::Sink::start(std::io::stderr(), log.queue_lines);
    let terminal = std::io::stderr().is_terminal();
    let json = log.format == LogFormat::Json;
    if !terminal || json {
        // Access lines preformatted (see `access`), on the same queue; at
        // a terminal in text, `tracing`'s coloured line.
        access::install(sink.clone(), json);
    }
    // Colour codes only for a person at a terminal: in a file, journald or
    // a log shipper they are noise that breaks grep and parsers.
    let fmt = log_layer(sink.events(), json, terminal, logged(filter));
    let (spans, error) = match tracing.otlp_endpoint.as_deref().map(|e| otlp::tracer(tracing, e)) {
        Some(Ok((provider, tracer))) => (Some((provider, tracer)), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let (provider, otel) = match spans {
        Some((provider, tracer)) => {
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(filter_fn(is_exported_span));
            (Some(provider), Some(layer))
        }
        None => (None, None),
    };
    // Two subscriber types, not one with an `Option` layer: a `None` layer
    // counts as interested in every call site, which would build each
    // span of [`SPANS`] (in the registry) with no exporter to take it.
    let logs = tracing_subscriber::registry().with(fmt);
    let _ = match otel {
        Some(otel) => logs.with(otel).try_init(),
        None => logs.try_init(),
    };
    access::levels_changed();
    let telemetry = Telemetry {
        _log_writer: guard,
        spans: provider,
    };
    match error {
        None => Ok(telemetry),
        Some(e) => Err((telemetry, e)),
    }
}

/// Sets the installed log layer's level, when [`init`] installed one (the
/// binary; in-process gateways of tests share whatever the test set).
type SetLevel = Box<dyn Fn(&crate::config::LogLevel) -> bool + Send + Sync>;
static LEVEL: std::sync::OnceLock<SetLevel> = std::sync::OnceLock::new();

/// A reload's `log.level`, applied to every log line (access lines
/// included) from now on; `false` when this process installed no log layer.
pub(crate) fn set_level(level: &crate::config::LogLevel) -> bool {
    LEVEL.get().is_some_and(|set| set(level))
}

/// The log layer: `tracing-subscriber`'s full text format, or its JSON
/// with the event's fields flattened, through `filter`. The access line
/// (`access`) is written in the same shape; its test formats through this.
fn log_layer<S, W>(
    writer: W,
    json: bool,
    ansi: bool,
    filter: impl tracing_subscriber::layer::Filter<S> + Send + Sync + 'static,
) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi)
        .with_target(true);
    if json {
        fmt.json().flatten_event(true).with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    }
}

/// What the log layer takes: `log.level`, never an exported span, so the
/// log lines (and the JSON lines' "span" fields) read the same with or
/// without export.
fn logged<S>(level: impl tracing_subscriber::layer::Filter<S>) -> impl tracing_subscriber::layer::Filter<S> {
    level.and(filter_fn(|m| !is_exported_span(m)))
}

fn is_exported_span(m: &Metadata<'_>) -> bool {
    m.is_span() && m.target() == SPANS
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::EnvFilter;

    #[test]
    fn a_bad_tracing_section_names_its_keys() {
        let text = "[upstream]\napi_key = \"k\"\n[tracing]\notlp_endpoint = \"collector:4318\"\n\
                    service_name = \"\"\nsample_ratio = 1.5\n";
        let errors = crate::config::Config::load(crate::config::Source::Text(text))
            .expect_err("refused")
            .to_string();
        for key in ["tracing.otlp_endpoint", "tracing.service_name", "tracing.sample_ratio"] {
            assert!(errors.contains(key), "{key} not named in: {errors}");
        }
        let ok = "[upstream]\napi_key = \"k\"\n[tracing]\notlp_endpoint = \"https://otel.example:4318/\"\n";
        assert!(crate::config::Config::load(crate::config::Source::Text(ok)).is_ok());
    }

    #[test]
    fn without_an_exporter_no_span_is_built() {
        let logs = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::sink)
                .with_filter(logged(EnvFilter::new("trace"))),
        );
        tracing::subscriber::with_default(logs, || {
            assert!(tracing::info_span!(target: SPANS, "request").is_disabled());
            assert!(!tracing::info_span!("logged").is_disabled());
        });
    }
}
