//! The format each stored file of the gateway records, so that no release
//! misreads what a newer one wrote.
//!
//! Every redb file the gateway keeps records the format it is in, in a
//! table of `&str → &str` whose name and types never change (`format` →
//! the format's number, `since` → the first release that writes it):
//!
//! | file | table | format | what reading a newer format does |
//! |---|---|---|---|
//! | `ledger.redb` (`quota.path`) | `meta` | [`crate::ledger::file`]'s, 2 | refuses to start, one line naming the release to run |
//! | `settles.redb` (beside `quota.path`, Redis ledger) | `format` | [`SETTLE_JOURNAL`], 1 | refuses to start, the same |
//! | `cache.redb` (`cache.disk_path`) | `format` | [`DISK_TIER`], 1 | starts without the tier, the file untouched, one error line |
//!
//! The Redis ledger records its format in Redis, beside its keys
//! (`ledger::redis::format`). A file that records none is format 1: the
//! files of the releases before the number was kept, which format 1
//! describes. The check runs at open, before anything is written; a file
//! that records no format has it recorded then.
//!
//! The cache's entries carry a version of their own in every value
//! (`cache::entry`): a value of a version a release does not know is a
//! miss, never a wrong answer, so the disk tier's number covers only its
//! tables.

use redb::{Database, ReadableDatabase, TableDefinition, WriteTransaction};
use std::path::Path;

/// Why a file is not read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A newer release's format: the line that says which to run.
    Newer(String),
    /// Its format could not be read or recorded (an I/O error).
    Unreadable(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Newer(line) | Refused::Unreadable(line) => f.write_str(line),
        }
    }
}

/// A stored format: what the file is, where it records its format, and
/// the format this release writes (and the newest it reads).
pub(crate) struct Stored {
    /// How the operator calls the file, in the line that refuses it.
    what: &'static str,
    /// The format's name in that line: "`name` format N".
    name: &'static str,
    table: &'static str,
    format: u32,
    /// The first release that writes [`Stored::format`].
    since: &'static str,
}

/// The settle journal of the Redis ledger (`settles.redb`).
pub(crate) const SETTLE_JOURNAL: Stored = Stored {
    what: "the ledger's settle journal",
    name: "settle journal",
    table: "format",
    format: 1,
    since: "0.1.0",
};

/// The cache's disk tier (`cache.redb`).
pub(crate) const DISK_TIER: Stored = Stored {
    what: "the cache's disk tier",
    name: "disk tier",
    table: "format",
    format: 1,
    since: "0.1.0",
};

impl Stored {
    /// A format kept in the table `table`.
    pub(crate) const fn new(
        what: &'static str,
        name: &'static str,
        table: &'static str,
        format: u32,
        since: &'static str,
    ) -> Stored {
        Stored {
            what,
            name,
            table,
            format,
            since,
        }
    }

