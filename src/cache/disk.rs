//! The disk tier: answers and records written through, in the
//! background, to one redb file on the data volume, read when the memory
//! tier misses. A restart, a crash or a deploy then keeps what was bought
//! within its TTL and stale grace, as nginx's `proxy_cache` keeps its
//! files; and the tier holds more than RAM, up to `cache.disk_max_bytes`.
//!
//! - **Never on the hit path.** A memory hit does not touch it. Writes go
//!   to a bounded queue ([`QUEUE`]) and one writer thread, which applies
//!   them in batches of one transaction each; a full queue drops the write
//!   (counted), never waits. Reads run on the blocking pool
//!   (`spawn_blocking`): one is a B-tree walk that may read the file
//!   (BENCHMARKS.md, "Disk tier": 28 µs hot, 135 µs spread over 300 MB),
//!   too long for an async worker.
//! - **Crash-safe as a cache must be.** Commits are non-durable (no fsync)
//!   but one every [`DURABLE_EVERY`] that is (and the last, at shutdown),
//!   so a SIGKILL loses at most that second of writes, and redb reopens at
//!   its last durable commit. Every value is framed with an xxh3 of the
//!   whole [`Entry::encode`] (which checks its body once more): a torn or
//!   damaged value is dropped and counted, never served. A file redb cannot
//!   open is moved aside (`.corrupt`) and a new one started.
//! - **A damaged file never stops a start or a request.** The open checks
//!   the file's integrity (redb's check at open: a file cut or scribbled on
//!   outside redb is reported, not trusted, and moved aside), and every
//!   open, read and commit runs [`guarded`]: a panic inside redb (its
//!   assertions on pages it does not recognise) is caught, counted as
//!   corruption, logged once, and the tier stops reading (and writing) the
//!   file until the next start, whose check then moves it aside.
//! - **A purge answered 200 is durable.** A batch holding a purge commits
//!   with fsync; a purge that cannot be committed (a full volume) moves the
//!   file aside (`.unpurged`): nothing of it is read again, before or
//!   after a restart.
//! - **Bounded.** Each entry costs its key, its value and [`OVERHEAD`];
//!   past `disk_max_bytes` the least recently written or read are evicted
//!   in the same transaction. An entry larger than the whole budget is not
//!   written.
//! - **The ledger keeps its room.** Before a commit that writes, the
//!   writer reads the volume's free space; at `cache.disk_reserve_bytes` or
//!   below it writes nothing (purges and removals still run), counted under
//!   `reason="reserve"`, one log line each way. The ledger usually shares
//!   the volume, and a cache is never worth refusing a team for want of room.
//! - **Degrades, never fails a request.** An unwritable path at start, or
//!   a failed commit (a full disk), leaves the tier off for writes
//!   (`gateway_cache_disk_degraded` 1, one log line; a failed commit is
//!   tried again after [`RETRY_AFTER_ERROR`]); reads that fail are misses.
//!
//! Keys are the memory tier's: page keys, complete indexes and record keys
//! (`records::Resource::key`), so a purge by route finds them by the route
//! code inside each value.

use super::Entry;
use crate::clock::now_ms;
use crate::guarded::guarded;
use crate::metrics::{DiskDrop, Metrics, Tier};
use crate::route::Route;
use bytes::Bytes;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use xxhash_rust::xxh3::xxh3_64;

/// Key → `[xxh3 of the rest u64][Entry::encode()]`.
const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entries");
/// Key → (its recency tick, its cost in bytes).
const META: TableDefinition<&str, (u64, u64)> = TableDefinition::new("meta");
/// Recency tick → key: the first is the least recently used.
const LRU: TableDefinition<u64, &str> = TableDefinition::new("lru");
/// `bytes`, `count`, `tick`.
const STATS: TableDefinition<&str, u64> = TableDefinition::new("stats");

/// Writes waiting for the writer thread; past it a write is dropped.
const QUEUE: usize = 8192;
/// Operations applied in one transaction at most.
const BATCH: usize = 512;
/// The longest a commit stays non-durable (what a SIGKILL may lose).
pub(crate) const DURABLE_EVERY: Duration = Duration::from_secs(1);
/// After a failed commit, writes are dropped this long before a new try.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(60);
/// redb's own page cache: the memory tier is the cache of hot entries,
/// this one only holds the B-tree's upper pages.
const PAGE_CACHE_BYTES: usize = 16 << 20;
/// Bytes counted per entry beyond its key and value: its META and LRU rows
/// and B-tree slack, roughly (the file is larger still: docs/operations.md).
pub(crate) const OVERHEAD: u64 = 96;
/// Where the route code sits in a framed value: the frame's checksum, then
/// `Entry::encode`'s version, credits, stored-at and TTL.
const ROUTE_AT: usize = 8 + 25;

