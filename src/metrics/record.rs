//! The typed recorders: one method per thing that happens, taking the
//! label values as types (a [`Route`], a [`Scope`], a status code), so the
//! call sites on the request path cannot misplace or misspell a label.
//! Team names are the one free-form label, and they come from config
//! (validated as 1–64 of `[a-z0-9_-]`).

use super::Metrics;
use crate::error::Spent;
use crate::route::Route;
use http::StatusCode;
use std::time::Duration;

/// `cache`: every [`crate::proxy::CacheState`], in the order of the hit
/// path's children (`labels::CACHE_STATES` is this list).
pub(super) const CACHE_STATES: [&str; 4] = ["hit", "miss", "stale", "bypass"];

/// The index of a cache state label in [`CACHE_STATES`].
fn cache_index(cache: &str) -> Option<usize> {
    CACHE_STATES.iter().position(|c| *c == cache)
}

/// Which limit refused a request with 429 (`scope` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The team's own `requests_per_minute`.
    Team,
    /// The shared upstream rate: the fair queue's wait would pass its bound,
    /// or the upstream itself said 429.
    Upstream,
}

impl Scope {
    pub(super) const fn as_str(self) -> &'static str {
        match self {
            Scope::Team => "team",
            Scope::Upstream => "upstream",
        }
    }
}

/// A cache tier (`tier` label); also which tier answered a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Memory,
    Redis,
    /// The disk tier (`cache::disk`).
    Disk,
}

impl Tier {
    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::Memory => "memory",
            Tier::Redis => "redis",
            Tier::Disk => "disk",
        }
    }
}

/// Why an answer cost a team nothing (`reason` label of
/// `gateway_credits_saved_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavedReason {
    /// Held in memory or Redis, coalesced on another request's fetch, or
    /// held by another key's page or records: every saving before the disk
    /// tier and the monthly windows.
    Cache,
    /// Served from the disk tier, which memory did not hold (after a
    /// restart, or beyond the memory tier's size).
    Disk,
    /// Monthly-metrics rows held from another window (`proxy::reuse`).
    Window,
    /// Held past its route TTL because the vendor's data release has not
    /// changed (`cache.freshness = "release"`, `cache::release`).
    Release,
}

impl SavedReason {
    /// The reason of an answer from a cache tier.
    pub const fn of_tier(tier: Tier) -> SavedReason {
        match tier {
            Tier::Disk => SavedReason::Disk,
            Tier::Memory | Tier::Redis => SavedReason::Cache,
        }
    }

    pub const ALL: [SavedReason; 4] = [
        SavedReason::Cache,
        SavedReason::Disk,
        SavedReason::Window,
        SavedReason::Release,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            SavedReason::Cache => "cache",
            SavedReason::Disk => "disk",
            SavedReason::Window => "window",
            SavedReason::Release => "release",
        }
    }
}

/// Why the disk tier dropped an entry or a write (`reason` label of
/// `gateway_cache_disk_drops_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DiskDrop {
    /// Larger than `cache.disk_max_bytes`: never written.
    TooLarge,
    /// The write queue was full: not written.
    QueueFull,
    /// Not written: the tier is off after an I/O error (a full disk).
    Degraded,
    /// Removed to keep the tier within `cache.disk_max_bytes`.
    Evicted,
    /// Failed its checksum when read: removed, never served.
    Corrupt,
    /// Found past its TTL and stale grace when read: removed.
    Expired,
    /// Not written: the volume's free space is at `cache.disk_reserve_bytes`,
    /// kept for the ledger beside the file.
    Reserve,
}

impl DiskDrop {
    pub(crate) const ALL: [DiskDrop; 7] = [
        DiskDrop::TooLarge,
        DiskDrop::QueueFull,
        DiskDrop::Degraded,
        DiskDrop::Evicted,
        DiskDrop::Corrupt,
        DiskDrop::Expired,
        DiskDrop::Reserve,
    ];

    pub(super) const fn as_str(self) -> &'static str {
        match self {
            DiskDrop::TooLarge => "too_large",
            DiskDrop::QueueFull => "queue_full",
            DiskDrop::Degraded => "degraded",
            DiskDrop::Evicted => "evicted",
            DiskDrop::Corrupt => "corrupt",
            DiskDrop::Expired => "expired",
            DiskDrop::Reserve => "reserve",
        }
    }
}

/// A ledger operation that failed (`op` label with `backend="ledger"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LedgerOp {
    Reserve,
    Settle,
    Usage,
}

impl LedgerOp {
    pub(super) const fn as_str(self) -> &'static str {
        match self {
            LedgerOp::Reserve => "reserve",
            LedgerOp::Settle => "settle",
            LedgerOp::Usage => "usage",
        }
    }
}

