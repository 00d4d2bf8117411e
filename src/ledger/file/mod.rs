//! The file ledger: spend durably in redb (`ledger.redb`), budgets checked
//! in memory.
//!
//! Memory holds a mirror of the last days' spend (loaded at start) and the
//! reservations in flight; the budget check is a mutex-guarded sum. Writes go
//! to one writer thread that commits every write queued at that moment in
//! one durable transaction (group commit) and only then answers. A settle
//! the durable hold already covers is not waited for (see `settle`): it
//! rides the next commit, usually the next miss's hold.
//!
//! **Durable intent**: a metered reservation is written (`held` table)
//! before its upstream call may start, and removed by its settle or release
//! in the same transaction that records the spend. A process that dies in
//! between leaves the row behind; at the next start every such row counts
//! as spent at its full amount (route `unsettled`): the upstream may have
//! charged it, and the budget must never forget a charge. It counts on the
//! later of its reservation's day and the day of that start: the charge
//! may have landed after midnight, and a window that closed meanwhile must
//! not hide it from the new one.
//!
//! **A damaged file is refused, never read as less spend**: every durable
//! commit is two-phase, and the start verifies every page (`disk::open`), so
//! a file cut or altered at rest stops the start with a message that names
//! it and says what to do. So does the hold log of the releases before
//! the file ledger was redb alone (`holds.log`), which this one does not
//! read. `ledger.redb` is the one file to back up (docs/operations.md).
//!
//! **The company's account starts whole**: a start that finds it without
//! spend in the window seeds it from the teams' (`seed`, before anything
//! is held in it).
//!
//! **The file records its format** (`format`): a start refuses a file of a
//! newer format than it knows, before writing anything, and brings an
//! older one up. The internal accounts (`*org`, `team/app`) have tables of
//! their own, which the releases before them do not read.

mod backup;
mod disk;
mod format;
#[cfg(test)]
mod format_tests;
mod seed;
#[cfg(test)]
mod tests;

use super::saved::SavedTally;
use super::{new_id, Budget, LedgerError, Refusal, Reservation, Reserved, TeamUsage, UsageRow, Window, UNSETTLED};
use crate::clock::Clock;
use crate::route::Route;
use disk::{Op, Write};
use redb::Database;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Days of spend kept in memory: enough for either window.
const MEMORY_DAYS: u32 = 62;

/// A reservation in memory.
struct Hold {
    team: String,
    amount: u64,
    day: u32,
    expires: Instant,
}

#[derive(Default)]
struct State {
    /// team → day → credits spent.
    /// By account (a team's, an app's, the company's): names from the
    /// config, so foldhash (a hit reads it for `X-Credits-Remaining`).
    days: Days,
    held: HashMap<u64, Hold>,
}

pub struct FileLedger {
    db: Arc<Database>,
    /// The folder of `ledger.redb` (`quota.path`).
    dir: std::path::PathBuf,
    state: Mutex<State>,
    writes: mpsc::Sender<Write>,
    /// Credits saved by hits, written by the writer thread in the background.
    saved: Arc<SavedTally>,
    /// Joined on drop, so the file is closed when the ledger is gone.
    writer: Option<std::thread::JoinHandle<()>>,
    /// A reservation's term, set by `quota.reservation_lease_secs`.
    term: Duration,
    pub(super) window: Window,
    /// The days spend is booked on (shifted only in tests).
    pub(super) clock: Clock,
}

