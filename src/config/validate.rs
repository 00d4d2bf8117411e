//! Validation: every semantic problem of a loaded [`Config`](super::Config),
//! each prefixed with its key path, all collected at once.

use super::{
    CacheConfig, LogConfig, QuotaConfig, QuotaStore, RedisConfig, Secret, ServerConfig, TeamConfig, TokenHash,
    TracingConfig, UpstreamConfig,
};

impl CacheConfig {
    pub(super) fn validate(&self, p: &mut Vec<String>) {
        // Names that are no route were refused while loading (`Route`'s serde).
        if self
            .route_ttl_secs
            .get(&crate::route::Route::Usage)
            .is_some_and(|secs| *secs > 0)
        {
            p.push("cache.route_ttl_secs.usage: /v2/usage is never cached".into());
        }
        positive("cache.redis_timeout_ms", self.redis_timeout_ms, p);
        if self.redis_connections > 64 {
            p.push("cache.redis_connections: at most 64".into());
        }
        if self.stale_while_revalidate_secs > self.stale_grace_secs {
            // Entries are dropped after the grace period: nothing to serve beyond it.
            p.push("cache.stale_while_revalidate_secs: must not exceed cache.stale_grace_secs".into());
        }
        positive("cache.max_entry_bytes", self.max_entry_bytes as u64, p);
        if self.freshness == super::Freshness::Release {
            if self.release_poll_secs == 0 {
                p.push("cache.freshness: \"release\" needs cache.release_poll_secs above 0".into());
            }
            positive("cache.release_max_age_secs", self.release_max_age_secs, p);
        }
        if self.redis_key_prefix.contains(['{', '}']) {
            // Redis Cluster hashes the first `{...}` of a key: braces in the
            // prefix would put every key in one slot and split scripts' keys.
            p.push("cache.redis_key_prefix: must not contain { or }".into());
        }
        if let Some(url) = &self.redis_url {
            check_redis_url("cache.redis_url", url, p);
        }
    }
}

impl ServerConfig {
    pub(super) fn validate(&self, p: &mut Vec<String>) {
        // Port 0 (tests) binds two different free ports.
        if self.listen == self.admin_listen && self.listen.port() != 0 {
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
        positive("server.admin_max_connections", self.admin_max_connections as u64, p);
        positive(
            "server.max_connections_per_peer",
            self.max_connections_per_peer as u64,
            p,
        );
        if self.http2_max_buffered_bytes < super::HTTP2_CHUNK_BYTES {
            p.push(format!(
                "server.http2_max_buffered_bytes: must be at least {}",
                super::HTTP2_CHUNK_BYTES
            ));
        }
        if self.max_header_bytes < 8192 {
            p.push("server.max_header_bytes: must be at least 8192".into());
        }
        if self.max_uri_bytes < 256 {
            p.push("server.max_uri_bytes: must be at least 256".into());
        }
        positive("server.header_read_timeout_secs", self.header_read_timeout_secs, p);
        positive("server.idle_timeout_secs", self.idle_timeout_secs, p);
        positive("server.write_timeout_secs", self.write_timeout_secs, p);
        positive(
            "server.http2_max_concurrent_streams",
            self.http2_max_concurrent_streams.into(),
            p,
        );
        if self.per_core_threads > 1024 {
            p.push("server.per_core_threads: at most 1024".into());
        }
    }
}

impl UpstreamConfig {
    pub(super) fn validate(&self, p: &mut Vec<String>) {
        // `base_url` was checked while loading (`BaseUrl`).
        if self.api_key.is_some() && self.api_key_file.is_some() {
            p.push("upstream.api_key_file: set either api_key or api_key_file, not both".into());
        }
        positive("upstream.requests_per_minute", self.requests_per_minute.into(), p);
        if let Some(burst) = self.burst {
            if burst == 0 || burst > self.requests_per_minute {
                p.push(format!(
                    "upstream.burst: {burst}: must be from 1 to upstream.requests_per_minute ({}); omit for the whole window",
                    self.requests_per_minute
                ));
            }
        }
        positive("upstream.timeout_secs", self.timeout_secs, p);
        positive("upstream.connect_timeout_secs", self.connect_timeout_secs, p);
        if self.batch_window_ms > 1000 {
            p.push("upstream.batch_window_ms: at most 1000 (every lookup that gathers company waits this long)".into());
        }
        if self.max_retries > 10 {
            p.push("upstream.max_retries: at most 10".into());
        }
        if let Some(ca) = &self.ca_file {
            if !ca.is_file() {
                p.push(format!("upstream.ca_file: {} does not exist", ca.display()));
            }
        }
        positive("upstream.max_response_bytes", self.max_response_bytes as u64, p);
        positive("upstream.max_retry_after_secs", self.max_retry_after_secs, p);
    }
}

impl QuotaConfig {
    /// `has_redis`: [`Config::quota_redis_url`](super::Config::quota_redis_url) finds one.
    pub(super) fn validate(&self, p: &mut Vec<String>, has_redis: bool) {
        positive("quota.reservation_lease_secs", self.reservation_lease_secs, p);
        positive("quota.redis_timeout_ms", self.redis_timeout_ms, p);
        // A test's shift of a day or a month; anything larger is a mistake.
        if self.clock_offset_secs.unsigned_abs() > 400 * 86_400 {
            p.push("quota.clock_offset_secs: must be within 400 days of 0 (tests only)".into());
        }
        if self.store != QuotaStore::Redis {
            return;
        }
        match &self.redis_url {
            Some(url) => check_redis_url("quota.redis_url", url, p),
            None if !has_redis => {
                p.push("quota.redis_url: the redis store needs quota.redis_url or cache.redis_url".into())
            }
            None => {}
        }
    }
}

pub(super) fn validate_log(log: &LogConfig, p: &mut Vec<String>) {
    // `level` was checked while loading (`LogLevel`).
    if log.queue_lines == 0 {
        p.push("log.queue_lines: must be at least 1".into());
    }
}

pub(super) fn validate_tracing(tracing: &TracingConfig, p: &mut Vec<String>) {
    if let Some(endpoint) = &tracing.otlp_endpoint {
        let ok = endpoint
            .parse::<http::Uri>()
            .is_ok_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some());
        if !ok {
            p.push(format!(
                "tracing.otlp_endpoint: {endpoint:?} is not a URL like http://127.0.0.1:4318"
            ));
        }
    }
    if tracing.service_name.is_empty() {
        p.push("tracing.service_name: must not be empty".into());
    }
    if !(0.0..=1.0).contains(&tracing.sample_ratio) {
        p.push(format!(
            "tracing.sample_ratio: {} is not between 0 and 1",
            tracing.sample_ratio
        ));
    }
}

