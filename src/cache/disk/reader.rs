//! The disk tier's lookups: a batch of keys read in one read transaction
//! on the blocking pool, never on an async worker (a read may wait on the
//! file). What a read finds expired or damaged is handed to the writer to
//! remove, and what it finds alive to move to the recent end.

use super::frame::{frame_sum, unframe};
use super::writer::Op;
use super::{Disk, ENTRIES};
use crate::cache::Entry;
use crate::clock::now_ms;
use crate::guarded::guarded;
use crate::metrics::DiskDrop;
use redb::ReadableDatabase;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Disk {
    /// The entries of `keys`, in order: alive (within TTL and stale
    /// grace) and intact, else `None`. Blocking: call it off the async
    /// workers ([`Disk::get_many`]).
    fn read(&self, keys: &[String]) -> Vec<Option<Entry>> {
        match guarded(|| self.read_unguarded(keys)) {
            Some(found) => found,
            None => {
                self.damaged("a read");
                keys.iter().map(|_| None).collect()
            }
        }
    }

    /// The file is damaged (redb panicked in `what`): counted, logged once,
    /// and neither read nor written again by this process; the next start's
    /// check moves it aside.
    fn damaged(&self, what: &str) {
        self.metrics.disk_dropped(DiskDrop::Corrupt, 1);
        self.shared.degraded.store(true, Ordering::Relaxed);
        if !self.shared.unreadable.swap(true, Ordering::Relaxed) {
            tracing::error!(path = %self.path.display(), during = what, "cache disk tier: the file is damaged (redb panicked); not used until a restart, which moves it aside");
        }
    }

    fn read_unguarded(&self, keys: &[String]) -> Vec<Option<Entry>> {
        let mut out: Vec<Option<Entry>> = keys.iter().map(|_| None).collect();
        if self.shared.unreadable.load(Ordering::Relaxed) {
            return out;
        }
        let Some(db) = self.db.load_full() else { return out };
        let Ok(txn) = db.begin_read() else { return out };
        let Ok(table) = txn.open_table(ENTRIES) else { return out };
        let now = now_ms();
        for (key, slot) in keys.iter().zip(out.iter_mut()) {
            let Ok(Some(value)) = table.get(key.as_str()) else {
                continue;
            };
            let value = value.value();
            match unframe(value) {
                Some(entry) if !entry.remaining_life(now, self.grace).is_zero() => {
                    let _ = self.tx.try_send(Op::Touch(key.clone()));
                    *slot = Some(entry);
                }
                found => {
                    let why = if found.is_some() {
                        DiskDrop::Expired
                    } else {
                        tracing::warn!(path = %self.path.display(), "cache disk tier: an entry failed its checksum; dropped, bought again");
                        DiskDrop::Corrupt
                    };
                    self.metrics.disk_dropped(why, 1);
                    let _ = self.tx.try_send(Op::Remove(key.clone(), frame_sum(value)));
                }
            }
        }
        out
    }

    /// [`Disk::read`] on the blocking pool.
    pub(crate) async fn get_many(self: &Arc<Self>, keys: Vec<String>) -> Vec<Option<Entry>> {
        let n = keys.len();
        let disk = self.clone();
        tokio::task::spawn_blocking(move || disk.read(&keys))
            .await
            .unwrap_or_else(|_| (0..n).map(|_| None).collect())
    }
}

#[cfg(test)]
impl Disk {
    /// One key's entry, as [`Disk::get_many`] reads it.
    pub(super) async fn get(self: &Arc<Self>, key: &str) -> Option<Entry> {
        self.get_many(vec![key.to_string()]).await.pop().flatten()
    }
}
