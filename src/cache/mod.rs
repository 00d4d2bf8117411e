//! The credit-saving cache: L1 in process (moka, weighed in bytes, expiry per
//! entry) over L2 in Redis (shared by replicas), keyed by the normalized
//! query of [`key`]; beside them, the disk tier ([`disk`]): a file
//! on the data volume written in the background, read when memory misses
//! (before Redis), so what was bought outlives a restart. Expired entries live on for a grace period so they can
//! be served when the upstream fails ([`Entry::staleness`]).
//!
//! Redis errors never fail a request: they count in
//! `gateway_backend_errors_total`, read as misses, and the breaker in
//! [`crate::redis_backend`] keeps a dead Redis from costing latency.
//!
//! # Layout
//! One concept per file; this one holds [`Cache`] itself: building it and
//! its memory tier (moka), storing an answer in every tier, the TTLs per
//! route, the tier gauges.
//! - [`key`]: the normalized cache key of a request.
//! - [`entry`]: one cached answer, and its encoding for Redis.
//! - [`control`]: `Cache-Control`, the client's directives and the
//!   upstream's refusals to be stored.
//! - [`tiers`]: the tier chain, memory → disk → Redis, for one key or many.
//! - [`disk`]: the disk tier, one redb file on the data volume (a folder:
//!   its handle, writer thread, reads and checksummed values).
//! - [`lease`]: the cross-replica fetch lease, one buyer per key.
//! - [`covered`]: answers another key's complete or counted page holds.
//! - [`records`]: the records of stored pages, filed by id.
//! - [`months`]: monthly-metrics rows, filed month by month.
//! - [`refusals`]: the upstream's 422s, kept a while.
//! - [`purge`]: purges of every tier that reach every replica.
//! - [`release`]: the vendor's data release, and how it outdates (or, opted
//!   in, extends) a held answer's freshness.

pub(crate) mod control;
mod covered;
pub(crate) mod disk;
pub(crate) mod entry;
pub mod key;
pub mod lease;
pub(crate) mod months;
pub mod purge;
pub(crate) mod records;
pub(crate) mod refusals;
pub(crate) mod release;
mod tiers;

pub use entry::Entry;
pub(crate) use tiers::Found;

use crate::clock::now_ms;
use crate::config::CacheConfig;
use crate::metrics::Metrics;
use crate::metrics::RedisOp;
use crate::redis_backend::keys::{set_px, EntryKey, Keys};
use crate::redis_backend::RedisBackend;
use crate::route::Route;
use bytes::Bytes;
use moka::future::Cache as Moka;
use moka::Expiry;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which tier answered a lookup; its own type is the metrics' tier label.
pub use crate::metrics::Tier;

/// Each entry lives for its TTL plus the stale grace, from when the
/// upstream answered (an entry promoted from Redis keeps its age).
struct LifeOf {
    grace: Duration,
}

impl Expiry<Arc<str>, Arc<Entry>> for LifeOf {
    fn expire_after_create(&self, _: &Arc<str>, entry: &Arc<Entry>, _: Instant) -> Option<Duration> {
        Some(entry.remaining_life(now_ms(), self.grace))
    }

    fn expire_after_update(
        &self,
        _: &Arc<str>,
        entry: &Arc<Entry>,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(entry.remaining_life(now_ms(), self.grace))
    }
}

pub struct Cache {
    /// `None` when `memory_max_bytes = 0` (L2 only). foldhash, randomly
    /// seeded per process, instead of SipHash: a key is ~100 bytes hashed
    /// on every lookup.
    memory: Option<Moka<Arc<str>, Arc<Entry>, foldhash::fast::RandomState>>,
    redis: Option<Arc<RedisBackend>>,
    /// The L2 keys of entries, records and complete indexes.
    keys: Keys,
    grace: Duration,
    pub(crate) max_entry_bytes: usize,
    /// Each route's TTL; a reload changes a route's, between two values
    /// (a route turned cached or uncached needs a restart: its requests'
    /// parsed keys are memoized).
    ttls: arc_swap::ArcSwap<Ttls>,
    metrics: Arc<Metrics>,
    /// `cache.record_reuse`: stored pages also file their records ([`records`]).
    record_reuse: bool,
    /// The purges of every replica this one has applied to its L1 ([`purge`]).
    purges_seen: purge::Seen,
    /// The disk tier, when on and usable ([`disk`]).
    disk: Option<Arc<disk::Disk>>,
    /// The disk tier's file when it is on but could not be opened at start:
    /// a purge cannot reach it, and says so ([`purge`]).
    disk_unusable: Option<std::path::PathBuf>,
    /// `cache.month_reuse`: monthly metrics filed by month ([`months`]).
    month_reuse: bool,
    /// `cache.past_month_ttl_secs`, when set ([`months`]).
    past_month_ttl: Option<Duration>,
    /// The upstream's 422s, for `cache.refusal_ttl_secs` ([`refusals`]).
    pub(crate) refusals: refusals::Refusals,
    /// The data release as last read, and its view of held entries ([`release`]).
    pub(crate) release: Arc<release::Release>,
}