/// Values the `team` label already has for requests of no team: a team of
/// that name would merge into them on every dashboard.
const RESERVED_TEAM_NAMES: [&str; 2] = ["unauthenticated", "other"];

pub(super) fn validate_teams(teams: &[TeamConfig], p: &mut Vec<String>) {
    let mut names = std::collections::HashMap::new();
    let mut hashes = std::collections::HashMap::new();
    for (i, team) in teams.iter().enumerate() {
        // The key by the team's place, then the team by its name: the
        // name is what the operator looks for.
        let at = format!("teams[{i}]");
        let team_name = &team.name;
        if !is_label(team_name) {
            p.push(format!("{at}.name: team {team_name:?}: must be 1-64 of [a-z0-9_-]"));
        } else if RESERVED_TEAM_NAMES.contains(&team_name.as_str()) {
            p.push(format!(
                "{at}.name: team {team_name:?}: reserved: the metrics' team label uses it for requests of no team"
            ));
        } else if let Some(first) = names.insert(team_name.as_str(), i) {
            p.push(format!(
                "{at}.name: team {team_name:?}: teams[{first}] has the same name"
            ));
        }
        if team.token_sha256.is_none() && team.tokens.is_empty() {
            p.push(format!(
                "{at}.token_sha256: team {team_name:?}: has no token: set token_sha256 or give it [[teams.tokens]]"
            ));
        }
        if team.not_after.is_some() && team.token_sha256.is_none() {
            // Nothing it could end: an app's end goes in its own entry.
            p.push(format!(
                "{at}.not_after: team {team_name:?}: ends the team's token_sha256, which is not set; \
                 give an app's end as not_after in its [[teams.tokens]] entry"
            ));
        }
        let mut apps = std::collections::HashMap::new();
        for (k, app) in team.apps().enumerate() {
            let key = app_key(team, i, k);
            let who = who(team, &app.name);
            let app_name = &app.name;
            if !is_label(app_name) {
                p.push(format!("{key}.name: {who}: must be 1-64 of [a-z0-9_-]"));
            } else if apps.insert(app_name.clone(), k).is_some() {
                let why = if app_name == crate::config::DEFAULT_APP && team.token_sha256.is_some() {
                    "the team's token_sha256 is its app \"default\" already"
                } else {
                    "another token of the team has the same name"
                };
                p.push(format!("{key}.name: {who}: {why}"));
            }
            let field = match key.ends_with("token_sha256") {
                true => key.clone(),
                false => format!("{key}.token_sha256"),
            };
            if let Some(other) = hashes.insert(app.token_sha256, who_at(team, i, &app.name)) {
                p.push(format!("{field}: {who}: the same token is given to {other}"));
            }
            if let (Some(app_limit), Some(team_limit)) = (app.credit_limit, team.credit_limit) {
                if app_limit > team_limit {
                    p.push(format!(
                        "{key}.credit_limit: {who}: {app_limit} is above the team's credit_limit ({team_limit}); an app's limit is its share of the team's"
                    ));
                }
            }
        }
        if team.requests_per_minute == Some(0) {
            p.push(format!(
                "{at}.requests_per_minute: team {team_name:?}: must be positive (omit for no limit)"
            ));
        }
        if !(1..=100).contains(&team.weight) {
            p.push(format!(
                "{at}.weight: team {team_name:?}: {}: must be from 1 to 100 (its share of the upstream rate against a team of weight 1)",
                team.weight
            ));
        }
    }
}

