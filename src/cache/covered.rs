//! Covered answers: what the upstream answers is sometimes provably
//! inside an answer already bought for a different query, and is then
//! reused at 0 credits.
//!
//! - **A complete page is size-independent.** A page whose `next_cursor`
//!   is `null` holds every record of its query from its position on (the
//!   upstream's cursors are keysets, `docs/vendor-api.md`, query semantics). With n
//!   records, the same query asked with any `size` ≥ n gets those n records,
//!   and the envelope's `size` is the number of records *returned*, so the
//!   body is byte for byte the same. [`Cache::store`] files such a page a
//!   second time under [`key::complete_key`] (the key without `size`);
//!   [`Cache::covering`] answers from it only when the asked size is ≥ n.
//! - **A counted first page holds the uncounted one.** `include_count=true`
//!   adds `total_count` and changes nothing else; the upstream answers
//!   `"total_count":null` when not asked ([`uncounted`] rewrites exactly
//!   that value, leaving every other byte as the upstream sent it).
//!
//! Both lookups run only on a miss of the request's own key; the caller
//! decides freshness as for any entry.

use super::{key, Cache, Entry, Tier};
use crate::page::{Cursor, Page};
use crate::route::{self, Target};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

/// The two facts of a page envelope that prove a covered answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PageFacts {
    records: u64,
    /// `next_cursor` is present and `null`: nothing follows this page.
    complete: bool,
}

impl PageFacts {
    /// Billed one credit per record it holds: nothing was cut from it.
    fn honest(&self, entry: &Entry) -> bool {
        entry.credits == self.records
    }
}

/// What a body says of itself; `None` when it is not a page envelope.
fn page_facts(body: &[u8]) -> Option<PageFacts> {
    let page = Page::parse(body)?;
    Some(PageFacts {
        records: page.len(),
        complete: page.next_cursor == Cursor::End,
    })
}

/// The body of a counted page as the upstream answers the same page
/// uncounted: the top-level `total_count` value replaced by `null`, every
/// other byte kept. `None` when the body is not a page envelope.
fn uncounted(body: &Bytes) -> Option<Bytes> {
    let page = Page::parse(body)?;
    // `null` or absent already: the uncounted page is this one.
    let Some(raw) = page.total_count else {
        return Some(body.clone());
    };
    // The raw value borrows from `body`: its offset is where it sits.
    let start = (raw.get().as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start + raw.get().len();
    let mut out = BytesMut::with_capacity(body.len());
    out.extend_from_slice(body.get(..start)?);
    out.extend_from_slice(b"null");
    out.extend_from_slice(body.get(end..)?);
    Some(out.freeze())
}

/// Which page covered an answer (the debug log says so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CoveredBy {
    /// A complete page of the same query asked with another size.
    Complete,
    /// The same first page asked with `include_count=true`.
    Counted,
    /// A complete counted page of the same query, another size.
    CompleteCounted,
}

impl Cache {
    /// Files a complete page under its size-free index key too (both tiers,
    /// so every replica finds it). `page` is what the memory tier holds.
    ///
    /// Only an honest page is filed (a page billed above its records was
    /// once served for sizes it did not hold): no cursor, no more records
    /// than the size asked, and billed exactly one credit per record it
    /// holds. A page billed for records it lacks (the upstream cut it) may
    /// be complete at no size: it is served as it is, under its own key.
    pub(super) async fn file_complete(&self, key: &str, entry: &Arc<Entry>, page: &Arc<Entry>) {
        let Some(index) = key::complete_key(entry.route, key) else {
            return;
        };
        let Some(size) = key::size_of(entry.route, key) else {
            return;
        };
        if !page_facts(&entry.body).is_some_and(|f| f.complete && f.records <= size && f.honest(entry)) {
            return;
        }
        self.put(&index, entry, page.clone()).await;
    }

    /// On a miss of `key`: an entry of another key that provably holds the
    /// upstream's answer to `target`, rewritten to be that answer.
    pub(crate) async fn covering(&self, target: &Target, key: &str) -> Option<(Entry, Tier, CoveredBy)> {
        let asked = route::page_size_asked(target)?;
        let route = target.route;
        let counted = key::counted_key(route, key);
        // In order of preference: the first that fits answers.
        let candidates = [
            (key::complete_key(route, key), CoveredBy::Complete),
            (counted.clone(), CoveredBy::Counted),
            (
                counted.and_then(|c| key::complete_key(route, &c)),
                CoveredBy::CompleteCounted,
            ),
        ];
        let (keys, hows): (Vec<String>, Vec<CoveredBy>) =
            candidates.into_iter().filter_map(|(k, how)| Some((k?, how))).unzip();
        if keys.is_empty() {
            return None;
        }
        // Every candidate in one trip through the tiers: one read of the
        // disk tier on the blocking pool, Redis's reads in flight at once.
        // Boxed, as `lookup_tagged` boxes the lower tiers: the request's
        // future does not carry their state.
        let found = Box::pin(self.get_many(route, &keys)).await;
        hows.into_iter().zip(found).find_map(|(how, found)| {
            let (page, tier) = found?;
            answer_from(&page, how, asked).map(|entry| (entry, tier, how))
        })
    }
}

