//! The record tier: every record of a cached page, filed under (resource,
//! id), so that an id lookup is answered from records that searches and
//! earlier lookups already bought (`proxy::reuse` asks; docs/design.md §2, `lookup_pieces`).
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
//! same TTL; only a trustworthy answer says so (`proxy::reuse`).
//!
//! A record is filed only where the upstream serves it byte for byte the
//! same in a search and in a lookup (`docs/vendor-api.md`, "Id lookups"):
//! contractor searches scope their tallies to the search, and property
//! searches with excluded tags add a `trust` block, so those are not filed.

use super::{key, Cache, Entry};
use crate::page::{item_of, Page};
use crate::redis_backend::keys;
use crate::route::{Route, Target};
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

/// An id lookup as the record tier answers it: the resource, the ids in
/// the order asked (each once: the upstream answers a repeated id once, at
/// its first position) and each id's record key. Memoized with its request
/// target (`proxy::parsed`).
#[derive(Debug, Clone)]
pub(crate) struct IdList {
    pub(crate) resource: Resource,
    /// The lookup's canonical path, which the call for missing ids asks.
    pub(crate) path: Arc<str>,
    pub(crate) ids: Vec<String>,
    pub(crate) keys: Vec<String>,
}

impl IdList {
    /// The ids of a lookup's query. Parameters the route does not declare
    /// are ignored by the upstream (FastAPI reads parameters by name), so
    /// they are here too; `None` for a declared one (`cursor`), bytes that
    /// are not UTF-8, or a route with no lookup: the page path forwards
    /// those as sent.
    pub(crate) fn of(target: &Target) -> Option<IdList> {
        let resource = Resource::of_lookup(target.route)?;
        let pairs = key::decode_pairs(target.query.as_deref()?)?;
        let mut ids: Vec<String> = Vec::with_capacity(pairs.len());
        for (name, value) in pairs {
            if name != "id" {
                if target.route.param(&name).is_some() {
                    return None;
                }
                continue;
            }
            if !ids.iter().any(|id| *id == value) {
                ids.push(value.into_owned());
            }
        }
        if ids.is_empty() {
            return None;
        }
        let keys = ids.iter().map(|id| resource.key(id)).collect();
        Some(IdList {
            resource,
            path: target.path.clone(),
            ids,
            keys,
        })
    }
}

/// `id=a&id=b`: the only list spelling the upstream reads.
pub(crate) fn query_of<'a>(ids: impl IntoIterator<Item = &'a String>) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(ids.into_iter().map(|id| ("id", id)))
        .finish()
}

/// Whether a held entry says "the upstream does not know this id".
pub(crate) fn is_absent(entry: &Entry) -> bool {
    entry.body.is_empty()
}

/// The records of a page envelope, as sent (byte for byte, views into
/// `body`, not copies: the caller copies what it keeps), each with its id. `None` when the body is not a page
/// of records with string ids.
pub(crate) fn records_of(body: &Bytes, resource: Resource) -> Option<Vec<(String, Bytes)>> {
    let page = Page::parse(body)?;
    let mut out = Vec::with_capacity(page.items.len());
    for raw in page.items {
        let (id, trust) = record_id(raw)?;
        // An absence search's property carries a `trust` block no lookup sends.
        if resource == Resource::Properties && trust {
            continue;
        }
        out.push((id, item_of(body, raw)));
    }
    Some(out)
}

/// A record's id, and whether it carries a `trust` block; `None` when the
/// item is not a record with a string id.
pub(crate) fn record_id(raw: &RawValue) -> Option<(String, bool)> {
    #[derive(Deserialize)]
    struct Record {
        id: String,
        trust: Option<IgnoredAny>,
    }
    let record: Record = serde_json::from_str(raw.get()).ok()?;
    Some((record.id, record.trust.is_some()))
}

/// A record (or an absence: empty body, 0 credits) with its page's times.
/// No ETag in any tier: a record is never answered alone (L2's value has
/// its own checksum).
fn record_entry(resource: Resource, page: &Entry, body: Bytes, credits: u64) -> Entry {
    Entry {
        etag: http::HeaderValue::from_static(""),
        body,
        credits,
        stored_at_ms: page.stored_at_ms,
        ttl_ms: page.ttl_ms,
        route: resource.lookup_route(),
        release: page.release,
    }
}

/// A record's bytes on their own allocation (see [`Cache::record_entry`]).
fn own(body: &Bytes) -> Bytes {
    Bytes::copy_from_slice(body)
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
        self.put_many(resource.lookup_route(), filed).await;
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
    fn only_id_parameters_make_a_lookup_and_repeats_count_once() {
        let ids = |route: Route, q: &str| {
            IdList::of(&Target {
                route,
                path: std::sync::Arc::from(""),
                query: Some(q.into()),
            })
            .map(|l| l.ids)
        };
        let p = |q| ids(Route::PermitsById, q);
        assert_eq!(p("id=a&id=b&id=a"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(p("id=a%2Cb"), Some(vec!["a,b".into()]), "a comma is part of the id");
        assert_eq!(p("id=a&foo=1"), Some(vec!["a".into()]), "the upstream ignores foo");
        assert_eq!(ids(Route::ContractorsById, "id=a&cursor=x"), None);
        assert_eq!(p("id=%FF"), None);
        assert_eq!(ids(Route::PermitsSearch, "id=a"), None, "not a lookup route");
        assert_eq!(query_of(&["a b".to_string(), "c&d".to_string()]), "id=a+b&id=c%26d");
    }

    #[test]
    fn contractor_searches_file_nothing() {
        assert_eq!(Resource::filed_by(Route::ContractorsSearch), None);
        assert_eq!(Resource::filed_by(Route::ContractorsById), Some(Resource::Contractors));
        assert_eq!(Resource::filed_by(Route::ContractorPermits), Some(Resource::Permits));
        assert_eq!(Resource::filed_by(Route::MetaRelease), None);
    }
}
