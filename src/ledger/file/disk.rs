//! The file ledger's disk side: the redb tables, the start-up open (which
//! verifies the whole file and refuses one that does not verify), recovery
//! (which turns reservations a dead process left into spend) and the read
//! of recent spend, and the writer thread that group-commits every queued
//! write in one fsync'd transaction.

use super::super::saved::{SavedTally, FLUSH_EVERY};
use super::super::{Account, UsageRow, UNSETTLED};
use crate::route::Route;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;
use tokio::sync::oneshot;

/// (team, day, route) → (credits spent, credits saved): the teams' own
/// accounts, the one spend table of the releases before format 2
/// (`format`), which still read it.
pub(super) const SPEND: TableDefinition<(&str, u32, &str), (u64, u64)> = TableDefinition::new("spend");

/// Reservation id → (team, amount, day): reservations whose call may be
/// running (or was, when the process died), of the teams' own accounts.
pub(super) const HELD: TableDefinition<u64, (&str, u64, u32)> = TableDefinition::new("held");

/// [`SPEND`] of the internal accounts (`*org`, `team/app`): apart, so that
/// a release that predates them never reads them as teams.
pub(super) const ACCOUNT_SPEND: TableDefinition<(&str, u32, &str), (u64, u64)> = TableDefinition::new("account_spend");

/// [`HELD`] of the internal accounts.
pub(super) const ACCOUNT_HELD: TableDefinition<u64, (&str, u64, u32)> = TableDefinition::new("account_held");

/// Whether `account` is kept in the teams' tables (what a release of
/// ledger format 1 reads) rather than the internal accounts'.
pub(super) fn in_team_tables(account: &str) -> bool {
    matches!(Account::of(account), Account::Team(_))
}

/// The hold log of the releases before the file ledger was redb alone,
/// beside `ledger.redb`.
pub(super) const OLD_HOLD_LOG: &str = "holds.log";

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
    /// Nothing: answered once every write queued before it is committed,
    /// by a durable commit of its own batch (a reader that must see settles
    /// not waited for; `/readyz`, which checks the write path with it).
    Flush,
}

/// A write, answered once it is durable (when someone waits for it).
pub(super) struct Write {
    pub(super) op: Op,
    pub(super) done: Option<oneshot::Sender<Result<(), String>>>,
}

/// Opens (or creates) the database at `path`, verifying it whole first.
///
/// Every durable commit is two-phase (`commit`), so the commit the header
/// names is complete on disk whatever stopped the process, and a check of
/// every page's checksum at open (redb's integrity check) can tell a file
/// damaged at rest (a flipped byte, a cut, a copy taken mid-commit) from a
/// crash: redb then answers `Corrupted` instead of quietly falling back to
/// the commit before, which would read as less spend than was charged.
/// (One bit escapes any check: the header's primary-slot bit flipped alone,
/// in a file a crash left, picks the commit before; redb's design says so.)
/// An empty file is refused too: redb would start a new ledger in it.
pub(super) fn open(path: &Path) -> Result<Database, String> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
        return Err(corrupted(path, "the file is empty"));
    }
    Database::builder()
        .set_check_integrity_on_open(true)
        .create(path)
        .map_err(|e| match e {
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(why)) => corrupted(path, &why),
            // Not a redb file, or one cut short.
            redb::DatabaseError::Storage(redb::StorageError::Io(io))
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                corrupted(path, &io.to_string())
            }
            e => format!("quota.path: cannot open {}: {e}", path.display()),
        })
}

/// What an operator reads when the ledger does not verify.
fn corrupted(path: &Path, why: &str) -> String {
    format!(
        "the credit ledger {} is damaged ({why}): refusing to start, because reading it could count \
         less spend than the upstream charged. Stop every process using it, keep the damaged file for \
         inspection (move it aside), and restore {} from a backup taken while the gateway was stopped \
         or from a volume snapshot (docs/operations.md, \"Backing up the file ledger\"); then start again. \
         Starting with no ledger file at all resets every team's spend to 0",
        path.display(),
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
    )
}

/// What an operator reads when the hold log of an earlier release is still
/// beside the ledger: its records may not be in `ledger.redb` yet, and this
/// release does not read it.
pub(super) fn old_hold_log(log: &Path) -> String {
    format!(
        "{} is the hold log of an earlier permit-gateway release, which this release does not \
         read: the reservations and settles in it may not be in ledger.redb yet. Start that earlier \
         release once on this directory and stop it cleanly (SIGTERM: it folds the log into \
         ledger.redb as it stops), then remove {} and start this release. Removing the file \
         without that clean stop can lose spend",
        log.display(),
        log.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
    )
}

