//! Team credit budgets: reserve the worst case before an upstream call,
//! settle to what the upstream charged, release on failure (docs/design.md §2,
//! `reserve` and `settle`). Two stores behind one type:
//!
//! - [`file`]: redb on local disk, for one replica. Chosen over SQLite (not
//!   for want of a C toolchain: the build needs one for ring and mimalloc)
//!   for ACID with fsync'd commits, a single-writer model that fits one
//!   replica, and one engine shared with the disk tier; writes are group-committed
//!   so concurrent misses share a commit, and a settle covered by its
//!   durable reservation rides the next one (`file`'s module doc).
//! - [`redis`]: Lua scripts on a shared Redis, so N replicas share one budget
//!   exactly; keys of one team share a `{team}` hash tag (Redis Cluster).
//!
//! Spend is kept per team, per UTC day, per route; the window sums the days
//! of the last 30 (`rolling_30d`, like the upstream) or of the current month.
//! Beside the teams' own accounts the ledger keeps internal ones (the
//! company's, each member's: [`Account`]), which [`export`] (usage.csv)
//! never lists as teams.
//!
//! # A reservation's life
//! A reservation is owned by the one task that makes the upstream call
//! (`proxy::fetch`), which no client can cancel, and it ends exactly once:
//! settled to what the upstream charged, or released when nothing was
//! charged. It outlives every wait it covers by **a term computed from the
//! real worst case**: `quota.reservation_lease_secs` sets the reservation's
//! term and must be at least the fair queue's hard bound
//! (`upstream.max_queue_wait_secs`, enforced as a timeout, not an estimate)
//! plus the upstream call's deadline
//! (`upstream.timeout_secs`, retries and a clamped `Retry-After` included)
//! plus a margin for the settle; config validation refuses less.
//!
//! A reservation that is not settled within its term can only belong to an
//! owner that died, or whose settle never landed: the upstream may have
//! charged it, so it **counts as spent** at its full amount (route
//! `unsettled` in the chargeback rows) rather than being given back. The
//! file store writes each reservation before the call and converts the
//! ones it finds at start-up the same way; the Redis store converts lapsed
//! ones in its reserve script. Such spend is booked on **the later of the
//! reservation's day and the day it is turned into spend**: a call
//! reserved at 23:59:58 and billed after midnight counts in the new day
//! (and month), where it was spent, never in a window that already closed. A team is then over- rather than
//! under-charged; `gateway_untracked_credits` shows the difference to the
//! org's spend seen upstream (reconciliation is the operator's, see
//! docs/alerts.md). Settles are idempotent by reservation id, so a retried
//! settle, or one after its reservation lapsed, never counts twice; a
//! settle after the lapse that charges more than the reservation adds
//! just the excess (the upstream billed it).

pub(crate) mod export;
pub(crate) mod file;
pub mod redis;
mod saved;

use crate::route::Route;
use chrono::{DateTime, Datelike, NaiveDate};

/// Which days count toward a team's budget (`quota.window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Window {
    #[serde(rename = "rolling_30d")]
    Rolling30d,
    #[serde(rename = "calendar_month")]
    CalendarMonth,
}

/// Days of spend a rolling window keeps.
pub(crate) const ROLLING_DAYS: u32 = 30;

impl Window {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Window::Rolling30d => "rolling_30d",
            Window::CalendarMonth => "calendar_month",
        }
    }

    /// The first day (days since 1970-01-01, UTC) inside the window.
    fn first_day(self, today: u32) -> u32 {
        match self {
            Window::Rolling30d => today.saturating_sub(ROLLING_DAYS - 1),
            Window::CalendarMonth => {
                let date = date_of(today);
                today - (date.day() - 1)
            }
        }
    }

    /// When spend of `day` stops counting.
    pub(crate) fn expires(self, day: u32) -> u32 {
        match self {
            Window::Rolling30d => day + ROLLING_DAYS,
            Window::CalendarMonth => {
                let d = date_of(day);
                let (y, m) = if d.month() == 12 {
                    (d.year() + 1, 1)
                } else {
                    (d.year(), d.month() + 1)
                };
                NaiveDate::from_ymd_opt(y, m, 1).map_or(day + 31, day_of)
            }
        }
    }
}

/// Today as days since the epoch, UTC, on the unshifted clock.
pub fn today() -> u32 {
    crate::clock::Clock::default().today()
}

