//! The free name searches that resolve text to geo IDs (`/v2/addresses/search`,
//! `/v2/cities/search`, `/v2/counties/search`) and the tag list
//! (`/v2/list/tags`). The three searches are server-capped like the vendor's
//! (20 addresses, 15 others), never page, ignore `size`/`cursor`, and answer
//! 404 when nothing matches.

use crate::dataset::names::TAGS;
use crate::dataset::Dataset;
use crate::geo::{free_page, no_match};
use crate::pagination::Envelope;
use crate::query::Query;
use crate::reply::{Answer, Outcome};
use serde_json::{json, Value};

/// Server caps of the name searches (vendor CLI `internal/contract`).
pub const ADDRESS_SEARCH_CAP: usize = 20;
pub const PLACE_SEARCH_CAP: usize = 15;

/// Every whitespace-separated word of the query appears in the text
/// (case-insensitive): the prefix/full-text feel of the vendor's search.
fn all_words(text: &str, q: &str) -> bool {
    let text = text.to_lowercase();
    q.split_whitespace().all(|w| text.contains(&w.to_lowercase()))
}

/// Reads the required `q`; the searches take nothing else.
fn needle(q: &mut Query) -> Result<String, Answer> {
    let needle = q.required_str("q");
    q.finish()?;
    Ok(needle.unwrap_or_default())
}

/// Sorts the `(name, item)` hits, caps them and answers a single page.
fn capped(mut hits: Vec<(String, Value)>, cap: usize, what: &str) -> Outcome {
    if hits.is_empty() {
        return Err(no_match(what));
    }
    hits.sort_by(|a, b| a.0.cmp(&b.0));
    let items: Vec<Value> = hits.into_iter().take(cap).map(|(_, v)| v).collect();
    Ok(Answer::ok(&Envelope::new(items, None, None)))
}

/// `/v2/addresses/search?q=`: addresses in USPS-like notation.
pub fn addresses(d: &Dataset, q: &mut Query) -> Outcome {
    let needle = needle(q)?;
    let hits = d
        .addresses
        .iter()
        .filter_map(|a| {
            let (city, zip, st) = (&d.cities[a.city].name, &d.zips[a.zip].code, d.state_code(a.state));
            let name = format!("{} {}, {city}, {st}", a.street_no, a.street);
            all_words(&format!("{name} {zip}"), &needle).then(|| {
                let item = json!({
                    "street_no": a.street_no, "street": a.street, "city": city,
                    "county": d.counties[a.county].name, "zip_code": zip,
                    "zip_code_ext": a.zip_code_ext(), "state": st,
                    "jurisdiction": d.jurisdictions[a.jurisdiction].name,
                    "lat": a.latlng[0], "long": a.latlng[1], "geo_id": a.geo_id, "name": name,
                });
                (name, item)
            })
        })
        .collect();
    capped(hits, ADDRESS_SEARCH_CAP, "addresses")
}

/// `/v2/cities/search?q=`: "CITY, COUNTY, ST" names.
pub fn cities(d: &Dataset, q: &mut Query) -> Outcome {
    let needle = needle(q)?;
    let hits = d
        .cities
        .iter()
        .filter(|c| all_words(&c.name, &needle))
        .map(|c| {
            let st = d.state_code(c.state);
            let name = format!("{}, {}, {st}", c.name, d.counties[c.county].name);
            let item = json!({"geo_id": c.geo_id, "name": name, "state": st});
            (name, item)
        })
        .collect();
    capped(hits, PLACE_SEARCH_CAP, "cities")
}

/// `/v2/counties/search?q=`: "NAME County, ST" names.
pub fn counties(d: &Dataset, q: &mut Query) -> Outcome {
    let needle = needle(q)?;
    let hits = d
        .counties
        .iter()
        .filter(|c| all_words(&c.name, &needle))
        .map(|c| {
            let st = d.state_code(c.state);
            let name = format!("{}, {st}", c.name);
            let item = json!({"geo_id": c.geo_id, "name": name, "state": st});
            (name, item)
        })
        .collect();
    capped(hits, PLACE_SEARCH_CAP, "counties")
}

/// A tag's human description: `heat_pump` → "Heat Pump".
fn describe(tag: &str) -> String {
    tag.split('_')
        .map(|w| {
            let mut cs = w.chars();
            cs.next()
                .map(|c| c.to_uppercase().chain(cs).collect::<String>())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `/v2/list/tags`: every permit tag, in ID order, paged (free).
pub fn tags(q: &mut Query) -> Outcome {
    let mut all: Vec<(String, Value)> = TAGS
        .iter()
        .map(|(id, _)| (id.to_string(), json!({"id": id, "description": describe(id)})))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    free_page(q, all, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_descriptions_read_as_words() {
        assert_eq!(describe("heat_pump"), "Heat Pump");
        assert_eq!(describe("solar"), "Solar");
    }

    #[test]
    fn every_word_must_match() {
        assert!(all_words("12 Main St, Oakville, CA 90001", "main oak"));
        assert!(!all_words("12 Main St, Oakville, CA", "main elm"));
    }
}
