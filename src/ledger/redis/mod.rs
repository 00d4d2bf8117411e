//! The shared ledger: budgets kept in Redis and changed only by Lua scripts,
//! which Redis runs atomically, so replicas cannot together overspend.
//!
//! Per team (one `{team}` hash tag, so a script's keys share a Cluster slot;
//! spelled in `redis_backend::keys`):
//! - `<prefix>l:{team}:days`    day → credits spent;
//! - `<prefix>l:{team}:held`    reservation id → "amount:expires_ms:day";
//! - `<prefix>l:{team}:routes`  "day|route|s" (spent) / "day|route|v" (saved);
//! - `<prefix>l:{team}:settled` reservation id → when it ended (ms), kept
//!   for twice a reservation's term: what makes a settle idempotent;
//! - `<prefix>l:{team}:settled_at` the same marks as a sorted set scored by
//!   that time (or by a time a day ahead while the settle may be applied
//!   again: `unacked`, pinned), so that a settle forgets the few oldest past the window
//!   (`ZRANGEBYSCORE … LIMIT`, O(log n)) instead of reading every mark
//!   (before it, an `HGETALL` per settle made each settle O(marks));
//! - `<prefix>l:{team}:settled_scan` where the walk over unindexed marks
//!   (see *Upgrading*) goes on;
//! - `<prefix>l:{team}:lapsed` reservation id → the amount its lapse
//!   counted, forgotten with its mark: what a late settle adds its excess
//!   over.
//!
//! The company's account (`{*org}`) has one key more, `seeded`: set once
//! its spend is whole (`seed`).
//!
//! A reservation carries its own expiry. One that passes it unsettled (its
//! replica died, or its settle never landed) is turned into spend at its
//! full amount by the next reserve of that team (route `unsettled`), on the
//! later of its own day and the reserve's (the day it becomes spend). A
//! settle is retried until it lands or its reservation's `settle_by`; the
//! `settled` mark makes a retry that already ran, or a settle after the
//! lapse, count nothing twice — even across a Redis restart that lost the
//! reservation itself (ids are random, never reused). A settle after the
//! lapse that charges more than was counted adds the excess, once.
//!
//! # Upgrading
//! The marks stay where and as the previous release kept them (the
//! `settled` hash, checked with `HSETNX`); the sorted set only indexes
//! them. So during a rolling upgrade every replica, old or new, sees every
//! mark, whoever wrote it: a settle retried by an old replica, or one that
//! arrives after a new replica lapsed its reservation, still counts once.
//! Marks written by the previous release have no index entry; while the
//! hash holds more marks than the index, each settle walks a few more of
//! them (`HSCAN`, bounded), indexing the live ones and dropping the expired
//! ones, so none is left behind once the old replicas are gone. A rollback
//! keeps exactness too (the old release reads the same hash); it leaves the
//! index to go stale, missing at most the marks of twice a reservation's
//! term, which the next upgrade prunes.

mod flush;
mod format;
mod journal;
mod scripts;
mod seed;
mod unacked;

use super::saved::SavedTally;
use super::{new_id, Budget, LedgerError, Refusal, Reservation, Reserved, TeamUsage, UsageRow, Window, UNSETTLED};
use crate::clock::{millis, Clock};
use crate::metrics::RedisOp;
use crate::redis_backend::keys::{Keys, LedgerKey};
use crate::redis_backend::{BackendError, RedisBackend};
use crate::route::Route;
use backon::{ExponentialBuilder, Retryable};
use redis::{FromRedisValue, Script};
use scripts::{END, RESERVE, SETTLE};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most marks one settle forgets: more than a settle adds, so a
/// backlog (after an idle spell, a burst of lapses) drains.
pub const FORGET_PER_SETTLE: u64 = 64;

/// Hash buckets (about as many marks) one settle walks while marks of the
/// previous release lack an index entry (measured with 100k such marks:
/// ~0.15 ms a settle while the walk lasts, where the old script took ~100 ms).
pub const WALK_PER_SETTLE: u64 = 16;

/// A team's figures as last read: settled spend, holds in flight, when.
#[derive(Clone, Copy)]
struct Figures {
    spent: u64,
    held: u64,
    at: Instant,
}

/// A team's `held` hash: reservation id → "amount:expires_ms:day".
type HeldRows = Vec<(String, String)>;

/// team → its figures as last read.
type Recent = std::collections::HashMap<String, Figures>;