    fn table(&self) -> TableDefinition<'static, &'static str, &'static str> {
        TableDefinition::new(self.table)
    }

    /// The format the file records, and the release that wrote it: `None`
    /// when it records none. A number this release cannot parse is a
    /// format it does not know (`u32::MAX`).
    pub(crate) fn recorded(&self, db: &Database) -> Result<Option<(u32, String)>, redb::Error> {
        let read = db.begin_read()?;
        let table = match read.open_table(self.table()) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let text = |key: &str| -> Result<String, redb::Error> {
            Ok(table.get(key)?.map(|v| v.value().to_string()).unwrap_or_default())
        };
        let format = text("format")?.parse::<u32>().unwrap_or(u32::MAX);
        Ok(Some((format, text("since")?)))
    }

    /// Records this release's format in `txn` (committed by the caller).
    pub(crate) fn record(&self, txn: &WriteTransaction) -> Result<(), redb::Error> {
        let mut table = txn.open_table(self.table())?;
        table.insert("format", self.format.to_string().as_str())?;
        table.insert("since", self.since)?;
        Ok(())
    }

    /// At open, before anything else is written: [`Refused::Newer`], with
    /// the one line that names the release to run, when the file is of a
    /// newer format; a file that records none has this release's recorded
    /// (format 1 is the only one such files can be in).
    pub(crate) fn check(&self, db: &Database, path: &Path) -> Result<(), Refused> {
        let unreadable =
            |e: redb::Error| Refused::Unreadable(format!("cannot read the format of {}: {e}", path.display()));
        match self.recorded(db).map_err(unreadable)? {
            Some((format, since)) if format > self.format => Err(Refused::Newer(self.newer(path, format, &since))),
            Some(_) => Ok(()),
            None if self.format == 1 => self
                .record_at_open(db)
                .map_err(|e| Refused::Unreadable(format!("cannot record the format of {}: {e}", path.display()))),
            None => Ok(()),
        }
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "at open, before the file's one writer starts: the format is recorded once"
    )]
    fn record_at_open(&self, db: &Database) -> Result<(), redb::Error> {
        let mut txn = db.begin_write()?;
        txn.set_two_phase_commit(true);
        self.record(&txn)?;
        txn.commit()?;
        Ok(())
    }

    /// What an operator reads when the file is newer than this release.
    pub(crate) fn newer(&self, path: &Path, format: u32, since: &str) -> String {
        format!(
            "{} {} is in {} format {}, which this permit-gateway {} (formats up to {}) cannot read: \
             run {} on it (docs/operations.md, \"Upgrading\")",
            self.what,
            path.display(),
            self.name,
            shown(format),
            crate::VERSION,
            self.format,
            release_to_run(since),
        )
    }
}

/// A format's number as the refusal shows it.
pub(crate) fn shown(format: u32) -> String {
    if format == u32::MAX {
        "unknown".to_string()
    } else {
        format.to_string()
    }
}

/// The release a refusal names: the one the file says wrote it, when it
/// reads as a version (it is printed in a log line), else "a later
/// release".
pub(crate) fn release_to_run(since: &str) -> String {
    let version = !since.is_empty()
        && since.len() <= 32
        && since
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    if version {
        format!("permit-gateway {since} or later")
    } else {
        "a later release".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[expect(clippy::disallowed_methods, reason = "a test writing as a newer release")]
    fn write(db: &Database, table: &str, format: &str, since: &str) {
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(TableDefinition::<&str, &str>::new(table)).unwrap();
            t.insert("format", format).unwrap();
            t.insert("since", since).unwrap();
        }
        txn.commit().unwrap();
    }

    #[test]
    fn a_file_without_a_format_gets_this_releases_and_a_newer_one_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.redb");
        let db = Database::create(&path).unwrap();
        assert_eq!(DISK_TIER.recorded(&db).unwrap(), None);
        DISK_TIER
            .check(&db, &path)
            .expect("a file without a format is format 1");
        assert_eq!(DISK_TIER.recorded(&db).unwrap(), Some((1, "0.1.0".to_string())));
        DISK_TIER.check(&db, &path).expect("its own format reads");

        write(&db, "format", "3", "0.9.1");
        let Err(Refused::Newer(refused)) = DISK_TIER.check(&db, &path) else {
            panic!("refused as newer")
        };
        assert!(refused.contains("disk tier format 3"), "{refused}");
        assert!(refused.contains("permit-gateway 0.9.1 or later"), "{refused}");
        assert!(refused.contains(&path.display().to_string()), "{refused}");
        assert_eq!(
            DISK_TIER.recorded(&db).unwrap(),
            Some((3, "0.9.1".to_string())),
            "left as found"
        );

        write(&db, "format", "x", "$(reboot)");
        let Err(Refused::Newer(refused)) = DISK_TIER.check(&db, &path) else {
            panic!("refused as newer")
        };
        assert!(refused.contains("disk tier format unknown"), "{refused}");
        assert!(refused.contains("run a later release"), "{refused}");
        assert!(!refused.contains("reboot"), "{refused}");
    }
}
