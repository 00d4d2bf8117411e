//! Team authentication, the `authenticate` phase of the request path
//! (docs/design.md §2), after `resolve` decided the path is ours, and the
//! `limit_team` phase after it. A request's token (from `X-API-Key` or
//! `Authorization: Bearer`) names a team and one of its members; the
//! team's admission limits then decide whether it runs now.
//!
//! - `credentials`: the token a request carries, read from its headers.
//! - `tokens`: the token table ([`Teams`]): token → team and member,
//!   rebuilt whole on reload.
//! - `admission`: a team's requests in flight and its own request rate.
//!
//! This file holds what they share: a [`Team`], its [`Member`]s, the
//! [`Caller`] a token resolves to, and the team's [`Tenant`].

mod admission;
mod credentials;
mod tokens;

pub(crate) use admission::TeamInFlight;
pub(crate) use credentials::{bearer_token, has_credential, Credentials};
// Named outside only by the pipeline's tests (`proxy::heads`).
#[cfg(test)]
pub(crate) use credentials::Once;
pub use tokens::{token_sha256_hex, Teams};

use crate::config::TokenHash;
use governor::DefaultDirectRateLimiter;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// One member of a team, by its token: what a request is attributed to.
pub struct Member {
    /// The member's name (`default` for a team's `token_sha256`).
    pub(crate) name: String,
    token_sha256: TokenHash,
    /// Unix milliseconds from which the token is refused.
    not_after: Option<u64>,
    /// The member's own credits per window, within its team's.
    pub(crate) credit_limit: Option<u64>,
    /// `class = "bulk"`: its calls take only the upstream rate that
    /// interactive calls leave.
    pub(crate) bulk: bool,
    /// The ledger account of the member's spend: set when its team names
    /// its members (`tokens`); a team of one token keeps one account.
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
    /// changed, so that the members' requests on every core do not all
    /// write one shared word.
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

/// A team as the pools it shares with others count it (the overload
/// manager's connection slots and answer bytes, the log queue): a hash of
/// its name, made once per team table. The same name gives the same
/// tenant in every table, so a reload changes nobody's share; two teams of
/// one hash share a share.
pub(crate) type Tenant = u64;

/// The tenant of the team named `name` (a fixed seed: the same in every
/// table and on every thread).
pub(crate) fn tenant_of(name: &str) -> Tenant {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x007e_4a17).hash_one(name)
}

/// One team as the request path sees it.
pub struct Team {
    /// A metric label, from the config's bounded set.
    pub(crate) name: String,
    /// Its tenant in the shared pools, from `name`.
    pub(crate) tenant: Tenant,
    /// Its members, one per token.
    pub(crate) members: Vec<Arc<Member>>,
    /// Credits per window; `None` is unlimited.
    pub(crate) credit_limit: Option<u64>,
    /// `X-Credits-Limit` of the team's answers, formatted once per config.
    pub(crate) limit_header: Option<http::HeaderValue>,
    /// The team's own request rate; `None` is no limit of its own.
    pub(crate) requests_per_minute: Option<u32>,
    /// `clamp_to_budget`: pages clamped to the remaining credits.
    pub(crate) clamp_to_budget: bool,
    /// Its share of the upstream rate (`weight`).
    pub(crate) weight: u32,
    /// Enforces `requests_per_minute` (docs/design.md §2, `limit_team`). Rebuilt on reload.
    limiter: Option<DefaultDirectRateLimiter>,
    /// Authenticated requests since start (admin API). Shared with the
    /// same-named team of the table a reload replaces, so it survives it.
    pub(crate) requests: Arc<AtomicU64>,
    /// Requests of this team in flight now; carried over a reload too.
    in_flight: Arc<AtomicUsize>,
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
    /// The member of that name, in this (the live) table.
    pub(crate) fn member(&self, name: &str) -> Option<&Arc<Member>> {
        self.members.iter().find(|m| m.name == name)
    }
}

/// Who a token is: its team and its member.
pub type Caller = (Arc<Team>, Arc<Member>);
