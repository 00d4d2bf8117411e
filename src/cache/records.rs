//! The record tier: every record of a cached page, filed under (resource,
//! id), so that an id lookup is answered from records that searches and
//! earlier lookups already bought (`proxy::by_id` asks; docs/design.md §2, `lookup_ids`).
//!
//! Records live in the same two tiers as pages, under the same byte budget
//! (L1) and in the key space of their lookup route (L2: `c:permits_by_id:…`),
//! so a purge of everything or of the lookup route drops them. Each record
//! keeps the answer time and TTL of the page that brought it (bounded by
//! the lookup route's own TTL) and is only served while that page would be
//! fresh: a record is never newer than its page claims, and never older.
//! Filed, a record owns a copy of its bytes: a view would keep its whole
//! page alive after the page left L1 while weighing only itself. An id a
//! complete lookup answer lacks is held as absent (an empty body) for the
//! same TTL; only a trustworthy answer says so (`proxy::by_id`).
//!
//! A record is filed only where the upstream serves it byte for byte the
//! same in a search and in a lookup (`docs/vendor-api.md`, "Id lookups"):
//! contractor searches scope their tallies to the search, and property
//! searches with excluded tags add a `trust` block, so those are not filed.

use super::{Cache, Entry};
use crate::clock::now_ms;
use crate::metrics::RedisOp;
use crate::redis_backend::{keys, RedisBackend};
use crate::route::Route;
use bytes::Bytes;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::Arc;

/// A kind of record with an id lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resource {
    Permits,
    Contractors,
    Decisions,
    Properties,
}

impl Resource {
    /// The resource an id-lookup route answers with.
    pub(crate) fn of_lookup(route: Route) -> Option<Resource> {
        match route {
            Route::PermitsById => Some(Resource::Permits),
            Route::ContractorsById => Some(Resource::Contractors),
            Route::DecisionsById => Some(Resource::Decisions),
            Route::PropertiesById => Some(Resource::Properties),
            _ => None,
        }
    }

    /// The resource whose lookup records a route's pages carry exactly.
    /// Contractor searches are missing on purpose: their tallies are scoped
    /// to the search, a lookup's to the contractor's lifetime.
    pub(super) fn filed_by(route: Route) -> Option<Resource> {
        match route {
            Route::PermitsSearch | Route::ContractorPermits => Some(Resource::Permits),
            Route::DecisionsSearch => Some(Resource::Decisions),
            Route::PropertiesSearch => Some(Resource::Properties),
            lookup => Resource::of_lookup(lookup),
        }
    }

    /// The lookup route; its name is the records' purge and L2 key space.
    pub(crate) fn lookup_route(self) -> Route {
        match self {
            Resource::Permits => Route::PermitsById,
            Resource::Contractors => Route::ContractorsById,
            Resource::Decisions => Route::DecisionsById,
            Resource::Properties => Route::PropertiesById,
        }
    }

    /// The record's key in L1 and of its in-process flight, also hashed
    /// into its L2 key and its lease's key (`redis_backend::keys::record_key`).
    pub(crate) fn key(self, id: &str) -> String {
        keys::record_key(self.lookup_route(), id)
    }
}

/// Whether a held entry says "the upstream does not know this id".
pub(crate) fn is_absent(entry: &Entry) -> bool {
    entry.body.is_empty()
}

/// The records of a page envelope, as sent (byte for byte, views into
/// `body`, not copies: the caller copies what it keeps), each with its id. `None` when the body is not a page
/// of records with string ids.
pub(crate) fn records_of(body: &Bytes, resource: Resource) -> Option<Vec<(String, Bytes)>> {
    #[derive(Deserialize)]
    struct Page<'a> {
        #[serde(borrow)]
        items: Vec<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Record {
        id: String,
        trust: Option<IgnoredAny>,
    }
    let page: Page = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(page.items.len());
    for raw in page.items {
        let record: Record = serde_json::from_str(raw.get()).ok()?;
        // An absence search's property carries a `trust` block no lookup sends.
        if resource == Resource::Properties && record.trust.is_some() {
            continue;
        }
        out.push((record.id, body.slice_ref(raw.get().as_bytes())));
    }
    Some(out)
}

/// A record (or an absence: empty body, 0 credits) with its page's times.
/// No ETag in memory (a record is never answered alone); L2 adds one, its
/// integrity check.
fn record_entry(resource: Resource, page: &Entry, body: Bytes, credits: u64) -> Entry {
    Entry {
        etag: http::HeaderValue::from_static(""),
        body,
        credits,
        stored_at_ms: page.stored_at_ms,
        ttl_ms: page.ttl_ms,
        route: resource.lookup_route(),
    }
}

