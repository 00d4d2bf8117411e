//! The file ledger: spend durably in redb, budgets checked in memory.
//!
//! Memory holds a mirror of the last days' spend (loaded at start) and the
//! reservations in flight; the budget check is a mutex-guarded sum. Writes go
//! to one writer thread that commits every write queued at that moment in
//! one fsync'd transaction (group commit) and only then answers.
//!
//! **Durable intent**: a metered reservation is written (`held` table)
//! before its upstream call may start, and removed by its settle or release
//! in the same transaction that records the spend. A process that dies in
//! between leaves the row behind; at the next start every such row counts
//! as spent at its full amount (route `unsettled`): the upstream may have
//! charged it, and the budget must never forget a charge.

use super::saved::{SavedTally, FLUSH_EVERY};
use super::{new_id, LedgerError, Reservation, Reserved, TeamUsage, UsageRow, Window, UNSETTLED};
use crate::route::Route;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// (team, day, route) → (credits spent, credits saved).
const SPEND: TableDefinition<(&str, u32, &str), (u64, u64)> = TableDefinition::new("spend");

/// Reservation id → (team, amount, day): reservations whose call may be
/// running (or was, when the process died).
const HELD: TableDefinition<u64, (&str, u64, u32)> = TableDefinition::new("held");

/// Days of spend kept in memory: enough for either window.
const MEMORY_DAYS: u32 = 62;

/// One change for the writer thread.
enum Op {
    /// A reservation, written before its call starts.
    Hold {
        id: u64,
        team: String,
        amount: u64,
        day: u32,
    },
    /// Ends a reservation: removes its row and, if the row was still there
    /// (not ended before: idempotent), records `spent` under `route`.
    End {
        id: u64,
        team: String,
        day: u32,
        route: &'static str,
        spent: u64,
    },
}

/// A write, answered once it is durable (when someone waits for it).
struct Write {
    op: Op,
    done: Option<oneshot::Sender<Result<(), String>>>,
}

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
    days: HashMap<String, BTreeMap<u32, u64>>,
    held: HashMap<u64, Hold>,
}

pub struct FileLedger {
    db: Arc<Database>,
    state: Mutex<State>,
    writes: mpsc::Sender<Write>,
    /// Credits saved by hits, written by the writer thread in the background.
    saved: Arc<SavedTally>,
    /// Joined on drop, so the file is closed when the ledger is gone.
    writer: Option<std::thread::JoinHandle<()>>,
    lease: Duration,
    pub window: Window,
}

