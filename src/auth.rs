//! Team authentication: the token from `X-API-Key` or `Authorization:
//! Bearer` is hashed with SHA-256 and compared in constant time with every
//! team's `token_sha256`. Plaintext tokens are never stored or logged.
//!
//! A token that matched once is recognised after that by a keyed hash of
//! it (SipHash, the std hasher, under two random 64-bit key pairs drawn at
//! start: a 128-bit pseudo-random function of the token), not by SHA-256
//! again: a few dozen instructions against thousands. The memo holds only
//! tokens that matched (one per app at most; a reload starts an empty
//! one) and never a token's text; its lookup's timing depends only on the
//! keyed hash, which tells nobody without the keys anything of the token.
//!
//! The `authenticate` phase of the request path (docs/design.md §2), after
//! `resolve` decided the path is ours; the comparison itself is
//! `TokenHash::matches` (in constant time).

use crate::config::{TeamConfig, TokenHash};
use crate::error::GatewayError;
use governor::{DefaultDirectRateLimiter, Quota};
use http::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// One app of a team, by its token: what a request is attributed to.
pub struct Member {
    /// The app's name (`default` for a team's `token_sha256`).
    pub(crate) name: String,
    token_sha256: TokenHash,
    /// Unix milliseconds from which the token is refused.
    not_after: Option<u64>,
    /// The app's own credits per window, within its team's.
    pub(crate) credit_limit: Option<u64>,
    /// The ledger account of the app's spend: set when its team names its
    /// apps (`tokens`); a team of one token keeps one account, as before.
    pub(crate) account: Option<String>,
    /// Unix milliseconds of this token's last request here, to the second
    /// (0: none since this process started); carried over a reload.
    last_used: Arc<AtomicU64>,
    /// The day (since the epoch) the token's coming end was last logged.
    warned_day: Arc<AtomicU64>,
}

/// How long before its `not_after` a token still in use is reported (ms).
pub(crate) const EXPIRY_NOTICE_MS: u64 = 7 * 86_400_000;

impl Member {
    /// Unix milliseconds of the last request with this token (`None`: none
    /// since start).
    pub(crate) fn last_used(&self) -> Option<u64> {
        Some(self.last_used.load(Ordering::Relaxed)).filter(|t| *t > 0)
    }

    /// A request with this token at `now_ms`: written only when the second
    /// changed, so that the apps' requests on every core do not all write
    /// one shared word.
    fn used_at(&self, now_ms: u64) {
        let second = now_ms - now_ms % 1000;
        if self.last_used.load(Ordering::Relaxed) != second {
            self.last_used.store(second, Ordering::Relaxed);
        }
    }

    /// Unix milliseconds from which the token is refused.
    pub(crate) fn not_after(&self) -> Option<u64> {
        self.not_after
    }

    /// Whether the token ends within [`EXPIRY_NOTICE_MS`] of `now_ms`, and
    /// whether this is the first such use today (to log once a day).
    pub(crate) fn ending_soon(&self, now_ms: u64) -> Option<bool> {
        let end = self.not_after?;
        if end.saturating_sub(now_ms) > EXPIRY_NOTICE_MS {
            return None;
        }
        let today = now_ms / 86_400_000;
        Some(self.warned_day.swap(today, Ordering::Relaxed) != today)
    }
}

impl PartialEq for Member {
    fn eq(&self, other: &Member) -> bool {
        self.name == other.name && self.token_sha256 == other.token_sha256
    }
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("name", &self.name).finish()
    }
}

