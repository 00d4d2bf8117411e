//! The tier chain, written once: memory, then the disk tier, then Redis,
//! for one key ([`Cache::lookup_tagged`], a page) or many at once
//! ([`Cache::get_many`], the pieces an answer is built from: records,
//! months' rows).
//!
//! The one rule for every caller: an entry held in memory and fresh
//! answers; one memory lacks is read from the disk tier (on the blocking
//! pool: a disk read never holds an async worker); one still missing, or
//! held only stale, is read from Redis, where another replica may have
//! bought it again: the newer copy wins. What a lower tier had is promoted
//! into memory. Entries past their stale grace are never returned; stale
//! ones are, and the caller decides what staleness it accepts. Every entry
//! returned is as the data release sees it (`super::release`: outdated by
//! a newer release, or fresh past its TTL under release-bound freshness).

use super::{Cache, Entry, Tier};
use crate::clock::now_ms;
use crate::metrics::RedisOp;
use crate::redis_backend::keys::{set_px, EntryKey, Tag};
use crate::redis_backend::RedisBackend;
use crate::route::Route;
use bytes::Bytes;
use std::sync::Arc;

/// A held entry and the tier that had it.
pub(crate) type Found = (Arc<Entry>, Tier);

impl Cache {
    /// One key through the chain. A fresh memory hit (the hot path) returns
    /// before anything else is looked at.
    pub(crate) async fn lookup_tagged(&self, route: Route, key: &str, tag: Option<&Tag>) -> Option<Found> {
        let now = now_ms();
        let memory = self.in_memory(key, now).await;
        if let Some(entry) = &memory {
            if entry.is_fresh(now) {
                return Some((entry.clone(), Tier::Memory));
            }
        }
        let mut found = [memory.map(|e| (e, Tier::Memory))];
        // Boxed: a memory hit's future does not carry the lower tiers'
        // state (the request's future is moved whole into its box).
        Box::pin(self.below_memory(route, &[key], &mut found, tag, now)).await;
        let [found] = found;
        found.map(|(e, tier)| (self.release.view(e, now), tier))
    }

    /// [`Cache::lookup_tagged`] for a key whose tag the caller does not keep.
    pub(crate) async fn lookup(&self, route: Route, key: &str) -> Option<Found> {
        self.lookup_tagged(route, key, None).await
    }

    /// Many keys of `route`'s key space through the chain, each tier asked
    /// once for all the keys it may answer. In order; `None` for a key no
    /// tier holds alive.
    pub(crate) async fn get_many(&self, route: Route, keys: &[String]) -> Vec<Option<Found>> {
        let now = now_ms();
        let mut found = Vec::with_capacity(keys.len());
        for key in keys {
            found.push(self.in_memory(key, now).await.map(|e| (e, Tier::Memory)));
        }
        self.below_memory(route, keys, &mut found, None, now).await;
        found
            .into_iter()
            .map(|f| f.map(|(e, tier)| (self.release.view(e, now), tier)))
            .collect()
    }

    /// A fresh entry in L2, the tier peers store to: what a replica that
    /// coalesces on another's lease accepts in place of buying the key.
    pub(crate) async fn fresh_in_redis(&self, route: Route, key: &str) -> Option<Entry> {
        let redis = self.redis.as_ref()?;
        let got = redis_get(redis, vec![self.redis_key(route, key)]).await;
        let now = now_ms();
        let entry = self.release.view(Arc::new(got.into_iter().next().flatten()?), now);
        entry.is_fresh(now).then(|| Entry::clone(&entry))
    }

    /// The memory tier's entry, while it is alive, as the data release
    /// sees it ([`super::release`]).
    async fn in_memory(&self, key: &str, now: u64) -> Option<Arc<Entry>> {
        let entry = self.memory.as_ref()?.get(key).await?;
        (!entry.remaining_life(now, self.grace).is_zero()).then(|| self.release.view(entry, now))
    }

