//! The file ledger's disk side: the redb tables (the compacted state), the
//! start-up load (which replays the hold log and turns reservations a dead
//! process left into spend) and the writer thread, which appends every
//! queued write to the hold log with one `fdatasync` (group commit) and
//! folds the log into redb from time to time (`compact`).

use super::super::saved::{SavedTally, FLUSH_EVERY};
use super::super::{UsageRow, UNSETTLED};
use super::log::{self, HoldLog};
use crate::route::Route;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use std::borrow::Cow;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// (team, day, route) → (credits spent, credits saved).
const SPEND: TableDefinition<(&str, u32, &str), (u64, u64)> = TableDefinition::new("spend");

/// Reservation id → (team, amount, day): reservations whose call may be
/// running (or was, when the process died).
const HELD: TableDefinition<u64, (&str, u64, u32)> = TableDefinition::new("held");

/// `LOG_APPLIED` → the last hold-log generation whose records are in the
/// tables above: committed with them, so a replay never applies one twice.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LOG_APPLIED: &str = "log_applied";

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
        route: Cow<'static, str>,
        spent: u64,
    },
    /// Spend of a reservation that was never written (a free call's hold
    /// of 0 credits that the upstream charged after all).
    Spend {
        team: String,
        day: u32,
        route: Cow<'static, str>,
        spent: u64,
    },
    /// Nothing: answered once every write queued before it is in redb
    /// (a reader that must see settles not waited for).
    Flush,
    /// Tests: the writer stops as a crash would, without compacting; with
    /// `applied`, after compaction's redb commit but before the log restarts.
    #[cfg(test)]
    Crash { applied: bool },
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
    /// Records of the hold log that redb did not hold yet.
    pub(super) replayed: usize,
    /// The hold log, started on a new generation.
    pub(super) log: HoldLog,
}

/// Replays the hold log into redb, turns the reservations a dead process
/// left into spend, starts the log over, then reads the spend since
/// `since`. A hold becomes spend on the later of its day and `today` (the
/// day it is turned into spend).
pub(super) fn load(db: &Database, log_path: &Path, since: u32, today: u32) -> Result<Loaded, String> {
    let replay = log::read(log_path)?;
    let (generation, replayed, unsettled) = recover(db, replay, today).map_err(|e| e.to_string())?;
    let log = HoldLog::start(log_path, generation + 1)?;
    let spend = read_spend(db, since).map_err(|e| e.to_string())?;
    Ok(Loaded {
        spend,
        unsettled,
        replayed,
        log,
    })
}

/// One transaction: the log's records unless redb applied them already,
/// then every hold left counts as unsettled spend. Answers the generation
/// applied, the records replayed and the holds converted.
#[expect(
    clippy::disallowed_methods,
    reason = "runs once at open, before the writer thread starts"
)]
fn recover(db: &Database, replay: Option<log::Replay>, today: u32) -> Result<(u64, usize, usize), redb::Error> {
    let txn = db.begin_write()?;
    let applied = applied_generation(&txn)?;
    let (generation, ops) = match replay {
        Some(r) if r.generation > applied => (r.generation, r.ops),
        // Applied already: a crash after compaction's commit.
        _ => (applied, Vec::new()),
    };
    apply(&txn, &ops, &[])?;
    txn.open_table(META)?.insert(LOG_APPLIED, generation)?;
    // Every hold still there ends as unsettled spend, through the same
    // end a settle writes.
    let mut lapsed = Vec::new();
    for item in txn.open_table(HELD)?.iter()? {
        let (id, v) = item?;
        let (team, amount, day) = v.value();
        lapsed.push(Op::End {
            id: id.value(),
            team: team.to_string(),
            day: day.max(today),
            route: UNSETTLED.into(),
            spent: amount,
        });
    }
    apply(&txn, &lapsed, &[])?;
    let unsettled = lapsed.len();
    txn.commit()?;
    Ok((generation, ops.len(), unsettled))
}

fn applied_generation(txn: &WriteTransaction) -> Result<u64, redb::Error> {
    Ok(txn.open_table(META)?.get(LOG_APPLIED)?.map_or(0, |v| v.value()))
}