impl Cache {
    pub(crate) fn new(cfg: &CacheConfig, redis: Option<Arc<RedisBackend>>, metrics: Arc<Metrics>) -> Cache {
        let release = release::Release::new(
            cfg.freshness == crate::config::Freshness::Release,
            Duration::from_secs(cfg.release_max_age_secs),
            Duration::from_secs(cfg.release_poll_secs),
        );
        // Under release-bound freshness an entry may stay fresh up to
        // `cache.release_max_age_secs`: every tier keeps it that long more.
        let grace = Duration::from_secs(cfg.stale_grace_secs) + release.extra_life();
        let memory = (cfg.memory_max_bytes > 0).then(|| {
            Moka::builder()
                .max_capacity(cfg.memory_max_bytes)
                .weigher(|k: &Arc<str>, v: &Arc<Entry>| v.weight(k.len()))
                .expire_after(LifeOf { grace })
                .support_invalidation_closures()
                .build_with_hasher(foldhash::fast::RandomState::default())
        });
        let ttls = ttls_of(cfg);
        Cache {
            memory,
            redis,
            keys: Keys::new(&cfg.redis_key_prefix),
            grace,
            max_entry_bytes: cfg.max_entry_bytes,
            ttls: arc_swap::ArcSwap::from_pointee(ttls),
            metrics,
            record_reuse: cfg.record_reuse,
            purges_seen: purge::Seen::default(),
            disk: None,
            disk_unusable: None,
            month_reuse: cfg.month_reuse,
            past_month_ttl: cfg.past_month_ttl(),
            refusals: refusals::Refusals::new(Duration::from_secs(cfg.refusal_ttl_secs)),
            release,
        }
    }

    /// Adds the disk tier at `path` (`CacheConfig::disk_file`), bounded by
    /// `cache.disk_max_bytes`; an unusable path leaves it off ([`disk`]).
    pub(crate) fn with_disk(mut self, path: Option<std::path::PathBuf>, max_bytes: u64, reserve: u64) -> Cache {
        self.disk = path.as_ref().and_then(|p| {
            let limits = disk::Limits {
                max_bytes,
                reserve,
                grace: self.grace,
            };
            disk::Disk::open(p, limits, self.metrics.clone()).map(Arc::new)
        });
        self.disk_unusable = path.filter(|_| self.disk.is_none());
        self
    }

    /// Makes everything the disk tier was given durable and releases its
    /// file (graceful shutdown: SIGTERM, `Running::shutdown`).
    pub async fn close(&self) {
        if let Some(disk) = &self.disk {
            disk.flush(true).await;
        }
    }

    /// A durable commit of every disk-tier write queued so far (tests).
    pub async fn flush_disk(&self) {
        if let Some(disk) = &self.disk {
            disk.flush(false).await;
        }
    }

    /// The disk tier's file, when the tier is on and usable.
    pub(crate) fn disk_path(&self) -> Option<&std::path::Path> {
        self.disk.as_deref().map(disk::Disk::path)
    }

    /// Freshness lifetime of a route's answers; `None`: never cached.
    pub fn ttl(&self, route: Route) -> Option<Duration> {
        self.ttls.load()[route as usize]
    }

    /// A reload's TTLs, for the routes cached before and after it; the
    /// routes whose TTL could not change live (cached ↔ never cached), as
    /// their config keys.
    pub(crate) fn reload_ttls(&self, cfg: &CacheConfig) -> Vec<String> {
        let (old, new) = (self.ttls.load_full(), ttls_of(cfg));
        let mut applied = *old;
        let mut stuck = Vec::new();
        for (i, route) in Route::ALL.iter().enumerate() {
            match (old[i], new[i]) {
                (Some(_), Some(ttl)) => applied[i] = Some(ttl),
                (None, None) => {}
                _ => stuck.push(format!("cache.route_ttl_secs.{}", route.as_str())),
            }
        }
        self.ttls.store(Arc::new(applied));
        stuck
    }

    pub(crate) fn redis(&self) -> Option<&Arc<RedisBackend>> {
        self.redis.as_ref()
    }

    /// The Redis key of an entry, a record or a complete-page index
    /// ([`held`]); the index is a key space of its own in L2 too.
    fn redis_key(&self, route: Route, key: &str) -> EntryKey {
        if key::is_complete_index(key) {
            self.keys.complete_index(route, key)
        } else {
            self.keys.entry(route, key)
        }
    }