/// The answer `page` holds for a page of `asked` records, covered `how`;
/// `None` when it does not provably hold it. Checked again on the way out:
/// an index an older replica filed may hold a page billed above its records.
fn answer_from(page: &Entry, how: CoveredBy, asked: u64) -> Option<Entry> {
    let fits = page_facts(&page.body).is_some_and(|f| {
        f.honest(page)
            && match how {
                // Same size: the very page, counted.
                CoveredBy::Counted => true,
                _ => f.complete && f.records <= asked,
            }
    });
    if !fits {
        return None;
    }
    match how {
        CoveredBy::Complete => Some(page.clone()),
        _ => {
            let body = uncounted(&page.body)?;
            Some(Entry {
                etag: super::entry::etag_of(&body),
                body,
                ..page.clone()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_tell_complete_pages_apart() {
        let f = |b: &str| page_facts(b.as_bytes());
        assert_eq!(
            f(r#"{"items":[1,2],"size":2,"next_cursor":null,"total_count":null}"#),
            Some(PageFacts {
                records: 2,
                complete: true
            })
        );
        assert!(!f(r#"{"items":[1],"size":1,"next_cursor":"abc"}"#).unwrap().complete);
        assert!(!f(r#"{"items":[1],"size":1}"#).unwrap().complete, "absent is not null");
        assert_eq!(f(r#"{"geo_id":"x"}"#), None);
        assert_eq!(f("not json"), None);
        assert_eq!(f("[[1], null]"), None, "an array is no envelope");
    }

    #[test]
    fn uncounted_rewrites_only_the_count() {
        let counted = Bytes::from_static(
            br#"{"items":[{"total_count":{"value":1}}],"size":1,"next_cursor":null,"total_count":{"value":7,"relation":"eq"}}"#,
        );
        assert_eq!(
            uncounted(&counted).unwrap(),
            Bytes::from_static(
                br#"{"items":[{"total_count":{"value":1}}],"size":1,"next_cursor":null,"total_count":null}"#
            )
        );
        let plain = Bytes::from_static(br#"{"items":[],"size":0,"next_cursor":null,"total_count":null}"#);
        assert_eq!(uncounted(&plain).unwrap(), plain);
        let spaced =
            Bytes::from_static(b"{\"total_count\" : {\"value\": 10000, \"relation\": \"gte\"} , \"items\":[]}");
        assert_eq!(
            uncounted(&spaced).unwrap(),
            Bytes::from_static(b"{\"total_count\" : null , \"items\":[]}")
        );
        assert_eq!(uncounted(&Bytes::from_static(b"[1]")), None);
    }

    fn search(query: &str) -> Target {
        Target {
            route: route::Route::PermitsSearch,
            path: Arc::from("/v2/permits/search"),
            query: Some(Arc::from(query)),
        }
    }

    fn page(body: &'static str) -> Arc<Entry> {
        let ttl = std::time::Duration::from_secs(60);
        Arc::new(Entry::new(
            Bytes::from_static(body.as_bytes()),
            2,
            ttl,
            route::Route::PermitsSearch,
        ))
    }

    #[tokio::test]
    async fn the_first_candidate_that_fits_answers_in_order_of_preference() {
        let config =
            crate::config::Config::load(crate::config::Source::Text("[upstream]\napi_key = \"k\"\n")).expect("valid");
        let cache = Cache::new(&config.cache, None, Arc::new(crate::metrics::Metrics::new()));
        let asked = search("geo_id=CA&size=5");
        let key = key::cache_key(&asked);
        assert!(cache.covering(&asked, &key).await.is_none(), "nothing held");
        // The same first page, counted: filed under its own key and, being
        // complete, under its size-free counted index too.
        let counted = search("geo_id=CA&size=5&include_count=true");
        let body = r#"{"items":[1,2],"size":2,"next_cursor":null,"total_count":{"value":2,"relation":"eq"}}"#;
        cache.store(&key::cache_key(&counted), page(body)).await;
        let (entry, tier, how) = cache.covering(&asked, &key).await.expect("covered");
        assert_eq!((tier, how), (Tier::Memory, CoveredBy::Counted));
        assert_eq!(
            &entry.body[..],
            br#"{"items":[1,2],"size":2,"next_cursor":null,"total_count":null}"#
        );
        // A complete plain page of another size comes first.
        let larger = search("geo_id=CA&size=10");
        cache
            .store(
                &key::cache_key(&larger),
                page(r#"{"items":[1,2],"size":2,"next_cursor":null}"#),
            )
            .await;
        let (entry, _, how) = cache.covering(&asked, &key).await.expect("covered");
        assert_eq!(how, CoveredBy::Complete);
        assert_eq!(&entry.body[..], br#"{"items":[1,2],"size":2,"next_cursor":null}"#);
    }
}
