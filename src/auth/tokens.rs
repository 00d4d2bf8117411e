//! The token table: token → team and member. A token is hashed with
//! SHA-256 and compared in constant time with every member's
//! `token_sha256` (`TokenHash::matches`). Plaintext tokens are never
//! stored or logged.
//!
//! A token that matched once is recognised after that by a keyed hash of
//! it (SipHash, the std hasher, under two random 64-bit key pairs drawn at
//! start: a 128-bit pseudo-random function of the token), not by SHA-256
//! again: a few dozen instructions against thousands. The memo holds only
//! tokens that matched (one per member at most; a reload starts an empty
//! one) and never a token's text; its lookup's timing depends only on the
//! keyed hash, which tells nobody without the keys anything of the token.

use super::admission::rate_limiter;
use super::{tenant_of, Caller, Credentials, Member, Team};
use crate::config::{TeamConfig, TokenHash};
use crate::error::GatewayError;
#[cfg(test)]
use http::header::HeaderMap;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

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

    /// The table a reload swaps in: built from `teams`, each team's
    /// counters (requests, in flight, its members' last use) carried over
    /// from this table's team of the same name.
    pub(crate) fn reloaded(&self, teams: &[TeamConfig]) -> Teams {
        Teams {
            teams: teams.iter().map(|t| Arc::new(self.successor(t))).collect(),
            ..Teams::default()
        }
    }

    /// The team `config` describes, as it replaces this table's team of
    /// the same name.
    fn successor(&self, config: &TeamConfig) -> Team {
        let old = self.by_name(&config.name);
        let members = config
            .apps()
            .map(|token| {
                let before = old.and_then(|o| o.member(&token.name));
                Arc::new(Member {
                    account: config
                        .has_apps()
                        .then(|| crate::ledger::app_account(&config.name, &token.name)),
                    token_sha256: token.token_sha256,
                    not_after: token
                        .not_after
                        .map(|at| u64::try_from(at.timestamp_millis()).unwrap_or(0)),
                    credit_limit: token.credit_limit,
                    bulk: token.class == crate::config::AppClass::Bulk,
                    last_used: before.map(|b| b.last_used.clone()).unwrap_or_default(),
                    warned_day: before.map(|b| b.warned_day.clone()).unwrap_or_default(),
                    name: token.name,
                })
            })
            .collect();
        Team {
            name: config.name.clone(),
            tenant: tenant_of(&config.name),
            members,
            credit_limit: config.credit_limit,
            limit_header: config.credit_limit.map(http::HeaderValue::from),
            requests_per_minute: config.requests_per_minute,
            clamp_to_budget: config.clamp_to_budget,
            weight: config.weight,
            limiter: rate_limiter(config.requests_per_minute),
            requests: old.map(|o| o.requests.clone()).unwrap_or_default(),
            in_flight: old.map(|o| o.in_flight.clone()).unwrap_or_default(),
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Team>> {
        self.teams.iter()
    }

    pub(crate) fn by_name(&self, name: &str) -> Option<&Arc<Team>> {
        self.teams.iter().find(|t| t.name == name)
    }

    /// The team and member whose token the request carries; a token past
    /// its `not_after` is refused (401, "Token expired"). (The pipeline
    /// picks the credentials out of its one pass over the headers.)
    #[cfg(test)]
    pub(crate) fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, GatewayError> {
        self.authenticate_with(Credentials::of(headers))
            .map_err(GatewayError::from)
    }

    /// [`authenticate`](Self::authenticate) by the credential headers
    /// already picked out of the request; a refusal says whose token it
    /// was when one matched ([`Refused::ended`]).
    pub(crate) fn authenticate_with(&self, credentials: Credentials<'_>) -> Result<Caller, Refused> {
        let token = credentials.token()?;
        let (team, member) = self.find_token(token).ok_or(GatewayError::InvalidCredential)?;
        // A token's end and its last use are seconds-grained: the coarse clock.
        let now = crate::clock::coarse_now_ms();
        if member.not_after.is_some_and(|end| now >= end) {
            return Err(Refused {
                error: GatewayError::ExpiredCredential,
                ended: Some((team, member)),
            });
        }
        team.requests.fetch_add(1, Ordering::Relaxed);
        member.used_at(now);
        Ok((team, member))
    }

    /// Looks a plaintext token up. Every member's hash is compared,
    /// matching or not, so the time taken does not depend on which team
    /// (if any) matched. A token seen to match before is found by its
    /// keyed hash.
    pub fn find_token(&self, token: &str) -> Option<Caller> {
        let mac = self.keyed_hash(token);
        if let Some(caller) = self.memo.read().unwrap_or_else(|p| p.into_inner()).get(&mac) {
            return Some(caller.clone());
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for team in &self.teams {
            for member in &team.members {
                if bool::from(member.token_sha256.matches(&digest)) {
                    found = Some((team, member));
                }
            }
        }
        let found = found.map(|(t, m)| (t.clone(), m.clone()))?;
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

/// A request's token refused: why, and, for a token that matched but is
/// past its `not_after`, whose it was. That team and app are the 401's
/// (its access line and its `team` label), so the stragglers of a
/// rotation are traced to the app that has not moved; the request gets no
/// further than a refusal either way.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) error: GatewayError,
    /// The team and app of an ended token; `None` for every other refusal.
    pub(crate) ended: Option<Caller>,
}

impl From<GatewayError> for Refused {
    fn from(error: GatewayError) -> Refused {
        Refused { error, ended: None }
    }
}

impl From<Refused> for GatewayError {
    fn from(refused: Refused) -> GatewayError {
        refused.error
    }
}

/// SHA-256 of a token as lowercase hex: what `token_sha256` holds.
pub fn token_sha256_hex(token: &str) -> String {
    TokenHash::of(token).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A team of one token.
    fn team(name: &str, token: &str, credit_limit: Option<u64>) -> TeamConfig {
        TeamConfig {
            name: name.into(),
            token_sha256: Some(TokenHash::of(token)),
            not_after: None,
            tokens: Vec::new(),
            credit_limit,
            requests_per_minute: None,
            clamp_to_budget: false,
            weight: 1,
        }
    }

    /// Two teams of one token each: growth (`tok-growth`, 10 credits) and
    /// ops (`tok-ops`, unlimited).
    fn growth_and_ops() -> Teams {
        Teams::from_config(&[team("growth", "tok-growth", Some(10)), team("ops", "tok-ops", None)])
    }

    #[test]
    fn the_memo_holds_only_tokens_that_matched() {
        let t = growth_and_ops();
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
        let only_growth = t.reloaded(&[team("growth", "tok-growth", Some(10))]);
        assert!(only_growth.find_token("tok-ops").is_none());
        assert_eq!(only_growth.find_token("tok-growth").unwrap().0.name, "growth");
    }

    #[test]
    fn each_member_token_finds_its_team_and_member_and_an_ended_one_is_refused() {
        use crate::config::TokenConfig;
        let token = |name: &str, token: &str, not_after: Option<&str>| TokenConfig {
            name: name.into(),
            token_sha256: TokenHash::of(token),
            not_after: not_after.map(|t| t.parse().expect("RFC 3339")),
            credit_limit: None,
            class: Default::default(),
        };
        let t = Teams::from_config(&[TeamConfig {
            name: "growth".into(),
            token_sha256: Some(TokenHash::of("tok-old")),
            not_after: None,
            tokens: vec![
                token("web", "tok-web", Some("2999-01-01T00:00:00Z")),
                token("batch", "tok-batch", Some("2001-01-01T00:00:00Z")),
            ],
            credit_limit: Some(10),
            requests_per_minute: None,
            clamp_to_budget: false,
            weight: 1,
        }]);
        let who = |token: &'static str| t.authenticate(&headers(&[("x-api-key", token)]));
        let (team, web) = who("tok-web").expect("web");
        assert_eq!((team.name.as_str(), web.name.as_str()), ("growth", "web"));
        assert_eq!(web.account.as_deref(), Some("growth/web"));
        assert!(web.last_used().is_some(), "its use is recorded");
        let (_, old) = who("tok-old").expect("the team's token_sha256");
        assert_eq!(old.name, "default");
        for _ in 0..2 {
            // Refused at every use, memoized or not, saying whose it was.
            assert_eq!(who("tok-batch").err(), Some(GatewayError::ExpiredCredential));
            let refused = t
                .authenticate_with(Credentials::of(&headers(&[("x-api-key", "tok-batch")])))
                .expect_err("ended");
            let (team, app) = refused.ended.expect("an ended token's team and app are known");
            assert_eq!((team.name.as_str(), app.name.as_str()), ("growth", "batch"));
        }
        let unknown = t
            .authenticate_with(Credentials::of(&headers(&[("x-api-key", "tok-nope")])))
            .expect_err("unknown");
        assert!(unknown.ended.is_none(), "an unknown token is nobody's");
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
    fn a_teams_own_not_after_ends_its_default_token() {
        let mut ended = team("growth", "tok-old", None);
        ended.not_after = Some("2001-01-01T00:00:00Z".parse().expect("RFC 3339"));
        let t = Teams::from_config(&[ended, team("ops", "tok-ops", None)]);
        let refused = t
            .authenticate_with(Credentials::of(&headers(&[("x-api-key", "tok-old")])))
            .expect_err("past the team's not_after");
        assert_eq!(refused.error, GatewayError::ExpiredCredential);
        let (team, app) = refused.ended.expect("whose");
        assert_eq!((team.name.as_str(), app.name.as_str()), ("growth", "default"));
        assert!(app.account.is_none(), "a team of one token keeps one account");
        assert_eq!(
            t.authenticate(&headers(&[("x-api-key", "tok-ops")])).unwrap().0.name,
            "ops"
        );
    }

    #[test]
    fn a_team_keeps_its_tenant_across_a_reload() {
        let t = growth_and_ops();
        let growth = t.by_name("growth").expect("growth").tenant;
        assert_ne!(growth, t.by_name("ops").expect("ops").tenant);
        let reloaded = t.reloaded(&[TeamConfig {
            name: "growth".into(),
            token_sha256: Some(TokenHash::of("tok-new")),
            not_after: None,
            tokens: Vec::new(),
            credit_limit: None,
            requests_per_minute: None,
            clamp_to_budget: false,
            weight: 1,
        }]);
        assert_eq!(reloaded.by_name("growth").expect("growth").tenant, growth);
    }

    #[test]
    fn hash_matches_sha256sum() {
        assert_eq!(
            token_sha256_hex("pgw_demo_growth"),
            "a3e92f2d680ed5bb92cd6079860eb5f2cf999286d3e5209b28d201b24ea57bc4"
        );
    }

    /// A request's headers, in order (a name may repeat).
    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn both_token_styles_find_the_team() {
        let t = growth_and_ops();
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
        let t = growth_and_ops();
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
}