/// The key of a team's `k`th app ([`TeamConfig::apps`]): its
/// `token_sha256`, or its `tokens` entry.
fn app_key(team: &TeamConfig, i: usize, k: usize) -> String {
    match (team.token_sha256.is_some(), k) {
        (true, 0) => format!("teams[{i}].token_sha256"),
        (true, k) => format!("teams[{i}].tokens[{}]", k - 1),
        (false, k) => format!("teams[{i}].tokens[{k}]"),
    }
}

/// The team (and the app, where the team names its apps) a problem is of.
fn who(team: &TeamConfig, app: &str) -> String {
    match team.has_apps() {
        true => format!("team {:?}, app {app:?}", team.name),
        false => format!("team {:?}", team.name),
    }
}

/// [`who`] with the team's place: `teams[0] "growth"`.
fn who_at(team: &TeamConfig, i: usize, app: &str) -> String {
    match team.has_apps() {
        true => format!("teams[{i}] {:?}, app {app:?}", team.name),
        false => format!("teams[{i}] {:?}", team.name),
    }
}

/// Team names become metric labels: short, lowercase, no surprises.
fn is_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

impl RedisConfig {
    /// The files must be there and readable as PEM now, not at the first
    /// connection (which is lazy, and may come long after start-up).
    pub(super) fn validate(&self, p: &mut Vec<String>) {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) => p.push("redis.tls_key_file: required with redis.tls_cert_file".into()),
            (None, Some(_)) => p.push("redis.tls_cert_file: required with redis.tls_key_file".into()),
            _ => {}
        }
        if let Err(e) = crate::redis_backend::TlsFiles::load(
            self.tls_ca_file.as_deref(),
            self.tls_cert_file.as_deref(),
            self.tls_key_file.as_deref(),
        ) {
            p.push(e);
        }
    }
}

fn check_redis_url(key: &str, url: &Secret, p: &mut Vec<String>) {
    // Never echo the URL: it may hold a password.
    if let Err(e) = crate::redis_backend::Target::parse(url.expose()) {
        p.push(format!(
            "{key}: {e}; expected redis://, rediss://, redis+unix://, redis[s]+cluster://host:port,host:port or redis[s]+sentinel://host:port,host:port/service"
        ));
    }
}

fn positive(key: &str, value: u64, p: &mut Vec<String>) {
    if value == 0 {
        p.push(format!("{key}: must be positive"));
    }
}

/// A team (or the admin) whose token hash is one of the demo's public
/// tokens: anyone who has read the README holds that token. Refused
/// everywhere but the demo, naming the team and the token.
pub(super) fn refuse_demo_tokens(teams: &[TeamConfig], admin: Option<&TokenHash>, p: &mut Vec<String>) {
    let demo_token = |hash: &TokenHash| {
        super::DEMO_TOKENS
            .iter()
            .map(|(_, token)| *token)
            .chain([super::DEMO_ADMIN_TOKEN])
            .find(|token| TokenHash::of(token) == *hash)
    };
    for (i, team) in teams.iter().enumerate() {
        for (k, app) in team.apps().enumerate() {
            if let Some(token) = demo_token(&app.token_sha256) {
                let key = app_key(team, i, k);
                let field = match key.ends_with("token_sha256") {
                    true => key,
                    false => format!("{key}.token_sha256"),
                };
                p.push(format!(
                    "{field}: {} would accept the public demo token {token:?}; \
                     give it its own token (`permit-gateway token`)",
                    who(team, &app.name)
                ));
            }
        }
    }
    if let Some(token) = admin.and_then(demo_token) {
        p.push(format!(
            "admin.token_sha256: the admin API would accept the public demo token {token:?}; \
             make one of its own (`permit-gateway token`)"
        ));
    }
}

/// Teams whose hash is a placeholder (all zeros but a digit, as the
/// example config ships): valid, but no token hashes to it, so the team
/// cannot get in until someone pastes a real `token_sha256` line.
pub(super) fn placeholder_warnings(teams: &[TeamConfig]) -> Vec<String> {
    teams
        .iter()
        .enumerate()
        .filter(|(_, team)| {
            team.token_sha256
                .is_some_and(|h| h.to_string().bytes().filter(|b| *b != b'0').count() <= 1)
        })
        .map(|(i, team)| {
            format!(
                "teams[{i}].token_sha256: team {:?} has a placeholder hash that no token matches; \
                 paste the line `permit-gateway token` prints",
                team.name
            )
        })
        .collect()
}
