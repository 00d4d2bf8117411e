//! The file ledger's disk side: the redb tables, the start-up load (which
//! turns reservations a dead process left into spend) and the writer thread
//! that group-commits every queued write in one fsync'd transaction.

use super::super::saved::{SavedTally, FLUSH_EVERY};
use super::super::{UsageRow, UNSETTLED};
use crate::route::Route;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;

/// (team, day, route) → (credits spent, credits saved).
const SPEND: TableDefinition<(&str, u32, &str), (u64, u64)> = TableDefinition::new("spend");

/// Reservation id → (team, amount, day): reservations whose call may be
/// running (or was, when the process died).
const HELD: TableDefinition<u64, (&str, u64, u32)> = TableDefinition::new("held");

/// One change for the writer thread.
pub(super) enum Op {
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
    /// Spend of a reservation that was never written (a free call's hold
    /// of 0 credits that the upstream charged after all).
    Spend {
        team: String,
        day: u32,
        route: &'static str,
        spent: u64,
    },
    /// Nothing: answered once every write queued before it is committed
    /// (a reader that must see settles not waited for).
    Flush,
}

/// A write, answered once it is durable (when someone waits for it).
pub(super) struct Write {
    pub(super) op: Op,
    pub(super) done: Option<oneshot::Sender<Result<(), String>>>,
}

/// What a start finds on disk.
pub(super) struct Loaded {
    /// (team, day, credits spent) since the day asked for.
    pub(super) spend: Vec<(String, u32, u64)>,
    /// Reservations a dead process left, now counted as spent.
    pub(super) unsettled: usize,
}

/// Turns the reservations a dead process left into spend, then reads the
/// spend since `since`. A hold becomes spend on the later of its day and
/// `today` (the day it is turned into spend).
pub(super) fn load(db: &Database, since: u32, today: u32) -> Result<Loaded, redb::Error> {
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
            let key = (team.as_str(), (*day).max(today), UNSETTLED);
            let (spent, saved) = spend.get(key)?.map_or((0, 0), |v| v.value());
            spend.insert(key, (spent.saturating_add(*amount), saved))?;
        }
        rows.len()
    };
    txn.commit()?;
    let read = db.begin_read()?;
    let table = read.open_table(SPEND)?;
    let mut spend = Vec::new();
    for item in table.iter()? {
        let (k, v) = item?;
        let (team, day, _route) = k.value();
        let (spent, _saved) = v.value();
        if day >= since && spent > 0 {
            spend.push((team.to_string(), day, spent));
        }
    }
    Ok(Loaded { spend, unsettled })
}

/// The spend rows between two days inclusive.
pub(super) fn read_rows(db: &Database, from: u32, to: u32) -> Result<Vec<UsageRow>, redb::Error> {
    let txn = db.begin_read()?;
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
}

/// The writer thread: drain what is queued, one transaction, one fsync,
/// then answer every settle in it. Saved credits ride along, and are
/// written on their own (without fsync) every `FLUSH_EVERY` when idle.
pub(super) fn writer(db: Arc<Database>, rx: mpsc::Receiver<Write>, saved: Arc<SavedTally>) {
    loop {
        let mut batch = Vec::new();
        let mut last = match rx.recv_timeout(FLUSH_EVERY) {
            Ok(first) => {
                batch.push(first);
                drain(&rx, &mut batch);
                false
            }
            Err(mpsc::RecvTimeoutError::Timeout) => false,
            Err(mpsc::RecvTimeoutError::Disconnected) => true,
        };
        // Nobody waits on this batch (ends covered by their durable holds):
        // give the next waited-for write a moment to share its fsync, so a
        // miss costs one fsync (its hold, with the last miss's end), not two.
        if !batch.is_empty() && batch.iter().all(|w| w.done.is_none()) {
            match rx.recv_timeout(LAZY_WINDOW) {
                Ok(more) => {
                    batch.push(more);
                    drain(&rx, &mut batch);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => last = true,
            }
        }
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

/// How long a batch nobody waits for may wait for company.
const LAZY_WINDOW: std::time::Duration = std::time::Duration::from_millis(50);

fn drain(rx: &mpsc::Receiver<Write>, batch: &mut Vec<Write>) {
    while let Ok(more) = rx.try_recv() {
        batch.push(more);
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
                Op::Spend {
                    team,
                    day,
                    route,
                    spent,
                } => credit(team, *day, route, *spent, 0)?,
                Op::Flush => {}
            }
        }
        for (team, day, route, credits) in saved {
            credit(team, *day, route.as_str(), 0, *credits)?;
        }
    }
    txn.commit()?;
    Ok(())
}
