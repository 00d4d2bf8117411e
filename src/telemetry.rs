//! Logs: human-readable or JSON lines on stderr, filtered by `log.level`.
//! The access log is the `access` target, one line per request, written by
//! `proxy::RequestContext::finish`. Nothing secret is ever a field: team names,
//! never tokens; routes, never the upstream key.
//!
//! Lines are handed to a writer thread (tracing-appender), so a slow stderr
//! never holds a request; when its buffer is full, requests wait rather
//! than lines being dropped (an access log with holes is no audit trail).

use crate::config::LogConfig;
use std::io::IsTerminal;
use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Keep the guard alive for the process's
/// life: dropping it flushes and stops the writer thread.
pub fn init(cfg: &LogConfig) -> WorkerGuard {
    let filter = EnvFilter::try_new(&cfg.level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(64 * 1024)
        .finish(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        // Colour codes only for a person at a terminal: in a file, journald
        // or a log shipper they are noise that breaks grep and parsers.
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(true);
    let result = if cfg.format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
    let _ = result;
    guard
}
