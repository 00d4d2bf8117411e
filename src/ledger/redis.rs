//! The shared ledger: budgets kept in Redis and changed only by Lua scripts,
//! which Redis runs atomically, so replicas cannot together overspend.
//!
//! Per team (one `{team}` hash tag, so a script's keys share a Cluster slot;
//! spelled in `redis_backend::keys`):
//! - `<prefix>l:{team}:days`    day → credits spent;
//! - `<prefix>l:{team}:held`    reservation id → "amount:expires_ms:day";
//! - `<prefix>l:{team}:routes`  "day|route|s" (spent) / "day|route|v" (saved);
//! - `<prefix>l:{team}:settled` reservation id → when it ended (ms), kept
//!   for twice the lease: what makes a settle idempotent;
//! - `<prefix>l:{team}:settled_at` the same marks as a sorted set scored by
//!   that time, so that a settle forgets the few oldest past the window
//!   (`ZRANGEBYSCORE … LIMIT`, O(log n)) instead of reading every mark
//!   (issue 19: an `HGETALL` per settle made each settle O(marks));
//! - `<prefix>l:{team}:settled_scan` where the walk over unindexed marks
//!   (see *Upgrading*) goes on;
//! - `<prefix>l:{team}:lapsed` reservation id → the amount its lapse
//!   counted, forgotten with its mark: what a late settle adds its excess
//!   over.
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
//! index to go stale, at most twice the lease of marks, which the next
//! upgrade prunes.

mod scripts;

use super::saved::{SavedTally, FLUSH_EVERY};
use super::{new_id, LedgerError, Reservation, Reserved, TeamUsage, UsageRow, Window, UNSETTLED};
use crate::clock::Clock;
use crate::metrics::RedisOp;
use crate::redis_backend::keys::{Keys, LedgerKey};
use crate::redis_backend::RedisBackend;
use crate::route::Route;
use backon::{ExponentialBuilder, Retryable};
use redis::Script;
use scripts::{RESERVE, SETTLE};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most marks one settle forgets: more than a settle adds, so a
/// backlog (after an idle spell, a burst of lapses) drains.
pub const FORGET_PER_SETTLE: u64 = 64;

/// Hash buckets (about as many marks) one settle walks while marks of the
/// previous release lack an index entry (measured with 100k such marks:
/// ~0.15 ms a settle while the walk lasts, where the old script took ~100 ms).
pub const WALK_PER_SETTLE: u64 = 16;

/// team → (credits used, when it was read).
type Recent = std::collections::HashMap<String, (u64, std::time::Instant)>;

pub struct RedisLedger {
    redis: Arc<RedisBackend>,
    /// Credits saved by hits, written every `FLUSH_EVERY` by a background task.
    saved: Arc<SavedTally>,
    /// team → (credits used, when read): the budget headers of hits need no
    /// Redis round trip each.
    recent: std::sync::Mutex<Recent>,
    /// A team's keys, one `{team}` tag: a script's keys share a slot.
    keys: Keys,
    reserve: Script,
    settle: Script,
    lease: Duration,
    pub(super) window: Window,
    /// Days booked and reservation expiries (shifted only in tests).
    pub(super) clock: Clock,
}

impl RedisLedger {
    /// Must run inside a tokio runtime: it starts the saved-credits writer.
    pub fn new(redis: Arc<RedisBackend>, prefix: &str, window: Window, lease: Duration) -> RedisLedger {
        let saved = Arc::new(SavedTally::default());
        let keys = Keys::new(prefix);
        tokio::spawn(flush_saved(Arc::downgrade(&saved), redis.clone(), keys.clone()));
        RedisLedger {
            redis,
            saved,
            recent: Default::default(),
            keys,
            reserve: Script::new(RESERVE),
            settle: Script::new(SETTLE),
            lease,
            window,
            clock: Clock::default(),
        }
    }

    /// Books days and expiries on `clock` (tests: `quota.clock_offset_secs`).
    pub fn with_clock(mut self, clock: Clock) -> RedisLedger {
        self.clock = clock;
        self
    }

    pub async fn reserve(
        &self,
        team: &str,
        limit: Option<u64>,
        amount: u64,
        today: u32,
    ) -> Result<Reserved, LedgerError> {
        let id = new_id();
        let now = self.clock.now_ms();
        let reserved_at = Instant::now();
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
        let invocation = || {
            let mut inv = self.reserve.prepare_invoke();
            for k in &keys {
                inv.key(k);
            }
            inv.arg(amount)
                .arg(limit_arg)
                .arg(now)
                .arg(self.window.first_day(today))
                .arg(now.saturating_add(millis(self.lease)))
                .arg(id)
                .arg(today)
                .arg(UNSETTLED);
            inv
        };
        // The first call after a Redis restart finds a dead connection:
        // tried once more on a fresh one. A reserve that did not run holds
        // nothing; one that did run is overwritten under the same id (held
        // once; at the limit's very edge it may refuse: erring to count).
        let (granted, used): (u64, u64) = self
            .redis
            .call_reconnecting(RedisOp::LedgerReserve, |mut c| {
                let inv = invocation();
                async move { inv.invoke_async(&mut c).await }
            })
            .await
            .map_err(|e| LedgerError(format!("ledger reserve: {e}")))?;
        Ok(match (granted, limit) {
            (0, Some(limit)) => Reserved::Rejected { used, limit },
            _ => Reserved::Granted(Reservation {
                id,
                team: team.to_string(),
                amount,
                settle_by: reserved_at + self.lease.saturating_sub(Duration::from_secs(1)),
            }),
        })
    }

