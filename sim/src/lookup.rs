//! The id lookups (`/v2/permits?id=`, `/v2/contractors?id=`, and the shared
//! id parsing `/v2/decisions?id=` and `/v2/properties?id=` use).
//!
//! What the vendor accepts, and so what the simulator does (see
//! `docs/vendor-api.md`, "Id lookups"):
//! - ids are a FastAPI `list[str]` query parameter: **repeated `id=`** keys.
//!   A comma list is *not* split (`id=a,b` is one id, `"a,b"`, which matches
//!   nothing and is omitted);
//! - at most 50 `id`s (more: a Pydantic `too_long` 422); none: `missing` 422;
//! - records come back **in request order** (documented for properties;
//!   the simulator does the same for every lookup), each id once (a repeated
//!   id is answered once, at its first position), unknown ids omitted with no
//!   per-id 404;
//! - one credit per record returned; no records, no charge.
//!
//! Each record is the very object the searches return for it.

use crate::dataset::Dataset;
use crate::pagination::Envelope;
use crate::query::Query;
use crate::records::{ContractorOut, PermitOut, Tallies};
use crate::reply::{Answer, Outcome};
use serde::Serialize;

/// Upper bound on `id`s per lookup (the vendor's `maxItems`).
pub const MAX_IDS: usize = 50;

/// The requested ids, in request order, first occurrence only; records the
/// `missing`/`too_long` errors on `q`.
pub fn ids(q: &mut Query) -> Vec<String> {
    if !q.has("id") {
        q.required_str("id");
        return Vec::new();
    }
    let mut seen = std::collections::HashSet::new();
    q.list("id", None, Some(MAX_IDS))
        .into_iter()
        .filter(|id| seen.insert(id.clone()))
        .collect()
}

/// One page holding every found record: lookups never page (≤ 50 ids).
pub fn answer<T: Serialize>(items: Vec<T>) -> Answer {
    let n = items.len();
    Answer::metered(&Envelope::new(items, None, None), n)
}

/// `/v2/permits?id=`.
pub fn permits(d: &Dataset, q: &mut Query) -> Outcome {
    let ids = ids(q);
    q.finish()?;
    let items: Vec<PermitOut> = ids
        .iter()
        .filter_map(|id| d.permits.binary_search_by(|p| p.id.as_str().cmp(id)).ok())
        .map(|i| PermitOut::new(d, &d.permits[i]))
        .collect();
    Ok(answer(items))
}

/// `/v2/contractors?id=`: the search's record with its lifetime tallies
/// (a lookup has no search filters to scope them to).
pub fn contractors(d: &Dataset, q: &mut Query) -> Outcome {
    let ids = ids(q);
    // Declared by the vendor; with at most 50 ids there is never a next page,
    // but a malformed cursor is still a 422.
    q.cursor();
    q.finish()?;
    let items: Vec<ContractorOut> = ids
        .iter()
        .filter_map(|id| d.contractor_by_id.get(id).map(|c| &d.contractors[*c]))
        .map(|c| {
            let mut t = Tallies::default();
            c.permits.iter().for_each(|i| t.add(&d.permits[*i]));
            ContractorOut::new(d, c, t)
        })
        .collect();
    Ok(answer(items))
}
