//! Configuration: embedded commented defaults → file → environment, then
//! validation that reports every problem at once with its key path.
//!
//! Sits before everything: `main` loads a [`Config`], `app` builds the shared
//! state from it. The defaults file `config/defaults.toml` is compiled in, so
//! the binary runs with no file at all, and it is the reference of every key.

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The compiled-in defaults, also the documentation of every key.
pub const DEFAULTS_TOML: &str = include_str!("../config/defaults.toml");

/// The configuration the demo runs with (tokens are public demo values).
pub const DEMO_TOML: &str = include_str!("../config/demo.toml");

/// Prefix of environment overrides; `__` separates section and key.
pub const ENV_PREFIX: &str = "PERMIT_GATEWAY_";

/// The file read by `serve` and `check-config` when no `--config` is given.
pub const DEFAULT_CONFIG_PATH: &str = "config/gateway.toml";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub cache: CacheConfig,
    pub quota: QuotaConfig,
    pub admin: AdminConfig,
    pub log: LogConfig,
    #[serde(default)]
    pub teams: Vec<TeamConfig>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerConfig {
    pub listen: String,
    pub admin_listen: String,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub max_connections: usize,
    pub max_header_bytes: usize,
    pub max_uri_bytes: usize,
    pub header_read_timeout_secs: u64,
    pub http2_max_concurrent_streams: u32,
    pub shutdown_grace_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpstreamConfig {
    pub base_url: String,
    pub api_key: Option<Secret>,
    pub api_key_file: Option<PathBuf>,
    pub requests_per_minute: u32,
    pub timeout_secs: u64,
    pub connect_timeout_secs: u64,
    pub max_retries: u32,
    pub ca_file: Option<PathBuf>,
    pub max_response_bytes: usize,
    pub max_queue_wait_secs: u64,
    pub exhausted_backoff_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheConfig {
    pub memory_max_bytes: u64,
    pub default_ttl_secs: u64,
    pub redis_url: Option<Secret>,
    pub stale_grace_secs: u64,
    pub max_entry_bytes: usize,
    pub redis_key_prefix: String,
    pub redis_timeout_ms: u64,
    pub coalesce_wait_ms: u64,
    #[serde(default)]
    pub route_ttl_secs: std::collections::BTreeMap<String, u64>,
}

impl CacheConfig {
    /// Freshness of a route's answers; `None` never caches.
    pub fn ttl_for(&self, route: crate::route::Route) -> Option<std::time::Duration> {
        if route == crate::route::Route::Usage {
            return None;
        }
        let secs = self
            .route_ttl_secs
            .get(route.as_str())
            .copied()
            .unwrap_or(self.default_ttl_secs);
        (secs > 0).then(|| std::time::Duration::from_secs(secs))
    }

    fn validate(&self, p: &mut Vec<String>) {
        for (name, secs) in &self.route_ttl_secs {
            match crate::route::Route::ALL.iter().find(|r| r.as_str() == name) {
                None => p.push(format!("cache.route_ttl_secs.{name}: not a route name")),
                Some(crate::route::Route::Usage) if *secs > 0 => {
                    p.push("cache.route_ttl_secs.usage: /v2/usage is never cached".into())
                }
                _ => {}
            }
        }
        positive("cache.redis_timeout_ms", self.redis_timeout_ms, p);
        positive("cache.max_entry_bytes", self.max_entry_bytes as u64, p);
        if let Some(url) = &self.redis_url {
            check_redis_url("cache.redis_url", url, p);
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuotaConfig {
    pub window: String,
    pub store: String,
    pub path: PathBuf,
    pub redis_url: Option<Secret>,
    pub upgrade_url: String,
    pub redis_timeout_ms: u64,
    pub reservation_lease_secs: u64,
    pub fail_open: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminConfig {
    pub token_sha256: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogConfig {
    pub format: String,
    pub level: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TeamConfig {
    pub name: String,
    pub token_sha256: String,
    pub credit_limit: Option<u64>,
    pub requests_per_minute: Option<u32>,
}

/// A value that must never be printed: Debug and Serialize redact it.
///
/// Redis URLs are secrets too: they may carry a password.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself; call sites are the only places it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

/// Every problem found while loading, each with its key path.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<String>);

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
        let figment = figment_for(source)?;
        let config = extract(&figment)?;
        let problems = config.validate();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors(problems))
        }
    }

    /// The effective configuration as TOML, secrets redacted.
    pub fn redacted_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    /// The upstream key: `upstream.api_key`, else the contents of
    /// `upstream.api_key_file` (trimmed).
    pub fn upstream_key(&self) -> Result<Secret, String> {
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
    pub fn validate(&self) -> Vec<String> {
        let mut p = Vec::new();
        self.server.validate(&mut p);
        self.upstream.validate(&mut p);
        self.cache.validate(&mut p);
        self.quota.validate(&mut p, self.cache.redis_url.is_some());
        validate_log(&self.log, &mut p);
        if let Some(hash) = &self.admin.token_sha256 {
            check_sha256("admin.token_sha256", hash, &mut p);
        }
        if let Err(e) = self.upstream_key() {
            p.push(e);
        }
        validate_teams(&self.teams, &mut p);
        if self.quota.reservation_lease_secs <= self.upstream.timeout_secs {
            // A reservation must outlive the call it covers, or a slow call's
            // credits would be free to spend twice.
            p.push("quota.reservation_lease_secs: must be longer than upstream.timeout_secs".into());
        }
        p
    }
}

fn figment_for(source: Source<'_>) -> Result<Figment, ConfigErrors> {
    let mut figment = Figment::from(Toml::string(DEFAULTS_TOML));
    match source {
        Source::File(path) => {
            if !path.is_file() {
                return Err(ConfigErrors(vec![format!(
                    "--config: {} does not exist or is not a file",
                    path.display()
                )]));
            }
            figment = figment.merge(Toml::file(path));
        }
        Source::Default => {
            figment = figment.merge(Toml::file(DEFAULT_CONFIG_PATH));
        }
        Source::Text(text) => figment = figment.merge(Toml::string(text)),
    }
    Ok(figment.merge(Env::prefixed(ENV_PREFIX).split("__")))
}

/// Extracts the typed config, and separately lists every unknown key: serde
/// alone would stop at the first one.
fn extract(figment: &Figment) -> Result<Config, ConfigErrors> {
    let mut problems = Vec::new();
    match figment.extract::<figment::value::Value>() {
        Ok(value) => {
            let _ = serde_ignored::deserialize(&value, |path| {
                problems.push(format!("{path}: unknown key"));
            })
            .map(|_: Config| ());
        }
        Err(e) => problems.extend(e.into_iter().map(|e| e.to_string())),
    }
    match figment.extract::<Config>() {
        Ok(config) if problems.is_empty() => Ok(config),
        Ok(_) => Err(ConfigErrors(problems)),
        Err(e) => {
            problems.extend(e.into_iter().map(describe_figment_error));
            Err(ConfigErrors(problems))
        }
    }
}

/// Figment errors name the key path; keep the message without the profile.
fn describe_figment_error(e: figment::Error) -> String {
    let path = e.path.join(".");
    let kind = e.kind.to_string();
    if path.is_empty() {
        kind
    } else {
        format!("{path}: {kind}")
    }
}

impl ServerConfig {
    fn validate(&self, p: &mut Vec<String>) {
        check_addr("server.listen", &self.listen, p);
        check_addr("server.admin_listen", &self.admin_listen, p);
        // Port 0 (tests) binds two different free ports.
        if self.listen == self.admin_listen && !self.listen.ends_with(":0") {
            p.push("server.admin_listen: must differ from server.listen".into());
        }
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) => p.push("server.tls_key_file: required with tls_cert_file".into()),
            (None, Some(_)) => p.push("server.tls_cert_file: required with tls_key_file".into()),
            _ => {}
        }
        for (key, path) in [
            ("server.tls_cert_file", &self.tls_cert_file),
            ("server.tls_key_file", &self.tls_key_file),
        ] {
            if let Some(path) = path {
                if !path.is_file() {
                    p.push(format!("{key}: {} does not exist", path.display()));
                }
            }
        }
        positive("server.max_connections", self.max_connections as u64, p);
        if self.max_header_bytes < 8192 {
            p.push("server.max_header_bytes: must be at least 8192".into());
        }
        if self.max_uri_bytes < 256 {
            p.push("server.max_uri_bytes: must be at least 256".into());
        }
        positive("server.header_read_timeout_secs", self.header_read_timeout_secs, p);
        positive(
            "server.http2_max_concurrent_streams",
            self.http2_max_concurrent_streams.into(),
            p,
        );
    }
}

impl UpstreamConfig {
    fn validate(&self, p: &mut Vec<String>) {
        match self.base_url.parse::<http::Uri>() {
            Ok(uri) if matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some() => {
                if uri.query().is_some() {
                    p.push("upstream.base_url: must not have a query".into());
                }
            }
            _ => p.push(format!("upstream.base_url: {:?} is not an http(s) URL", self.base_url)),
        }
        if self.api_key.is_some() && self.api_key_file.is_some() {
            p.push("upstream.api_key_file: set either api_key or api_key_file, not both".into());
        }
        positive("upstream.requests_per_minute", self.requests_per_minute.into(), p);
        positive("upstream.timeout_secs", self.timeout_secs, p);
        positive("upstream.connect_timeout_secs", self.connect_timeout_secs, p);
        if self.max_retries > 10 {
            p.push("upstream.max_retries: at most 10".into());
        }
        if let Some(ca) = &self.ca_file {
            if !ca.is_file() {
                p.push(format!("upstream.ca_file: {} does not exist", ca.display()));
            }
        }
        positive("upstream.max_response_bytes", self.max_response_bytes as u64, p);
    }
}

impl QuotaConfig {
    fn validate(&self, p: &mut Vec<String>, cache_redis: bool) {
        positive("quota.reservation_lease_secs", self.reservation_lease_secs, p);
        positive("quota.redis_timeout_ms", self.redis_timeout_ms, p);
        if !matches!(self.window.as_str(), "rolling_30d" | "calendar_month") {
            p.push(format!(
                "quota.window: {:?} is not \"rolling_30d\" or \"calendar_month\"",
                self.window
            ));
        }
        match self.store.as_str() {
            "file" => {}
            "redis" if self.redis_url.is_some() || cache_redis => {
                if let Some(url) = &self.redis_url {
                    check_redis_url("quota.redis_url", url, p);
                }
            }
            "redis" => p.push("quota.redis_url: the redis store needs quota.redis_url or cache.redis_url".into()),
            other => p.push(format!("quota.store: {other:?} is not \"file\" or \"redis\"")),
        }
    }
}

fn validate_log(log: &LogConfig, p: &mut Vec<String>) {
    if !matches!(log.format.as_str(), "human" | "json") {
        p.push(format!("log.format: {:?} is not \"human\" or \"json\"", log.format));
    }
    if tracing_subscriber::EnvFilter::try_new(&log.level).is_err() {
        p.push(format!("log.level: {:?} is not a valid filter", log.level));
    }
}

fn validate_teams(teams: &[TeamConfig], p: &mut Vec<String>) {
    let mut names = std::collections::HashSet::new();
    let mut hashes = std::collections::HashSet::new();
    for (i, team) in teams.iter().enumerate() {
        let at = format!("teams[{i}]");
        if !is_label(&team.name) {
            p.push(format!("{at}.name: {:?} must be 1-64 of [a-z0-9_-]", team.name));
        } else if !names.insert(team.name.as_str()) {
            p.push(format!("{at}.name: {:?} is used by another team", team.name));
        }
        if check_sha256(&format!("{at}.token_sha256"), &team.token_sha256, p)
            && !hashes.insert(team.token_sha256.to_ascii_lowercase())
        {
            p.push(format!("{at}.token_sha256: the same token is given to another team"));
        }
        if team.requests_per_minute == Some(0) {
            p.push(format!(
                "{at}.requests_per_minute: must be positive (omit for no limit)"
            ));
        }
    }
}

/// Team names become metric labels: short, lowercase, no surprises.
pub fn is_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn check_sha256(key: &str, value: &str, p: &mut Vec<String>) -> bool {
    let ok = value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit());
    if !ok {
        p.push(format!(
            "{key}: must be 64 hex characters (the SHA-256 of the token, see `permit-gateway token`)"
        ));
    }
    ok
}

fn check_redis_url(key: &str, url: &Secret, p: &mut Vec<String>) {
    if redis::Client::open(url.expose()).is_err() {
        // Never echo the URL: it may hold a password.
        p.push(format!(
            "{key}: not a valid redis URL (redis://, rediss://, redis+unix://)"
        ));
    }
}

fn check_addr(key: &str, value: &str, p: &mut Vec<String>) {
    if value.parse::<SocketAddr>().is_err() {
        p.push(format!("{key}: {value:?} is not an address like 0.0.0.0:8080"));
    }
}

fn positive(key: &str, value: u64, p: &mut Vec<String>) {
    if value == 0 {
        p.push(format!("{key}: must be positive"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "[upstream]\napi_key = \"k\"\n";

    fn load(text: &str) -> Result<Config, ConfigErrors> {
        Config::load(Source::Text(text))
    }

    #[test]
    fn defaults_alone_need_only_the_upstream_key() {
        let c = load(KEY).expect("defaults plus a key are valid");
        assert_eq!(c.upstream.requests_per_minute, 120);
        assert_eq!(c.quota.window, "rolling_30d");
        assert!(c.teams.is_empty());
    }

    #[test]
    fn demo_config_is_valid_with_a_key() {
        let text = format!("{DEMO_TOML}\n{KEY}");
        let c = load(&text).expect("demo config valid");
        assert_eq!(c.teams.len(), 2);
    }

    #[test]
    fn every_problem_is_reported_at_once_with_its_key_path() {
        let text = r#"
            [server]
            listen = "nope"
            [upstream]
            base_url = "ftp://x"
            [quota]
            window = "weekly"
            [[teams]]
            name = "Bad Name"
            token_sha256 = "abc"
            [[teams]]
            name = "ok"
            token_sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
            requests_per_minute = 0
        "#;
        let errs = load(text).expect_err("invalid").0;
        for key in [
            "server.listen",
            "upstream.base_url",
            "quota.window",
            "teams[0].name",
            "teams[0].token_sha256",
            "teams[1].requests_per_minute",
            "upstream.api_key",
        ] {
            assert!(errs.iter().any(|e| e.starts_with(key)), "{key} missing from {errs:#?}");
        }
    }

    #[test]
    fn unknown_keys_are_rejected_all_together() {
        let text = format!("{KEY}\n[server]\nlisten_port = 1\n[cache]\nttl = 5\n[bogus]\nx = 1\n");
        let errs = load(&text).expect_err("unknown keys").0;
        for key in ["server.listen_port", "cache.ttl", "bogus"] {
            assert!(
                errs.iter().any(|e| e.contains(key) && e.contains("unknown")),
                "{key}: {errs:#?}"
            );
        }
    }

    #[test]
    fn type_errors_name_their_key() {
        let text = format!("{KEY}timeout_secs = \"soon\"\n");
        let errs = load(&text).expect_err("type error").0;
        assert!(errs.iter().any(|e| e.starts_with("upstream.timeout_secs")), "{errs:#?}");
    }

    #[test]
    fn secrets_are_redacted_in_the_printed_config() {
        let text = "[upstream]\napi_key = \"super-secret-key\"\n[cache]\nredis_url = \"redis://:pw@h:6379\"\n";
        let c = load(text).expect("valid");
        let printed = c.redacted_toml();
        assert!(!printed.contains("super-secret-key"));
        assert!(!printed.contains(":pw@"));
        assert!(!format!("{c:?}").contains("super-secret-key"));
    }

    #[test]
    fn the_key_can_come_from_a_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("key");
        std::fs::write(&path, "from-file\n").expect("write");
        let text = format!("[upstream]\napi_key_file = {:?}\n", path.display().to_string());
        let c = load(&text).expect("valid");
        assert_eq!(c.upstream_key().expect("key").expose(), "from-file");
    }
}
