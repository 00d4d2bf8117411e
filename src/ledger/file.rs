//! The file ledger: spend durably in redb, budgets checked in memory.
//!
//! Memory holds a mirror of the last days' spend (loaded at start) and the
//! reservations in flight; reserve is a mutex-guarded sum, no I/O. Settles go
//! to one writer thread that commits every settle queued at that moment in
//! one fsync'd transaction (group commit) and only then answers, so a settle
//! is durable before its response leaves. Reservations are never written:
//! when the process dies they vanish with it, which is their expiry.

use super::saved::{SavedTally, FLUSH_EVERY};
use super::{LedgerError, Reservation, Reserved, TeamUsage, UsageRow, Window};
use crate::route::Route;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// (team, day, route) → (credits spent, credits saved).
const SPEND: TableDefinition<(&str, u32, &str), (u64, u64)> = TableDefinition::new("spend");

/// Days of spend kept in memory: enough for either window.
const MEMORY_DAYS: u32 = 62;

/// One settle for the writer thread, answered once it is durable.
struct Write {
    team: String,
    day: u32,
    route: &'static str,
    spent: u64,
    done: oneshot::Sender<Result<(), String>>,
}

#[derive(Default)]
struct State {
    /// team → day → credits spent.
    days: HashMap<String, BTreeMap<u32, u64>>,
    /// id → (team, amount, expires).
    held: HashMap<u64, (String, u64, Instant)>,
    next_id: u64,
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
        load(&db, &mut state, super::today())
            .map_err(|e| format!("quota.path: cannot read {}: {e}", path.display()))?;
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

    pub fn reserve(&self, team: &str, limit: Option<u64>, amount: u64, today: u32) -> Reserved {
        let mut s = self.lock();
        let now = Instant::now();
        s.held.retain(|_, (_, _, expires)| *expires > now);
        let spent = window_sum(s.days.get(team), self.window.first_day(today));
        let held: u64 = s.held.values().filter(|(t, _, _)| t == team).map(|(_, a, _)| a).sum();
        if let Some(limit) = limit {
            if spent + held + amount > limit {
                return Reserved::Rejected {
                    used: spent + held,
                    limit,
                };
            }
        }
        s.next_id += 1;
        let id = s.next_id;
        s.held.insert(id, (team.to_string(), amount, now + self.lease));
        Reserved::Granted(Reservation {
            id,
            team: team.to_string(),
            amount,
        })
    }

    pub async fn settle(&self, r: Reservation, actual: u64, route: Route, today: u32) -> Result<(), LedgerError> {
        let result = if actual == 0 {
            Ok(())
        } else {
            let (tx, rx) = oneshot::channel();
            let write = Write {
                team: r.team.clone(),
                day: today,
                route: route.as_str(),
                spent: actual,
                done: tx,
            };
            match self.writes.send(write) {
                Ok(()) => rx.await.unwrap_or_else(|_| Err("ledger writer stopped".into())),
                Err(_) => Err("ledger writer stopped".into()),
            }
        };
        // Spend counts in memory even when the disk failed: the upstream
        // charged it, so the budget must see it (fail closed).
        let mut s = self.lock();
        s.held.remove(&r.id);
        if actual > 0 {
            *s.days.entry(r.team).or_default().entry(today).or_insert(0) += actual;
        }
        result.map_err(LedgerError)
    }

    pub fn release(&self, r: Reservation) {
        self.lock().held.remove(&r.id);
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
    days.map_or(0, |d| d.range(first..).map(|(_, c)| c).sum())
}

fn load(db: &Database, state: &mut State, today: u32) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    txn.open_table(SPEND)?;
    txn.commit()?;
    let read = db.begin_read()?;
    let table = read.open_table(SPEND)?;
    let since = today.saturating_sub(MEMORY_DAYS);
    for item in table.iter()? {
        let (k, v) = item?;
        let (team, day, _route) = k.value();
        let (spent, _saved) = v.value();
        if day >= since && spent > 0 {
            *state.days.entry(team.to_string()).or_default().entry(day).or_insert(0) += spent;
        }
    }
    Ok(())
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
            let _ = w.done.send(result.clone());
        }
        if last {
            return;
        }
    }
}

/// Settles are durable (fsync) when the commit returns; a commit of saved
/// credits alone is not, unless it is the last one before closing.
fn commit(db: &Database, batch: &[Write], saved: &[(String, u32, Route, u64)], last: bool) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    if batch.is_empty() && !last {
        let _ = txn.set_durability(redb::Durability::None);
    }
    {
        let mut table = txn.open_table(SPEND)?;
        let rows = batch
            .iter()
            .map(|w| (w.team.as_str(), w.day, w.route, w.spent, 0))
            .chain(saved.iter().map(|(t, d, r, c)| (t.as_str(), *d, r.as_str(), 0, *c)));
        for (team, day, route, spent_now, saved_now) in rows {
            let key = (team, day, route);
            let (spent, saved) = table.get(key)?.map_or((0, 0), |v| v.value());
            table.insert(key, (spent + spent_now, saved + saved_now))?;
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

    #[tokio::test]
    async fn reserve_settle_release_and_restart() {
        let dir = tempfile::tempdir().unwrap();
        let today = crate::ledger::today();
        {
            let l = ledger(dir.path());
            let Reserved::Granted(a) = l.reserve("t", Some(100), 60, today) else {
                panic!("granted")
            };
            assert_eq!(
                l.reserve("t", Some(100), 50, today),
                Reserved::Rejected { used: 60, limit: 100 }
            );
            l.settle(a, 10, Route::PermitsSearch, today).await.expect("settle");
            let got = l.reserve("t", Some(100), 90, today);
            let Reserved::Granted(b) = got else {
                panic!("the difference came back: {got:?}")
            };
            l.release(b);
            assert_eq!(l.usage("t", today).used, 10);
            l.record_saved("t", Route::PermitsSearch, 5, today);
        }
        let l = ledger(dir.path());
        assert_eq!(l.usage("t", today).used, 10, "spend survives a restart");
        assert_eq!(l.usage("t", today + 30).used, 0, "and leaves the rolling window");
        let rows = l.rows(today, today);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].spent, rows[0].saved), (10, 5));
    }

    #[test]
    fn expired_reservations_stop_holding_credits() {
        let dir = tempfile::tempdir().unwrap();
        let l = FileLedger::open(dir.path(), Window::Rolling30d, Duration::ZERO).expect("opens");
        assert!(matches!(l.reserve("t", Some(10), 10, 1), Reserved::Granted(_)));
        assert!(
            matches!(l.reserve("t", Some(10), 10, 1), Reserved::Granted(_)),
            "the first lease ran out"
        );
    }
}
