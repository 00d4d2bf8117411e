//! The durable side of the queue of unacknowledged settles
//! ([`super::unacked`]): a redb file beside `quota.path`
//! (`settles.redb`), so that a settle no Redis replica acknowledged
//! survives this gateway's crash and is applied again by it after its
//! restart, on whatever primary the Sentinels name then.
//!
//! A settle is written here (one fsync'd commit) once its `WAIT` found no
//! replica, before the settle's caller moves on, and deleted once a replica
//! acknowledged it. Re-applying it is idempotent by reservation id: the
//! settle script keeps the mark of a settle that may be applied again for
//! [`super::unacked::PIN`] (a day), not for twice a reservation's term.
//!
//! redb, the engine the file ledger and the disk tier already use: no
//! format of our own on the money path. Every call into it is guarded
//! against its panics like the disk tier's; a file that fails redb's check
//! at open is moved aside (`.corrupt`, logged) and a new one started: its
//! settles were applied once already, and are lost only if their primary
//! failed over before a replica had them.

use crate::guarded::guarded;
use crate::route::Route;
use crate::stored::Refused;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};

/// One settle, as it is applied (again) and journaled.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) id: u64,
    pub(super) team: String,
    pub(super) actual: u64,
    pub(super) route: Route,
    pub(super) day: u32,
    /// When it was first applied (ms, the ledger's clock).
    pub(super) at: u64,
}

/// Reservation id → (team, credits, route, day, when first applied, ms).
const SETTLES: TableDefinition<u64, (&str, u64, &str, u32, u64)> = TableDefinition::new("unacked_settles");

/// The journal's file name, beside the ledger's `quota.path`.
pub(crate) const FILE: &str = "settles.redb";

/// Why a journal was not opened.
#[derive(Debug)]
pub(super) enum Unopened {
    /// The path cannot be used: settles are then kept in memory only.
    Unusable(String),
    /// A newer release wrote it, in a format this one cannot read: the
    /// settles it may hold must not be lost, so the gateway does not start.
    Newer(String),
}

pub(super) struct Journal {
    db: Database,
    path: PathBuf,
}

impl Journal {
    /// The journal of a gateway whose `quota.path` is `quota_path`.
    pub(super) fn path_for(quota_path: &Path) -> PathBuf {
        quota_path.parent().unwrap_or(Path::new(".")).join(FILE)
    }

    /// Opens (or creates) the journal at `path`. A damaged file is moved
    /// aside and a new one started; [`Unopened::Unusable`] when the path
    /// cannot be used (a permission, a read-only volume, another gateway
    /// holding it), [`Unopened::Newer`] when a newer release wrote it.
    pub(super) fn open(path: &Path) -> Result<Journal, Unopened> {
        let db = crate::guarded::open_or_move_aside(path, None, |why, aside| {
            tracing::error!(path = %path.display(), error = %why, aside = %aside.display(), "ledger settle journal damaged: moved aside, starting empty (its settles were applied once; they are lost only if their primary failed over before a replica had them)");
        })
        .map_err(Unopened::Unusable)?;
        match guarded(|| crate::stored::SETTLE_JOURNAL.check(&db, path)) {
            Some(Ok(())) => {}
            Some(Err(Refused::Newer(line))) => return Err(Unopened::Newer(line)),
            Some(Err(Refused::Unreadable(e))) => return Err(Unopened::Unusable(e)),
            None => return Err(Unopened::Unusable("redb panicked reading its format".into())),
        }
        Ok(Journal {
            db,
            path: path.to_path_buf(),
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Every settle written and not yet deleted, oldest first.
    pub(super) fn load(&self) -> Result<Vec<Pending>, String> {
        let read = || -> Result<Vec<Pending>, redb::Error> {
            let txn = self.db.begin_read()?;
            let table = match txn.open_table(SETTLES) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut out = Vec::new();
            for row in table.iter()? {
                let (id, v) = row?;
                let (team, actual, route, day, at) = v.value();
                out.push(Pending {
                    id: id.value(),
                    team: team.to_string(),
                    actual,
                    route: Route::from_name(route).unwrap_or(Route::Other),
                    day,
                    at,
                });
            }
            out.sort_by_key(|p| p.at);
            Ok(out)
        };
        guarded(read)
            .unwrap_or_else(|| Err(redb::Error::Corrupted("redb panicked reading the journal".into())))
            .map_err(|e| e.to_string())
    }

    /// Writes `settles` in one durable commit.
    pub(super) fn put(&self, settles: &[Pending]) -> Result<(), String> {
        self.commit(|table| {
            for p in settles {
                table.insert(p.id, (p.team.as_str(), p.actual, p.route.as_str(), p.day, p.at))?;
            }
            Ok(())
        })
    }

    /// Deletes the settles of `ids` (acknowledged by a replica) in one
    /// commit. A delete lost to a crash only applies a settle once more,
    /// which its mark makes count nothing.
    pub(super) fn delete(&self, ids: &[u64]) -> Result<(), String> {
        self.commit(|table| {
            for id in ids {
                table.remove(id)?;
            }
            Ok(())
        })
    }

    /// One durable commit. Called on a blocking thread (`spawn_blocking`),
    /// never an async worker; concurrent ones queue inside redb.
    #[expect(
        clippy::disallowed_methods,
        reason = "the journal's own file, written from blocking threads only: no batch to race"
    )]
    fn commit(
        &self,
        change: impl FnOnce(&mut redb::Table<'_, u64, (&str, u64, &str, u32, u64)>) -> Result<(), redb::StorageError>,
    ) -> Result<(), String> {
        let write = || -> Result<(), redb::Error> {
            let txn = self.db.begin_write()?;
            {
                let mut table = txn.open_table(SETTLES)?;
                change(&mut table)?;
            }
            txn.commit()?;
            Ok(())
        };
        guarded(write)
            .unwrap_or_else(|| Err(redb::Error::Corrupted("redb panicked writing the journal".into())))
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settle(id: u64, at: u64) -> Pending {
        Pending {
            id,
            team: "alpha".into(),
            actual: id * 10,
            route: Route::PermitsSearch,
            day: 20_000,
            at,
        }
    }

    #[test]
    fn settles_written_survive_a_reopen_until_deleted_oldest_first() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(FILE);
        {
            let j = Journal::open(&path).expect("opens");
            assert!(j.load().expect("loads").is_empty());
            j.put(&[settle(2, 20), settle(1, 10), settle(3, 30)]).expect("put");
            j.delete(&[3]).expect("delete");
        }
        let j = Journal::open(&path).expect("reopens");
        let loaded = j.load().expect("loads");
        let ids: Vec<u64> = loaded.iter().map(|p| p.id).collect();
        assert_eq!(ids, [1, 2]);
        assert_eq!(loaded[1].actual, 20);
        assert_eq!(loaded[1].route, Route::PermitsSearch);
        assert_eq!(loaded[1].team, "alpha");
    }

    #[test]
    fn a_second_open_of_the_same_file_is_refused_and_garbage_is_moved_aside() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(FILE);
        let first = Journal::open(&path).expect("opens");
        let err = Journal::open(&path).err().expect("held by the first");
        assert!(
            matches!(&err, Unopened::Unusable(e) if e.contains("another process")),
            "{err:?}"
        );
        drop(first);
        std::fs::write(&path, vec![0x5a; 9000]).expect("garbage");
        let j = Journal::open(&path).expect("a new file");
        assert!(j.load().expect("loads").is_empty());
        assert!(path.with_extension("redb.corrupt").exists());
    }
}