pub(crate) fn day_of(date: NaiveDate) -> u32 {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
    u32::try_from((date - epoch).num_days()).unwrap_or(0)
}

pub(crate) fn date_of(day: u32) -> NaiveDate {
    DateTime::from_timestamp(i64::from(day) * 86_400, 0).map_or_else(NaiveDate::default, |t| t.date_naive())
}

/// Route under which lapsed reservations are recorded as spend.
const UNSETTLED: &str = "unsettled";

/// Credits held for one upstream call in flight.
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Random, so ids stay unique across restarts of a process or of Redis
    /// (settles are idempotent by id).
    pub id: u64,
    pub team: String,
    pub amount: u64,
    /// Until when a settle may still be retried: shortly before the
    /// reservation's term runs out and the reservation counts as spent.
    pub settle_by: std::time::Instant,
    /// The same call's holds in its other budgets' accounts
    /// ([`Ledger::reserve_all`]): settled and released with it.
    pub linked: Vec<Reservation>,
}

/// A budget a call is held against: a ledger account and its limit. The
/// accounts are the team's (its name), an app's ([`app_account`]) and the
/// company's ([`ORG_ACCOUNT`]).
#[derive(Debug, Clone, Copy)]
pub struct Budget<'a> {
    pub account: &'a str,
    pub limit: Option<u64>,
}

/// Which budget of a [`Ledger::reserve_all`] refused, and its figures
/// (`used` includes the holds in flight).
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub budget: usize,
    pub used: u64,
    pub limit: u64,
}

/// The company's account: every metered call of every team is held and
/// settled in it too, so `quota.org_credit_limit` binds their sum. No team
/// can be named so (`[a-z0-9_-]`).
pub const ORG_ACCOUNT: &str = "*org";

/// The first day the company's account is seeded from when it holds no
/// spend since then (the first start of a release that keeps it, on a
/// ledger the releases before it wrote; `file::seed`, `redis::seed`): the
/// earlier of both windows' first days, so that the teams' spend the
/// window counts is in it, whichever window is configured now or later.
/// The teams' own accounts always held that spend; the company's starts
/// from it rather than from 0 (issue 59), once.
pub(crate) fn seed_since(today: u32) -> u32 {
    Window::Rolling30d
        .first_day(today)
        .min(Window::CalendarMonth.first_day(today))
}

/// The account of a team's app (`team/app`: no team name has a `/`).
pub fn app_account(team: &str, app: &str) -> String {
    format!("{team}/{app}")
}

/// What a ledger account is, by its name: a team's own, a member's, or
/// internal (the company's [`ORG_ACCOUNT`], and any name no config can
/// give a team). No export lists an internal account as a team: its spend
/// is already in the teams' own accounts, and counting it again inflated
/// the chargeback (issue 59).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Account<'a> {
    Team(&'a str),
    /// A member's (a token of `[[teams.tokens]]`: the operator's "app").
    Member {
        team: &'a str,
        member: &'a str,
    },
    Internal,
}

impl<'a> Account<'a> {
    pub(crate) fn of(name: &'a str) -> Account<'a> {
        match name.split_once('/') {
            None if is_name(name) => Account::Team(name),
            Some((team, member)) if is_name(team) && is_name(member) => Account::Member { team, member },
            _ => Account::Internal,
        }
    }
}

/// A team's or an app's name as the config allows it: 1-64 of
/// `[a-z0-9_-]`.
fn is_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A new reservation id.
fn new_id() -> u64 {
    // Never 0: the Redis reserve script answers 0 for a refusal.
    rand::random::<u64>().max(1)
}

#[derive(Debug, PartialEq, Eq)]
pub enum Reserved {
    Granted(Reservation),
    /// The budget cannot cover it: `used` includes reservations in flight.
    Rejected {
        used: u64,
        limit: u64,
    },
}

/// A team's spend in its window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeamUsage {
    pub used: u64,
    /// (day, credits) for the days inside the window, oldest first.
    pub daily: Vec<(u32, u64)>,
}

/// One row of the chargeback CSV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UsageRow {
    pub(crate) team: String,
    pub(crate) day: u32,
    pub(crate) route: String,
    pub(crate) spent: u64,
    pub(crate) saved: u64,
}