/// One team as the request path sees it.
pub struct Team {
    /// A metric label, from the config's bounded set.
    pub(crate) name: String,
    /// Its apps, one per token.
    pub(crate) members: Vec<Arc<Member>>,
    /// Credits per window; `None` is unlimited.
    pub(crate) credit_limit: Option<u64>,
    /// `X-Credits-Limit` of the team's answers, formatted once per config.
    pub(crate) limit_header: Option<http::HeaderValue>,
    /// The team's own request rate; `None` is no limit of its own.
    pub(crate) requests_per_minute: Option<u32>,
    /// `clamp_to_budget`: pages clamped to the remaining credits.
    pub(crate) clamp_to_budget: bool,
    /// Enforces `requests_per_minute` (docs/design.md §2, `limit_team`). Rebuilt on reload.
    limiter: Option<DefaultDirectRateLimiter>,
    /// Authenticated requests since start (admin API). Shared with the
    /// same-named team of the table a reload replaces, so it survives it.
    pub(crate) requests: Arc<std::sync::atomic::AtomicU64>,
    /// Requests of this team in flight now; carried over a reload too.
    in_flight: Arc<AtomicUsize>,
}

/// One of a team's requests in flight, until dropped.
pub(crate) struct TeamInFlight(Arc<AtomicUsize>);

impl Drop for TeamInFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token hash: not secret, but nobody needs it in a log.
        f.debug_struct("Team")
            .field("name", &self.name)
            .field("credit_limit", &self.credit_limit)
            .finish()
    }
}

impl PartialEq for Team {
    fn eq(&self, other: &Team) -> bool {
        self.name == other.name
    }
}

impl Team {
    /// The app of that name, in this (the live) table.
    pub(crate) fn member(&self, name: &str) -> Option<&Arc<Member>> {
        self.members.iter().find(|a| a.name == name)
    }

    /// Counts one more request in flight, unless `limit` are already.
    pub(crate) fn enter(&self, limit: usize) -> Option<TeamInFlight> {
        // A compare-and-swap loop (`fetch_update` is deprecated on newer
        // toolchains): never counts past `limit`, even for a moment.
        let mut n = self.in_flight.load(Ordering::Acquire);
        loop {
            if n >= limit {
                return None;
            }
            match self
                .in_flight
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(TeamInFlight(self.in_flight.clone())),
                Err(now) => n = now,
            }
        }
    }

    /// The team's own rate: `Err(seconds to wait)` when exceeded.
    pub(crate) fn check_rate(&self) -> Result<(), u64> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
            wait.as_secs_f64().ceil().max(1.0) as u64
        })
    }
}

/// Who a token is: its team and its app.
pub type Caller = (Arc<Team>, Arc<Member>);

/// The memo's hasher: its keys are keyed hashes already, so their low 64
/// bits serve as the hash (not hashed a third time).
#[derive(Default)]
struct MacBits(u64);