    /// The disk tier for the keys memory lacks, then Redis for those still
    /// missing or held stale; what they have is promoted into memory.
    async fn below_memory<K: AsRef<str>>(
        &self,
        route: Route,
        keys: &[K],
        found: &mut [Option<Found>],
        tag: Option<&Tag>,
        now: u64,
    ) {
        if let Some(disk) = &self.disk {
            let wanted: Vec<usize> = (0..keys.len()).filter(|i| found[*i].is_none()).collect();
            if !wanted.is_empty() {
                let got = disk.get_many(wanted.iter().map(|i| keys[*i].as_ref().to_string()).collect());
                for (i, entry) in wanted.into_iter().zip(got.await) {
                    if let Some(entry) = entry {
                        found[i] = Some((self.promote(keys[i].as_ref(), entry).await, Tier::Disk));
                    }
                }
            }
        }
        let Some(redis) = &self.redis else { return };
        let wanted: Vec<usize> = (0..keys.len())
            .filter(|i| {
                !found[*i]
                    .as_ref()
                    .is_some_and(|(e, _)| self.release.view(e.clone(), now).is_fresh(now))
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        let rkeys = wanted
            .iter()
            .map(|i| match tag {
                Some(tag) if keys.len() == 1 && !super::key::is_complete_index(keys[0].as_ref()) => {
                    self.keys.entry_tagged(route, tag)
                }
                _ => self.redis_key(route, keys[*i].as_ref()),
            })
            .collect();
        for (i, entry) in wanted.into_iter().zip(redis_get(redis, rkeys).await) {
            let Some(entry) = entry else { continue };
            let newer = found[i]
                .as_ref()
                .is_none_or(|(e, _)| e.stored_at_ms < entry.stored_at_ms);
            if newer && !entry.remaining_life(now, self.grace).is_zero() {
                found[i] = Some((self.promote(keys[i].as_ref(), entry).await, Tier::Redis));
            }
        }
    }

    /// Files entries of `route`'s key space (records, rows, their
    /// absences) in every tier, each for what is left of its life; L2's
    /// writes all in flight at once. Nothing when the route is never cached.
    pub(crate) async fn put_many(&self, route: Route, filed: Vec<(String, Entry)>) {
        let now = now_ms();
        let stamp = self.release.stamp();
        let filed: Vec<(String, Entry)> = filed
            .into_iter()
            .filter(|(_, e)| !e.remaining_life(now, self.grace).is_zero())
            .map(|(k, mut e)| {
                if e.release == 0 {
                    e.release = stamp;
                }
                (k, e)
            })
            .collect();
        if filed.is_empty() || self.ttl(route).is_none() {
            return;
        }
        for (key, e) in &filed {
            self.count_release_refresh(key, e).await;
            let e = Arc::new(e.clone());
            if let Some(disk) = &self.disk {
                disk.put(key, e.clone());
            }
            if let Some(memory) = &self.memory {
                memory.insert(Arc::from(key.as_str()), e).await;
            }
        }
        if let Some(redis) = &self.redis {
            let sets = filed.iter().map(|(key, e)| {
                let px = (e.remaining_life(now, self.grace).as_millis() as u64).max(1);
                set_px(&self.redis_key(route, key), e, px)
            });
            each::<()>(redis, RedisOp::CacheSet, sets.collect()).await;
        }
    }

    /// An entry a lower tier had, copied into memory.
    pub(super) async fn promote(&self, key: &str, entry: Entry) -> Arc<Entry> {
        let entry = Arc::new(entry);
        if let Some(memory) = &self.memory {
            memory.insert(Arc::from(key), entry.clone()).await;
        }
        entry
    }
}

/// `GET` of each Redis key, decoded; `None` for a miss, a value that does
/// not decode, or a command that failed. One key is read on this task (and
/// tried once more after a failover: a page's lookup); several are read
/// all at once ([`each`]).
async fn redis_get(redis: &Arc<RedisBackend>, rkeys: Vec<EntryKey>) -> Vec<Option<Entry>> {
    let decode = |bytes: Option<Vec<u8>>| bytes.and_then(|b| Entry::decode(Bytes::from(b)));
    if let [rkey] = &rkeys[..] {
        let got: Option<Vec<u8>> = redis
            .call_reconnecting(RedisOp::CacheGet, |mut c| async move {
                redis::cmd("GET").arg(rkey).query_async(&mut c).await
            })
            .await
            .ok()
            .flatten();
        return vec![decode(got)];
    }
    let gets = rkeys
        .into_iter()
        .map(|k| {
            let mut get = redis::cmd("GET");
            get.arg(k);
            get
        })
        .collect();
    let got: Vec<Option<Option<Vec<u8>>>> = each(redis, RedisOp::CacheGet, gets).await;
    got.into_iter().map(|b| decode(b.flatten())).collect()
}

/// One command per key, all in flight at once: on one multiplexed
/// connection they share round trips like a pipeline, and each is routed to
/// its own slot on a Cluster (piece keys carry their own hash tag, so a
/// pipeline or `MGET` of them would cross slots). Answers in order; `None`
/// for a command that failed.
pub(super) async fn each<T>(redis: &Arc<RedisBackend>, op: RedisOp, cmds: Vec<redis::Cmd>) -> Vec<Option<T>>
where
    T: redis::FromRedisValue + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, cmd) in cmds.into_iter().enumerate() {
        let redis = redis.clone();
        set.spawn(async move {
            let got = redis
                .call(op, |mut c| async move { cmd.query_async::<T>(&mut c).await })
                .await;
            (i, got.ok())
        });
    }
    let mut out: Vec<Option<T>> = Vec::new();
    out.resize_with(set.len(), || None);
    while let Some(done) = set.join_next().await {
        if let Ok((i, got)) = done {
            out[i] = got;
        }
    }
    out
}
