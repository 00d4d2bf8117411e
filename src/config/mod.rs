//! Configuration: embedded commented defaults → file → environment, then
//! validation that reports every problem at once with its key path.
//!
//! Sits before everything: `main` loads a [`Config`], `app` builds the shared
//! state from it. The defaults file `config/defaults.toml` is compiled in, so
//! the binary runs with no file at all, and it is the reference of every key.

pub(crate) use load::nearest;
use secret::url_redacted;
pub(crate) use secret::Secret;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use validate::{placeholder_warnings, refuse_demo_tokens, validate_log, validate_teams, validate_tracing};
pub use values::{BaseUrl, LogLevel, TokenHash};

mod diff;
mod load;
mod secret;
mod validate;
mod values;

/// The compiled-in defaults, also the documentation of every key.
pub const DEFAULTS_TOML: &str = include_str!("../../config/defaults.toml");

/// The configuration the demo runs with (tokens are public demo values).
#[cfg(any(feature = "demo", test))]
pub(crate) const DEMO_TOML: &str = include_str!("../../config/demo.toml");

/// The demo's team tokens (`config/demo.toml`): public values, so any
/// config but the demo's that accepts one is refused.
pub(crate) const DEMO_TOKENS: [(&str, &str); 2] = [("growth", "pgw_demo_growth"), ("analytics", "pgw_demo_analytics")];
/// The demo's admin token, public like its team tokens.
pub(crate) const DEMO_ADMIN_TOKEN: &str = "pgw_demo_admin";

/// Prefix of environment overrides; `__` separates section and key.
const ENV_PREFIX: &str = "PERMIT_GATEWAY_";

/// The size of the frames an HTTP/2 answer is sent in (`server::CHUNK`):
/// here, below the server, because `server.http2_max_buffered_bytes` must
/// hold at least one.
pub(crate) const HTTP2_CHUNK_BYTES: usize = 16 * 1024;

/// The file read by `serve` and `check-config` when no `--config` is given.
pub const DEFAULT_CONFIG_PATH: &str = "config/gateway.toml";

/// Its fields are public so that the integration tests build a config as a
/// value (`tests/it/support/gateway.rs`); secrets stay crate-private.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub cache: CacheConfig,
    pub quota: QuotaConfig,
    /// TLS files and Sentinel login for every Redis URL (cache, ledger, rate).
    #[serde(default)]
    pub redis: RedisConfig,
    pub admin: AdminConfig,
    pub log: LogConfig,
    pub tracing: TracingConfig,
    #[serde(default)]
    pub teams: Vec<TeamConfig>,
    /// What loading noticed that is allowed but unwise (an upstream key
    /// written in a file): `check-config` prints them, `serve` logs them.
    #[serde(skip)]
    warnings: Vec<String>,
    /// Whether `teams` was written (as `[[teams]]` blocks, or `teams = []`
    /// on purpose): a reload of a file without it is refused.
    #[serde(skip)]
    teams_declared: bool,
    /// Where the configuration came from, in words (`serve` logs it).
    #[serde(skip)]
    origin: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerConfig {
    #[serde(deserialize_with = "socket_addr")]
    pub listen: SocketAddr,
    #[serde(deserialize_with = "socket_addr")]
    pub admin_listen: SocketAddr,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    /// The admin listener's own cap (probes, scrapes, the admin API).
    pub admin_max_connections: usize,
    pub max_header_bytes: usize,
    pub max_uri_bytes: usize,
    pub header_read_timeout_secs: u64,
    pub idle_timeout_secs: u64,
    pub write_timeout_secs: u64,
    pub http2_max_concurrent_streams: u32,
    pub http2_max_buffered_bytes: usize,
    /// 0: derived from `max_connections` ([`ServerConfig::team_in_flight_limit`]).
    pub team_max_in_flight: usize,
    pub shutdown_grace_secs: u64,
    /// How the team listener is served (`server::per_core`).
    pub runtime: Runtime,
    /// `per_core`: its loops; 0: [`ServerConfig::per_core_loops`] decides.
    pub per_core_threads: usize,
}