/// How long a team's figures answer the budget headers without a Redis
/// round trip (docs/operations.md: how far replicas may disagree).
const FRESH: Duration = Duration::from_secs(1);

/// No estimate of Redis's clock yet: above any sample, so the first one replaces it (`fetch_min`).
const NO_OFFSET: i64 = i64::MAX;

/// What a reserve script answered.
enum Reply {
    /// Ran in time: `granted` or refused for budget; the team's spend and
    /// holds (this one's included) as the script saw them.
    Done { granted: bool, spent: u64, held: u64 },
    /// Ran after its deadline (or its id had ended): held nothing.
    /// `clock` is Redis's, in ms.
    Late { clock: u64 },
}

pub struct RedisLedger {
    redis: Arc<RedisBackend>,
    /// Set while Redis holds a ledger of a newer format (`format`): every
    /// reserve is refused.
    newer_format: Arc<AtomicBool>,
    /// Credits saved by hits, written every `FLUSH_EVERY` by a background task.
    saved: Arc<SavedTally>,
    /// team → its spend and holds as last read: the budget headers of hits
    /// need no Redis round trip each.
    recent: std::sync::Mutex<Recent>,
    /// Redis's clock minus ours (ms), at most: the least a reserve's reply
    /// showed. A reserve's deadline is set on Redis's clock with it.
    clock_offset: AtomicI64,
    /// A team's keys, one `{team}` tag: a script's keys share a slot.
    keys: Keys,
    reserve: Script,
    /// The connection settles go on (`with_settle_connection`).
    settle_redis: Arc<RedisBackend>,
    /// Applies settles, waits for a replica, keeps the unacknowledged:
    /// built at the first settle, once the builder calls have set its
    /// connection and clock.
    settler: std::sync::OnceLock<Arc<unacked::Settler>>,
    end: Script,
    /// The company's account made whole once for all replicas (`seed`).
    seed: Script,
    org_seed: seed::OrgSeed,
    /// A reservation's term, set by `quota.reservation_lease_secs`.
    term: Duration,
    pub(super) window: Window,
    /// Days booked and reservation expiries (shifted only in tests).
    pub(super) clock: Clock,
}

impl RedisLedger {
    /// Must run inside a tokio runtime: it starts the saved-credits writer.
    pub fn new(redis: Arc<RedisBackend>, prefix: &str, window: Window, term: Duration) -> RedisLedger {
        let saved = Arc::new(SavedTally::default());
        let keys = Keys::new(prefix);
        tokio::spawn(flush::flush_saved(Arc::downgrade(&saved), redis.clone(), keys.clone()));
        RedisLedger {
            newer_format: Arc::new(AtomicBool::new(false)),
            settle_redis: redis.clone(),
            settler: std::sync::OnceLock::new(),
            redis,
            saved,
            recent: Default::default(),
            keys,
            reserve: Script::new(RESERVE),
            end: Script::new(END),
            seed: Script::new(seed::SEED),
            org_seed: seed::OrgSeed::new(Vec::new()),
            clock_offset: AtomicI64::new(NO_OFFSET),
            term,
            window,
            clock: Clock::default(),
        }
    }

    /// Books days and expiries on `clock` (tests: `quota.clock_offset_secs`).
    pub fn with_clock(mut self, clock: Clock) -> RedisLedger {
        self.clock = clock;
        self
    }

    /// The teams whose spend the company's account starts from when it
    /// has none of its own in the window (`seed`): the config's.
    pub fn with_teams(mut self, teams: Vec<String>) -> RedisLedger {
        self.org_seed = seed::OrgSeed::new(teams);
        self
    }

    /// Settles (and their `WAIT`) on a connection of their own: a `WAIT`
    /// blocks the connection it is sent on for up to its timeout when no
    /// replica acknowledges (a stalled link), and reserves, reads and ends
    /// must not queue behind it.
    pub fn with_settle_connection(mut self, settles: Arc<RedisBackend>) -> RedisLedger {
        self.settle_redis = settles;
        self
    }

    /// Checks the format the ledger in Redis is in (`format`), before the
    /// gateway serves: `Err`, the line to print, for a newer release's.
    pub async fn check_format(&self) -> Result<(), String> {
        format::at_start(self.redis.clone(), self.keys.clone(), self.newer_format.clone()).await
    }