/// One transaction: every hold a dead process left ends as unsettled
/// spend, through the same end a settle writes, on the later of its day
/// and `today` (the day it is turned into spend). Answers the holds
/// converted.
pub(super) fn recover(db: &Database, today: u32) -> Result<usize, redb::Error> {
    let txn = begin(db, true)?;
    let mut lapsed = Vec::new();
    for table in [HELD, ACCOUNT_HELD] {
        for item in txn.open_table(table)?.iter()? {
            let (id, v) = item?;
            let (team, amount, day) = v.value();
            lapsed.push(Op::End {
                id: id.value(),
                team: team.to_string(),
                day: day.max(today),
                route: UNSETTLED,
                spent: amount,
            });
        }
    }
    apply(&txn, lapsed.iter(), &[])?;
    txn.commit()?;
    Ok(lapsed.len())
}

/// Every account's spend since `since`: (account, day, credits spent).
pub(super) fn read_spend(db: &Database, since: u32) -> Result<Vec<(String, u32, u64)>, redb::Error> {
    Ok(read_rows(db, since, u32::MAX)?
        .into_iter()
        .filter(|r| r.spent > 0)
        .map(|r| (r.team, r.day, r.spent))
        .collect())
}

/// The spend rows of every account (the teams' and the internal ones')
/// between two days inclusive.
pub(super) fn read_rows(db: &Database, from: u32, to: u32) -> Result<Vec<UsageRow>, redb::Error> {
    let txn = db.begin_read()?;
    let mut rows = Vec::new();
    for definition in [SPEND, ACCOUNT_SPEND] {
        let table = match txn.open_table(definition) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => continue,
            Err(e) => return Err(e.into()),
        };
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
    }
    Ok(rows)
}

/// How long a batch nobody waits for may wait for company.
const LAZY_WINDOW: Duration = Duration::from_millis(50);

/// The writer thread: drain what is queued, one transaction, one durable
/// commit, then answer every write in it. Saved credits ride along, and are
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
        // give the next waited-for write a moment to share its commit, so a
        // miss costs one commit (its hold, with the last miss's end), not two.
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
        let durable = !batch.is_empty() || last;
        let result = commit(&db, batch.iter().map(|w| &w.op), &tally, durable).map_err(|e| {
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

fn drain(rx: &mpsc::Receiver<Write>, batch: &mut Vec<Write>) {
    while let Ok(more) = rx.try_recv() {
        batch.push(more);
    }
}

/// A write transaction; a durable one commits in two phases (see `open`).
#[expect(
    clippy::disallowed_methods,
    reason = "the ledger's one writer: the writer thread's commits, and recovery, the format's upgrade and the company's seed at open before that thread starts"
)]
pub(super) fn begin(db: &Database, durable: bool) -> Result<WriteTransaction, redb::Error> {
    let mut txn = db.begin_write()?;
    if durable {
        txn.set_two_phase_commit(true);
    } else {
        let _ = txn.set_durability(redb::Durability::None);
    }
    Ok(txn)
}

/// One transaction: durable (two fsyncs: pages, then the header) when
/// `durable`; saved credits alone are not, unless it is the last commit
/// before closing.
fn commit<'a>(
    db: &Database,
    ops: impl Iterator<Item = &'a Op>,
    saved: &[(String, u32, Route, u64)],
    durable: bool,
) -> Result<(), redb::Error> {
    let txn = begin(db, durable)?;
    apply(&txn, ops, saved)?;
    txn.commit()?;
    Ok(())
}

/// Applies writes, in order, and saved credits to the tables.
fn apply<'a>(
    txn: &WriteTransaction,
    ops: impl Iterator<Item = &'a Op>,
    saved: &[(String, u32, Route, u64)],
) -> Result<(), redb::Error> {
    // Each account's rows in its tables: the teams' own, or the internal
    // accounts' (`format`).
    let mut held = [txn.open_table(HELD)?, txn.open_table(ACCOUNT_HELD)?];
    let mut tables = [txn.open_table(SPEND)?, txn.open_table(ACCOUNT_SPEND)?];
    let at = |team: &str| usize::from(!in_team_tables(team));
    let mut credit = |team: &str, day: u32, route: &str, spent_now: u64, saved_now: u64| {
        let table = &mut tables[at(team)];
        let key = (team, day, route);
        let (spent, saved) = table.get(key)?.map_or((0, 0), |v| v.value());
        table.insert(key, (spent.saturating_add(spent_now), saved.saturating_add(saved_now)))?;
        Ok::<(), redb::Error>(())
    };
    for op in ops {
        match op {
            Op::Hold { id, team, amount, day } => {
                held[at(team)].insert(*id, (team.as_str(), *amount, *day))?;
            }
            Op::End {
                id,
                team,
                day,
                route,
                spent,
            } => {
                // Only the first end of a reservation counts.
                let was_held = held[at(team)].remove(*id)?.is_some();
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
    Ok(())
}