impl ServerConfig {
    /// Requests one team may have in flight at once (followers included):
    /// `team_max_in_flight`, or a quarter of `max_connections`, so that one
    /// team can never keep every connection busy.
    pub(crate) fn team_in_flight_limit(&self) -> usize {
        match self.team_max_in_flight {
            0 => (self.max_connections / 4).max(1),
            n => n,
        }
    }

    /// The single-threaded loops of `server.runtime = "per_core"`:
    /// `per_core_threads`, else one per worker thread of the runtime this
    /// runs on (`TOKIO_WORKER_THREADS`, what the benchmarks set, else the
    /// cores).
    pub fn per_core_loops(&self) -> usize {
        match self.per_core_threads {
            0 => worker_threads(),
            n => n,
        }
    }
}

/// Worker threads of the runtime this runs on; outside one, the cores.
fn worker_threads() -> usize {
    tokio::runtime::Handle::try_current()
        .map(|h| h.metrics().num_workers())
        .unwrap_or_else(|_| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// How the team listener is served (`server.runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    /// Every listener on the one work-stealing tokio runtime.
    MultiThread,
    /// The team listener on single-threaded runtimes, one per thread, each
    /// with its own `SO_REUSEPORT` socket on the same address (as nginx's
    /// workers); one registry of connections across them.
    PerCore,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpstreamConfig {
    pub(crate) base_url: BaseUrl,
    api_key: Option<Secret>,
    pub api_key_file: Option<PathBuf>,
    pub requests_per_minute: u32,
    /// Calls that may go back to back (`scheduler`): unset, the whole
    /// window of `requests_per_minute`, as the vendor allows.
    #[serde(default)]
    pub burst: Option<u32>,
    pub timeout_secs: u64,
    pub connect_timeout_secs: u64,
    pub max_retries: u32,
    pub ca_file: Option<PathBuf>,
    pub max_response_bytes: usize,
    pub max_queue_wait_secs: u64,
    /// How long the ids of an id lookup route gather before their call
    /// goes, when the route had a call in the last second (`proxy::reuse`,
    /// batches): a crowd of lookups shares calls; a lone lookup on an idle
    /// gateway goes at once.
    pub batch_window_ms: u64,
    pub exhausted_backoff_secs: u64,
    pub max_retry_after_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheConfig {
    pub memory_max_bytes: u64,
    pub default_ttl_secs: u64,
    #[serde(serialize_with = "url_redacted")]
    pub(crate) redis_url: Option<Secret>,
    pub stale_grace_secs: u64,
    pub stale_while_revalidate_secs: u64,
    /// How long the upstream's 422 for a normalized query is kept and
    /// answered again without a call (`cache::refusals`); 0: not kept.
    pub refusal_ttl_secs: u64,
    pub max_entry_bytes: usize,
    pub redis_key_prefix: String,
    pub redis_timeout_ms: u64,
    /// Multiplexed connections of the cache's Redis (`redis_backend::pool`):
    /// one socket capped the Redis tier on many cores (measured: 5.2 of 8
    /// cores busy, Redis at 0.7). 0: one per worker thread
    /// ([`CacheConfig::redis_pool_size`]).
    pub redis_connections: usize,
    pub coalesce_wait_ms: u64,
    /// Id lookups answered from records that searches and earlier lookups
    /// already bought (`cache::records`); off: lookups cache as whole queries.
    pub record_reuse: bool,
    #[serde(default)]
    pub route_ttl_secs: std::collections::BTreeMap<crate::route::Route, u64>,
    /// The disk tier (`cache::disk`): `auto` is on without
    /// `redis_url`.
    pub disk: DiskMode,
    /// The disk tier's file; unset: `cache.redb` in the folder of
    /// `quota.path` (the data volume). Relative: from the config file's folder.
    #[serde(default)]
    pub disk_path: Option<PathBuf>,
    /// Bytes of entries the disk tier keeps before it evicts the least
    /// recently used.
    pub disk_max_bytes: u64,
    /// Free space the disk tier leaves on its volume (for the ledger
    /// beside it): past it, it writes nothing (`cache::disk`).
    pub disk_reserve_bytes: u64,
    /// Monthly metrics answered month by month from rows already held
    /// (`proxy::reuse`): a window buys only the months not held.
    pub month_reuse: bool,
    /// Freshness of a monthly-metrics row of a month that has ended; 0: the
    /// route's TTL, like the current month's.
    pub past_month_ttl_secs: u64,
    /// How often `GET /v2/meta/release` is read, one call for all replicas
    /// (`cache::release`); 0: never (answers carry no release).
    pub release_poll_secs: u64,
    /// `ttl`: route TTLs, and a newer data release outdates older answers;
    /// `release`: besides, an answer of the current release stays fresh
    /// past its TTL, up to `release_max_age_secs`.
    pub freshness: Freshness,
    /// With `freshness = "release"`: the longest an answer stays fresh.
    pub release_max_age_secs: u64,
}

/// `cache.freshness`: what keeps an answer fresh (`cache::release`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Freshness {
    /// The route's TTL (a newer release still outdates older answers).
    Ttl,
    /// The data release: fresh while it is unchanged, up to a maximum age.
    Release,
}

/// Whether the cache keeps a disk tier (`cache.disk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskMode {
    /// On when no `cache.redis_url` is set (the embedded default).
    Auto,
    On,
    Off,
}

impl CacheConfig {
    /// Connections of the cache's Redis pool: `redis_connections`, or when
    /// it is 0 one per worker thread of the runtime this runs on (at most
    /// 16). Per worker: on one core, more sockets only split the batches
    /// one socket writes (callgrind: ~1k more instructions a Redis-tier hit
    /// with 4 than with 1).
    pub(crate) fn redis_pool_size(&self) -> usize {
        match self.redis_connections {
            0 => worker_threads().clamp(1, 16),
            n => n,
        }
    }

    /// Freshness of a route's answers; `None` never caches. A route's own
    /// `route_ttl_secs` entry wins over its TTL class in the route table;
    /// unknown paths (`other`) use `default_ttl_secs`.
    pub(crate) fn ttl_for(&self, route: crate::route::Route) -> Option<std::time::Duration> {
        use crate::route::table::TtlClass;
        let class_secs = match route.ttl_class() {
            TtlClass::Never => return None,
            TtlClass::Default => self.default_ttl_secs,
            class => class.secs().unwrap_or(self.default_ttl_secs),
        };
        let secs = self.route_ttl_secs.get(&route).copied().unwrap_or(class_secs);
        (secs > 0).then(|| std::time::Duration::from_secs(secs))
    }

    /// The disk tier's file when it is on (`cache.disk`): `disk_path`, or
    /// `cache.redb` beside the ledger's folder (`quota.path`).
    pub(crate) fn disk_file(&self, quota_path: &Path) -> Option<PathBuf> {
        let on = match self.disk {
            DiskMode::Auto => self.redis_url.is_none(),
            DiskMode::On => true,
            DiskMode::Off => false,
        };
        if !on || self.disk_max_bytes == 0 {
            return None;
        }
        Some(self.disk_path.clone().unwrap_or_else(|| {
            let folder = quota_path.parent().unwrap_or(Path::new("."));
            folder.join("cache.redb")
        }))
    }

    /// A monthly-metrics row's freshness: `past_month_ttl_secs` for a month
    /// that has ended, when set; else the route's.
    pub(crate) fn past_month_ttl(&self) -> Option<std::time::Duration> {
        (self.past_month_ttl_secs > 0).then(|| std::time::Duration::from_secs(self.past_month_ttl_secs))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuotaConfig {
    pub window: crate::ledger::Window,
    pub store: QuotaStore,
    pub path: PathBuf,
    #[serde(serialize_with = "url_redacted")]
    pub(crate) redis_url: Option<Secret>,
    pub upgrade_url: String,
    pub redis_timeout_ms: u64,
    pub reservation_lease_secs: u64,
    /// The company's credits per window, over every team (`None`: no cap):
    /// past it every metered call is refused (402) before anything is bought.
    #[serde(default)]
    pub org_credit_limit: Option<u64>,
    pub fail_open: bool,
    /// Tests only: shifts the ledger's clock (its days and reservation
    /// expiries) by this many seconds; 0 in production.
    pub clock_offset_secs: i64,
}

/// `[redis]`: what a `rediss://` (or `rediss+cluster://`,
/// `rediss+sentinel://`) URL needs beyond the URL, shared by the cache's,
/// the ledger's and the rate limiter's Redis: in practice they are one
/// service behind one CA. The ACL login stays in the URL (`user:password@`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RedisConfig {
    pub tls_ca_file: Option<PathBuf>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub sentinel_username: Option<String>,
    pub(crate) sentinel_password: Option<Secret>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminConfig {
    pub(crate) token_sha256: Option<TokenHash>,
    pub metrics_auth: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogConfig {
    pub format: LogFormat,
    pub level: LogLevel,
    /// Lines the log queue holds for a slow stderr before it drops them
    /// (anonymous access lines first; see `telemetry::sink`).
    pub queue_lines: usize,
}

/// Trace context and span export (`[tracing]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TracingConfig {
    /// The OTLP/HTTP collector (`http://host:4318`); unset: no span is made
    /// or exported (the W3C context still travels to the upstream).
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the exported spans.
    pub service_name: String,
    /// The share of the teams' traces that are exported, decided by the
    /// trace id; a client's sampled flag does not change it.
    pub sample_ratio: f64,
}

/// Where the team budgets are kept (`quota.store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaStore {
    /// A file on local disk: one replica.
    File,
    /// Redis: shared by every replica.
    Redis,
}

/// How log lines are written (`log.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// For a person at a terminal.
    Human,
    /// One JSON object per line, for a log shipper.
    Json,
}

/// Serde's own `SocketAddr` error ("invalid socket address syntax") does
/// not say what a valid one looks like.
fn socket_addr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    text.parse()
        .map_err(|_| serde::de::Error::custom(format!("{text:?} is not an address like 0.0.0.0:8080")))
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TeamConfig {
    pub name: String,
    /// The team's one token: an app named [`DEFAULT_APP`]. Besides or
    /// instead of it, `tokens` names one token per app.
    #[serde(default)]
    pub token_sha256: Option<TokenHash>,
    /// When `token_sha256` (the app `default`) is refused from: the end of
    /// a rotation, as `not_after` of a `[[teams.tokens]]` entry.
    #[serde(default, deserialize_with = "values::not_after")]
    pub not_after: Option<chrono::DateTime<chrono::Utc>>,
    /// One token per app of the team (`[[teams.tokens]]`).
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    pub credit_limit: Option<u64>,
    pub requests_per_minute: Option<u32>,
    /// A page its remaining credits cannot cover is asked with the size
    /// they cover instead of refused (docs/design.md, "Spending less").
    #[serde(default)]
    pub clamp_to_budget: bool,
    /// The team's share of the upstream rate against other teams' (a team
    /// of weight 2 gets two turns to another's one while both wait).
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// What an app's calls ask of the upstream gate (`[[teams.tokens]] class`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AppClass {
    /// Its turn by its team's share.
    #[default]
    Interactive,
    /// Only the upstream rate that interactive calls leave.
    Bulk,
}

/// The app of a team's `token_sha256` (its one token of old).
pub const DEFAULT_APP: &str = "default";

/// One app's token (`[[teams.tokens]]`): attributed by its name, retired at
/// `not_after`, optionally with a budget of its own within the team's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TokenConfig {
    /// The app: 1-64 of `[a-z0-9_-]`, unique in the team.
    pub name: String,
    pub token_sha256: TokenHash,
    /// Refused (401) from then on; the overlap of a rotation. Written as
    /// a date (the start of its day, UTC) or a time (`values::not_after`).
    #[serde(default, deserialize_with = "values::not_after")]
    pub not_after: Option<chrono::DateTime<chrono::Utc>>,
    /// This app's credits per window, within the team's.
    #[serde(default)]
    pub credit_limit: Option<u64>,
    /// `bulk`: its calls take only what interactive calls leave.
    #[serde(default)]
    pub class: AppClass,
}