#[derive(Debug)]
pub struct LedgerError(String);

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub enum Ledger {
    File(file::FileLedger),
    Redis(redis::RedisLedger),
}

impl Ledger {
    /// A copy of the file ledger as of its last commit, taken while it
    /// runs (`GET /admin/ledger/backup`); `None` for the Redis ledger,
    /// which Redis's own persistence backs up.
    pub(crate) async fn backup(&self) -> Option<Result<Vec<u8>, LedgerError>> {
        match self {
            Ledger::File(l) => Some(l.backup().await),
            Ledger::Redis(_) => None,
        }
    }

    /// Before the gateway serves: `Err`, the line to print, when the ledger
    /// is of a newer release's format. The file ledger checked its file at
    /// open; the Redis ledger checks what Redis holds now.
    pub async fn check_format(&self) -> Result<(), String> {
        match self {
            Ledger::File(_) => Ok(()),
            Ledger::Redis(l) => l.check_format().await,
        }
    }

    /// Holds `amount` credits for `team` unless that would pass `limit`.
    pub async fn reserve(&self, team: &str, limit: Option<u64>, amount: u64) -> Result<Reserved, LedgerError> {
        match self {
            Ledger::File(l) => l.reserve(team, limit, amount, self.today()).await,
            Ledger::Redis(l) => l.reserve(team, limit, amount, self.today()).await,
        }
    }

    /// Holds `amount` in every budget's account, or in none: the first
    /// budget that cannot cover it refuses (`Err(Refusal)`) and nothing
    /// stays held. The file store checks and holds them all under one lock
    /// and one commit; the Redis store reserves them in order, each atomic
    /// in its own account, and ends the ones held before a refusal — so
    /// give the narrowest budget (an app's) first: a refused app never
    /// holds its team's credits even for a moment. The reservation is the
    /// first budget's, the others linked to it.
    pub async fn reserve_all(
        &self,
        budgets: &[Budget<'_>],
        amount: u64,
    ) -> Result<Result<Reservation, Refusal>, LedgerError> {
        match self {
            Ledger::File(l) => l.reserve_all(budgets, amount, self.today()).await,
            Ledger::Redis(l) => l.reserve_all(budgets, amount, self.today()).await,
        }
    }

    /// Turns a reservation (and its linked ones) into spend of `actual`
    /// credits (durable when this returns Ok), recorded under `route` for
    /// chargeback. Idempotent by reservation id; the Redis store retries
    /// until `settle_by`.
    pub async fn settle(&self, mut r: Reservation, actual: u64, route: Route) -> Result<(), LedgerError> {
        let today = self.today();
        let mut result = Ok(());
        for linked in std::mem::take(&mut r.linked).into_iter().chain([r]) {
            let settled = match self {
                Ledger::File(l) => l.settle(linked, actual, route, today).await,
                Ledger::Redis(l) => l.settle(linked, actual, route, today).await,
            };
            if settled.is_err() {
                result = settled;
            }
        }
        result
    }

    /// Gives the credits back (the reservation's and its linked ones'):
    /// the call failed and the upstream charged nothing. Best effort: a
    /// release that is lost leaves the reservation to lapse into spend
    /// (over-, never under-charged).
    pub(crate) async fn release(&self, mut r: Reservation) {
        for linked in std::mem::take(&mut r.linked).into_iter().chain([r]) {
            match self {
                Ledger::File(l) => l.release(linked),
                Ledger::Redis(l) => l.release(linked).await,
            }
        }
    }

    /// Credits a cache hit saved a team (best effort: chargeback detail
    /// only). Never waits: the hit path must not pay for bookkeeping.
    pub(crate) fn record_saved(&self, team: &str, route: Route, credits: u64) {
        match self {
            Ledger::File(l) => l.record_saved(team, route, credits, self.today()),
            Ledger::Redis(l) => l.record_saved(team, route, credits, self.today()),
        }
    }

    /// Credits spent in the window, for the budget headers of every answer:
    /// the file store sums memory; the Redis store keeps each team's figure
    /// for up to a second (refreshed at once after that team's settles).
    pub(crate) async fn used(&self, team: &str) -> Result<u64, LedgerError> {
        match self {
            Ledger::File(l) => Ok(l.used(team, self.today())),
            Ledger::Redis(l) => l.used(team, self.today()).await,
        }
    }

    /// Credits spent in the window plus those held by calls in flight:
    /// what the team's budget headers subtract from its limit,
    /// the sum a reserve checks. Same freshness as [`Ledger::used`]; a
    /// reserve on this replica refreshes it, so a 402 shows the figure
    /// that refused it.
    pub(crate) async fn committed(&self, team: &str) -> Result<u64, LedgerError> {
        match self {
            Ledger::File(l) => Ok(l.committed(team, self.today())),
            // Boxed: a hit's future (which reads this for its budget
            // headers) does not carry a Redis call's state when the file
            // ledger answers it.
            Ledger::Redis(l) => Box::pin(l.committed(team, self.today())).await,
        }
    }

    pub async fn usage(&self, team: &str) -> Result<TeamUsage, LedgerError> {
        match self {
            Ledger::File(l) => Ok(l.usage(team, self.today())),
            Ledger::Redis(l) => l.usage(team, self.today()).await,
        }
    }

    /// The company's spend in its window and its cap (`limit`,
    /// `quota.org_credit_limit`) as gauges, at scrape time: the series an
    /// alert on the cap reads (`gateway_org_credits_used`,
    /// `gateway_org_credit_limit`).
    pub(crate) async fn observe_org(&self, metrics: &crate::metrics::Metrics, limit: Option<u64>) {
        let used = match self.usage(ORG_ACCOUNT).await {
            Ok(usage) => Some(usage.used),
            Err(_) => {
                metrics.ledger_error(crate::metrics::LedgerOp::Usage);
                None
            }
        };
        metrics.org_credits(used, limit);
    }

    /// Per team, day and route, between two days inclusive.
    pub(crate) async fn rows(&self, teams: &[String], from: u32, to: u32) -> Result<Vec<UsageRow>, LedgerError> {
        match self {
            Ledger::File(l) => Ok(l.rows(from, to).await),
            Ledger::Redis(l) => l.rows(teams, from, to).await,
        }
    }

    /// For /readyz: `Err` when the store cannot take a settle now; the
    /// `Ok` text is a note for operators (e.g. Redis without AOF).
    pub(crate) async fn check(&self) -> Result<&'static str, String> {
        match self {
            Ledger::File(l) => l.check().await.map(|()| "ok"),
            Ledger::Redis(l) => l.check().await,
        }
    }