impl FileLedger {
    /// Opens (or creates) `<dir>/ledger.redb` and loads recent spend,
    /// booking days on `clock`.
    pub(crate) fn open_at(dir: &Path, window: Window, term: Duration, clock: Clock) -> Result<FileLedger, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("quota.path: cannot create {}: {e}", dir.display()))?;
        let old_log = dir.join(disk::OLD_HOLD_LOG);
        if old_log.exists() {
            return Err(disk::old_hold_log(&old_log));
        }
        let path = dir.join("ledger.redb");
        let db = Arc::new(disk::open(&path)?);
        // Before anything is written: a newer format is refused as it is.
        format::check(&db, &path)?;
        let today = clock.today();
        let since = today.saturating_sub(MEMORY_DAYS);
        let cannot = |e: redb::Error| format!("quota.path: cannot read {}: {e}", path.display());
        // The holds a dead process left are spend before the company's
        // account is seeded from the teams' (`seed`), and both before the
        // spend is read.
        let unsettled = disk::recover(&db, today).map_err(cannot)?;
        let seeded = seed::seed_org(&db, super::seed_since(today), today).map_err(cannot)?;
        let spend = disk::read_spend(&db, since).map_err(cannot)?;
        let mut state = State::default();
        for (team, day, credits) in spend {
            add(&mut state.days, &team, day, credits);
        }
        if let Some(credits) = seeded.filter(|c| *c > 0) {
            tracing::info!(
                credits,
                "the company's account (quota.org_credit_limit) starts from the teams' spend already in the window"
            );
        }
        if unsettled > 0 {
            tracing::warn!(
                reservations = unsettled,
                "reservations left unsettled by the last run now count as spent"
            );
        }
        let (tx, rx) = mpsc::channel();
        let writer_db = db.clone();
        let saved = Arc::new(SavedTally::default());
        let writer_saved = saved.clone();
        let handle = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || disk::writer(writer_db, rx, writer_saved))
            .map_err(|e| format!("ledger writer: {e}"))?;
        Ok(FileLedger {
            db,
            dir: dir.to_path_buf(),
            state: Mutex::new(state),
            writes: tx,
            saved,
            writer: Some(handle),
            term,
            window,
            clock,
        })
    }

    /// A copy of the ledger as of its last commit, taken while it runs
    /// (`backup`): the bytes of a redb file to restore as `ledger.redb`.
    pub(super) async fn backup(&self) -> Result<Vec<u8>, LedgerError> {
        let (db, dir) = (self.db.clone(), self.dir.clone());
        tokio::task::spawn_blocking(move || backup::snapshot(&db, &dir))
            .await
            .map_err(|e| LedgerError(format!("ledger backup: {e}")))?
            .map_err(|e| LedgerError(format!("ledger backup: {e}")))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `amount` unless that would pass `limit`; a metered hold is
    /// durable before this returns.
    pub(super) async fn reserve(
        &self,
        team: &str,
        limit: Option<u64>,
        amount: u64,
        today: u32,
    ) -> Result<Reserved, LedgerError> {
        let budget = [Budget { account: team, limit }];
        Ok(match self.reserve_all(&budget, amount, today).await? {
            Ok(r) => Reserved::Granted(r),
            Err(refusal) => Reserved::Rejected {
                used: refusal.used,
                limit: refusal.limit,
            },
        })
    }

    /// Holds `amount` in every budget's account, or in none: checked and
    /// held under one lock, so no other reserve sees some of the holds and
    /// not the others; the metered holds are durable (one group commit)
    /// before this returns. The reservation is the first budget's, the
    /// others linked to it.
    pub(super) async fn reserve_all(
        &self,
        budgets: &[Budget<'_>],
        amount: u64,
        today: u32,
    ) -> Result<Result<Reservation, Refusal>, LedgerError> {
        let now = Instant::now();
        let ids: Vec<u64> = budgets.iter().map(|_| new_id()).collect();
        {
            let mut s = self.lock();
            self.lapse_expired(&mut s, now, today);
            for (i, b) in budgets.iter().enumerate() {
                let spent = window_sum(s.days.get(b.account), self.window.first_day(today));
                let held = s
                    .held
                    .values()
                    .filter(|h| h.team == b.account)
                    .fold(0u64, |sum, h| sum.saturating_add(h.amount));
                let used = spent.saturating_add(held);
                if let Some(limit) = b.limit {
                    if used.saturating_add(amount) > limit {
                        return Ok(Err(Refusal { budget: i, used, limit }));
                    }
                }
            }
            for (b, id) in budgets.iter().zip(&ids) {
                let hold = Hold {
                    team: b.account.to_string(),
                    amount,
                    day: today,
                    expires: now + self.term,
                };
                s.held.insert(*id, hold);
            }
        }
        if amount > 0 {
            // Queued together: one group commit makes them all durable.
            let waits: Vec<_> = budgets
                .iter()
                .zip(&ids)
                .map(|(b, id)| {
                    self.queue(Op::Hold {
                        id: *id,
                        team: b.account.to_string(),
                        amount,
                        day: today,
                    })
                })
                .collect();
            for wait in waits {
                if let Err(e) = wait.await {
                    let mut s = self.lock();
                    for id in &ids {
                        s.held.remove(id);
                    }
                    return Err(LedgerError(e));
                }
            }
        }
        let settle_by = now + self.term.saturating_sub(Duration::from_secs(1));
        let mut reservations = budgets.iter().zip(ids).map(|(b, id)| Reservation {
            id,
            team: b.account.to_string(),
            amount,
            settle_by,
            linked: Vec::new(),
        });
        let mut first = reservations
            .next()
            .ok_or_else(|| LedgerError("no budget to reserve in".into()))?;
        first.linked = reservations.collect();
        Ok(Ok(first))
    }

    /// Reservations past their term count as spent: their owner is gone.
    /// Booked on the later of the reservation's day and today's, the day it
    /// becomes spend.
    fn lapse_expired(&self, s: &mut State, now: Instant, today: u32) {
        let lapsed: Vec<u64> = s
            .held
            .iter()
            .filter(|(_, h)| h.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in lapsed {
            let Some(h) = s.held.remove(&id) else { continue };
            tracing::warn!(team = %h.team, credits = h.amount, "a reservation lapsed unsettled: counted as spent");
            if h.amount == 0 {
                continue;
            }
            let day = h.day.max(today);
            add(&mut s.days, &h.team, day, h.amount);
            let op = Op::End {
                id,
                team: h.team,
                day,
                route: UNSETTLED,
                spent: h.amount,
            };
            // Not awaited: the held row already makes this durable.
            let _ = self.writes.send(Write { op, done: None });
        }
    }

    /// Queues a write and waits until it is durable.
    async fn write(&self, op: Op) -> Result<(), String> {
        self.queue(op).await
    }

    /// Queues a write now; the future answers once it is durable.
    fn queue(&self, op: Op) -> impl std::future::Future<Output = Result<(), String>> {
        let (tx, rx) = oneshot::channel();
        let sent = self.writes.send(Write { op, done: Some(tx) });
        async move {
            match sent {
                Ok(()) => rx.await.unwrap_or_else(|_| Err("ledger writer stopped".into())),
                Err(_) => Err("ledger writer stopped".into()),
            }
        }
    }

    pub(super) async fn settle(
        &self,
        r: Reservation,
        actual: u64,
        route: Route,
        today: u32,
    ) -> Result<(), LedgerError> {
        // Spend counts in memory even when the disk fails: the upstream
        // charged it, so the budget must see it (fail closed). A reservation
        // that already lapsed was counted in full, once; a charge above it
        // adds its excess (a reservation is settled at most once, so one
        // that is no longer held lapsed).
        let was_held = {
            let mut s = self.lock();
            let was_held = s.held.remove(&r.id).is_some();
            if was_held && actual > 0 {
                add(&mut s.days, &r.team, today, actual);
            } else if !was_held && actual > r.amount {
                add(&mut s.days, &r.team, today, actual - r.amount);
            }
            was_held
        };
        let op = match (was_held, r.amount, actual) {
            (false, amount, actual) if actual > amount => Op::Spend {
                team: r.team,
                day: today,
                route: route.as_str(),
                spent: actual - amount,
            },
            (false, _, _) | (true, 0, 0) => return Ok(()),
            // A hold of 0 credits was never written: nothing to end.
            (true, 0, _) => Op::Spend {
                team: r.team,
                day: today,
                route: route.as_str(),
                spent: actual,
            },
            _ => Op::End {
                id: r.id,
                team: r.team,
                day: today,
                route: route.as_str(),
                spent: actual,
            },
        };
        // The hold row, durable since `reserve`, already covers a charge up
        // to its amount: a crash before this end commits counts the hold in
        // full at the next start (never less than was charged). So the
        // answer need not wait for this fsync; it rides the next group
        // commit. A charge above the hold, or with no hold, is not covered
        // and waits. (A failed commit is logged by the writer; memory
        // already counts the spend, and the hold stays on disk.)
        if matches!(op, Op::End { .. }) && actual <= r.amount {
            let _ = self.writes.send(Write { op, done: None });
            return Ok(());
        }
        self.write(op).await.map_err(LedgerError)
    }

    pub(super) fn release(&self, r: Reservation) {
        let was_held = self.lock().held.remove(&r.id).is_some();
        if was_held && r.amount > 0 {
            let op = Op::End {
                id: r.id,
                team: r.team,
                day: 0,
                route: UNSETTLED,
                spent: 0,
            };
            // Not awaited: a release lost to a crash only over-charges.
            let _ = self.writes.send(Write { op, done: None });
        }
    }

    pub(super) fn record_saved(&self, team: &str, route: Route, credits: u64, today: u32) {
        if credits > 0 {
            self.saved.add(team, today, route, credits);
        }
    }

    /// The same sum `reserve` checks the budget against (settled spend).
    pub(super) fn used(&self, team: &str, today: u32) -> u64 {
        window_sum(self.lock().days.get(team), self.window.first_day(today))
    }

    /// Settled spend plus the holds in flight: what `reserve` compares
    /// with the limit.
    pub(super) fn committed(&self, team: &str, today: u32) -> u64 {
        let s = self.lock();
        let held = s
            .held
            .values()
            .filter(|h| h.team == team)
            .fold(0u64, |sum, h| sum.saturating_add(h.amount));
        window_sum(s.days.get(team), self.window.first_day(today)).saturating_add(held)
    }

    pub(super) fn usage(&self, team: &str, today: u32) -> TeamUsage {
        let s = self.lock();
        let first = self.window.first_day(today);
        let daily: Vec<(u32, u64)> = s
            .days
            .get(team)
            .map(|d| {
                d.range(first..=today)
                    .map(|(d, c)| (*d, *c))
                    .filter(|(_, c)| *c > 0)
                    .collect()
            })
            .unwrap_or_default();
        TeamUsage {
            used: daily.iter().map(|(_, c)| c).sum(),
            daily,
        }
    }

    /// Every settle queued so far is in the rows (a settle covered by its
    /// hold does not wait for its commit: this read does).
    pub(super) async fn rows(&self, from: u32, to: u32) -> Vec<UsageRow> {
        if let Err(e) = self.write(Op::Flush).await {
            tracing::error!(error = %e, "ledger flush before read failed");
        }
        let mut rows = disk::read_rows(&self.db, from, to).unwrap_or_else(|e| {
            tracing::error!(error = %e, "ledger read failed");
            Vec::new()
        });
        self.saved.merge_into(&mut rows, from, to);
        rows
    }

    /// The write path works: a durable commit through the writer thread
    /// (the one that commits reservations, so a stuck or failing disk shows
    /// here), answered within `CHECK_WITHIN`. Never a redb transaction on
    /// the caller's (async) thread.
    pub(super) async fn check(&self) -> Result<(), String> {
        match tokio::time::timeout(CHECK_WITHIN, self.write(Op::Flush)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("ledger not writable: {e}")),
            Err(_) => Err(format!(
                "ledger not writable: no commit within {} ms",
                CHECK_WITHIN.as_millis()
            )),
        }
    }
}

/// How long `/readyz` waits for the ledger's probe commit.
const CHECK_WITHIN: Duration = Duration::from_secs(2);

impl Drop for FileLedger {
    fn drop(&mut self) {
        // Closing the channel ends the writer after its last batch.
        self.writes = mpsc::channel().0;
        if let Some(handle) = self.writer.take() {
            let _ = handle.join();
        }
    }
}

fn window_sum(days: Option<&BTreeMap<u32, u64>>, first: u32) -> u64 {
    days.map_or(0, |d| d.range(first..).fold(0u64, |sum, (_, c)| sum.saturating_add(*c)))
}

type Days = HashMap<String, BTreeMap<u32, u64>, foldhash::fast::RandomState>;

fn add(days: &mut Days, team: &str, day: u32, credits: u64) {
    let slot = days.entry(team.to_string()).or_default().entry(day).or_insert(0);
    *slot = slot.saturating_add(credits);
}
