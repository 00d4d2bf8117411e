//! Purge (`POST /admin/cache/purge[?route=NAME]`): every entry, or one
//! route's, gone from both tiers — on every replica, not only the one asked.
//!
//! L2 is shared, so one replica's SCAN + UNLINK empties it for all. But each
//! replica's L1 keeps copies (the pages it bought, the records it promoted
//! from L2) that would go on answering what was purged, for up to a day. So
//! the purging replica stamps the purge in Redis once the L2 keys are gone
//! (`<prefix>purges`, a hash: route name or `all` → a fresh random token),
//! and every replica looks at that hash every [`FOLLOW_EVERY`] and drops
//! from its L1 the routes whose token changed. A peer's copies are gone
//! within that interval (plus one Redis timeout). Polling one small key,
//! not pub/sub: nothing to keep subscribed through failovers and Cluster
//! moves, and a replica cut off from Redis catches up at its next look.
//!
//! The records a route's pages filed go with the route: they would
//! otherwise keep answering lookups with what was purged. The disk tier
//! ([`super::disk`]) is emptied the same way, before the purge answers, on
//! the purging replica and on each replica that follows it.

use super::disk::DiskPurged;
use super::{records, Cache};
use crate::metrics::RedisOp;
use crate::redis_backend::keys::PurgeTokens;
use crate::route::Route;
use std::sync::Mutex;
use std::time::Duration;

/// How often a replica looks for other replicas' purges.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// The hash field of a purge of everything.
const ALL: &str = "all";

/// The purge tokens a replica has applied: `None` until its first look at
/// Redis, which only takes them in (the replica's L1 has nothing older
/// than its start).
#[derive(Default)]
pub(crate) struct Seen(Mutex<Option<PurgeTokens>>);

impl Cache {
    /// Drops every entry, or one route's (and the records its pages filed),
    /// from every tier, then tells the other replicas. Returns how many
    /// Redis keys went, and what the disk tier did (`None`: no disk tier).
    pub(crate) async fn purge(&self, route: Option<Route>) -> (u64, Option<DiskPurged>) {
        let records = route.and_then(records_filed_by).filter(|r| Some(*r) != route);
        self.refusals.clear();
        self.purge_memory(route).await;
        let disk = self.purge_disk(route).await;
        let mut removed = self.purge_redis(route).await;
        if let Some(lookup) = records {
            removed += self.purge_redis(Some(lookup)).await;
        }
        self.stamp_purge(route).await;
        (removed, disk)
    }

    /// The disk tier's copies: the route's entries and the records its
    /// pages filed, or everything; then this replica's L1 once more, for
    /// what a request promoted from disk while the disk purge ran.
    async fn purge_disk(&self, route: Option<Route>) -> Option<DiskPurged> {
        let disk = self.disk.as_ref()?;
        let routes = route.map(|r| std::iter::once(r).chain(records_filed_by(r)).collect());
        let purged = disk.purge(routes).await;
        if let DiskPurged::Committed(removed) = purged {
            tracing::info!(
                route = route.map_or(ALL, Route::as_str),
                disk_entries = removed,
                "cache purged from the disk tier"
            );
        }
        self.purge_memory(route).await;
        Some(purged)
    }

    /// Whether this replica has copies in memory of a shared tier, which
    /// other replicas' purges must reach ([`Cache::follow_purges`]).
    pub(crate) fn follows_purges(&self) -> bool {
        (self.memory.is_some() || self.disk.is_some()) && self.redis.is_some()
    }

    /// One look at the purges of every replica: the routes whose token
    /// changed since the last look are dropped from this replica's L1. The
    /// purging replica sees its own purge too and drops its L1 once more,
    /// which also removes what a request promoted from L2 while the purge's
    /// SCAN ran.
    pub(crate) async fn follow_purges(&self) {
        let Some(redis) = &self.redis else { return };
        let key = self.keys.purges();
        let Ok(now) = redis
            .call(RedisOp::CachePurge, |mut c| async move {
                redis::cmd("HGETALL").arg(&key).query_async::<PurgeTokens>(&mut c).await
            })
            .await
        else {
            return;
        };
        let changed: Vec<String> = {
            let mut seen = self.purges_seen.0.lock().unwrap_or_else(|p| p.into_inner());
            let changed = match seen.as_ref() {
                None => Vec::new(),
                Some(before) => now
                    .iter()
                    .filter(|(field, token)| before.get(*field) != Some(*token))
                    .map(|(field, _)| field.clone())
                    .collect(),
            };
            // A field that went (Redis lost its data) marks no purge: the
            // next purge writes a token never seen.
            *seen = Some(now);
            changed
        };
        for field in changed {
            tracing::info!(
                route = field.as_str(),
                "a replica purged the cache: memory tier dropped"
            );
            // `all`, or a route this build does not know (a newer
            // replica's): everything.
            self.purge_memory(Route::from_name(&field)).await;
            self.purge_disk(Route::from_name(&field)).await;
        }
    }

    /// Writes a fresh token for the purge, after its L2 keys are gone, so a
    /// peer that drops its copies cannot promote a purged one back from L2.
    async fn stamp_purge(&self, route: Option<Route>) {
        let Some(redis) = &self.redis else { return };
        let (key, field) = (self.keys.purges(), route.map_or(ALL, Route::as_str));
        let token = format!("{:032x}", rand::random::<u128>());
        let _ = redis
            .call(RedisOp::CachePurge, |mut c| async move {
                redis::cmd("HSET")
                    .arg(&key)
                    .arg(field)
                    .arg(&token)
                    .query_async::<()>(&mut c)
                    .await
            })
            .await;
    }

    /// This replica's L1: the route's entries and the records its pages
    /// filed, or everything.
    async fn purge_memory(&self, route: Option<Route>) {
        let Some(memory) = &self.memory else { return };
        match route {
            None => memory.invalidate_all(),
            Some(r) => {
                let records = records_filed_by(r);
                let _ = memory.invalidate_entries_if(move |_, e| e.route == r || Some(e.route) == records);
            }
        }
        memory.run_pending_tasks().await;
    }

    /// The route's keys in L2 (every primary).
    async fn purge_redis(&self, route: Option<Route>) -> u64 {
        let Some(redis) = &self.redis else { return 0 };
        let pattern = self.keys.purge_pattern(route);
        redis.scan_delete(RedisOp::CachePurge, &pattern).await
    }
}

/// The lookup route under which a route's pages file their records (a
/// lookup route's own, for a lookup route): its records go with it.
fn records_filed_by(route: Route) -> Option<Route> {
    records::Resource::filed_by(route).map(records::Resource::lookup_route)
}
