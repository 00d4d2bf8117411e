//! The disk tier's one writer thread: it takes what the tier queued
//! ([`Op`]), in batches of one redb transaction each, and keeps the file
//! within its budget (least recently written or read evicted in the same
//! transaction) and the volume above its reserve.
//!
//! Each batch commits without fsync unless [`DURABLE_EVERY`] has passed,
//! a flush asked for it, or it holds a purge (a purge answered 200 must
//! not come back after a crash). A failed commit degrades the tier for
//! [`RETRY_AFTER_ERROR`]; a commit in which redb panics marks the file
//! damaged; a purge that cannot commit moves the file aside.

use super::frame::{frame, frame_sum, ROUTE_AT};
use super::{DiskPurged, Doomed, Shared, DURABLE_EVERY, ENTRIES, LRU, META, OVERHEAD, STATS};
use crate::cache::Entry;
use crate::guarded::guarded;
use crate::metrics::{DiskDrop, Metrics};
use redb::{Database, Durability, ReadableTable, ReadableTableMetadata};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Writes waiting for the writer thread; past it a write is dropped.
pub(super) const QUEUE: usize = 8192;
/// Operations applied in one transaction at most.
const BATCH: usize = 512;
/// After a failed commit, writes are dropped this long before a new try.
pub(super) const RETRY_AFTER_ERROR: Duration = Duration::from_secs(60);

/// What the tier asks of its writer.
pub(super) enum Op {
    Put(String, Arc<Entry>),
    /// Moves a key to the recent end (a read found it).
    Touch(String),
    /// Removes a key if its value still carries this frame checksum (a
    /// read found it expired or damaged; a newer write stays).
    Remove(String, u64),
    /// Every entry, those of some routes, or some keys; answers what it did.
    Purge(Doomed, oneshot::Sender<DiskPurged>),
    /// A durable commit now; with `close`, the writer then ends.
    Flush {
        close: bool,
        done: oneshot::Sender<()>,
    },
}

/// The thread's state: the file, the books it shares, and why it is not
/// writing (the reserve reached, a failed commit).
pub(super) struct Writer {
    db: Arc<Database>,
    /// The file, moved aside when a purge cannot be committed.
    path: PathBuf,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    max_bytes: u64,
    /// `cache.disk_reserve_bytes`: the free space it leaves on the volume.
    reserve: u64,
    /// The volume's free space was at the reserve at the last look.
    short_of_room: bool,
    /// Set by a failed commit: writes are dropped until then.
    broken_until: Option<Instant>,
    /// When the last commit with fsync was.
    last_durable: Instant,
    /// Puts committed without fsync since the last durable commit.
    unsynced: u64,
}

/// A batch taken apart: the operations of its transaction, and who waits
/// on the commit.
struct Batch {
    /// Every operation but the flushes (a purge's answer taken out).
    ops: Vec<Op>,
    /// Flushes, answered once the batch is committed.
    waiters: Vec<oneshot::Sender<()>>,
    /// Purges, answered with what the commit did.
    purges: Vec<oneshot::Sender<DiskPurged>>,
    /// A flush asked the writer to end after this batch.
    close: bool,
}

impl Batch {
    fn of(taken: Vec<Op>) -> Batch {
        let mut batch = Batch {
            ops: Vec::with_capacity(taken.len()),
            waiters: Vec::new(),
            purges: Vec::new(),
            close: false,
        };
        for op in taken {
            match op {
                Op::Flush { close, done } => {
                    batch.close |= close;
                    batch.waiters.push(done);
                }
                Op::Purge(doomed, done) => {
                    batch.ops.push(Op::Purge(doomed, oneshot::channel().0));
                    batch.purges.push(done);
                }
                op => batch.ops.push(op),
            }
        }
        batch
    }
}

/// The next batch: what arrives within [`DURABLE_EVERY`] (possibly
/// nothing: a durable commit may be due), then whatever else is queued,
/// up to [`BATCH`]. `None` once every sender is gone.
fn next_batch(rx: &Receiver<Op>) -> Option<Vec<Op>> {
    let first = match rx.recv_timeout(DURABLE_EVERY) {
        Ok(op) => Some(op),
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => return None,
    };
    let mut batch: Vec<Op> = first.into_iter().collect();
    while batch.len() < BATCH {
        match rx.try_recv() {
            Ok(op) => batch.push(op),
            Err(_) => break,
        }
    }
    Some(batch)
}

/// The writes among `ops` (what `pending` counts).
fn count_puts(ops: &[Op]) -> u64 {
    ops.iter().filter(|op| matches!(op, Op::Put(..))).count() as u64
}