    /// Keeps the settles no replica acknowledged in the journal at `path`
    /// too, and applies again those a previous run left there. Called last
    /// of the builder calls (the settler starts here). A journal that
    /// cannot be opened (another gateway holds it, a read-only volume) is
    /// logged: settles are kept in memory only. `Err`: a newer release's.
    pub fn with_journal(self, path: &std::path::Path) -> Result<RedisLedger, String> {
        let journal = match journal::Journal::open(path) {
            Ok(j) => {
                tracing::info!(path = %path.display(), "ledger settle journal: settles no replica acknowledged survive a restart");
                Some(j)
            }
            Err(journal::Unopened::Unusable(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "ledger settle journal unusable: settles no replica acknowledged are kept in memory only, and lost if this gateway dies before a replica has them");
                None
            }
            Err(journal::Unopened::Newer(line)) => return Err(line),
        };
        let _ = self.settler.set(self.new_settler(journal));
        Ok(self)
    }

    /// The settler, started at the first settle when no journal started it
    /// (its replay task needs the runtime); settles mark their time on the
    /// same clock as reserves.
    fn settler(&self) -> &Arc<unacked::Settler> {
        self.settler.get_or_init(|| self.new_settler(None))
    }

    fn new_settler(&self, journal: Option<journal::Journal>) -> Arc<unacked::Settler> {
        unacked::Settler::new(
            self.settle_redis.clone(),
            self.keys.clone(),
            Script::new(SETTLE),
            self.clock,
            self.term,
            journal,
        )
    }

    /// Holds `amount` for `team` unless that passes `limit`. The reserve
    /// carries its id and a deadline on Redis's clock (when this call stops
    /// waiting for it): Redis running it later holds nothing. A call that
    /// gives up (timeout, dropped connection) ends the id before it
    /// answers, so a reserve still queued in Redis has exactly one outcome:
    /// none.
    pub async fn reserve(
        &self,
        team: &str,
        limit: Option<u64>,
        amount: u64,
        today: u32,
    ) -> Result<Reserved, LedgerError> {
        if self.newer_format.load(Ordering::Relaxed) {
            return Err(LedgerError("the ledger in Redis is of a newer release's format".into()));
        }
        self.org_whole(team, today).await?;
        let id = new_id();
        let reserved_at = Instant::now();
        let settle_by = reserved_at + self.term.saturating_sub(Duration::from_secs(1));
        let mut attempt = self.reserve_once(team, limit, amount, today, id).await;
        // Refused as late although it answered in time: the estimate of
        // Redis's clock was behind it (a failover to a host whose clock is
        // ahead). Corrected from this reply; tried once more.
        if let Ok(Reply::Late { clock }) = attempt {
            self.learn_clock(clock, reserved_at, true);
            attempt = self.reserve_once(team, limit, amount, today, id).await;
        }
        let reply = match attempt {
            Ok(reply) => reply,
            // Never sent: nothing to end.
            Err(e @ BackendError::Open) => return Err(LedgerError(format!("ledger reserve: {e}"))),
            Err(e) => {
                // It may still run when Redis wakes: its id is ended first.
                self.give_up(team, id, settle_by).await;
                return Err(LedgerError(format!("ledger reserve: {e}")));
            }
        };
        match reply {
            Reply::Late { .. } => {
                self.give_up(team, id, settle_by).await;
                Err(LedgerError("ledger reserve: ran after its deadline".into()))
            }
            Reply::Done { granted, spent, held } => {
                self.remember(team, spent, held);
                Ok(match (granted, limit) {
                    (false, Some(limit)) => Reserved::Rejected {
                        used: spent.saturating_add(held),
                        limit,
                    },
                    _ => Reserved::Granted(Reservation {
                        id,
                        team: team.to_string(),
                        amount,
                        settle_by,
                        linked: Vec::new(),
                    }),
                })
            }
        }
    }

