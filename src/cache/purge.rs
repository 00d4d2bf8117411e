//! Purge (`POST /admin/cache/purge`): everything, one route's entries,
//! one answer (by its request) or one record (by its id), gone from every
//! tier — on every replica, not only the one asked ([`Scope`]).
//!
//! L2 is shared, so one replica's SCAN + UNLINK (or DEL of one answer's
//! keys) empties it for all. But each replica's L1 keeps copies (the pages
//! it bought, the records it promoted from L2) that would go on answering
//! what was purged, for up to a day. So the purging replica stamps the
//! purge in Redis once the L2 keys are gone (`<prefix>purges`, a hash:
//! route name or `all` → a fresh random token), and every replica looks at
//! that hash every [`FOLLOW_EVERY`] and drops from its L1 the routes whose
//! token changed. A peer's copies are gone within that interval (plus one
//! Redis timeout). Polling one small key, not pub/sub: nothing to keep
//! subscribed through failovers and Cluster moves, and a replica cut off
//! from Redis catches up at its next look.
//!
//! A purge of one answer or record is stamped under its route too: every
//! replica (this one included, at its next look) then drops its own copies
//! of the route, and takes the others again from L2 as they are asked, so
//! nothing but the purged answer is bought again. A field per key would be
//! exact, but the hash would grow with every such purge, and every replica
//! reads all of it every second.
//!
//! The records a route's pages filed go with the route: they would
//! otherwise keep answering lookups with what was purged. The disk tier
//! ([`super::disk`]) is emptied the same way, before the purge answers, on
//! the purging replica and on each replica that follows it. A disk tier
//! configured but unusable since the start cannot be purged: the answer
//! says so ([`DiskPurged::Unusable`]), since a start that opens it again
//! would serve what it holds.

use super::disk::{DiskPurged, Doomed};
use super::months::Window;
use super::records::{IdList, Resource};
use super::tiers::each;
use super::{key, records, Cache};
use crate::metrics::RedisOp;
use crate::redis_backend::keys::PurgeTokens;
use crate::route::{Route, Target};
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

/// What a purge drops.
#[derive(Debug, Clone)]
pub(crate) enum Scope {
    /// Every entry.
    All,
    /// A route's entries, and the records its pages filed.
    Route(Route),
    /// One answer: every entry that would answer this request
    /// ([`answer_keys`]).
    Request(Target),
    /// One record, by its id, of every resource with an id lookup.
    Record(String),
}

/// What a purge dropped, tier by tier; `None` for a tier not configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Purged {
    /// Entries of this replica's memory tier (a kept refusal counts).
    pub(crate) memory: Option<u64>,
    /// Redis keys deleted.
    pub(crate) redis: Option<u64>,
    /// What the disk tier did, and how many entries went when it committed.
    pub(crate) disk: Option<DiskPurged>,
}

impl Cache {
    /// Drops what `scope` names from every tier, then tells the other
    /// replicas: what went, tier by tier.
    pub(crate) async fn purge(&self, scope: &Scope) -> Purged {
        match scope {
            Scope::All => self.purge_route(None).await,
            Scope::Route(route) => self.purge_route(Some(*route)).await,
            Scope::Request(target) => self.purge_keys(answer_keys(target)).await,
            Scope::Record(id) => self.purge_keys(record_keys(id)).await,
        }
    }

    /// Every entry, or one route's (and the records its pages filed).
    async fn purge_route(&self, route: Option<Route>) -> Purged {
        let records = route.and_then(records_filed_by).filter(|r| Some(*r) != route);
        self.refusals.clear();
        let memory = self.purge_memory(route).await;
        let disk = self.purge_disk(route).await;
        let mut removed = self.purge_redis(route).await;
        if let Some(lookup) = records {
            removed += self.purge_redis(Some(lookup)).await;
        }
        self.stamp_purge(route).await;
        Purged {
            memory,
            redis: self.redis.as_ref().map(|_| removed),
            disk,
        }
    }

    /// Some keys, each in its route's key space: L2 first, so that no
    /// lookup promotes one of them again once memory has dropped it; the
    /// disk tier (committed with fsync); memory, twice (what a request
    /// promoted from disk meanwhile). Then each route is stamped.
    async fn purge_keys(&self, keys: Vec<(Route, String)>) -> Purged {
        let redis = self.delete_from_redis(&keys).await;
        let disk = match &self.disk {
            Some(disk) => Some(
                disk.purge(Doomed::Keys(keys.iter().map(|(_, k)| k.clone()).collect()))
                    .await,
            ),
            None => self.disk_unusable.as_ref().map(|_| DiskPurged::Unusable),
        };
        let refused = keys.iter().filter(|(_, k)| self.refusals.forget(k)).count() as u64;
        let memory = self.remove_from_memory(&keys).await.map(|n| n + refused);
        self.remove_from_memory(&keys).await;
        let mut routes: Vec<Route> = Vec::new();
        for (route, _) in &keys {
            if !routes.contains(route) {
                routes.push(*route);
            }
        }
        for route in routes {
            self.stamp_purge(Some(route)).await;
        }
        Purged { memory, redis, disk }
    }

    /// `keys` from this replica's L1: how many it held.
    async fn remove_from_memory(&self, keys: &[(Route, String)]) -> Option<u64> {
        let memory = self.memory.as_ref()?;
        let mut removed = 0;
        for (_, key) in keys {
            removed += u64::from(memory.remove(key.as_str()).await.is_some());
        }
        Some(removed)
    }