impl Writer {
    pub(super) fn new(
        db: Arc<Database>,
        path: PathBuf,
        shared: Arc<Shared>,
        metrics: Arc<Metrics>,
        max_bytes: u64,
        reserve: u64,
    ) -> Writer {
        Writer {
            db,
            path,
            shared,
            metrics,
            max_bytes,
            reserve,
            short_of_room: false,
            broken_until: None,
            last_durable: Instant::now(),
            unsynced: 0,
        }
    }

    /// Starts the thread: the queue to it, and the handle a close joins.
    pub(super) fn start(self) -> std::io::Result<(SyncSender<Op>, JoinHandle<()>)> {
        let (tx, rx) = sync_channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name("cache-disk".into())
            .spawn(move || self.run(rx))?;
        Ok((tx, thread))
    }

    /// Batch after batch until a flush closes it; when the tier is
    /// dropped without one, a last durable commit.
    fn run(mut self, rx: Receiver<Op>) {
        loop {
            let Some(batch) = next_batch(&rx) else {
                let _ = self.commit(Vec::new(), true);
                return;
            };
            if self.apply(batch) {
                return;
            }
        }
    }

    /// One batch: dropped writes counted, committed, its waiters answered.
    /// `true` when a flush closed the writer.
    fn apply(&mut self, batch: Vec<Op>) -> bool {
        let flush = batch.iter().any(|op| matches!(op, Op::Flush { .. }));
        // A purge answered 200 must not come back after a crash: the
        // batch holding one commits with fsync.
        let purging = batch.iter().any(|op| matches!(op, Op::Purge(..)));
        let durable = flush || purging || self.last_durable.elapsed() >= DURABLE_EVERY;
        if batch.is_empty() && (self.unsynced == 0 || !durable) {
            return false;
        }
        let puts = count_puts(&batch);
        let Batch {
            mut ops,
            waiters,
            purges,
            close,
        } = Batch::of(batch);
        if puts > 0 && self.short_of_room() {
            self.drop_writes(&mut ops, DiskDrop::Reserve);
        }
        let broken = self.broken_until.is_some_and(|t| Instant::now() < t);
        if broken {
            // Degraded: writes dropped, purges still tried (a purge of a
            // degraded tier must not leave answers to come back).
            self.drop_writes(&mut ops, DiskDrop::Degraded);
        }
        if self.shared.unreadable.load(Ordering::Relaxed) && !purging {
            // The file is damaged or moved aside: nothing more goes in.
            let dropped = count_puts(&ops);
            self.metrics.disk_dropped(DiskDrop::Degraded, dropped);
            self.shared
                .pending
                .fetch_sub(dropped + self.unsynced, Ordering::Relaxed);
            self.unsynced = 0;
            for done in waiters {
                let _ = done.send(());
            }
            return close;
        }
        let purged = self.commit_counted(ops, durable, puts, broken, purging);
        for done in purges {
            let _ = done.send(purged);
        }
        for done in waiters {
            let _ = done.send(());
        }
        close
    }

    /// Drops the batch's writes and touches, counted under `why`.
    fn drop_writes(&self, ops: &mut Vec<Op>, why: DiskDrop) {
        let dropped = count_puts(ops);
        self.metrics.disk_dropped(why, dropped);
        ops.retain(|op| !matches!(op, Op::Put(..) | Op::Touch(_)));
        self.shared.pending.fetch_sub(dropped, Ordering::Relaxed);
    }

    /// Commits `ops` (a panic inside redb caught: the file is damaged) and
    /// keeps the books: what is still pending, whether the tier writes.
    /// What a purge among them did.
    fn commit_counted(&mut self, ops: Vec<Op>, durable: bool, puts: u64, broken: bool, purging: bool) -> DiskPurged {
        let outcome = guarded(|| self.commit(ops, durable)).unwrap_or_else(|| {
            self.metrics.disk_dropped(DiskDrop::Corrupt, 1);
            if !self.shared.unreadable.swap(true, Ordering::Relaxed) {
                tracing::error!(path = %self.path.display(), "cache disk tier: the file is damaged (redb panicked in a commit); not used until a restart, which moves it aside");
            }
            Err(redb::Error::Corrupted("redb panicked in a commit".into()))
        });
        match outcome {
            Ok((applied, removed)) => {
                if self.broken_until.take().is_some() {
                    tracing::info!("cache disk tier writes again");
                    self.shared.degraded.store(false, Ordering::Relaxed);
                }
                self.metrics.disk_dropped(DiskDrop::TooLarge, applied.too_large);
                self.metrics.disk_dropped(DiskDrop::Evicted, applied.evicted);
                if !broken {
                    self.unsynced += puts;
                }
                if durable {
                    self.shared.pending.fetch_sub(self.unsynced, Ordering::Relaxed);
                    self.unsynced = 0;
                    self.last_durable = Instant::now();
                }
                DiskPurged::Committed(removed)
            }
            Err(e) => {
                if !broken {
                    tracing::error!(error = %e, "cache disk tier: a write failed (disk full or unwritable?); serving from memory, trying again in 60 s");
                    self.metrics.disk_dropped(DiskDrop::Degraded, puts);
                    self.shared.pending.fetch_sub(puts + self.unsynced, Ordering::Relaxed);
                    self.unsynced = 0;
                }
                let purged = match purging {
                    true => self.unpurged(),
                    false => DiskPurged::Failed,
                };
                self.shared.degraded.store(true, Ordering::Relaxed);
                self.broken_until = Some(Instant::now() + RETRY_AFTER_ERROR);
                purged
            }
        }
    }