/// What a purge did to the disk tier's file, as the purge's answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DiskPurged {
    /// Committed with fsync: these many entries went.
    Committed(u64),
    /// The purge could not be committed (a full volume): the file was moved
    /// aside (`.unpurged`) or deleted, so nothing of it is read again,
    /// before or after a restart; the tier starts empty at the next start.
    MovedAside,
    /// Neither committed nor the file moved aside or deleted: this process
    /// reads nothing more from it, but a restart would. Not durable.
    Failed,
}

impl DiskPurged {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DiskPurged::Committed(_) => "purged",
            DiskPurged::MovedAside => "moved_aside",
            DiskPurged::Failed => "failed",
        }
    }
}

enum Op {
    Put(String, Arc<Entry>),
    /// Moves a key to the recent end (a read found it).
    Touch(String),
    /// Removes a key if its value still carries this frame checksum (a
    /// read found it expired or damaged; a newer write stays).
    Remove(String, u64),
    /// Every entry, or those of these routes; answers what it did.
    Purge(Option<Vec<Route>>, oneshot::Sender<DiskPurged>),
    /// A durable commit now; with `close`, the writer then ends.
    Flush {
        close: bool,
        done: oneshot::Sender<()>,
    },
}

/// What the writer tells the rest of the process.
#[derive(Default)]
struct Shared {
    degraded: AtomicBool,
    entries: AtomicU64,
    bytes: AtomicU64,
    /// Writes accepted and not yet durable (queued, or committed without
    /// fsync): 0 means a SIGKILL now loses nothing.
    pending: AtomicU64,
    /// A purge could not be committed: what it was to remove may still be
    /// in the file, so nothing is read from it any more (until a restart).
    unreadable: AtomicBool,
}

pub(crate) struct Disk {
    /// `None` once closed: reads are misses.
    db: arc_swap::ArcSwapOption<Database>,
    tx: SyncSender<Op>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    grace: Duration,
    path: PathBuf,
    /// Joined on close, so the file is released when `flush(true)` returns.
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Disk {
    /// Its file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Opens (or creates) the file and starts its writer. `None` when the
    /// path cannot be used: the gateway then serves from memory, with the
    /// degraded gauge at 1 and one warning.
    pub(crate) fn open(path: &Path, limits: Limits, metrics: Arc<Metrics>) -> Option<Disk> {
        let Limits {
            max_bytes,
            reserve,
            grace,
        } = limits;
        let db = match open_db(path, &metrics) {
            Ok(db) => Arc::new(db),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cache disk tier unusable: serving from memory only");
                metrics.disk_degraded(true);
                return None;
            }
        };
        let shared = Arc::new(Shared::default());
        if let Ok((entries, bytes)) = totals(&db) {
            shared.entries.store(entries, Ordering::Relaxed);
            shared.bytes.store(bytes, Ordering::Relaxed);
        }
        let (tx, rx) = sync_channel(QUEUE);
        let writer = Writer {
            db: db.clone(),
            path: path.to_path_buf(),
            shared: shared.clone(),
            metrics: metrics.clone(),
            max_bytes,
            reserve,
            short_of_room: false,
            broken_until: None,
        };
        warn_if_it_cannot_fit(path, max_bytes, reserve);
        let thread = match std::thread::Builder::new()
            .name("cache-disk".into())
            .spawn(move || writer.run(rx))
        {
            Ok(thread) => thread,
            Err(e) => {
                tracing::warn!(error = %e, "cache disk tier: no writer thread; serving from memory only");
                metrics.disk_degraded(true);
                return None;
            }
        };
        metrics.disk_degraded(false);
        tracing::info!(
            path = %path.display(),
            max_bytes,
            entries = shared.entries.load(Ordering::Relaxed),
            "cache disk tier"
        );
        Some(Disk {
            db: arc_swap::ArcSwapOption::from(Some(db)),
            tx,
            shared,
            metrics,
            grace,
            path: path.to_path_buf(),
            writer: std::sync::Mutex::new(Some(thread)),
        })
    }

