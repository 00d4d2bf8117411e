//! The file ledger's format version, checked at every start before
//! anything is written.
//!
//! `ledger.redb` records the format it is in (table `meta`: `format`, and
//! `since`, the first release that writes it). A start on a file of a newer
//! format than this release knows refuses with one line naming the release
//! to run instead: a table it does not know may hold spend, and a silent
//! misreading is worse than no start. A file of an older format is brought
//! to this one in one durable transaction.
//!
//! The formats:
//! 1. the releases up to 0.1.0 (no `meta` table): every account's spend in
//!    `spend`, every reservation in `held`;
//! 2. since 0.2.0: the teams' own accounts stay in `spend` and `held`; the
//!    internal ones (`*org`, `team/app`: `ledger::Account`) are in
//!    `account_spend` and `account_held`, which a release of format 1 does
//!    not read. So 0.1.0 started on a file of this format (a rollback)
//!    lists only teams in its usage.csv, with their own spend: it ignores
//!    the app and company budgets, whose accounts wait untouched for the
//!    next upgrade (docs/operations.md, "Upgrading").

use super::disk::{begin, in_team_tables, ACCOUNT_HELD, ACCOUNT_SPEND, HELD, SPEND};
use crate::stored::Stored;
use redb::{Database, ReadableTable};
use std::path::Path;

/// The format this release writes, and the newest it reads.
pub(super) const FORMAT: u32 = 2;

/// Where the file records it: table `meta` (`format` → the format's
/// number; `since` → the first release writing it), whose name and types
/// never change: every release must read it to know whether it may read
/// the rest.
const LEDGER: Stored = Stored::new("the credit ledger", "ledger", "meta", FORMAT, "0.2.0");

/// Refuses a file of a newer format (before anything is written); brings
/// an older one to [`FORMAT`].
pub(super) fn check(db: &Database, path: &Path) -> Result<(), String> {
    let cannot = |e: redb::Error| format!("quota.path: cannot read the format of {}: {e}", path.display());
    // A file that records none is of 0.1.0 or earlier, or new.
    let (format, since) = LEDGER.recorded(db).map_err(cannot)?.unwrap_or((1, String::new()));
    if format > FORMAT {
        return Err(LEDGER.newer(path, format, &since));
    }
    if format < FORMAT {
        let moved = upgrade(db).map_err(|e| format!("quota.path: cannot upgrade {}: {e}", path.display()))?;
        tracing::info!(
            path = %path.display(),
            from = format,
            to = FORMAT,
            internal_rows_moved = moved,
            "credit ledger: format upgraded"
        );
    }
    Ok(())
}

/// One durable transaction: the internal accounts' rows move from the
/// teams' tables to their own (added to what is there), and the format is
/// recorded. Answers the rows moved.
fn upgrade(db: &Database) -> Result<usize, redb::Error> {
    let txn = begin(db, true)?;
    let mut moved = 0;
    {
        let mut spend = txn.open_table(SPEND)?;
        let mut rows = Vec::new();
        for item in spend.iter()? {
            let (k, v) = item?;
            let (account, day, route) = k.value();
            if !in_team_tables(account) {
                rows.push((account.to_string(), day, route.to_string(), v.value()));
            }
        }
        let mut internal = txn.open_table(ACCOUNT_SPEND)?;
        for (account, day, route, (spent, saved)) in &rows {
            let key = (account.as_str(), *day, route.as_str());
            spend.remove(key)?;
            let (s, v) = internal.get(key)?.map_or((0, 0), |v| v.value());
            internal.insert(key, (s.saturating_add(*spent), v.saturating_add(*saved)))?;
        }
        moved += rows.len();
        let mut held = txn.open_table(HELD)?;
        let mut holds = Vec::new();
        for item in held.iter()? {
            let (id, v) = item?;
            let (account, amount, day) = v.value();
            if !in_team_tables(account) {
                holds.push((id.value(), account.to_string(), amount, day));
            }
        }
        let mut internal_held = txn.open_table(ACCOUNT_HELD)?;
        for (id, account, amount, day) in &holds {
            held.remove(*id)?;
            internal_held.insert(*id, (account.as_str(), *amount, *day))?;
        }
        moved += holds.len();
        LEDGER.record(&txn)?;
    }
    txn.commit()?;
    Ok(moved)
}