    /// Whether the volume's free space is at the reserve (then nothing is
    /// written); logs the change each way.
    fn short_of_room(&mut self) -> bool {
        if self.reserve == 0 {
            return false;
        }
        let short = crate::volume::free_space(&self.path).is_some_and(|free| free <= self.reserve);
        if short != self.short_of_room {
            self.short_of_room = short;
            match short {
                true => {
                    tracing::warn!(path = %self.path.display(), reserve = self.reserve, "cache disk tier: the volume is down to cache.disk_reserve_bytes; writing nothing until room comes back")
                }
                false => {
                    tracing::info!(path = %self.path.display(), "cache disk tier: room again on the volume; writing")
                }
            }
        }
        short
    }

    /// A purge could not be committed (a full volume): what it was to remove
    /// may still be in the file, so the file goes aside, where neither this
    /// process nor the next start reads it (the next start begins empty);
    /// where it cannot be renamed, it is deleted (neither needs free space).
    fn unpurged(&self) -> DiskPurged {
        self.shared.unreadable.store(true, Ordering::Relaxed);
        let aside = self.path.with_extension("redb.unpurged");
        match std::fs::rename(&self.path, &aside) {
            Ok(()) => {
                tracing::error!(path = %self.path.display(), aside = %aside.display(), "cache disk tier: a purge could not be written; the file is moved aside and not read again");
                DiskPurged::MovedAside
            }
            Err(e) => match std::fs::remove_file(&self.path) {
                Ok(()) => {
                    tracing::error!(path = %self.path.display(), error = %e, "cache disk tier: a purge could not be written nor the file moved aside; the file is deleted");
                    DiskPurged::MovedAside
                }
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "cache disk tier: a purge could not be written, nor the file moved aside or deleted; not read by this process, but a restart would read it: the purge answers 503");
                    DiskPurged::Failed
                }
            },
        }
    }

    /// One transaction for `ops`, then eviction down to the budget.
    /// Returns what it did and how many entries purges removed.
    #[expect(
        clippy::disallowed_methods,
        reason = "the disk tier's writer thread: the one writer of its file"
    )]
    fn commit(&self, ops: Vec<Op>, durable: bool) -> Result<(Applied, u64), redb::Error> {
        let mut txn = self.db.begin_write()?;
        if durable {
            // Allocator state with the commit: a reopen after a crash
            // needs no walk of the whole file.
            txn.set_quick_repair(true);
        } else {
            let _ = txn.set_durability(Durability::None);
        }
        let mut applied = Applied::default();
        let mut removed = 0;
        {
            let mut entries = txn.open_table(ENTRIES)?;
            let mut meta = txn.open_table(META)?;
            let mut lru = txn.open_table(LRU)?;
            let mut stats = txn.open_table(STATS)?;
            let stat = |stats: &redb::Table<&str, u64>, k: &str| stats.get(k).map(|v| v.map_or(0, |v| v.value()));
            let (mut bytes, mut count, mut tick) =
                (stat(&stats, "bytes")?, stat(&stats, "count")?, stat(&stats, "tick")?);
            for op in ops {
                match op {
                    Op::Put(key, entry) => {
                        let value = frame(&entry);
                        let cost = key.len() as u64 + value.len() as u64 + OVERHEAD;
                        if cost > self.max_bytes {
                            applied.too_large += 1;
                            continue;
                        }
                        forget(&key, &mut entries, &mut meta, &mut lru, &mut bytes, &mut count)?;
                        tick += 1;
                        entries.insert(key.as_str(), value.as_slice())?;
                        meta.insert(key.as_str(), (tick, cost))?;
                        lru.insert(tick, key.as_str())?;
                        bytes += cost;
                        count += 1;
                    }
                    Op::Touch(key) => {
                        let Some((t, cost)) = meta.get(key.as_str())?.map(|v| v.value()) else {
                            continue;
                        };
                        lru.remove(t)?;
                        tick += 1;
                        lru.insert(tick, key.as_str())?;
                        meta.insert(key.as_str(), (tick, cost))?;
                    }
                    Op::Remove(key, sum) => {
                        let same = entries.get(key.as_str())?.is_some_and(|v| frame_sum(v.value()) == sum);
                        if same {
                            forget(&key, &mut entries, &mut meta, &mut lru, &mut bytes, &mut count)?;
                        }
                    }
                    Op::Purge(doomed, _) => {
                        for key in purged_keys(&entries, doomed)? {
                            if forget(&key, &mut entries, &mut meta, &mut lru, &mut bytes, &mut count)? {
                                removed += 1;
                            }
                        }
                    }
                    Op::Flush { .. } => {}
                }
            }
            while bytes > self.max_bytes {
                let Some(key) = lru.pop_first()?.map(|(_, k)| k.value().to_string()) else {
                    break;
                };
                entries.remove(key.as_str())?;
                if let Some((_, cost)) = meta.remove(key.as_str())?.map(|v| v.value()) {
                    bytes = bytes.saturating_sub(cost);
                }
                count = count.saturating_sub(1);
                applied.evicted += 1;
            }
            if count == 0 || entries.is_empty()? {
                // Nothing left: start the books over (a purge of everything).
                bytes = 0;
                count = 0;
            }
            stats.insert("bytes", bytes)?;
            stats.insert("count", count)?;
            stats.insert("tick", tick)?;
            self.shared.bytes.store(bytes, Ordering::Relaxed);
            self.shared.entries.store(count, Ordering::Relaxed);
        }
        txn.commit()?;
        Ok((applied, removed))
    }
}

