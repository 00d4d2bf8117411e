//! An online backup of the file ledger, for a host without volume
//! snapshots: every table as one read transaction sees it (redb's reads
//! are a snapshot of the last commit, whole, while the writer goes on)
//! copied into a new redb file, which is the backup.
//!
//! A restored backup is the ledger as it stood at that commit, as a crash
//! then would have left it: the reservations open at that instant count in
//! full at the next start (`disk::recover`). The copy is made beside the
//! ledger (the same volume, so no other folder must be writable) under a
//! name no start reads, read back and removed; a copy that fails leaves
//! nothing behind.

use super::disk::{ACCOUNT_HELD, ACCOUNT_SPEND, HELD, SPEND};
use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The file ledger's format table (`format`), copied as it is.
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");

/// The ledger's bytes as of its last commit, a redb file of the same
/// format as the ledger's.
pub(super) fn snapshot(db: &Database, dir: &Path) -> Result<Vec<u8>, String> {
    let copy = Scratch::new(dir);
    let read = db.begin_read().map_err(|e| format!("cannot read the ledger: {e}"))?;
    write_copy(&read, &copy.0).map_err(|e| format!("cannot write the copy in {}: {e}", dir.display()))?;
    std::fs::read(&copy.0).map_err(|e| format!("cannot read the copy back: {e}"))
}

/// A file beside the ledger, removed when dropped (whatever happened).
struct Scratch(PathBuf);

impl Scratch {
    fn new(dir: &Path) -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Scratch(dir.join(format!(".backup-{}-{n}.redb.tmp", std::process::id())))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "a new file of its own, written once by this call: not the ledger's"
)]
fn write_copy(read: &ReadTransaction, to: &Path) -> Result<(), redb::Error> {
    let copy = Database::create(to)?;
    let txn = copy.begin_write()?;
    table(read, &txn, SPEND)?;
    table(read, &txn, ACCOUNT_SPEND)?;
    table(read, &txn, HELD)?;
    table(read, &txn, ACCOUNT_HELD)?;
    table(read, &txn, META)?;
    txn.commit()?;
    Ok(())
}

/// Copies one table's rows (a table the ledger has not created is left out).
fn table<K, V>(read: &ReadTransaction, txn: &WriteTransaction, def: TableDefinition<K, V>) -> Result<(), redb::Error>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
    for<'a> K::SelfType<'a>: std::borrow::Borrow<K::SelfType<'a>>,
{
    let from = match read.open_table(def) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut to = txn.open_table(def)?;
    for row in from.iter()? {
        let (k, v) = row?;
        to.insert(k.value(), v.value())?;
    }
    Ok(())
}