fn read_spend(db: &Database, since: u32) -> Result<Vec<(String, u32, u64)>, redb::Error> {
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
    Ok(spend)
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

/// Saved credits and a log that is not full are folded into redb at most
/// this often under load (and at once when idle, on a flush, at the end).
const COMPACT_EVERY: Duration = Duration::from_secs(10);

/// The writer thread: drain what is queued, append it to the hold log,
/// one `fdatasync` if anyone waits, answer. Ends covered by their holds
/// wait for nobody: they ride the next `fdatasync`. Every so often the
/// log's records go to redb in one transaction (`compact`); saved credits
/// ride along, or are written on their own (without fsync) every
/// `FLUSH_EVERY`.
pub(super) fn writer(db: Arc<Database>, mut log: HoldLog, rx: mpsc::Receiver<Write>, saved: Arc<SavedTally>) {
    let mut pending: Vec<Op> = Vec::new();
    let mut buf = Vec::new();
    let mut tick = Instant::now() + FLUSH_EVERY;
    let mut compacted = Instant::now();
    loop {
        let mut batch = Vec::new();
        let last = match rx.recv_timeout(tick.saturating_duration_since(Instant::now())) {
            Ok(first) => {
                batch.push(first);
                drain(&rx, &mut batch);
                false
            }
            Err(mpsc::RecvTimeoutError::Timeout) => false,
            Err(mpsc::RecvTimeoutError::Disconnected) => true,
        };
        let idle = batch.is_empty();
        let logged = log_batch(&mut log, &batch, &mut buf);
        let mut flushes = Vec::new();
        for w in batch {
            match w.op {
                Op::Flush => flushes.extend(w.done),
                #[cfg(test)]
                Op::Crash { applied } => {
                    if applied {
                        let _ = commit(&db, &pending, &[], Some(log.generation()), true);
                    }
                    return;
                }
                op => {
                    if let Some(done) = w.done {
                        let _ = done.send(logged.clone());
                    }
                    // A hold whose write failed was refused: it covers no call.
                    if logged.is_ok() || !matches!(op, Op::Hold { .. }) {
                        pending.push(op);
                    }
                }
            }
        }
        let now = Instant::now();
        let due = now >= tick;
        if due {
            tick = now + FLUSH_EVERY;
        }
        let stale = !pending.is_empty() && (idle || now >= compacted + COMPACT_EVERY);
        let result = if last || !flushes.is_empty() || logged.is_err() || log.wants_compaction() || stale {
            compacted = now;
            compact(&db, &mut log, &mut pending, &saved, last)
        } else if due {
            save_tally(&db, &saved)
        } else {
            Ok(())
        };
        for done in flushes {
            let _ = done.send(result.clone());
        }
        if last {
            return;
        }
    }
}

fn drain(rx: &mpsc::Receiver<Write>, batch: &mut Vec<Write>) {
    while let Ok(more) = rx.try_recv() {
        batch.push(more);
    }
}

/// Appends the batch to the log; durable (`fdatasync`) when someone waits.
fn log_batch(log: &mut HoldLog, batch: &[Write], buf: &mut Vec<u8>) -> Result<(), String> {
    buf.clear();
    for w in batch {
        log::encode(&w.op, log.generation(), buf);
    }
    if buf.is_empty() {
        return Ok(());
    }
    let result = log.append(buf).and_then(|()| {
        if batch.iter().any(|w| w.done.is_some() && !matches!(w.op, Op::Flush)) {
            log.sync()
        } else {
            Ok(())
        }
    });
    result.map_err(|e| {
        tracing::error!(error = %e, writes = batch.len(), "ledger log write failed");
        format!("ledger write failed: {e}")
    })
}

/// Folds the log's records (`pending`) and saved credits into redb in one
/// durable transaction that also records the log's generation as applied,
/// then starts the log's next generation. A crash in between replays
/// nothing twice: the old generation is applied. With nothing logged,
/// only saved credits are written (durably if `last`).
fn compact(
    db: &Database,
    log: &mut HoldLog,
    pending: &mut Vec<Op>,
    saved: &SavedTally,
    last: bool,
) -> Result<(), String> {
    let tally = saved.take();
    if pending.is_empty() && log.is_empty() {
        if tally.is_empty() {
            return Ok(());
        }
        return commit(db, &[], &tally, None, last).map_err(|e| failed(saved, tally, e));
    }
    let generation = log.generation();
    commit(db, pending, &tally, Some(generation), true).map_err(|e| failed(saved, tally, e))?;
    pending.clear();
    log.restart(generation + 1).map_err(|e| {
        tracing::error!(error = %e, "hold log restart failed: appends wait for it");
        e
    })
}

/// Saved credits alone, without fsync (best effort: chargeback detail).
fn save_tally(db: &Database, saved: &SavedTally) -> Result<(), String> {
    let tally = saved.take();
    if tally.is_empty() {
        return Ok(());
    }
    commit(db, &[], &tally, None, false).map_err(|e| failed(saved, tally, e))
}

fn failed(saved: &SavedTally, tally: Vec<(String, u32, Route, u64)>, e: redb::Error) -> String {
    tracing::error!(error = %e, "ledger commit failed");
    saved.restore(tally);
    format!("ledger commit failed: {e}")
}

/// One redb transaction, recording `applied` as the log generation whose
/// records it holds; fsync'd when `durable` (saved credits alone are not,
/// but for the last write before closing).
#[expect(clippy::disallowed_methods, reason = "the writer thread's own commit")]
fn commit(
    db: &Database,
    ops: &[Op],
    saved: &[(String, u32, Route, u64)],
    applied: Option<u64>,
    durable: bool,
) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    if !durable {
        let _ = txn.set_durability(redb::Durability::None);
    }
    if let Some(generation) = applied {
        txn.open_table(META)?.insert(LOG_APPLIED, generation)?;
    }
    apply(&txn, ops, saved)?;
    txn.commit()?;
    Ok(())
}

/// Applies writes, in order, and saved credits to the tables.
fn apply(txn: &WriteTransaction, ops: &[Op], saved: &[(String, u32, Route, u64)]) -> Result<(), redb::Error> {
    let mut held = txn.open_table(HELD)?;
    let mut table = txn.open_table(SPEND)?;
    let mut credit = |team: &str, day: u32, route: &str, spent_now: u64, saved_now: u64| {
        let key = (team, day, route);
        let (spent, saved) = table.get(key)?.map_or((0, 0), |v| v.value());
        table.insert(key, (spent.saturating_add(spent_now), saved.saturating_add(saved_now)))?;
        Ok::<(), redb::Error>(())
    };
    for op in ops {
        match op {
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
            #[cfg(test)]
            Op::Crash { .. } => {}
        }
    }
    for (team, day, route, credits) in saved {
        credit(team, *day, route.as_str(), 0, *credits)?;
    }
    Ok(())
}