impl FileLedger {
    /// Opens (or creates) `<dir>/ledger.redb` and loads recent spend.
    pub fn open(dir: &Path, window: Window, lease: Duration) -> Result<FileLedger, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("quota.path: cannot create {}: {e}", dir.display()))?;
        let path = dir.join("ledger.redb");
        let db = Database::create(&path).map_err(|e| format!("quota.path: cannot open {}: {e}", path.display()))?;
        let db = Arc::new(db);
        let mut state = State::default();
        let unsettled = load(&db, &mut state, super::today())
            .map_err(|e| format!("quota.path: cannot read {}: {e}", path.display()))?;
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
            .spawn(move || writer(writer_db, rx, writer_saved))
            .map_err(|e| format!("ledger writer: {e}"))?;
        Ok(FileLedger {
            db,
            state: Mutex::new(state),
            writes: tx,
            saved,
            writer: Some(handle),
            lease,
            window,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `amount` unless that would pass `limit`; a metered hold is
    /// durable before this returns.
    pub async fn reserve(
        &self,
        team: &str,
        limit: Option<u64>,
        amount: u64,
        today: u32,
    ) -> Result<Reserved, LedgerError> {
        let id = new_id();
        let now = Instant::now();
        {
            let mut s = self.lock();
            self.lapse_expired(&mut s, now);
            let spent = window_sum(s.days.get(team), self.window.first_day(today));
            let held = s
                .held
                .values()
                .filter(|h| h.team == team)
                .fold(0u64, |sum, h| sum.saturating_add(h.amount));
            let used = spent.saturating_add(held);
            if let Some(limit) = limit {
                if used.saturating_add(amount) > limit {
                    return Ok(Reserved::Rejected { used, limit });
                }
            }
            let hold = Hold {
                team: team.to_string(),
                amount,
                day: today,
                expires: now + self.lease,
            };
            s.held.insert(id, hold);
        }
        if amount > 0 {
            let op = Op::Hold {
                id,
                team: team.to_string(),
                amount,
                day: today,
            };
            if let Err(e) = self.write(op).await {
                self.lock().held.remove(&id);
                return Err(LedgerError(e));
            }
        }
        Ok(Reserved::Granted(Reservation {
            id,
            team: team.to_string(),
            amount,
            settle_by: now + self.lease.saturating_sub(Duration::from_secs(1)),
        }))
    }

    /// Reservations past their lease count as spent: their owner is gone.
    fn lapse_expired(&self, s: &mut State, now: Instant) {
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
            add(&mut s.days, &h.team, h.day, h.amount);
            let op = Op::End {
                id,
                team: h.team,
                day: h.day,
                route: UNSETTLED,
                spent: h.amount,
            };
            // Not awaited: the held row already makes this durable.
            let _ = self.writes.send(Write { op, done: None });
        }
    }

    /// Queues a write and waits until it is durable.
    async fn write(&self, op: Op) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        match self.writes.send(Write { op, done: Some(tx) }) {
            Ok(()) => rx.await.unwrap_or_else(|_| Err("ledger writer stopped".into())),
            Err(_) => Err("ledger writer stopped".into()),
        }
    }

    pub async fn settle(&self, r: Reservation, actual: u64, route: Route, today: u32) -> Result<(), LedgerError> {
        // Spend counts in memory even when the disk fails: the upstream
        // charged it, so the budget must see it (fail closed). A reservation
        // that already lapsed was counted in full, once.
        let was_held = {
            let mut s = self.lock();
            let was_held = s.held.remove(&r.id).is_some();
            if was_held && actual > 0 {
                add(&mut s.days, &r.team, today, actual);
            }
            was_held
        };
        if !was_held || r.amount == 0 && actual == 0 {
            return Ok(());
        }
        let op = Op::End {
            id: r.id,
            team: r.team,
            day: today,
            route: route.as_str(),
            spent: actual,
        };
        self.write(op).await.map_err(LedgerError)
    }

    pub fn release(&self, r: Reservation) {
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

    pub fn record_saved(&self, team: &str, route: Route, credits: u64, today: u32) {
        if credits > 0 {
            self.saved.add(team, today, route, credits);
        }
    }

    /// The same sum `reserve` checks the budget against (settled spend).
    pub fn used(&self, team: &str, today: u32) -> u64 {
        window_sum(self.lock().days.get(team), self.window.first_day(today))
    }

    pub fn usage(&self, team: &str, today: u32) -> TeamUsage {
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

    pub fn rows(&self, from: u32, to: u32) -> Vec<UsageRow> {
        let read = || -> Result<Vec<UsageRow>, redb::Error> {
            let txn = self.db.begin_read()?;
            let table = match txn.open_table(SPEND) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut rows = Vec::new();
            for item in table.iter()? {
                let (k, v) = item?;
                let (team, day, route) = k.value();
                let (spent, saved) = v.value();
                if (from..=to).contains(&day) {
                    rows.push(UsageRow {
                        team: team.to_string(),
                        day,
                        route: route.to_string(),
                        spent,
                        saved,
                    });
                }
            }
            Ok(rows)
        };
        let mut rows = read().unwrap_or_else(|e| {
            tracing::error!(error = %e, "ledger read failed");
            Vec::new()
        });
        self.saved.merge_into(&mut rows, from, to);
        rows
    }

    /// Writable: a write transaction can begin.
    pub fn check(&self) -> Result<(), String> {
        self.db
            .begin_write()
            .map(drop)
            .map_err(|e| format!("ledger not writable: {e}"))
    }
}

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

fn add(days: &mut HashMap<String, BTreeMap<u32, u64>>, team: &str, day: u32, credits: u64) {
    let slot = days.entry(team.to_string()).or_default().entry(day).or_insert(0);
    *slot = slot.saturating_add(credits);
}

/// Turns the reservations a dead process left into spend, then loads the
/// recent spend into memory. Returns how many reservations were left.
fn load(db: &Database, state: &mut State, today: u32) -> Result<usize, redb::Error> {
    let txn = db.begin_write()?;
    let unsettled = {
        let mut held = txn.open_table(HELD)?;
        let mut spend = txn.open_table(SPEND)?;
        let mut rows = Vec::new();
        for item in held.iter()? {
            let (id, v) = item?;
            let (team, amount, day) = v.value();
            rows.push((id.value(), team.to_string(), amount, day));
        }
        for (id, team, amount, day) in &rows {
            held.remove(id)?;
            let key = (team.as_str(), *day, UNSETTLED);
            let (spent, saved) = spend.get(key)?.map_or((0, 0), |v| v.value());
            spend.insert(key, (spent.saturating_add(*amount), saved))?;
        }
        rows.len()
    };
    txn.commit()?;
    let read = db.begin_read()?;
    let table = read.open_table(SPEND)?;
    let since = today.saturating_sub(MEMORY_DAYS);
    for item in table.iter()? {
        let (k, v) = item?;
        let (team, day, _route) = k.value();
        let (spent, _saved) = v.value();
        if day >= since && spent > 0 {
            add(&mut state.days, team, day, spent);
        }
    }
    Ok(unsettled)
}

/// The writer thread: drain what is queued, one transaction, one fsync,
/// then answer every settle in it. Saved credits ride along, and are
/// written on their own (without fsync) every `FLUSH_EVERY` when idle.
fn writer(db: Arc<Database>, rx: mpsc::Receiver<Write>, saved: Arc<SavedTally>) {
    loop {
        let mut batch = Vec::new();
        let last = match rx.recv_timeout(FLUSH_EVERY) {
            Ok(first) => {
                batch.push(first);
                while let Ok(more) = rx.try_recv() {
                    batch.push(more);
                }
                false
            }
            Err(mpsc::RecvTimeoutError::Timeout) => false,
            Err(mpsc::RecvTimeoutError::Disconnected) => true,
        };
        let tally = saved.take();
        if batch.is_empty() && tally.is_empty() && !last {
            continue;
        }
        let result = commit(&db, &batch, &tally, last).map_err(|e| {
            tracing::error!(error = %e, writes = batch.len(), "ledger commit failed");
            format!("ledger commit failed: {e}")
        });
        if result.is_err() {
            saved.restore(tally);
        }
        for w in batch {
            if let Some(done) = w.done {
                let _ = done.send(result.clone());
            }
        }
        if last {
            return;
        }
    }
}

/// Writes are durable (fsync) when the commit returns; a commit of saved
/// credits alone is not, unless it is the last one before closing.
fn commit(db: &Database, batch: &[Write], saved: &[(String, u32, Route, u64)], last: bool) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    if batch.is_empty() && !last {
        let _ = txn.set_durability(redb::Durability::None);
    }
    {
        let mut held = txn.open_table(HELD)?;
        let mut table = txn.open_table(SPEND)?;
        let mut credit = |team: &str, day: u32, route: &str, spent_now: u64, saved_now: u64| {
            let key = (team, day, route);
            let (spent, saved) = table.get(key)?.map_or((0, 0), |v| v.value());
            table.insert(key, (spent.saturating_add(spent_now), saved.saturating_add(saved_now)))?;
            Ok::<(), redb::Error>(())
        };
        for w in batch {
            match &w.op {
                Op::Hold { id, team, amount, day } => {
                    held.insert(*id, (team.as_str(), *amount, *day))?;
                }
                Op::End {
                    id,
                    team,
                    day,
                    route,
                    spent,
                } => {
                    // Only the first end of a reservation counts.
                    let was_held = held.remove(*id)?.is_some();
                    if was_held && *spent > 0 {
                        credit(team, *day, route, *spent, 0)?;
                    }
                }
            }
        }
        for (team, day, route, credits) in saved {
            credit(team, *day, route.as_str(), 0, *credits)?;
        }
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(dir: &Path) -> FileLedger {
        FileLedger::open(dir, Window::Rolling30d, Duration::from_secs(60)).expect("opens")
    }

    async fn granted(l: &FileLedger, limit: u64, amount: u64, today: u32) -> Reservation {
        match l.reserve("t", Some(limit), amount, today).await.expect("reserve") {
            Reserved::Granted(r) => r,
            other => panic!("not granted: {other:?}"),
        }
    }

    #[tokio::test]
    async fn reserve_settle_release_and_restart() {
        let dir = tempfile::tempdir().unwrap();
        let today = crate::ledger::today();
        {
            let l = ledger(dir.path());
            let a = granted(&l, 100, 60, today).await;
            assert_eq!(
                l.reserve("t", Some(100), 50, today).await.unwrap(),
                Reserved::Rejected { used: 60, limit: 100 }
            );
            l.settle(a, 10, Route::PermitsSearch, today).await.expect("settle");
            let b = granted(&l, 100, 90, today).await;
            l.release(b);
            assert_eq!(l.usage("t", today).used, 10);
            l.record_saved("t", Route::PermitsSearch, 5, today);
        }
        let l = ledger(dir.path());
        assert_eq!(
            l.usage("t", today).used,
            10,
            "spend survives a restart; a release is no spend"
        );
        assert_eq!(l.usage("t", today + 30).used, 0, "and leaves the rolling window");
        let rows = l.rows(today, today);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].spent, rows[0].saved), (10, 5));
    }

    #[tokio::test]
    async fn a_reservation_left_by_a_dead_process_counts_as_spent_after_restart() {
        let dir = tempfile::tempdir().unwrap();
        let today = crate::ledger::today();
        {
            let l = ledger(dir.path());
            let settled = granted(&l, 100, 30, today).await;
            l.settle(settled, 25, Route::PermitsSearch, today)
                .await
                .expect("settle");
            // Never settled: the process "dies" with it in flight.
            std::mem::forget(granted(&l, 100, 40, today).await);
        }
        let l = ledger(dir.path());
        assert_eq!(l.usage("t", today).used, 65, "25 settled + 40 worst case");
        let unsettled: u64 = l
            .rows(today, today)
            .iter()
            .filter(|r| r.route == UNSETTLED)
            .map(|r| r.spent)
            .sum();
        assert_eq!(unsettled, 40);
        drop(l);
        assert_eq!(
            ledger(dir.path()).usage("t", today).used,
            65,
            "converted once, not again"
        );
    }

    #[tokio::test]
    async fn lapsed_reservations_count_as_spent_once() {
        let dir = tempfile::tempdir().unwrap();
        let l = FileLedger::open(dir.path(), Window::Rolling30d, Duration::ZERO).expect("opens");
        let today = crate::ledger::today();
        let first = granted(&l, 10, 6, today).await;
        assert!(
            matches!(
                l.reserve("t", Some(10), 6, today).await.unwrap(),
                Reserved::Rejected { used: 6, .. }
            ),
            "the lapsed reservation is spent, not given back"
        );
        l.settle(first, 2, Route::PermitsSearch, today).await.expect("settle");
        assert_eq!(
            l.usage("t", today).used,
            6,
            "a settle after the lapse does not count twice"
        );
    }
}
