//! Id lookups as a [`Kind`]: `permits_by_id`, `contractors_by_id`,
//! `decisions_by_id`, `properties_by_id` answered record by record from
//! the record tier (`cache::records`), the missing ids bought in one call
//! of the lookup route (`id=a&id=b`), each id once however lookups overlap
//! ([`Buying::PerPiece`]). The answer is assembled as the upstream
//! assembles it (`docs/vendor-api.md`, "Id lookups"): request order, each
//! id once, unknown ids omitted.

use super::kind::{Buying, Kind, Read};
use crate::cache::records::{query_of, record_id, IdList, Resource};
use crate::cache::{Cache, Entry};
use crate::metrics::SavedReason;
use crate::page::{item_of, Page};
use crate::route::{Route, Target};
use bytes::Bytes;
use http::StatusCode;

impl Kind for IdList {
    fn route(&self) -> Route {
        self.resource.lookup_route()
    }

    fn keys(&self) -> &[String] {
        &self.keys
    }

    fn holds(&self, _: usize) -> bool {
        true
    }

    fn reason(&self) -> SavedReason {
        SavedReason::Cache
    }

    fn answers(&self, _: usize) -> bool {
        true
    }

    fn omits_unknown(&self) -> bool {
        true
    }

    fn buying(&self) -> Buying {
        Buying::PerPiece
    }

    fn call(&self, wanted: &[usize], _: u64) -> Option<Target> {
        Some(Target {
            route: self.resource.lookup_route(),
            path: self.path.clone(),
            query: Some(query_of(wanted.iter().map(|i| &self.ids[*i])).into()),
        })
    }

    fn read(&self, wanted: &[usize], body: &Bytes, page: &Page<'_>) -> Option<Read> {
        let mut pieces = vec![None; wanted.len()];
        let mut foreign = 0;
        for raw in &page.items {
            let (id, trust) = record_id(raw)?;
            // An absence search's property carries a `trust` block no lookup sends.
            if self.resource == Resource::Properties && trust {
                continue;
            }
            match wanted.iter().position(|i| self.ids[*i] == id) {
                Some(at) => pieces[at] = Some(item_of(body, raw)),
                None => foreign += 1,
            }
        }
        Some(Read { pieces, foreign })
    }

    fn entry(&self, cache: &Cache, _: usize, body: Bytes) -> Entry {
        let route = self.resource.lookup_route();
        let ttl = cache.ttl(route).unwrap_or_default();
        let answered = Entry::new(Bytes::new(), 0, ttl, route);
        cache.record_entry(self.resource, &answered, Bytes::copy_from_slice(&body))
    }

    fn none_found(&self, _: StatusCode) -> bool {
        false
    }

    fn ids(&self) -> Option<&IdList> {
        Some(self)
    }
}