    /// The day the ledger books on: today on its clock
    /// (`quota.clock_offset_secs`, 0 but in tests).
    pub fn today(&self) -> u32 {
        match self {
            Ledger::File(l) => l.clock.today(),
            Ledger::Redis(l) => l.clock.today(),
        }
    }

    pub(crate) fn window(&self) -> Window {
        match self {
            Ledger::File(l) => l.window,
            Ledger::Redis(l) => l.window,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_are_teams_apps_or_internal_by_their_name() {
        assert_eq!(Account::of("growth"), Account::Team("growth"));
        assert_eq!(
            Account::of(&app_account("growth", "web")),
            Account::Member {
                team: "growth",
                member: "web"
            }
        );
        for internal in [ORG_ACCOUNT, "*other", "", "Growth", "a/b/c", "/web", "growth/", "a b"] {
            assert_eq!(Account::of(internal), Account::Internal, "{internal:?}");
        }
    }

    #[test]
    fn windows_pick_their_first_day() {
        let d = day_of(NaiveDate::from_ymd_opt(2026, 3, 15).unwrap());
        assert_eq!(Window::Rolling30d.first_day(d), d - 29);
        assert_eq!(
            date_of(Window::CalendarMonth.first_day(d)),
            NaiveDate::from_ymd_opt(2026, 3, 1).unwrap()
        );
        assert_eq!(
            date_of(Window::CalendarMonth.expires(d)),
            NaiveDate::from_ymd_opt(2026, 4, 1).unwrap()
        );
        let dec = day_of(NaiveDate::from_ymd_opt(2026, 12, 31).unwrap());
        assert_eq!(
            date_of(Window::CalendarMonth.expires(dec)),
            NaiveDate::from_ymd_opt(2027, 1, 1).unwrap()
        );
        assert_eq!(Window::Rolling30d.expires(d), d + 30);
        assert_eq!(
            date_of(day_of(NaiveDate::from_ymd_opt(2026, 11, 21).unwrap())).to_string(),
            "2026-11-21"
        );
    }
}