/// Removes a key from the three tables and the books.
fn forget(
    key: &str,
    entries: &mut redb::Table<&str, &[u8]>,
    meta: &mut redb::Table<&str, (u64, u64)>,
    lru: &mut redb::Table<u64, &str>,
    bytes: &mut u64,
    count: &mut u64,
) -> Result<bool, redb::Error> {
    entries.remove(key)?;
    let Some((t, cost)) = meta.remove(key)?.map(|v| v.value()) else {
        return Ok(false);
    };
    lru.remove(t)?;
    *bytes = bytes.saturating_sub(cost);
    *count = count.saturating_sub(1);
    Ok(true)
}

/// The keys a purge removes: those it names, or those of its routes (of
/// every route: [`Doomed::All`]).
fn purged_keys(entries: &redb::Table<&str, &[u8]>, doomed: Doomed) -> Result<Vec<String>, redb::Error> {
    let codes: Option<Vec<u8>> = match doomed {
        Doomed::Keys(keys) => return Ok(keys),
        Doomed::All => None,
        Doomed::Routes(rs) => Some(rs.iter().map(|r| u8::try_from(r.index()).unwrap_or(u8::MAX)).collect()),
    };
    let mut doomed = Vec::new();
    for row in entries.iter()? {
        let (k, v) = row?;
        let route = v.value().get(ROUTE_AT).copied();
        // A value too short to hold a route goes too.
        let hit = match (&codes, route) {
            (None, _) | (_, None) => true,
            (Some(codes), Some(code)) => codes.contains(&code),
        };
        if hit {
            doomed.push(k.value().to_string());
        }
    }
    Ok(doomed)
}

/// What one transaction did, for the shared counters and metrics.
#[derive(Default)]
struct Applied {
    too_large: u64,
    evicted: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::disk::tests::{disk, entry};
    use crate::route::Route;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_budget_evicts_the_least_recent_and_refuses_the_too_large() {
        let dir = tempfile::tempdir().unwrap();
        let one = (1 + frame(&entry(r#"{"n":0}"#, Route::PermitsSearch)).len()) as u64 + OVERHEAD;
        let d = disk(dir.path(), one * 3);
        for k in ["a", "b", "c"] {
            d.put(k, entry(r#"{"n":0}"#, Route::PermitsSearch));
        }
        d.flush(false).await;
        // A read makes "a" recent: "b" is the one to go.
        assert!(d.get("a").await.is_some());
        d.put("d", entry(r#"{"n":0}"#, Route::PermitsSearch));
        d.flush(false).await;
        let got = d.get_many(["a", "b", "c", "d"].map(String::from).to_vec()).await;
        assert_eq!(
            got.iter().map(Option::is_some).collect::<Vec<_>>(),
            [true, false, true, true]
        );
        let tiny = disk(&dir.path().join("tiny"), 10);
        tiny.put("a", entry(r#"{"n":0}"#, Route::PermitsSearch));
        tiny.flush(false).await;
        assert!(tiny.get("a").await.is_none(), "larger than the whole budget");
        assert_eq!(tiny.shared.pending.load(Ordering::Relaxed), 0);
    }
}