    /// Stores in both tiers. L2 is awaited (bounded by its timeout) so that a
    /// replica waiting on the lease finds the entry as soon as we answer.
    /// A complete page is also filed under its size-free key ([`held`]).
    pub async fn store(&self, key: &str, entry: Arc<Entry>) {
        if entry.remaining_life(now_ms(), self.grace).is_zero() {
            return;
        }
        let entry = self.stamped(entry);
        // Records are filed as copies of their bytes (`records::own`), so
        // the page's body can go when the page leaves L1.
        let page = match &self.memory {
            Some(_) => compact(&entry),
            None => entry.clone(),
        };
        self.put(key, &entry, page.clone()).await;
        self.file_complete(key, &entry, &page).await;
        if let Some(resource) = records::Resource::filed_by(entry.route).filter(|_| self.record_reuse) {
            self.file_records(resource, &page).await;
        }
    }

    /// Writes one key in both tiers: `page` (the compacted entry) in memory,
    /// `entry` encoded in Redis, for what is left of its life.
    async fn put(&self, key: &str, entry: &Entry, page: Arc<Entry>) {
        let life = entry.remaining_life(now_ms(), self.grace);
        self.count_release_refresh(key, entry).await;
        if let Some(disk) = &self.disk {
            disk.put(key, page.clone());
        }
        if let Some(memory) = &self.memory {
            memory.insert(Arc::from(key), page).await;
        }
        if let Some(redis) = &self.redis {
            let px = life.as_millis() as u64;
            let set = &set_px(&self.redis_key(entry.route, key), entry, px.max(1));
            // Idempotent (the same value): tried once more after a failover.
            let _ = redis
                .call_reconnecting(
                    RedisOp::CacheSet,
                    |mut c| async move { set.query_async::<()>(&mut c).await },
                )
                .await;
        }
    }

    /// Sets the tier gauges (called at scrape time). Memory: exact, after
    /// moka's pending housekeeping. Redis: the server's key count and used
    /// memory (the whole Redis: it may hold the ledger and other data too).
    pub(crate) async fn observe(&self) {
        let m = &self.metrics;
        if let Some(memory) = &self.memory {
            memory.run_pending_tasks().await;
            m.cache_size(Tier::Memory, memory.entry_count(), memory.weighted_size());
        }
        if let Some(disk) = &self.disk {
            disk.observe();
        }
        if let Some(redis) = &self.redis {
            if let Ok((keys, used)) = redis.key_and_memory_totals(RedisOp::CacheStats).await {
                let count = |n: i64| u64::try_from(n).unwrap_or(0);
                m.cache_size(Tier::Redis, count(keys), count(used));
            }
        }
    }
}

impl Cache {
    /// The data release's Redis keys: its lease, and what was read
    /// (`crate::release`).
    pub(crate) fn release_keys(&self) -> (String, String) {
        (self.keys.release_lease(), self.keys.release())
    }

    /// The entry stamped with the current release, unless it has a stamp.
    pub(crate) fn stamped(&self, entry: Arc<Entry>) -> Arc<Entry> {
        match (entry.release, self.release.stamp()) {
            (0, stamp) if stamp != 0 => Arc::new(Entry {
                release: stamp,
                ..Entry::clone(&entry)
            }),
            _ => entry,
        }
    }

    /// Counts `gateway_release_refreshes_total` when `entry` replaces, in
    /// memory, one a newer release outdated.
    pub(super) async fn count_release_refresh(&self, key: &str, entry: &Entry) {
        let Some(memory) = &self.memory else { return };
        if let Some(old) = memory.get(key).await {
            if self.release.outdated(&old) && !self.release.outdated(entry) {
                self.metrics.release_refreshed(entry.route);
            }
        }
    }
}

/// A TTL per route, by [`Route`] index; `None`: never cached.
type Ttls = [Option<Duration>; Route::ALL.len()];

fn ttls_of(cfg: &CacheConfig) -> Ttls {
    let mut ttls = [None; Route::ALL.len()];
    for (i, route) in Route::ALL.iter().enumerate() {
        ttls[i] = cfg.ttl_for(*route);
    }
    ttls
}

/// The entry with a body of its own, for the memory tier. An upstream body
/// is usually a view into the HTTP client's read buffer, which is larger
/// than the body (measured: ~10 KB of RSS per 6 KB page); kept for a day,
/// the view would pin the whole buffer and the weigher would under-count.
/// One copy per store keeps an entry's memory at what the weigher counts.
fn compact(entry: &Arc<Entry>) -> Arc<Entry> {
    Arc::new(Entry {
        body: Bytes::copy_from_slice(&entry.body),
        ..Entry::clone(entry)
    })
}