    /// Queues an entry for writing; dropped (and counted) when the queue
    /// is full or the tier is degraded.
    pub(crate) fn put(&self, key: &str, entry: Arc<Entry>) {
        if self.shared.degraded.load(Ordering::Relaxed) {
            self.metrics.disk_dropped(DiskDrop::Degraded, 1);
            return;
        }
        self.shared.pending.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.tx.try_send(Op::Put(key.to_string(), entry)) {
            self.shared.pending.fetch_sub(1, Ordering::Relaxed);
            if matches!(e, TrySendError::Full(_)) {
                self.metrics.disk_dropped(DiskDrop::QueueFull, 1);
            }
        }
    }

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

    /// Removes every entry, or those of `routes`, before it returns (writes
    /// queued before it are removed too): what it did.
    pub(crate) async fn purge(&self, routes: Option<Vec<Route>>) -> DiskPurged {
        let (done, rx) = oneshot::channel();
        if !self.send_blocking(Op::Purge(routes, done)).await {
            // The writer is gone (the tier closed): nothing is read any more.
            return DiskPurged::Committed(0);
        }
        rx.await.unwrap_or(DiskPurged::Failed)
    }

    /// A durable commit of everything queued; with `close`, the writer
    /// ends and the file is released once reads in flight finish.
    pub(crate) async fn flush(&self, close: bool) {
        let (done, rx) = oneshot::channel();
        if self.send_blocking(Op::Flush { close, done }).await {
            let _ = tokio::time::timeout(Duration::from_secs(10), rx).await;
        }
        if close {
            self.db.store(None);
            let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(writer) = writer {
                let _ = tokio::task::spawn_blocking(move || writer.join()).await;
            }
        }
    }

    /// Queues a control operation, waiting for room (off the async workers).
    async fn send_blocking(&self, op: Op) -> bool {
        let tx = self.tx.clone();
        tokio::task::spawn_blocking(move || tx.send(op).is_ok())
            .await
            .unwrap_or(false)
    }

    /// Sets the tier's gauges (scrape time).
    pub(crate) fn observe(&self) {
        let s = &self.shared;
        self.metrics.cache_size(
            Tier::Disk,
            s.entries.load(Ordering::Relaxed),
            s.bytes.load(Ordering::Relaxed),
        );
        self.metrics.disk_pending(s.pending.load(Ordering::Relaxed));
        self.metrics.disk_degraded(s.degraded.load(Ordering::Relaxed));
    }
}

/// Opens the file, creating its folder; a file redb refuses as damaged or
/// of another format is moved aside and a new one started (counted, one
/// warning); any other error is the path's, and the tier stays off.
fn open_db(path: &Path, metrics: &Metrics) -> Result<Database, String> {
    crate::guarded::open_or_move_aside(path, Some(PAGE_CACHE_BYTES), |why, aside| {
        tracing::warn!(path = %path.display(), error = %why, aside = %aside.display(), "cache disk tier: file damaged or unreadable; moved aside, starting empty");
        metrics.disk_dropped(DiskDrop::Corrupt, 1);
    })
}

/// Entries and bytes as last committed.
fn totals(db: &Database) -> Result<(u64, u64), redb::Error> {
    let txn = db.begin_read()?;
    let stats = match txn.open_table(STATS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok((0, 0)),
        Err(e) => return Err(e.into()),
    };
    let get = |k: &str| stats.get(k).map(|v| v.map_or(0, |v| v.value()));
    Ok((get("count")?, get("bytes")?))
}

/// The stored form of an entry: the xxh3 of its encoding, then it.
fn frame(entry: &Entry) -> Vec<u8> {
    let encoded = entry.encode();
    let mut out = Vec::with_capacity(encoded.len() + 8);
    out.extend_from_slice(&xxh3_64(&encoded).to_be_bytes());
    out.extend_from_slice(&encoded);
    out
}