/// One command per key, all in flight at once: on one multiplexed
/// connection they share round trips like a pipeline, and each is routed to
/// its own slot on a Cluster (record keys carry their own hash tag, so a
/// pipeline or `MGET` of them would cross slots). Answers in order; `None`
/// for a command that failed.
async fn each<T>(redis: &Arc<RedisBackend>, op: RedisOp, cmds: Vec<redis::Cmd>) -> Vec<Option<T>>
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

/// A record's bytes on their own allocation (see [`Cache::record_entry`]).
fn own(body: &Bytes) -> Bytes {
    Bytes::copy_from_slice(body)
}

fn with_etag(e: &Entry) -> Entry {
    Entry {
        etag: super::entry::etag_of(&e.body),
        ..e.clone()
    }
}

impl Cache {
    /// Whether pages file their records here (`cache.record_reuse`).
    pub(crate) fn record_reuse(&self) -> bool {
        self.record_reuse
    }

    /// Files the records of a stored page under the page's answer time and
    /// TTL (called by [`Cache::store`]).
    pub(super) async fn file_records(&self, resource: Resource, page: &Entry) {
        let Some(records) = records_of(&page.body, resource) else {
            return;
        };
        let filed = records
            .into_iter()
            .map(|(id, body)| (resource.key(&id), self.record_entry(resource, page, own(&body))))
            .collect();
        self.put_records(resource, filed).await;
    }

    /// Files what a trusted lookup answer said of each asked id: its record,
    /// or its absence (see `by_id`'s `trusted`).
    pub(crate) async fn file_lookup(&self, resource: Resource, filed: &[(String, Arc<Entry>)]) {
        let filed = filed
            .iter()
            .map(|(id, e)| (resource.key(id), Entry::clone(e)))
            .collect();
        self.put_records(resource, filed).await;
    }