    /// Records the spend once, retrying a Redis that blips (a retry that
    /// already ran counts nothing) until `settle_by`; after that the
    /// reservation lapses into spend at its full amount.
    pub async fn settle(&self, r: Reservation, actual: u64, route: Route, today: u32) -> Result<(), LedgerError> {
        self.recent_lock().remove(&r.team);
        // The order `scripts::SETTLE` reads them in.
        let keys = LedgerKey::ALL.map(|k| self.keys.ledger(&r.team, k));
        let once = || async {
            let now = self.clock.now_ms();
            let mut inv = self.settle.prepare_invoke();
            for k in &keys {
                inv.key(k);
            }
            inv.arg(r.id)
                .arg(actual)
                .arg(today)
                .arg(route.as_str())
                .arg(today.saturating_sub(super::ROLLING_DAYS + 32))
                .arg(now)
                .arg(now.saturating_sub(millis(self.lease).saturating_mul(2)))
                .arg(FORGET_PER_SETTLE)
                .arg(WALK_PER_SETTLE);
            self.redis
                .call(RedisOp::LedgerSettle, |mut c| async move {
                    inv.invoke_async::<u64>(&mut c).await
                })
                .await
        };
        let settled = once.retry(until(r.settle_by)).await;
        self.recent_lock().remove(&r.team);
        settled
            .map(drop)
            .map_err(|e| LedgerError(format!("ledger settle: {e}")))
    }

    /// Frees the credits, retried like a settle; one that never lands lets
    /// the reservation lapse into spend (over-, never under-charged).
    pub(super) async fn release(&self, r: Reservation) {
        let key = self.keys.ledger(&r.team, LedgerKey::Held);
        let once = || async {
            let key = key.clone();
            self.redis
                .call(RedisOp::LedgerRelease, |mut c| async move {
                    redis::cmd("HDEL").arg(&key).arg(r.id).query_async::<u64>(&mut c).await
                })
                .await
        };
        let _ = once.retry(until(r.settle_by)).await;
    }

    pub(super) fn record_saved(&self, team: &str, route: Route, credits: u64, today: u32) {
        if credits > 0 {
            self.saved.add(team, today, route, credits);
        }
    }

    pub(super) async fn used(&self, team: &str, today: u32) -> Result<u64, LedgerError> {
        let fresh = Duration::from_secs(1);
        if let Some((used, at)) = self.recent_lock().get(team) {
            if at.elapsed() < fresh {
                return Ok(*used);
            }
        }
        let used = self.usage(team, today).await?.used;
        self.recent_lock()
            .insert(team.to_string(), (used, std::time::Instant::now()));
        Ok(used)
    }

    fn recent_lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub async fn usage(&self, team: &str, today: u32) -> Result<TeamUsage, LedgerError> {
        let key = self.keys.ledger(team, LedgerKey::Days);
        let days: Vec<(u32, u64)> = self
            .redis
            .call(RedisOp::LedgerUsage, |mut c| async move {
                redis::cmd("HGETALL").arg(&key).query_async(&mut c).await
            })
            .await
            .map_err(|e| LedgerError(format!("ledger usage: {e}")))?;
        let first = self.window.first_day(today);
        let mut daily: Vec<(u32, u64)> = days
            .into_iter()
            .filter(|(d, c)| *d >= first && *d <= today && *c > 0)
            .collect();
        daily.sort_unstable();
        Ok(TeamUsage {
            used: daily.iter().map(|(_, c)| c).sum(),
            daily,
        })
    }

    pub(super) async fn rows(&self, teams: &[String], from: u32, to: u32) -> Result<Vec<UsageRow>, LedgerError> {
        let mut rows: Vec<UsageRow> = Vec::new();
        for team in teams {
            let key = self.keys.ledger(team, LedgerKey::Routes);
            let fields: Vec<(String, u64)> = self
                .redis
                .call(RedisOp::LedgerRows, |mut c| async move {
                    redis::cmd("HGETALL").arg(&key).query_async(&mut c).await
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

/// Backoff from 50 ms to 1 s for as long as `deadline` allows.
fn until(deadline: Instant) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(1))
        .with_max_times(usize::MAX)
        .with_total_delay(Some(deadline.saturating_duration_since(Instant::now())))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Writes the saved-credits tally every `FLUSH_EVERY` (one pipeline of
/// HINCRBY); what fails is kept for the next round. Ends with the ledger.
async fn flush_saved(tally: std::sync::Weak<SavedTally>, redis: Arc<RedisBackend>, keys: Keys) {
    loop {
        tokio::time::sleep(FLUSH_EVERY).await;
        let Some(tally) = tally.upgrade() else { return };
        let rows = tally.take();
        if rows.is_empty() {
            continue;
        }
        // One pipeline per team: a pipeline must stay in one Cluster slot.
        let mut failed = Vec::new();
        for team_rows in rows.chunk_by(|a, b| a.0 == b.0) {
            let mut pipe = redis::pipe();
            for (team, day, route, credits) in team_rows {
                let key = keys.ledger(team, LedgerKey::Routes);
                pipe.cmd("HINCRBY")
                    .arg(key)
                    .arg(format!("{day}|{}|v", route.as_str()))
                    .arg(*credits)
                    .ignore();
            }
            let written = redis
                .call(RedisOp::LedgerSaved, |mut c| async move {
                    pipe.query_async::<()>(&mut c).await
                })
                .await;
            if written.is_err() {
                failed.extend_from_slice(team_rows);
            }
        }
        if !failed.is_empty() {
            tally.restore(failed);
        }
    }
}
