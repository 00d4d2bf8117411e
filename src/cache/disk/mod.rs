//! The disk tier: answers and records written through, in the
//! background, to one redb file on the data volume, read when the memory
//! tier misses. A restart, a crash or a deploy then keeps what was bought
//! within its TTL and stale grace, as nginx's `proxy_cache` keeps its
//! files; and the tier holds more than RAM, up to `cache.disk_max_bytes`.
//!
//! - **Never on the hit path.** A memory hit does not touch it. Writes go
//!   to a bounded queue ([`writer::QUEUE`]) and one writer thread, which applies
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
//!   open, read and commit runs [`guarded`](crate::guarded::guarded): a panic inside redb (its
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
//!   tried again after [`writer::RETRY_AFTER_ERROR`]); reads that fail are misses.
//!
//! Keys are the memory tier's: page keys, complete indexes and record keys
//! (`records::Resource::key`), so a purge by route finds them by the route
//! code inside each value.
//!
//! Here the tier's handle ([`Disk`]: opening, queueing, purge and flush)
//! and what its parts share; `writer.rs` the one writer thread (batches,
//! durability, the reserve, eviction); `reader.rs` the lookups on the
//! blocking pool; `frame.rs` the checksummed form a value is stored in.

mod frame;
mod reader;
mod writer;

use super::Entry;
use crate::metrics::{DiskDrop, Metrics, Tier};
use crate::route::Route;
use redb::{Database, ReadableDatabase, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use writer::Op;

/// Key → `[xxh3 of the rest u64][Entry::encode()]`.
const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entries");
/// Key → (its recency tick, its cost in bytes).
const META: TableDefinition<&str, (u64, u64)> = TableDefinition::new("meta");
/// Recency tick → key: the first is the least recently used.
const LRU: TableDefinition<u64, &str> = TableDefinition::new("lru");
/// `bytes`, `count`, `tick`.
const STATS: TableDefinition<&str, u64> = TableDefinition::new("stats");

/// The longest a commit stays non-durable (what a SIGKILL may lose).
pub(crate) const DURABLE_EVERY: Duration = Duration::from_secs(1);
/// redb's own page cache: the memory tier is the cache of hot entries,
/// this one only holds the B-tree's upper pages.
const PAGE_CACHE_BYTES: usize = 16 << 20;
/// Bytes counted per entry beyond its key and value: its META and LRU rows
/// and B-tree slack, roughly (the file is larger still: docs/operations.md).
pub(crate) const OVERHEAD: u64 = 96;

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
    /// The tier is configured but its file could not be opened at start (a
    /// read-only or missing volume): nothing could be purged from it, and a
    /// start that opens it would serve what it holds. Not durable.
    Unusable,
}

impl DiskPurged {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DiskPurged::Committed(_) => "purged",
            DiskPurged::MovedAside => "moved_aside",
            DiskPurged::Failed => "failed",
            DiskPurged::Unusable => "unusable",
        }
    }

    /// Whether a restart may serve again what the purge was to remove.
    pub(crate) fn may_come_back(self) -> bool {
        matches!(self, DiskPurged::Failed | DiskPurged::Unusable)
    }
}

/// What a purge removes from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Doomed {
    /// Every entry.
    All,
    /// The entries of these routes, by the route code inside each value.
    Routes(Vec<Route>),
    /// These keys (one answer, one record).
    Keys(Vec<String>),
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
        // A file of a newer release's format is left as it is (that release
        // reads it again after a roll forward) and not used: a cache never
        // stops a start, and never misreads.
        let refused = match crate::guarded::guarded(|| crate::stored::DISK_TIER.check(&db, path)) {
            Some(Ok(())) => None,
            Some(Err(e)) => Some(e.to_string()),
            None => Some("redb panicked reading its format".to_string()),
        };
        if let Some(e) = refused {
            tracing::error!(path = %path.display(), "cache disk tier not used, serving from memory only: {e}");
            metrics.disk_degraded(true);
            return None;
        }
        let shared = Arc::new(Shared::default());
        if let Ok((entries, bytes)) = totals(&db) {
            shared.entries.store(entries, Ordering::Relaxed);
            shared.bytes.store(bytes, Ordering::Relaxed);
        }
        let writer = writer::Writer::new(
            db.clone(),
            path.to_path_buf(),
            shared.clone(),
            metrics.clone(),
            max_bytes,
            reserve,
        );
        warn_if_it_cannot_fit(path, max_bytes, reserve);
        let (tx, thread) = match writer.start() {
            Ok(started) => started,
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

    /// Removes what `doomed` names, before it returns (writes queued before
    /// it are removed too): what it did.
    pub(crate) async fn purge(&self, doomed: Doomed) -> DiskPurged {
        let (done, rx) = oneshot::channel();
        if !self.send_blocking(Op::Purge(doomed, done)).await {
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
    if let Some(warning) = crate::volume::disk_room_warning(path, max_bytes, reserve) {
        tracing::warn!("{warning}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    pub(super) fn entry(body: &'static str, route: Route) -> Arc<Entry> {
        Arc::new(Entry::new(
            Bytes::from_static(body.as_bytes()),
            3,
            Duration::from_secs(60),
            route,
        ))
    }

    pub(super) fn disk(dir: &Path, max: u64) -> Arc<Disk> {
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
            d.purge(Doomed::Routes(vec![Route::PermitsSearch])).await,
            DiskPurged::Committed(1)
        );
        assert!(d.get("a").await.is_none(), "purged");
        assert!(d.get("b").await.is_some(), "another route's stays");
        d.put("c", entry(r#"{"items":[3]}"#, Route::CountiesSearch));
        let one = Doomed::Keys(vec!["b".into(), "nothing".into()]);
        assert_eq!(d.purge(one).await, DiskPurged::Committed(1), "only a key held counts");
        assert!(d.get("b").await.is_none(), "purged by its key");
        assert!(d.get("c").await.is_some(), "a write queued before it, not named, stays");
        d.flush(true).await;
    }
}