impl Hasher for MacBits {
    fn write(&mut self, bytes: &[u8]) {
        // Only `u128` keys are hashed with it; fold anything else.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Every configured team; replaced whole on reload.
#[derive(Default)]
pub struct Teams {
    teams: Vec<Arc<Team>>,
    /// Tokens that matched, by their keyed hash (see the module doc).
    memo: RwLock<HashMap<u128, Caller, BuildHasherDefault<MacBits>>>,
    /// The two SipHash keys of the memo, random per table.
    keys: (RandomState, RandomState),
}

impl Teams {
    /// Builds the table from loaded config.
    pub fn from_config(teams: &[TeamConfig]) -> Teams {
        Teams::default().reloaded(teams)
    }

    /// The table a reload swaps in: built from `teams`, each team's request
    /// counter carried over from this table's team of the same name.
    pub(crate) fn reloaded(&self, teams: &[TeamConfig]) -> Teams {
        let teams = teams
            .iter()
            .map(|t| {
                let limiter = t
                    .requests_per_minute
                    .and_then(NonZeroU32::new)
                    .map(|rpm| DefaultDirectRateLimiter::direct(Quota::per_minute(rpm)));
                let old = self.by_name(&t.name);
                let apps = t
                    .apps()
                    .map(|a| {
                        let before = old.and_then(|o| o.member(&a.name));
                        Arc::new(Member {
                            account: t.has_apps().then(|| crate::ledger::app_account(&t.name, &a.name)),
                            token_sha256: a.token_sha256,
                            not_after: a.not_after.map(|at| u64::try_from(at.timestamp_millis()).unwrap_or(0)),
                            credit_limit: a.credit_limit,
                            last_used: before.map(|b| b.last_used.clone()).unwrap_or_default(),
                            warned_day: before.map(|b| b.warned_day.clone()).unwrap_or_default(),
                            name: a.name,
                        })
                    })
                    .collect();
                Arc::new(Team {
                    name: t.name.clone(),
                    members: apps,
                    credit_limit: t.credit_limit,
                    limit_header: t.credit_limit.map(http::HeaderValue::from),
                    requests_per_minute: t.requests_per_minute,
                    clamp_to_budget: t.clamp_to_budget,
                    limiter,
                    requests: self
                        .by_name(&t.name)
                        .map(|old| old.requests.clone())
                        .unwrap_or_default(),
                    in_flight: self
                        .by_name(&t.name)
                        .map(|old| old.in_flight.clone())
                        .unwrap_or_default(),
                })
            })
            .collect();
        Teams {
            teams,
            ..Teams::default()
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Team>> {
        self.teams.iter()
    }

    pub(crate) fn by_name(&self, name: &str) -> Option<&Arc<Team>> {
        self.teams.iter().find(|t| t.name == name)
    }

    /// The team and app whose token the request carries; a token past
    /// its `not_after` is refused (401, "Token expired"). (The pipeline
    /// picks the credentials out of its one pass over the headers.)
    #[cfg(test)]
    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, GatewayError> {
        self.authenticate_with(Credentials::of(headers))
    }

    /// [`authenticate`](Self::authenticate) by the credential headers
    /// already picked out of the request.
    pub(crate) fn authenticate_with(&self, credentials: Credentials<'_>) -> Result<Caller, GatewayError> {
        let token = credentials.token()?;
        let (team, app) = self.find_token(token).ok_or(GatewayError::InvalidCredential)?;
        // A token's end and its last use are seconds-grained: the coarse clock.
        let now = crate::clock::coarse_now_ms();
        if app.not_after.is_some_and(|end| now >= end) {
            return Err(GatewayError::ExpiredCredential);
        }
        team.requests.fetch_add(1, Ordering::Relaxed);
        app.used_at(now);
        Ok((team, app))
    }

    /// Looks a plaintext token up. Every app's hash is compared, matching or
    /// not, so the time taken does not depend on which team (if any) matched.
    /// A token seen to match before is found by its keyed hash.
    pub fn find_token(&self, token: &str) -> Option<Caller> {
        let mac = self.keyed_hash(token);
        if let Some(caller) = self.memo.read().unwrap_or_else(|p| p.into_inner()).get(&mac) {
            return Some(caller.clone());
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for team in &self.teams {
            for app in &team.members {
                if bool::from(app.token_sha256.matches(&digest)) {
                    found = Some((team, app));
                }
            }
        }
        let found = found.map(|(t, a)| (t.clone(), a.clone()))?;
        // Only a token that matched is remembered: the memo's size is
        // bounded by the table's, whatever unknown tokens are tried.
        self.memo
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(mac, found.clone());
        Some(found)
    }

    /// The token under the table's two SipHash keys: 128 bits.
    fn keyed_hash(&self, token: &str) -> u128 {
        let (a, b) = (&self.keys.0, &self.keys.1);
        (u128::from(a.hash_one(token)) << 64) | u128::from(b.hash_one(token))
    }
}

/// Whether a request carries anything that may be a team's credential
/// (the overload manager counts a stream without one as anonymous before
/// its handler runs).
pub(crate) fn has_credential(headers: &HeaderMap) -> bool {
    headers.contains_key(&X_API_KEY) || headers.contains_key(AUTHORIZATION)
}

/// The headers that may carry a team's credential, each seen at most once
/// (a repeated one is refused, not guessed at).
#[derive(Clone, Copy, Default)]
pub(crate) struct Credentials<'a> {
    pub(crate) api_key: Once<'a>,
    pub(crate) authorization: Once<'a>,
}

/// A header that may appear once: absent, its one value, or repeated.
#[derive(Clone, Copy, Default)]
pub(crate) enum Once<'a> {
    #[default]
    Absent,
    One(&'a HeaderValue),
    Repeated,
}

impl<'a> Once<'a> {
    /// One more value of the header seen.
    fn see(&mut self, value: &'a HeaderValue) {
        *self = match self {
            Once::Absent => Once::One(value),
            _ => Once::Repeated,
        };
    }

    fn text(self) -> Result<Option<&'a str>, GatewayError> {
        match self {
            Once::Absent => Ok(None),
            Once::Repeated => Err(GatewayError::ConflictingCredentials),
            Once::One(value) => {
                let text = value.to_str().map_err(|_| GatewayError::InvalidCredential)?;
                Ok(Some(text.trim()))
            }
        }
    }
}

impl<'a> Credentials<'a> {
    /// The credential headers of `headers`.
    #[cfg(test)]
    pub(crate) fn of(headers: &'a HeaderMap) -> Credentials<'a> {
        let mut credentials = Credentials::default();
        for (name, value) in headers {
            credentials.see(name, value);
        }
        credentials
    }

    /// Takes one header of a pass over the request's: `true` when it is
    /// a credential header (the one list of them).
    pub(crate) fn see(&mut self, name: &HeaderName, value: &'a HeaderValue) -> bool {
        let header = if *name == X_API_KEY {
            &mut self.api_key
        } else if *name == AUTHORIZATION {
            &mut self.authorization
        } else {
            return false;
        };
        header.see(value);
        true
    }

    /// The one credential of a request. Repeated or disagreeing
    /// credentials are refused rather than guessed at: a proxy in front
    /// might have added one.
    fn token(self) -> Result<&'a str, GatewayError> {
        let api_key = self.api_key.text()?;
        let bearer = match self.authorization.text()? {
            Some(value) => bearer_token(value),
            None => None,
        };
        match (api_key, bearer) {
            (Some(a), Some(b)) if a != b => Err(GatewayError::ConflictingCredentials),
            (Some(token), _) | (None, Some(token)) if !token.is_empty() => Ok(token),
            _ => Err(GatewayError::MissingCredential),
        }
    }
}

/// A typed name: a `&str` name is parsed again on every lookup.
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The token of an `Authorization: Bearer <token>` value.
pub(crate) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// SHA-256 of a token as lowercase hex: what `token_sha256` holds.
pub fn token_sha256_hex(token: &str) -> String {
    TokenHash::of(token).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn teams() -> Teams {
        Teams::from_config(&[
            TeamConfig {
                name: "growth".into(),
                token_sha256: Some(TokenHash::of("tok-growth")),
                tokens: Vec::new(),
                credit_limit: Some(10),
                requests_per_minute: None,
                clamp_to_budget: false,
            },
            TeamConfig {
                name: "ops".into(),
                token_sha256: Some(TokenHash::of("tok-ops")),
                tokens: Vec::new(),
                credit_limit: None,
                requests_per_minute: None,
                clamp_to_budget: false,
            },
        ])
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn both_token_styles_find_the_team() {
        let t = teams();
        assert_eq!(
            t.authenticate(&headers(&[("x-api-key", "tok-ops")])).unwrap().0.name,
            "ops"
        );
        let bearer = headers(&[("authorization", "Bearer tok-growth")]);
        assert_eq!(t.authenticate(&bearer).unwrap().0.name, "growth");
        let lower = headers(&[("authorization", "bearer tok-growth")]);
        assert_eq!(t.authenticate(&lower).unwrap().0.name, "growth");
    }

    #[test]
    fn missing_wrong_and_conflicting_credentials() {
        let t = teams();
        assert_eq!(t.authenticate(&headers(&[])), Err(GatewayError::MissingCredential));
        assert_eq!(
            t.authenticate(&headers(&[("x-api-key", "")])),
            Err(GatewayError::MissingCredential)
        );
        assert_eq!(
            t.authenticate(&headers(&[("authorization", "Basic abc")])),
            Err(GatewayError::MissingCredential)
        );
        assert_eq!(
            t.authenticate(&headers(&[("x-api-key", "nope")])),
            Err(GatewayError::InvalidCredential)
        );
        assert_eq!(
            t.authenticate(&headers(&[
                ("x-api-key", "tok-ops"),
                ("authorization", "Bearer tok-growth")
            ])),
            Err(GatewayError::ConflictingCredentials)
        );
        assert_eq!(
            t.authenticate(&headers(&[("x-api-key", "tok-ops"), ("x-api-key", "tok-ops")])),
            Err(GatewayError::ConflictingCredentials)
        );
        let same = headers(&[("x-api-key", "tok-ops"), ("authorization", "Bearer tok-ops")]);
        assert_eq!(t.authenticate(&same).unwrap().0.name, "ops");
    }

    #[test]
    fn the_memo_holds_only_tokens_that_matched() {
        let t = teams();
        for _ in 0..3 {
            assert_eq!(
                t.find_token("tok-ops").map(|t| t.0.name.clone()).as_deref(),
                Some("ops")
            );
            assert!(t.find_token("tok-nope").is_none());
            // A prefix or extension of a known token is another token.
            assert!(t.find_token("tok-op").is_none());
            assert!(t.find_token("tok-opss").is_none());
        }
        assert_eq!(t.memo.read().unwrap().len(), 1, "unknown tokens are not remembered");
        assert_eq!(t.find_token("tok-growth").unwrap().0.name, "growth");
        assert_eq!(t.memo.read().unwrap().len(), 2);
        // A reload starts empty: a token the new table no longer has is refused.
        let only_growth = t.reloaded(&[TeamConfig {
            name: "growth".into(),
            token_sha256: Some(TokenHash::of("tok-growth")),
            tokens: Vec::new(),
            credit_limit: Some(10),
            requests_per_minute: None,
            clamp_to_budget: false,
        }]);
        assert!(only_growth.find_token("tok-ops").is_none());
        assert_eq!(only_growth.find_token("tok-growth").unwrap().0.name, "growth");
    }

    #[test]
    fn each_app_token_finds_its_team_and_app_and_an_ended_one_is_refused() {
        use crate::config::TokenConfig;
        let app = |name: &str, token: &str, not_after: Option<&str>| TokenConfig {
            name: name.into(),
            token_sha256: TokenHash::of(token),
            not_after: not_after.map(|t| t.parse().expect("RFC 3339")),
            credit_limit: None,
        };
        let t = Teams::from_config(&[TeamConfig {
            name: "growth".into(),
            token_sha256: Some(TokenHash::of("tok-old")),
            tokens: vec![
                app("web", "tok-web", Some("2999-01-01T00:00:00Z")),
                app("batch", "tok-batch", Some("2001-01-01T00:00:00Z")),
            ],
            credit_limit: Some(10),
            requests_per_minute: None,
            clamp_to_budget: false,
        }]);
        let who = |token: &'static str| t.authenticate(&headers(&[("x-api-key", token)]));
        let (team, web) = who("tok-web").expect("web");
        assert_eq!((team.name.as_str(), web.name.as_str()), ("growth", "web"));
        assert_eq!(web.account.as_deref(), Some("growth/web"));
        assert!(web.last_used().is_some(), "its use is recorded");
        let (_, old) = who("tok-old").expect("the team's token_sha256");
        assert_eq!(old.name, "default");
        for _ in 0..2 {
            // Refused at every use, memoized or not.
            assert_eq!(who("tok-batch").err(), Some(GatewayError::ExpiredCredential));
        }
        assert_eq!(web.ending_soon(crate::clock::now_ms()), None, "ends in 2999");
        assert_eq!(
            web.ending_soon(web.not_after().unwrap() - 3_600_000),
            Some(true),
            "first today"
        );
        assert_eq!(
            web.ending_soon(web.not_after().unwrap() - 3_000_000),
            Some(false),
            "once a day"
        );
        assert_eq!(team.requests.load(Ordering::Relaxed), 2, "refused uses are not counted");
    }

    #[test]
    fn hash_matches_sha256sum() {
        assert_eq!(
            token_sha256_hex("pgw_demo_growth"),
            "a3e92f2d680ed5bb92cd6079860eb5f2cf999286d3e5209b28d201b24ea57bc4"
        );
    }
}
