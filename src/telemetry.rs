//! Logs: human-readable or JSON lines on stderr, filtered by `log.level`.
//! The access log is the `access` target, one line per request, written by
//! `proxy::RequestLog::finish`. Nothing secret is ever a field: team names,
//! never tokens; routes, never the upstream key.

use crate::config::LogConfig;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are no-ops.
pub fn init(cfg: &LogConfig) {
    let filter = EnvFilter::try_new(&cfg.level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true);
    let result = if cfg.format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
    let _ = result;
}