fn frame_sum(value: &[u8]) -> u64 {
    value
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// The entry of a stored value; `None` when any byte of it changed.
fn unframe(value: &[u8]) -> Option<Entry> {
    let encoded = value.get(8..)?;
    if xxh3_64(encoded) != frame_sum(value) {
        return None;
    }
    Entry::decode(Bytes::copy_from_slice(encoded))
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

/// What one transaction did, for the shared counters and metrics.
#[derive(Default)]
struct Applied {
    too_large: u64,
    evicted: u64,
}

/// What bounds the tier: its own size, the room it leaves on its volume,
/// and how long past their TTL its entries stay (the stale grace).
pub(crate) struct Limits {
    pub(crate) max_bytes: u64,
    pub(crate) reserve: u64,
    pub(crate) grace: Duration,
}

/// One warning when the tier's budget cannot fit beside the reserve on its
/// volume: it will stop writing at the reserve, not at `disk_max_bytes`.
fn warn_if_it_cannot_fit(path: &Path, max_bytes: u64, reserve: u64) {
    if let Some(warning) = crate::config::disk_room_warning(path, max_bytes, reserve) {
        tracing::warn!("{warning}");
    }
}

struct Writer {
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
}

impl Writer {
    fn run(mut self, rx: Receiver<Op>) {
        let mut last_durable = Instant::now();
        // Puts committed without fsync since the last durable commit.
        let mut unsynced: u64 = 0;
        loop {
            let first = match rx.recv_timeout(DURABLE_EVERY) {
                Ok(op) => Some(op),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = self.commit(Vec::new(), true);
                    return;
                }
            };
            let mut batch: Vec<Op> = first.into_iter().collect();
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            let flush = batch.iter().any(|op| matches!(op, Op::Flush { .. }));
            // A purge answered 200 must not come back after a crash: the
            // batch holding one commits with fsync.
            let purging = batch.iter().any(|op| matches!(op, Op::Purge(..)));
            let durable = flush || purging || last_durable.elapsed() >= DURABLE_EVERY;
            if batch.is_empty() && (unsynced == 0 || !durable) {
                continue;
            }
            let puts = batch.iter().filter(|op| matches!(op, Op::Put(..))).count() as u64;
            let mut waiters = Vec::new();
            let mut purges = Vec::new();
            let mut ops = Vec::with_capacity(batch.len());
            let mut close = false;
            for op in batch {
                match op {
                    Op::Flush { close: c, done } => {
                        close |= c;
                        waiters.push(done);
                    }
                    Op::Purge(routes, done) => {
                        ops.push(Op::Purge(routes, oneshot::channel().0));
                        purges.push(done);
                    }
                    op => ops.push(op),
                }
            }
            if puts > 0 && self.short_of_room() {
                let dropped = ops.iter().filter(|op| matches!(op, Op::Put(..))).count() as u64;
                self.metrics.disk_dropped(DiskDrop::Reserve, dropped);
                ops.retain(|op| !matches!(op, Op::Put(..) | Op::Touch(_)));
                self.shared.pending.fetch_sub(dropped, Ordering::Relaxed);
            }
            let broken = self.broken_until.is_some_and(|t| Instant::now() < t);
            if broken {
                // Degraded: writes dropped, purges still tried (a purge of a
                // degraded tier must not leave answers to come back).
                let dropped = ops.iter().filter(|op| matches!(op, Op::Put(..))).count() as u64;
                self.metrics.disk_dropped(DiskDrop::Degraded, dropped);
                ops.retain(|op| !matches!(op, Op::Put(..) | Op::Touch(_)));
                self.shared.pending.fetch_sub(dropped, Ordering::Relaxed);
            }
            if self.shared.unreadable.load(Ordering::Relaxed) && !purging {
                // The file is damaged or moved aside: nothing more goes in.
                let dropped = ops.iter().filter(|op| matches!(op, Op::Put(..))).count() as u64;
                self.metrics.disk_dropped(DiskDrop::Degraded, dropped);
                self.shared.pending.fetch_sub(dropped + unsynced, Ordering::Relaxed);
                unsynced = 0;
                for done in waiters {
                    let _ = done.send(());
                }
                if close {
                    return;
                }
                continue;
            }
            let outcome = guarded(|| self.commit(ops, durable)).unwrap_or_else(|| {
                self.metrics.disk_dropped(DiskDrop::Corrupt, 1);
                if !self.shared.unreadable.swap(true, Ordering::Relaxed) {
                    tracing::error!(path = %self.path.display(), "cache disk tier: the file is damaged (redb panicked in a commit); not used until a restart, which moves it aside");
                }
                Err(redb::Error::Corrupted("redb panicked in a commit".into()))
            });
            let purged = match outcome {
                Ok((applied, removed)) => {
                    if self.broken_until.take().is_some() {
                        tracing::info!("cache disk tier writes again");
                        self.shared.degraded.store(false, Ordering::Relaxed);
                    }
                    self.metrics.disk_dropped(DiskDrop::TooLarge, applied.too_large);
                    self.metrics.disk_dropped(DiskDrop::Evicted, applied.evicted);
                    if !broken {
                        unsynced += puts;
                    }
                    if durable {
                        self.shared.pending.fetch_sub(unsynced, Ordering::Relaxed);
                        unsynced = 0;
                        last_durable = Instant::now();
                    }
                    DiskPurged::Committed(removed)
                }
                Err(e) => {
                    if !broken {
                        tracing::error!(error = %e, "cache disk tier: a write failed (disk full or unwritable?); serving from memory, trying again in 60 s");
                        self.metrics.disk_dropped(DiskDrop::Degraded, puts);
                        self.shared.pending.fetch_sub(puts + unsynced, Ordering::Relaxed);
                        unsynced = 0;
                    }
                    let purged = match purges.is_empty() {
                        true => DiskPurged::Failed,
                        false => self.unpurged(),
                    };
                    self.shared.degraded.store(true, Ordering::Relaxed);
                    self.broken_until = Some(Instant::now() + RETRY_AFTER_ERROR);
                    purged
                }
            };
            for done in purges {
                let _ = done.send(purged);
            }
            for done in waiters {
                let _ = done.send(());
            }
            if close {
                return;
            }
        }
    }

    /// Whether the volume's free space is at the reserve (then nothing is
    /// written); logs the change each way.
    fn short_of_room(&mut self) -> bool {
        if self.reserve == 0 {
            return false;
        }
        let short = crate::config::free_space(&self.path).is_some_and(|free| free <= self.reserve);
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
                    Op::Purge(routes, _) => {
                        let codes: Option<Vec<u8>> =
                            routes.map(|rs| rs.iter().map(|r| u8::try_from(r.index()).unwrap_or(u8::MAX)).collect());
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
                        for key in doomed {
                            forget(&key, &mut entries, &mut meta, &mut lru, &mut bytes, &mut count)?;
                            removed += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    impl Disk {
        async fn get(self: &Arc<Self>, key: &str) -> Option<Entry> {
            self.get_many(vec![key.to_string()]).await.pop().flatten()
        }
    }

    fn entry(body: &'static str, route: Route) -> Arc<Entry> {
        Arc::new(Entry::new(
            Bytes::from_static(body.as_bytes()),
            3,
            Duration::from_secs(60),
            route,
        ))
    }

    fn disk(dir: &Path, max: u64) -> Arc<Disk> {
        Arc::new(
            Disk::open(
                &dir.join("c.redb"),
                Limits {
                    max_bytes: max,
                    reserve: 0,
                    grace: Duration::from_secs(60),
                },
                Arc::new(Metrics::new()),
            )
            .expect("opens"),
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entries_survive_a_reopen_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = disk(dir.path(), 1 << 20);
        d.put("a", entry(r#"{"items":[1]}"#, Route::PermitsSearch));
        d.put("b", entry(r#"{"items":[2]}"#, Route::CountiesSearch));
        d.flush(true).await;
        drop(d);
        let d = disk(dir.path(), 1 << 20);
        let got = d.get_many(vec!["a".into(), "b".into(), "c".into()]).await;
        assert_eq!(&got[0].as_ref().unwrap().body[..], br#"{"items":[1]}"#);
        assert_eq!(got[0].as_ref().unwrap().credits, 3);
        assert!(got[1].is_some() && got[2].is_none());
        assert_eq!(
            d.purge(Some(vec![Route::PermitsSearch])).await,
            DiskPurged::Committed(1)
        );
        assert!(d.get("a").await.is_none(), "purged");
        assert!(d.get("b").await.is_some(), "another route's stays");
        d.flush(true).await;
    }

    #[test]
    fn a_changed_byte_anywhere_fails_the_frame() {
        let e = entry(r#"{"items":[]}"#, Route::PermitsSearch);
        let framed = frame(&e);
        assert_eq!(unframe(&framed).as_ref(), Some(&*e));
        for i in 0..framed.len() {
            let mut bad = framed.clone();
            bad[i] ^= 0x10;
            assert_eq!(unframe(&bad), None, "byte {i}");
        }
        assert_eq!(framed[ROUTE_AT] as usize, Route::PermitsSearch.index());
    }

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