    /// `keys` from L2, one DEL each (each key has its own slot): how many
    /// it held.
    async fn delete_from_redis(&self, keys: &[(Route, String)]) -> Option<u64> {
        let redis = self.redis.as_ref()?;
        let dels = keys
            .iter()
            .map(|(route, key)| {
                let mut del = redis::cmd("DEL");
                del.arg(self.redis_key(*route, key));
                del
            })
            .collect();
        let deleted: Vec<Option<u64>> = each(redis, RedisOp::CachePurge, dels).await;
        Some(deleted.into_iter().flatten().sum())
    }

    /// The disk tier's copies: the route's entries and the records its
    /// pages filed, or everything; then this replica's L1 once more, for
    /// what a request promoted from disk while the disk purge ran.
    async fn purge_disk(&self, route: Option<Route>) -> Option<DiskPurged> {
        let Some(disk) = self.disk.as_ref() else {
            return self.disk_unusable.as_ref().map(|_| DiskPurged::Unusable);
        };
        let doomed = match route {
            None => Doomed::All,
            Some(r) => Doomed::Routes(std::iter::once(r).chain(records_filed_by(r)).collect()),
        };
        let purged = disk.purge(doomed).await;
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
    /// filed, or everything. How many it held (counted before they go: an
    /// entry a request adds meanwhile may go uncounted).
    async fn purge_memory(&self, route: Option<Route>) -> Option<u64> {
        let memory = self.memory.as_ref()?;
        memory.run_pending_tasks().await;
        let dropped = match route {
            None => {
                let held = memory.entry_count();
                memory.invalidate_all();
                held
            }
            Some(r) => {
                let records = records_filed_by(r);
                let doomed = move |e: &super::Entry| e.route == r || Some(e.route) == records;
                let held = memory.iter().filter(|(_, e)| doomed(e)).count() as u64;
                let _ = memory.invalidate_entries_if(move |_, e| doomed(e));
                held
            }
        };
        memory.run_pending_tasks().await;
        Some(dropped)
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

/// Every key whose entry would answer `target`, each with the route whose
/// key space holds it: its own (its normalized cache key, so every
/// spelling of the request finds it); the pages `covered` would answer it
/// from in its place (the same query's complete page, filed without its
/// size; its first page asked with `include_count=true`); and the pieces
/// an answer to it is built from (an id lookup's records, a monthly
/// window's rows), which `proxy::reuse` would otherwise assemble it from
/// again.
fn answer_keys(target: &Target) -> Vec<(Route, String)> {
    let route = target.route;
    let own = key::cache_key(target);
    let counted = key::counted_key(route, &own);
    let covering = [
        key::complete_key(route, &own),
        counted.as_ref().and_then(|c| key::complete_key(route, c)),
        counted,
    ];
    let mut keys = vec![(route, own)];
    keys.extend(covering.into_iter().flatten().map(|k| (route, k)));
    if let Some(ids) = IdList::of(target) {
        let lookup = ids.resource.lookup_route();
        keys.extend(ids.keys.into_iter().map(|k| (lookup, k)));
    }
    if let Some(window) = Window::of(target) {
        keys.extend(window.keys.into_iter().map(|k| (route, k)));
    }
    keys
}

/// A record's keys: its id under every resource with an id lookup (an id
/// names one record; the others hold nothing under it).
fn record_keys(id: &str) -> Vec<(Route, String)> {
    Route::ALL
        .iter()
        .filter_map(|r| Resource::of_lookup(*r))
        .map(|resource| (resource.lookup_route(), resource.key(id)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn target(route: Route, path: &str, query: &str) -> Target {
        Target {
            route,
            path: Arc::from(path),
            query: Some(Arc::from(query)),
        }
    }

    #[test]
    fn an_answers_keys_are_the_same_for_every_spelling_and_cover_its_stand_ins() {
        let search = |q| answer_keys(&target(Route::PermitsSearch, "/v2/permits/search", q));
        let keys = search("geo_id=CO&size=3");
        assert_eq!(
            keys,
            search("size=3&include_count=false&geo_id=CO"),
            "one answer, two spellings"
        );
        let own = keys[0].1.clone();
        assert_eq!(own, "k1 /v2/permits/search?geo_id=CO&size=3");
        let covering: Vec<&str> = keys[1..].iter().map(|(_, k)| k.as_str()).collect();
        assert_eq!(
            covering,
            [
                "k1c /v2/permits/search?geo_id=CO",
                "k1c /v2/permits/search?geo_id=CO&include_count=true",
                "k1 /v2/permits/search?geo_id=CO&include_count=true&size=3",
            ]
        );
        let lookup = answer_keys(&target(Route::PermitsById, "/v2/permits", "id=a&id=b"));
        assert!(lookup.contains(&(Route::PermitsById, records::Resource::Permits.key("b"))));
    }

    #[test]
    fn a_records_keys_are_its_id_under_every_lookup() {
        let keys = record_keys("p-1");
        assert_eq!(keys.len(), 4);
        assert!(keys.contains(&(Route::PermitsById, Resource::Permits.key("p-1"))));
        assert!(keys.contains(&(Route::PropertiesById, Resource::Properties.key("p-1"))));
    }
}