/// A Redis call that failed (`op` label with `backend="redis"`): each
/// call site of `RedisBackend` names its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisOp {
    CacheGet,
    CacheSet,
    CacheStats,
    CachePurge,
    Ping,
    Rate,
    Lease,
    LedgerReserve,
    LedgerRelease,
    LedgerUsage,
    LedgerSettle,
    LedgerSaved,
    LedgerRows,
    LedgerCheck,
}

impl RedisOp {
    pub const ALL: [RedisOp; 14] = [
        RedisOp::CacheGet,
        RedisOp::CacheSet,
        RedisOp::CacheStats,
        RedisOp::CachePurge,
        RedisOp::Ping,
        RedisOp::Rate,
        RedisOp::Lease,
        RedisOp::LedgerReserve,
        RedisOp::LedgerRelease,
        RedisOp::LedgerUsage,
        RedisOp::LedgerSettle,
        RedisOp::LedgerSaved,
        RedisOp::LedgerRows,
        RedisOp::LedgerCheck,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            RedisOp::CacheGet => "cache_get",
            RedisOp::CacheSet => "cache_set",
            RedisOp::CacheStats => "cache_stats",
            RedisOp::CachePurge => "cache_purge",
            RedisOp::Ping => "ping",
            RedisOp::Rate => "rate",
            RedisOp::Lease => "lease",
            RedisOp::LedgerReserve => "ledger_reserve",
            RedisOp::LedgerRelease => "ledger_release",
            RedisOp::LedgerUsage => "ledger_usage",
            RedisOp::LedgerSettle => "ledger_settle",
            RedisOp::LedgerSaved => "ledger_saved",
            RedisOp::LedgerRows => "ledger_rows",
            RedisOp::LedgerCheck => "ledger_check",
        }
    }
}

/// Whose log line the log sink dropped (`kind` label of
/// `gateway_log_lines_dropped_total`); also the sink's order of dropping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogLine {
    /// The access line of a request with no authenticated team: the
    /// first to go.
    Anonymous,
    /// A team's access line.
    Team,
    /// Any other log line (`tracing` events: warnings, start-up, errors).
    Other,
}

impl LogLine {
    pub(crate) const ALL: [LogLine; 3] = [LogLine::Anonymous, LogLine::Team, LogLine::Other];

    pub(super) const fn as_str(self) -> &'static str {
        match self {
            LogLine::Anonymous => "anonymous",
            LogLine::Team => "team",
            LogLine::Other => "other",
        }
    }
}

/// Where an id of an id lookup got its answer (`source` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordSource {
    /// A record held from an earlier lookup.
    Cache,
    /// An absence held from an earlier lookup.
    Absent,
    Upstream,
    /// A record a lookup answer carried for an id it was not asked: an
    /// upstream anomaly, logged and never filed.
    Foreign,
}

impl RecordSource {
    const fn as_str(self) -> &'static str {
        match self {
            RecordSource::Cache => "cache",
            RecordSource::Absent => "absent",
            RecordSource::Upstream => "upstream",
            RecordSource::Foreign => "foreign",
        }
    }
}

/// How an upstream attempt ended (`status` label of the upstream requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpstreamAnswer {
    Status(StatusCode),
    /// The call's deadline passed, retries included.
    Timeout,
    ConnectError,
    TransportError,
}

impl UpstreamAnswer {
    fn as_str(&self) -> &str {
        match self {
            UpstreamAnswer::Status(status) => status.as_str(),
            UpstreamAnswer::Timeout => "timeout",
            UpstreamAnswer::ConnectError => "connect_error",
            UpstreamAnswer::TransportError => "transport_error",
        }
    }
}