impl TeamConfig {
    /// The team's apps: its `token_sha256` as [`DEFAULT_APP`] (ending at
    /// the team's `not_after`), then `tokens`.
    pub fn apps(&self) -> impl Iterator<Item = TokenConfig> + '_ {
        let default = self.token_sha256.map(|token_sha256| TokenConfig {
            name: DEFAULT_APP.to_string(),
            token_sha256,
            not_after: self.not_after,
            credit_limit: None,
            class: AppClass::Interactive,
        });
        default.into_iter().chain(self.tokens.iter().cloned())
    }

    /// Whether the team names its apps (`tokens`): then each app's spend is
    /// kept apart (a ledger account of its own) and can be limited.
    pub fn has_apps(&self) -> bool {
        !self.tokens.is_empty()
    }
}

/// Every problem found while loading, each with its key path.
#[derive(Debug)]
pub struct ConfigErrors(pub(crate) Vec<String>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problem(s)):", self.0.len())?;
        for problem in &self.0 {
            writeln!(f, "  - {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Which checks [`Config::load_checked`] runs beyond the always-on ones.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checks {
    /// `check-config --no-secrets`: the upstream key is not looked for, so
    /// a file can be validated where the secret is not (CI, a laptop).
    skip_secrets: bool,
    /// The demo's own config: its public tokens are allowed there only.
    demo: bool,
}

impl Checks {
    /// Everything but the upstream key.
    pub fn without_secrets() -> Checks {
        Checks {
            skip_secrets: true,
            ..Checks::default()
        }
    }

    /// The demo: its public tokens are expected.
    #[cfg(any(feature = "demo", test))]
    pub(crate) fn demo() -> Checks {
        Checks {
            demo: true,
            ..Checks::default()
        }
    }
}

/// Where the configuration comes from.
pub enum Source<'a> {
    /// `--config FILE`: the file must exist.
    File(&'a Path),
    /// No `--config`: `config/gateway.toml` when present, else defaults only.
    Default,
    /// A TOML text over the defaults (the demo, tests).
    Text(&'a str),
}

impl Config {
    /// Loads defaults → source → environment and validates the result.
    pub fn load(source: Source<'_>) -> Result<Config, ConfigErrors> {
        Config::load_checked(source, Checks::default())
    }

    /// [`Config::load`] with a choice of [`Checks`].
    pub fn load_checked(source: Source<'_>, checks: Checks) -> Result<Config, ConfigErrors> {
        let folder = load::config_folder(&source);
        let origin = load::origin(&source);
        let figment = load::figment_for(source)?;
        let (config, mut problems) = load::extract(&figment);
        let Some(mut config) = config else {
            return Err(ConfigErrors(problems));
        };
        // Relative paths from the file's folder, else from the working
        // directory: absolute either way, so every log line names one place.
        let folder = folder.or_else(|| std::path::absolute(".").ok());
        if let Some(folder) = &folder {
            config.quota.path = load::resolve(folder, &config.quota.path);
            if let Some(disk) = &config.cache.disk_path {
                config.cache.disk_path = Some(load::resolve(folder, disk));
            }
        }
        config.teams_declared = figment.contains("teams");
        config.origin = origin;
        config.warnings = load::warnings(&figment);
        config.warnings.extend(placeholder_warnings(&config.teams));
        if let Some(file) = config.cache.disk_file(&config.quota.path) {
            let (max, reserve) = (config.cache.disk_max_bytes, config.cache.disk_reserve_bytes);
            config
                .warnings
                .extend(crate::volume::disk_room_warning(&file, max, reserve));
        }
        if config.teams.is_empty() {
            config.warnings.push(format!(
                "teams: no team is configured ({}): every team request will be refused with 401; \
                 add [[teams]] blocks (docs/operations.md, \"Adding a team\")",
                config.origin
            ));
        }
        // Semantic checks run even after a type error (on the config with the
        // bad keys at their defaults), so one run lists every problem.
        problems.extend(config.validate(checks));
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors(problems))
        }
    }

    /// What loading noticed that is allowed but unwise, one sentence each.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Where the configuration came from, in words: the file (absolute), or
    /// the built-in defaults and why.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Whether the source wrote `teams` at all (blocks, or `teams = []`).
    pub(crate) fn teams_declared(&self) -> bool {
        self.teams_declared
    }

    /// The effective configuration as TOML, secrets redacted.
    pub fn redacted_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    /// The upstream key: `upstream.api_key`, else the contents of
    /// `upstream.api_key_file` (trimmed).
    pub(crate) fn upstream_key(&self) -> Result<Secret, String> {
        if let Some(key) = &self.upstream.api_key {
            return Ok(key.clone());
        }
        let Some(path) = &self.upstream.api_key_file else {
            return Err(
                "upstream.api_key: not set (give PERMIT_GATEWAY_UPSTREAM__API_KEY or upstream.api_key_file)".into(),
            );
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("upstream.api_key_file: cannot read {}: {e}", path.display()))?;
        let key = text.trim();
        if key.is_empty() {
            return Err(format!("upstream.api_key_file: {} is empty", path.display()));
        }
        Ok(Secret::new(key))
    }

    /// Every semantic problem, each prefixed with its key path.
    fn validate(&self, checks: Checks) -> Vec<String> {
        let mut p = Vec::new();
        self.server.validate(&mut p);
        self.upstream.validate(&mut p);
        self.cache.validate(&mut p);
        self.quota.validate(&mut p, self.quota_redis_url().is_some());
        self.redis.validate(&mut p);
        validate_log(&self.log, &mut p);
        validate_tracing(&self.tracing, &mut p);
        if self.admin.token_sha256.is_none() && self.admin.metrics_auth {
            // Nothing could ever scrape it.
            p.push("admin.metrics_auth: needs admin.token_sha256".into());
        }
        if !checks.skip_secrets {
            if let Err(e) = self.upstream_key() {
                p.push(e);
            }
        }
        validate_teams(&self.teams, &mut p);
        if !checks.demo {
            refuse_demo_tokens(&self.teams, self.admin.token_sha256.as_ref(), &mut p);
        }
        let path = self.reservation_path_secs();
        if self.quota.reservation_lease_secs < path {
            // A reservation must outlive the whole path it covers (fair
            // queue, upstream call, settle), or a slow call's credits would
            // lapse into spend while the call still runs.
            p.push(format!(
                "quota.reservation_lease_secs: must be at least upstream.max_queue_wait_secs + upstream.timeout_secs + {SETTLE_MARGIN_SECS} ({path})"
            ));
        }
        // A replica that gives up waiting for a peer's lease before the
        // peer's path can have ended buys the key a second time. The peer's
        // lease covers the same path as a reservation (queue, call, settle:
        // `app` gives it `reservation_path_secs`), so the wait does too.
        let path_ms = path.saturating_mul(1000);
        if self.cache.coalesce_wait_ms < path_ms {
            p.push(format!(
                "cache.coalesce_wait_ms: must be at least (upstream.max_queue_wait_secs + upstream.timeout_secs + {SETTLE_MARGIN_SECS}) * 1000 ({path_ms})"
            ));
        }
        p
    }
}

/// Time a reservation keeps beyond the fair queue's bound and the upstream
/// call's deadline: the queue's slack (`scheduler::QUEUE_SLACK`, 1 s) and
/// the settle (retried against a Redis that blips).
pub(crate) const SETTLE_MARGIN_SECS: u64 = 5;

impl Config {
    /// The Redis the budgets live in when `quota.store = "redis"`: its own
    /// `quota.redis_url`, else the cache's.
    pub(crate) fn quota_redis_url(&self) -> Option<&Secret> {
        self.quota.redis_url.as_ref().or(self.cache.redis_url.as_ref())
    }

    /// The longest a live reservation's path can take: the bounded wait in
    /// the fair queue, the upstream call's deadline, and the settle.
    pub(crate) fn reservation_path_secs(&self) -> u64 {
        self.upstream
            .max_queue_wait_secs
            .saturating_add(self.upstream.timeout_secs)
            .saturating_add(SETTLE_MARGIN_SECS)
    }
}

#[cfg(test)]
mod tests;