    /// Holds `amount` in each budget's account in turn, each atomic in its
    /// own account; at the first refusal (or error) the holds made before
    /// it are ended. The reservation is the first budget's, the others
    /// linked to it (`Ledger::reserve_all`).
    pub(super) async fn reserve_all(
        &self,
        budgets: &[Budget<'_>],
        amount: u64,
        today: u32,
    ) -> Result<Result<Reservation, Refusal>, LedgerError> {
        let mut held: Vec<Reservation> = Vec::new();
        for (i, b) in budgets.iter().enumerate() {
            let refused = match self.reserve(b.account, b.limit, amount, today).await {
                Ok(Reserved::Granted(r)) => {
                    held.push(r);
                    continue;
                }
                Ok(Reserved::Rejected { used, limit }) => Ok(Err(Refusal { budget: i, used, limit })),
                Err(e) => Err(e),
            };
            for r in held {
                self.release(r).await;
            }
            return refused;
        }
        let mut held = held.into_iter();
        let Some(mut first) = held.next() else {
            return Err(LedgerError("no budget to reserve in".into()));
        };
        first.linked = held.collect();
        Ok(Ok(first))
    }

    /// One reserve script call (tried once more on a fresh connection
    /// when the old one had dropped: a reserve that did not run holds
    /// nothing, one that did is overwritten under the same id).
    async fn reserve_once(
        &self,
        team: &str,
        limit: Option<u64>,
        amount: u64,
        today: u32,
        id: u64,
    ) -> Result<Reply, BackendError> {
        let now = self.clock.now_ms();
        // The order `scripts::RESERVE` reads them in.
        let keys = [
            LedgerKey::Days,
            LedgerKey::Held,
            LedgerKey::Routes,
            LedgerKey::Settled,
            LedgerKey::SettledAt,
            LedgerKey::Lapsed,
        ]
        .map(|k| self.keys.ledger(team, k));
        let limit_arg = limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
        let timeout = millis(self.redis.timeout());
        let invocation = |sent_ms: u64| {
            let offset = self.clock_offset.load(Ordering::Acquire);
            // Unknown until the first reply: then only the id's end guards.
            let deadline = if offset == NO_OFFSET {
                0
            } else {
                (i64::try_from(sent_ms).unwrap_or(i64::MAX))
                    .saturating_add(offset)
                    .saturating_add(i64::try_from(timeout).unwrap_or(i64::MAX))
                    .max(1)
            };
            let mut inv = self.reserve.prepare_invoke();
            for k in &keys {
                inv.key(k);
            }
            inv.arg(amount)
                .arg(limit_arg)
                .arg(now)
                .arg(self.window.first_day(today))
                .arg(now.saturating_add(millis(self.term)))
                .arg(id)
                .arg(today)
                .arg(UNSETTLED)
                .arg(deadline);
            inv
        };
        // Not waited for (`WAIT` blocks the connection it is sent on, and
        // every reserve shares this one): a hold lost at a failover lets the
        // team overspend by at most the calls then in flight; their settles
        // are kept in memory and applied again until a replica has them
        // (docs/operations.md).
        let sent = Instant::now();
        let (code, spent, held, clock): (i64, u64, u64, u64) = self
            .redis
            .call_reconnecting(RedisOp::LedgerReserve, |mut c| {
                let inv = invocation(crate::clock::now_ms());
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        self.learn_clock(clock, sent, false);
        Ok(match code {
            -1 => Reply::Late { clock },
            granted => Reply::Done {
                granted: granted == 1,
                spent,
                held,
            },
        })
    }

    /// Keeps the least (Redis clock − ours) a reply showed: it is never
    /// below the true offset (Redis ran the script after we sent it), so a
    /// deadline set with it never refuses a reserve that ran in time. A
    /// reserve refused as late that still answered in time (`reset`)
    /// replaces it.
    fn learn_clock(&self, redis_ms: u64, sent: Instant, reset: bool) {
        let sent_ms = crate::clock::now_ms().saturating_sub(millis(sent.elapsed()));
        let sample = i64::try_from(redis_ms)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(sent_ms).unwrap_or(i64::MAX));
        if reset {
            self.clock_offset.store(sample, Ordering::Release);
        } else {
            // The smallest sample so far (`NO_OFFSET` is above any).
            self.clock_offset.fetch_min(sample, Ordering::AcqRel);
        }
    }

    /// A reserve this call gave up on: its id is ended in a task of its
    /// own (retried until `settle_by`), waited for up to the Redis timeout
    /// so that the end is on its way, queued behind the reserve, before
    /// the caller answers; it lands whenever Redis can take it.
    async fn give_up(&self, team: &str, id: u64, settle_by: Instant) {
        let ender = self.ender(team);
        let ending = tokio::spawn(async move { ender.end(id, settle_by).await });
        let _ = tokio::time::timeout(self.redis.timeout(), ending).await;
        self.recent_lock().remove(team);
    }

    fn ender(&self, team: &str) -> Ender {
        Ender {
            redis: self.redis.clone(),
            keys: [LedgerKey::Held, LedgerKey::Settled, LedgerKey::SettledAt].map(|k| self.keys.ledger(team, k)),
            script: self.end.clone(),
            clock: self.clock,
            team: team.to_string(),
        }
    }

    /// Records the spend once, retrying a Redis that blips (a retry that
    /// already ran counts nothing) until `settle_by`; after that the
    /// reservation lapses into spend at its full amount.
    pub async fn settle(&self, r: Reservation, actual: u64, route: Route, today: u32) -> Result<(), LedgerError> {
        self.recent_lock().remove(&r.team);
        let pending = journal::Pending {
            id: r.id,
            team: r.team.clone(),
            actual,
            route,
            day: today,
            at: self.clock.now_ms(),
        };
        let once = || self.settler().apply(&pending);
        let settled = once.retry(until(r.settle_by)).await;
        self.recent_lock().remove(&r.team);
        match settled {
            Ok(true) => Ok(()),
            // On the primary, not yet on a replica: applied again until it is.
            Ok(false) => {
                self.settler().keep(pending).await;
                Ok(())
            }
            Err(e) => Err(LedgerError(format!("ledger settle: {e}"))),
        }
    }

    /// Frees the credits, retried like a settle; one that never lands lets
    /// the reservation lapse into spend (over-, never under-charged). The
    /// id is marked ended, so a retried reserve of it that Redis runs later
    /// holds nothing.
    pub(super) async fn release(&self, r: Reservation) {
        self.ender(&r.team).end(r.id, r.settle_by).await;
        self.recent_lock().remove(&r.team);
    }

    pub(super) fn record_saved(&self, team: &str, route: Route, credits: u64, today: u32) {
        if credits > 0 {
            self.saved.add(team, today, route, credits);
        }
    }

    /// Settled spend in the window, for up to [`FRESH`] from memory.
    pub(super) async fn used(&self, team: &str, today: u32) -> Result<u64, LedgerError> {
        Ok(self.figures(team, today).await?.spent)
    }

    /// Settled spend plus holds in flight (what a reserve checks), for up
    /// to [`FRESH`] from memory; a reserve on this replica refreshes it.
    pub(super) async fn committed(&self, team: &str, today: u32) -> Result<u64, LedgerError> {
        let f = self.figures(team, today).await?;
        Ok(f.spent.saturating_add(f.held))
    }

    /// Two hashes of `team`'s in one atomic read (one slot: its tag).
    async fn team_hashes<A: FromRedisValue, B: FromRedisValue>(
        &self,
        team: &str,
        keys: [LedgerKey; 2],
        what: &str,
    ) -> Result<(A, B), LedgerError> {
        let [a, b] = keys.map(|k| self.keys.ledger(team, k));
        let got = self.redis.call_reconnecting(RedisOp::LedgerUsage, |mut c| {
            let mut pipe = redis::pipe();
            pipe.atomic().cmd("HGETALL").arg(&a).cmd("HGETALL").arg(&b);
            async move { pipe.query_async(&mut c).await }
        });
        got.await.map_err(|e| LedgerError(format!("{what}: {e}")))
    }

    async fn figures(&self, team: &str, today: u32) -> Result<Figures, LedgerError> {
        if let Some(f) = self.recent_lock().get(team) {
            if f.at.elapsed() < FRESH {
                return Ok(*f);
            }
        }
        self.org_whole(team, today).await?;
        let (days, holds): (Vec<(u32, u64)>, HeldRows) = self
            .team_hashes(team, [LedgerKey::Days, LedgerKey::Held], "ledger usage")
            .await?;
        let spent = self.window_sum(days, today).iter().map(|(_, c)| c).sum();
        let held = holds
            .iter()
            .filter_map(|(_, v)| v.split(':').next()?.parse::<u64>().ok())
            .fold(0u64, u64::saturating_add);
        Ok(self.remember(team, spent, held))
    }

    fn remember(&self, team: &str, spent: u64, held: u64) -> Figures {
        let f = Figures {
            spent,
            held,
            at: Instant::now(),
        };
        self.recent_lock().insert(team.to_string(), f);
        f
    }

    /// The days of `days` inside the window, oldest first.
    fn window_sum(&self, days: Vec<(u32, u64)>, today: u32) -> Vec<(u32, u64)> {
        let first = self.window.first_day(today);
        let mut daily: Vec<(u32, u64)> = days
            .into_iter()
            .filter(|(d, c)| *d >= first && *d <= today && *c > 0)
            .collect();
        daily.sort_unstable();
        daily
    }

    fn recent_lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub async fn usage(&self, team: &str, today: u32) -> Result<TeamUsage, LedgerError> {
        self.org_whole(team, today).await?;
        let key = &self.keys.ledger(team, LedgerKey::Days);
        let days: Vec<(u32, u64)> = self
            .redis
            .call_reconnecting(RedisOp::LedgerUsage, |mut c| async move {
                redis::cmd("HGETALL").arg(key).query_async(&mut c).await
            })
            .await
            .map_err(|e| LedgerError(format!("ledger usage: {e}")))?;
        let daily = self.window_sum(days, today);
        Ok(TeamUsage {
            used: daily.iter().map(|(_, c)| c).sum(),
            daily,
        })
    }

    pub(super) async fn rows(&self, teams: &[String], from: u32, to: u32) -> Result<Vec<UsageRow>, LedgerError> {
        let mut rows: Vec<UsageRow> = Vec::new();
        for team in teams {
            let key = self.keys.ledger(team, LedgerKey::Routes);
            let key = &key;
            let fields: Vec<(String, u64)> = self
                .redis
                .call_reconnecting(RedisOp::LedgerRows, |mut c| async move {
                    redis::cmd("HGETALL").arg(key).query_async(&mut c).await
                })
                .await
                .map_err(|e| LedgerError(format!("ledger rows: {e}")))?;
            for (field, credits) in fields {
                let mut parts = field.split('|');
                let (Some(day), Some(route), Some(kind)) = (parts.next(), parts.next(), parts.next()) else {
                    continue;
                };
                let Ok(day) = day.parse::<u32>() else {
                    continue;
                };
                if !(from..=to).contains(&day) {
                    continue;
                }
                let row = match rows
                    .iter_mut()
                    .find(|r| r.team == *team && r.day == day && r.route == route)
                {
                    Some(r) => r,
                    None => {
                        rows.push(UsageRow {
                            team: team.clone(),
                            day,
                            route: route.to_string(),
                            spent: 0,
                            saved: 0,
                        });
                        rows.last_mut().expect("just pushed")
                    }
                };
                if kind == "s" {
                    row.spent += credits;
                } else {
                    row.saved += credits;
                }
            }
        }
        self.saved.merge_into(&mut rows, from, to);
        Ok(rows)
    }

    /// Reachable (on a cluster: every slot covered), and whether spend
    /// survives a Redis restart (AOF).
    pub(super) async fn check(&self) -> Result<&'static str, String> {
        self.redis.check_ledger_ready().await
    }
}

/// What ends one team's unused reservation (`scripts::END`), owned so that
/// the end can go on after its caller answered.
struct Ender {
    redis: Arc<RedisBackend>,
    /// held, settled, settled_at.
    keys: [String; 3],
    script: Script,
    clock: Clock,
    team: String,
}

impl Ender {
    /// Ends reservation `id`, retried until `settle_by`; one that never
    /// lands lets a hold, if Redis made one, lapse into spend (over-, never
    /// under-charged).
    async fn end(&self, id: u64, settle_by: Instant) {
        let once = || async {
            let mut inv = self.script.prepare_invoke();
            for k in &self.keys {
                inv.key(k);
            }
            inv.arg(id).arg(self.clock.now_ms());
            self.redis
                .call(RedisOp::LedgerRelease, |mut c| async move {
                    inv.invoke_async::<u64>(&mut c).await
                })
                .await
        };
        if let Err(e) = once.retry(until(settle_by)).await {
            tracing::warn!(team = %self.team, error = %e, "ledger: a reservation could not be ended; it lapses into spend");
        }
    }
}

/// The settle journal of a gateway whose `quota.path` is `quota_path`:
/// `settles.redb` in its folder (the data volume), absolute.
pub fn journal_path(quota_path: &std::path::Path) -> std::path::PathBuf {
    let path = journal::Journal::path_for(quota_path);
    std::path::absolute(&path).unwrap_or(path)
}

/// Backoff from 50 ms to 1 s for as long as `deadline` allows.
fn until(deadline: Instant) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(1))
        .with_max_times(usize::MAX)
        .with_total_delay(Some(deadline.saturating_duration_since(Instant::now())))
}