/// Gauges hold an `i64`; a count beyond it is shown as the largest.
fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    /// A team request answered; `cache` is its `X-Cache` state
    /// (`CacheState::as_str`, a fixed set of four).
    pub(crate) fn request(&self, team: &str, route: Route, status: StatusCode, cache: &'static str, took: Duration) {
        let (r, c) = (route.index(), cache_index(cache));
        let counted = match (status, c) {
            (StatusCode::OK, Some(c)) => self.children.with_team(team, |t| t.answered[r][c].inc()),
            _ => None,
        };
        if counted.is_none() {
            self.requests
                .requests_total
                .with_label_values(&[team, route.as_str(), status.as_str(), cache])
                .inc();
        }
        let took = took.as_secs_f64();
        match c {
            Some(c) => self.children.routes[r].durations[c].observe(took),
            None => self
                .requests
                .request_duration_seconds
                .with_label_values(&[route.as_str(), cache])
                .observe(took),
        }
    }

    /// A request refused with 429: counted once, where the error becomes
    /// the response, so a refusal rescued by a stale copy is not counted.
    pub(crate) fn rate_limited(&self, team: &str, scope: Scope) {
        self.requests
            .rate_limited_total
            .with_label_values(&[team, scope.as_str()])
            .inc();
    }

    /// A request refused 429 for the upstream's rate, by why.
    pub(crate) fn gate_refused(&self, team: &str, why: crate::error::GateRefusal) {
        self.requests
            .gate_refusals_total
            .with_label_values(&[team, why.as_str()])
            .inc();
    }

    /// A request refused with 402 by a budget: counted for its team, and
    /// by the budget that refused (its 402's `budget`).
    pub(crate) fn quota_rejection(&self, team: &str, budget: &Spent) {
        self.requests.quota_rejections_total.with_label_values(&[team]).inc();
        self.requests
            .budget_refusals_total
            .with_label_values(&[team, budget.as_str()])
            .inc();
    }

    /// A request with a token that ends within 7 days.
    pub(crate) fn token_expiring(&self, team: &str, app: &str) {
        self.requests
            .token_expiring_requests_total
            .with_label_values(&[team, app])
            .inc();
    }

    pub(crate) fn cache_hit(&self, route: Route, tier: Tier) {
        self.children.routes[route.index()].hits[tier as usize].inc();
    }

    /// A tier's size as last observed.
    pub(crate) fn cache_size(&self, tier: Tier, entries: u64, bytes: u64) {
        let tier = tier.as_str();
        self.cache.cache_entries.with_label_values(&[tier]).set(clamp(entries));
        self.cache.cache_size_bytes.with_label_values(&[tier]).set(clamp(bytes));
    }

    /// A request answered by another request's upstream fetch.
    /// One upstream call of an id lookup route: its ids, and the buyers
    /// (requests) whose ids it carried, all but one a call saved.
    pub(crate) fn upstream_batch(&self, route: Route, ids: usize, buyers: usize) {
        let route = route.as_str();
        self.upstream
            .upstream_batch_ids
            .with_label_values(&[route])
            .observe(ids as f64);
        if buyers > 1 {
            self.upstream
                .upstream_calls_saved_total
                .with_label_values(&[route])
                .inc_by(buyers as u64 - 1);
        }
    }

    /// A request's ids left a batch queue before a call carried them:
    /// `abandoned` (nobody waits for them) or `deadline` (refused, 429).
    pub(crate) fn upstream_withdrawn(&self, route: Route, reason: &'static str) {
        self.upstream
            .upstream_withdrawn_total
            .with_label_values(&[route.as_str(), reason])
            .inc();
    }

    pub(crate) fn coalesced(&self, route: Route) {
        self.requests
            .coalesced_requests_total
            .with_label_values(&[route.as_str()])
            .inc();
    }

    /// `ids` ids of an id lookup answered from `source`.
    pub(crate) fn cache_records(&self, route: Route, source: RecordSource, ids: u64) {
        self.cache
            .cache_records_total
            .with_label_values(&[route.as_str(), source.as_str()])
            .inc_by(ids);
    }

    pub(crate) fn credits_spent(&self, team: &str, route: Route, credits: u64) {
        self.credits
            .credits_spent_total
            .with_label_values(&[team, route.as_str()])
            .inc_by(credits);
    }

    /// Credits a team did not spend, by why ([`SavedReason`]).
    pub(crate) fn credits_saved_because(&self, team: &str, route: Route, credits: u64, reason: SavedReason) {
        let r = route.index();
        let child = (reason == SavedReason::Cache)
            .then(|| self.children.with_team(team, |t| t.saved[r].inc_by(credits)))
            .flatten();
        if child.is_none() {
            self.credits
                .credits_saved_total
                .with_label_values(&[team, route.as_str(), reason.as_str()])
                .inc_by(credits);
        }
    }

    /// Entries or writes the disk tier dropped, by why.
    pub(crate) fn disk_dropped(&self, why: DiskDrop, n: u64) {
        if n > 0 {
            self.cache
                .cache_disk_drops_total
                .with_label_values(&[why.as_str()])
                .inc_by(n);
        }
    }

    /// An answer bought again because a newer data release outdated the
    /// one held (`cache::release`).
    pub(crate) fn release_refreshed(&self, route: Route) {
        self.cache
            .release_refreshes_total
            .with_label_values(&[route.as_str()])
            .inc();
    }

    /// The data release as last read: its date (Unix seconds of its
    /// midnight UTC; 0: none), when a read last succeeded (0: never), and
    /// whether the last read succeeded.
    pub(crate) fn data_release(&self, day: u32, last_ok_ms: u64, readable: bool) {
        self.cache.data_release_timestamp_seconds.set(i64::from(day) * 86_400);
        self.cache
            .data_release_last_read_timestamp_seconds
            .set(clamp(last_ok_ms / 1000));
        self.cache.data_release_readable.set(i64::from(readable));
    }

    /// Whether the disk tier is off for writes (an unusable path, a failed
    /// commit).
    pub(crate) fn disk_degraded(&self, degraded: bool) {
        self.cache.cache_disk_degraded.set(i64::from(degraded));
    }

    /// Writes the disk tier accepted that a SIGKILL would still lose.
    pub(crate) fn disk_pending(&self, writes: u64) {
        self.cache.cache_disk_pending_writes.set(clamp(writes));
    }

    /// An upstream charge above the call's reservation.
    pub(crate) fn credit_anomaly(&self, team: &str) {
        self.credits.credit_anomalies_total.with_label_values(&[team]).inc();
    }

    /// A metered call answered 402 while the org is out of credits.
    pub(crate) fn upstream_exhausted(&self, team: &str) {
        self.credits.upstream_exhausted_total.with_label_values(&[team]).inc();
    }

    pub(crate) fn upstream_answer(&self, route: Route, answer: UpstreamAnswer) {
        self.upstream
            .upstream_requests_total
            .with_label_values(&[route.as_str(), answer.as_str()])
            .inc();
    }

    /// An upstream call's whole duration, retries included.
    pub(crate) fn upstream_duration(&self, route: Route, took: Duration) {
        self.upstream
            .upstream_request_duration_seconds
            .with_label_values(&[route.as_str()])
            .observe(took.as_secs_f64());
    }

    pub(crate) fn upstream_retry(&self, route: Route) {
        self.upstream
            .upstream_retries_total
            .with_label_values(&[route.as_str()])
            .inc();
    }

    pub(crate) fn redis_error(&self, op: RedisOp) {
        self.backend_errors_total
            .with_label_values(&["redis", op.as_str()])
            .inc();
    }

    pub(crate) fn ledger_error(&self, op: LedgerOp) {
        self.backend_errors_total
            .with_label_values(&["ledger", op.as_str()])
            .inc();
    }

    pub(crate) fn team_credits_used(&self, team: &str, used: u64) {
        self.credits
            .team_credits_used
            .with_label_values(&[team])
            .set(clamp(used));
    }

    /// Publishes the configured teams: their limits (teams removed by a
    /// reload disappear), and their anomaly counters at 0 from the start,
    /// so an alert on its increase sees the first.
    pub(crate) fn publish_teams<'t>(&self, teams: impl Iterator<Item = (&'t str, Option<u64>)>) {
        self.credits.team_credit_limit.reset();
        for (team, limit) in teams {
            self.credits.credit_anomalies_total.with_label_values(&[team]);
            if let Some(limit) = limit {
                self.credits
                    .team_credit_limit
                    .with_label_values(&[team])
                    .set(clamp(limit));
            }
        }
    }

    /// The company's spend in its window and its cap, at scrape time;
    /// `used` is `None` when the ledger could not answer (the gauge keeps
    /// its last value), `limit` `None` without a cap (no series).
    pub(crate) fn org_credits(&self, used: Option<u64>, limit: Option<u64>) {
        if let Some(used) = used {
            self.credits.org_credits_used.set(clamp(used));
        }
        match limit {
            Some(limit) => self
                .credits
                .org_credit_limit
                .with_label_values::<&str>(&[])
                .set(clamp(limit)),
            None => self.credits.org_credit_limit.reset(),
        }
    }

    /// Forgets the used-credits gauge of every team, before a scrape sets
    /// the current teams' again (a removed team must not linger).
    pub(crate) fn reset_team_credits_used(&self) {
        self.credits.team_credits_used.reset();
    }

    /// The gate's pressure for `team` (`Scheduler::pressure`): calls
    /// waiting, the oldest wait, the predicted wait.
    pub(crate) fn gate_pressure(&self, team: &str, waiting: usize, oldest: Duration, predicted: Duration) {
        let u = &self.upstream;
        u.upstream_team_waiting.with_label_values(&[team]).set(waiting as i64);
        u.upstream_team_oldest_wait_seconds
            .with_label_values(&[team])
            .set(oldest.as_secs_f64());
        u.upstream_team_predicted_wait_seconds
            .with_label_values(&[team])
            .set(predicted.as_secs_f64());
    }
}