    /// An id's record (its body copied out of `page`'s, so that the page can
    /// go when it leaves L1: a view would pin all of it while weighing
    /// itself; BENCHMARKS.md, "Record weights") or, with an empty body, its
    /// absence. Its life is the page's, bounded by the lookup route's TTL
    /// (`cache.route_ttl_secs.permits_by_id` and siblings).
    pub(crate) fn record_entry(&self, resource: Resource, page: &Entry, body: Bytes) -> Entry {
        // One credit per record: what serving it again saves.
        let credits = u64::from(!body.is_empty());
        let mut e = record_entry(resource, page, body, credits);
        if let Some(ttl) = self.ttl(resource.lookup_route()) {
            e.ttl_ms = e.ttl_ms.min(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        }
        e
    }

    /// Both tiers; L2 in one pipelined round trip. Nothing when the lookup
    /// route is never cached.
    async fn put_records(&self, resource: Resource, filed: Vec<(String, Entry)>) {
        let now = now_ms();
        let filed: Vec<(String, Entry)> = filed
            .into_iter()
            .filter(|(_, e)| !e.remaining_life(now, self.grace).is_zero())
            .collect();
        if filed.is_empty() || self.ttl(resource.lookup_route()).is_none() {
            return;
        }
        if self.memory.is_some() || self.disk.is_some() {
            for (key, e) in &filed {
                let e = Arc::new(e.clone());
                if let Some(disk) = &self.disk {
                    disk.put(key, e.clone());
                }
                if let Some(memory) = &self.memory {
                    memory.insert(Arc::from(key.as_str()), e).await;
                }
            }
        }
        if let Some(redis) = &self.redis {
            let sets = filed.iter().map(|(key, e)| {
                let px = (e.remaining_life(now, self.grace).as_millis() as u64).max(1);
                let mut set = redis::cmd("SET");
                set.arg(self.redis_key(resource.lookup_route(), key))
                    .arg(with_etag(e).encode())
                    .arg("PX")
                    .arg(px);
                set
            });
            each::<()>(redis, RedisOp::CacheSet, sets.collect()).await;
        }
    }

    /// The held entry (record or absence) of each id, in order, fresh or
    /// within the stale grace (the caller serves stale ones only when the
    /// upstream fails): L1, then L2 for the rest (promoting what it finds).
    pub(crate) async fn held_records(&self, resource: Resource, ids: &[String]) -> Vec<Option<Arc<Entry>>> {
        self.held_records_from(resource, ids).await.0
    }

    /// [`Cache::held_records`], and for each id whether its entry came
    /// from the disk tier (memory did not hold it: `SavedReason::Disk`).
    pub(crate) async fn held_records_from(
        &self,
        resource: Resource,
        ids: &[String],
    ) -> (Vec<Option<Arc<Entry>>>, Vec<bool>) {
        let now = now_ms();
        let mut held: Vec<Option<Arc<Entry>>> = Vec::with_capacity(ids.len());
        for id in ids {
            let found = match &self.memory {
                Some(memory) => memory.get(resource.key(id).as_str()).await,
                None => None,
            };
            held.push(found.filter(|e| !e.remaining_life(now, self.grace).is_zero()));
        }
        let mut from_disk = vec![false; ids.len()];
        if let Some(disk) = &self.disk {
            let wanted: Vec<usize> = (0..ids.len()).filter(|i| held[*i].is_none()).collect();
            if !wanted.is_empty() {
                let keys = wanted.iter().map(|i| resource.key(&ids[*i])).collect();
                let got = disk.get_many(keys).await;
                for (i, entry) in wanted.into_iter().zip(got) {
                    let Some(entry) = entry else { continue };
                    held[i] = Some(self.promote(&resource.key(&ids[i]), entry).await);
                    from_disk[i] = true;
                }
            }
        }
        let held = self.held_in_redis(resource, ids, held, now).await;
        (held, from_disk)
    }

    /// The Redis tier for the ids not held fresh (promoting what it finds).
    async fn held_in_redis(
        &self,
        resource: Resource,
        ids: &[String],
        mut held: Vec<Option<Arc<Entry>>>,
        now: u64,
    ) -> Vec<Option<Arc<Entry>>> {
        let Some(redis) = &self.redis else { return held };
        // Stale in L1 may be fresh in L2: another replica bought it again.
        let wanted: Vec<usize> = (0..ids.len())
            .filter(|i| !held[*i].as_ref().is_some_and(|e| e.is_fresh(now)))
            .collect();
        if wanted.is_empty() {
            return held;
        }
        let route = resource.lookup_route();
        let rkeys: Vec<String> = wanted
            .iter()
            .map(|i| self.redis_key(route, &resource.key(&ids[*i])))
            .collect();
        let gets = rkeys.into_iter().map(|k| {
            let mut get = redis::cmd("GET");
            get.arg(k);
            get
        });
        let got: Vec<Option<Option<Vec<u8>>>> = each(redis, RedisOp::CacheGet, gets.collect()).await;
        for (i, bytes) in wanted.into_iter().zip(got) {
            let Some(entry) = bytes.flatten().and_then(|b| Entry::decode(Bytes::from(b))) else {
                continue;
            };
            let newer = held[i].as_ref().is_none_or(|e| e.stored_at_ms < entry.stored_at_ms);
            if !newer || entry.remaining_life(now, self.grace).is_zero() {
                continue;
            }
            // L1 keeps no ETag for records (see `record_entry`).
            let entry = Entry {
                etag: http::HeaderValue::from_static(""),
                ..entry
            };
            held[i] = Some(self.promote(&resource.key(&ids[i]), entry).await);
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_taken_as_sent_and_absence_searches_are_skipped() {
        let page = Bytes::from_static(br#"{"items":[{"id":"a","x":[1, 2]},{"x":1,"id":"b"}],"size":2}"#);
        let got = records_of(&page, Resource::Permits).expect("a page");
        assert_eq!(
            got[0],
            ("a".to_string(), Bytes::from_static(br#"{"id":"a","x":[1, 2]}"#))
        );
        assert_eq!(got[1].0, "b");
        let inside = |b: &Bytes| page.as_ptr_range().contains(&b.as_ptr());
        assert!(got.iter().all(|(_, b)| inside(b)), "views into the page, not copies");
        let trust = Bytes::from_static(br#"{"items":[{"id":"a","trust":{}},{"id":"b"}]}"#);
        assert_eq!(records_of(&trust, Resource::Properties).map(|r| r.len()), Some(1));
        assert_eq!(records_of(&trust, Resource::Permits).map(|r| r.len()), Some(2));
        let bad = |b: &'static [u8]| records_of(&Bytes::from_static(b), Resource::Permits);
        assert_eq!(bad(br#"{"items":[{"id":7}]}"#), None);
        assert_eq!(bad(b"[]"), None);
    }

    #[test]
    fn contractor_searches_file_nothing() {
        assert_eq!(Resource::filed_by(Route::ContractorsSearch), None);
        assert_eq!(Resource::filed_by(Route::ContractorsById), Some(Resource::Contractors));
        assert_eq!(Resource::filed_by(Route::ContractorPermits), Some(Resource::Permits));
        assert_eq!(Resource::filed_by(Route::MetaRelease), None);
    }
}
