//! `permit-api-sim`: a faithful, deterministic stand-in for the paid permit
//! data upstream described in `docs/vendor-api.md`, for tests, the demo and
//! benchmarks.
//!
//! It serves all 34 `/v2` operations of the vendor's OpenAPI (the vendor's
//! interface specification decides where it speaks) from a seeded synthetic
//! dataset, meters credits like the real service (headers, rolling 30-day
//! window, 402), validates queries with FastAPI/Pydantic-v2-shaped 422s,
//! rate-limits with 429 + `Retry-After`, and can inject faults. It counts what
//! it served so tests can assert what reached the upstream.
//!
//! # Layout
//!
//! - [`server`]: accept loop, HTTP/1.1 + h2c (or TLS), graceful shutdown.
//! - [`router`]: the life of a request: route → auth → rate limit → fault →
//!   latency → answer (validation, search) → credits → record → fault mangling.
//! - [`control`]: the `/_sim/*` endpoints (stats, log, faults, config, clock, release).
//! - [`dataset`]: the seeded world (geography, permits, contractors) + indexes.
//! - [`query`]: query-string parsing and Pydantic-v2-style validation errors.
//! - [`search`]: permit and contractor search filters; [`pagination`]: cursors
//!   and the page envelope; [`records`]: the JSON shapes of permits/contractors.
//! - [`lookup`]: the id lookups and their id rules; [`decisions`],
//!   [`properties`]: those resources' searches and lookups; [`people`]:
//!   contractor employees and address residents.
//! - [`geo`], [`places`], [`metrics`], [`meta`]: geography details and
//!   searches, the tag list, area and contractor metrics, coverage/release.
//! - [`credits`], [`ratelimit`], [`stats`], [`faults`]: the knobs and counters.
//! - [`state`]: the per-`Sim` mutable state those modules share.

pub mod control;
pub mod credits;
pub mod dataset;
pub mod decisions;
pub mod faults;
pub mod geo;
pub mod lookup;
pub mod meta;
pub mod metrics;
pub mod pagination;
pub mod people;
pub mod places;
pub mod properties;
pub mod query;
pub mod ratelimit;
pub mod records;
pub mod reply;
pub mod router;
pub mod search;
pub mod server;
pub mod state;
pub mod stats;

pub use dataset::samples::Samples;
pub use faults::{FaultKind, Faults};
pub use stats::{LogEntry, Stats};

use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// How a simulator behaves; every field can also be changed at runtime through
/// [`Sim`] methods or `/_sim/config` where that makes sense.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub api_key: String,
    /// `None` = unlimited: no Limit/Remaining headers, usage `credit_limit: null`.
    pub credit_limit: Option<u64>,
    /// Per key, per 60 s; 0 disables the limit.
    pub requests_per_minute: u32,
    /// How the limit reads "per 60 s" ([`ratelimit::Window`]).
    pub rate_window: ratelimit::Window,
    /// Added to every `/v2` request.
    pub latency_ms: u64,
    /// Uniform extra latency in `0..=jitter`, drawn from a seeded RNG.
    pub latency_jitter_ms: u64,
    pub seed: u64,
    pub upgrade_url: String,
    /// Serve HTTPS (ALPN h2, http/1.1) when set.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            api_key: "sim-upstream-key".into(),
            credit_limit: None,
            requests_per_minute: 120,
            rate_window: ratelimit::Window::Bucket,
            latency_ms: 0,
            latency_jitter_ms: 0,
            seed: 42,
            upgrade_url: "https://upstream.example/upgrade".into(),
            tls: None,
        }
    }
}

/// A running simulator. Dropping it aborts the server task and every
/// connection; [`Sim::shutdown`] stops gracefully.
pub struct Sim {
    addr: SocketAddr,
    tls: bool,
    shared: Arc<state::Shared>,
    server: Option<server::ServerHandle>,
}

impl Sim {
    /// Starts serving on an already-bound listener (tests bind port 0) and
    /// returns at once; the accept loop runs on a spawned task.
    pub async fn start(listener: TcpListener, cfg: SimConfig) -> std::io::Result<Sim> {
        let addr = listener.local_addr()?;
        let tls = cfg.tls.is_some();
        let shared = Arc::new(state::Shared::new(cfg.clone()));
        let server = server::spawn(listener, cfg.tls, shared.clone());
        Ok(Sim {
            addr,
            tls,
            shared,
            server: Some(server),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn base_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn api_key(&self) -> &str {
        &self.shared.cfg.api_key
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    pub fn log(&self) -> Vec<LogEntry> {
        self.shared.log()
    }

    pub fn set_faults(&self, faults: Faults) {
        self.shared.set_faults(faults);
    }

    pub fn clear_faults(&self) {
        self.shared.set_faults(Faults::default());
    }

    pub fn set_credit_limit(&self, limit: Option<u64>) {
        self.shared.credits().set_limit(limit);
    }

    pub fn set_requests_per_minute(&self, rpm: u32) {
        self.shared.set_requests_per_minute(rpm);
    }

    /// Moves the simulator's clock forward; spend older than 30 days drops off.
    pub fn advance_clock(&self, secs: u64) {
        self.shared.credits().advance(secs);
    }

    pub fn reset(&self) {
        self.shared.reset();
    }

    /// Publishes the next data release `days` after the current one
    /// (`released_at` advances, every permit's job value is revised);
    /// returns its date. `POST /_sim/release` over HTTP.
    pub fn publish_release(&self, days: u32) -> chrono::NaiveDate {
        self.shared.publish_release(days)
    }

    /// `/v2/meta/release` answers `text` as `released_at` until the next
    /// publish (`None`: the real date again).
    pub fn garble_release(&self, text: Option<&str>) {
        self.shared.garble_release(text.map(str::to_string));
    }

    pub fn samples(&self) -> Samples {
        Samples::from_dataset(&self.shared.data())
    }

    /// Stops accepting, lets in-flight requests finish (bounded), then returns.
    pub async fn shutdown(mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}
