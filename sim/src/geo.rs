//! Geography: the `geo_id` area filter shared by the searches, the county /
//! city / jurisdiction detail calls and the free geo searches.

use crate::dataset::names::US_STATES;
use crate::dataset::{Dataset, GeoRef};
use crate::pagination::{self, Envelope};
use crate::query::{error, Query};
use crate::reply::{Answer, Outcome};
use http::StatusCode;
use serde_json::{json, Map, Value};

/// Server cap of `/v2/jurisdictions/search` (no pagination there).
pub const JURISDICTION_SEARCH_CAP: usize = 15;

fn is_geo_id(s: &str) -> bool {
    s.len() == 11 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The index key for a `geo_id` value: a state code, a five-digit ZIP (ZIP+4
/// cut to five), or an 11-char geo ID. `None` for anything else (free text).
pub fn area_key(raw: &str) -> Option<String> {
    let s = raw.trim();
    // Every accepted form is ASCII; checking first keeps the byte slicing
    // below on character boundaries (a multibyte `geo_id` is a 422, not a panic).
    if !s.is_ascii() {
        return None;
    }
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if s.len() == 2 && s.bytes().all(|b| b.is_ascii_alphabetic()) {
        let code = s.to_ascii_uppercase();
        return US_STATES.iter().any(|(c, _)| *c == code).then_some(code);
    }
    if s.len() == 5 && digits(s) {
        return Some(s.to_string());
    }
    let zip4 = (s.len() == 10 && digits(&s[..5]) && &s[5..6] == "-" && digits(&s[6..])) || (s.len() == 9 && digits(s));
    if zip4 {
        return Some(s[..5].to_string());
    }
    is_geo_id(s).then(|| s.to_string())
}

/// Reads a required `geo_id` area, recording a value error for free text.
pub fn required_area(q: &mut Query, name: &str) -> Option<String> {
    let raw = q.required_str(name)?;
    let key = area_key(&raw);
    if key.is_none() {
        q.push(invalid_geo_id(name, &raw));
    }
    key
}

pub fn invalid_geo_id(name: &str, raw: &str) -> Value {
    let why = format!(
        "Invalid geolocation ID '{raw}'. Accepted: 2-letter US state code, 5-digit ZIP code, \
         ZIP+4, or the geolocation ID of an address, city, county or jurisdiction"
    );
    let msg = format!("Value error, {why}");
    error(
        "value_error",
        json!(["query", name]),
        &msg,
        json!(raw),
        Some(json!({"error": why})),
    )
}

/// Which detail call: `/v2/counties`, `/v2/cities` or `/v2/jurisdictions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    County,
    City,
    Jurisdiction,
}

fn names_to_ids<'a>(pairs: impl Iterator<Item = (&'a String, &'a String)>) -> Value {
    let map: Map<String, Value> = pairs.map(|(n, id)| (n.clone(), json!(id))).collect();
    Value::Object(map)
}

/// A county, city or jurisdiction detail record, as a bare object.
pub fn details(d: &Dataset, level: Level, q: &mut Query) -> Outcome {
    let geo_id = q.required_str("geo_id");
    q.finish()?;
    let geo_id = geo_id.unwrap_or_default();
    let found = d.geo.get(&geo_id).copied();
    let zips = |zs: &[usize]| -> Vec<&str> { zs.iter().map(|z| d.zips[*z].code.as_str()).collect() };
    let body = match (level, found) {
        (Level::County, Some(GeoRef::County(i))) => {
            let c = &d.counties[i];
            json!({"geo_id": c.geo_id, "name": c.name, "state": d.state_code(c.state),
                "cities": names_to_ids(c.cities.iter().map(|x| (&d.cities[*x].name, &d.cities[*x].geo_id))),
                "jurisdictions": names_to_ids(c.jurisdictions.iter().map(|x| (&d.jurisdictions[*x].name, &d.jurisdictions[*x].geo_id))),
                "zipcodes": zips(&c.zips)})
        }
        (Level::City, Some(GeoRef::City(i))) => {
            let c = &d.cities[i];
            let (county, jur) = (&d.counties[c.county], &d.jurisdictions[c.jurisdiction]);
            json!({"geo_id": c.geo_id, "name": c.name, "state": d.state_code(c.state),
                "counties": names_to_ids(std::iter::once((&county.name, &county.geo_id))),
                "jurisdictions": names_to_ids(std::iter::once((&jur.name, &jur.geo_id))),
                "zipcodes": zips(&c.zips)})
        }
        (Level::Jurisdiction, Some(GeoRef::Jurisdiction(i))) => {
            let j = &d.jurisdictions[i];
            let county = &d.counties[j.county];
            let zs: Vec<usize> = j.cities.iter().flat_map(|c| d.cities[*c].zips.clone()).collect();
            json!({"geo_id": j.geo_id, "name": j.name, "state": d.state_code(j.state),
                "cities": names_to_ids(j.cities.iter().map(|x| (&d.cities[*x].name, &d.cities[*x].geo_id))),
                "counties": names_to_ids(std::iter::once((&county.name, &county.geo_id))),
                "zipcodes": zips(&zs)})
        }
        _ => {
            let what = match level {
                Level::County => "counties",
                Level::City => "cities",
                Level::Jurisdiction => "jurisdictions",
            };
            let msg = format!("The given geo_id didn't match any {what}");
            return Err(Answer::detail(StatusCode::NOT_FOUND, &msg));
        }
    };
    Ok(Answer::ok(&body))
}

/// The vendor's 404 for a geo search that matched nothing.
pub fn no_match(what: &str) -> Answer {
    let msg = format!("The specified search query didn't match any {what}");
    Answer::detail(StatusCode::NOT_FOUND, &msg)
}

/// A free page of an ordered list; `none` names what a search found nothing
/// of (its 404), `None` for lists that answer an empty page instead.
pub fn free_page(q: &mut Query, all: Vec<(String, Value)>, none: Option<&str>) -> Outcome {
    let size = q.size();
    let after = q.cursor();
    q.finish()?;
    if let Some(what) = none.filter(|_| all.is_empty()) {
        return Err(no_match(what));
    }
    let (items, next) = pagination::page(all, after.as_deref(), size);
    Ok(Answer::ok(&Envelope::new(items, next, None)))
}

/// `/v2/list/zip`: every ZIP code with data, in code order.
pub fn list_zip(d: &Dataset, q: &mut Query) -> Outcome {
    let mut all: Vec<(String, Value)> = d
        .zips
        .iter()
        .map(|z| (z.code.clone(), json!({"zip_code": z.code})))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    free_page(q, all, None)
}

/// `/v2/zipcodes/search?q=`: ZIPs starting with the given digits.
pub fn zip_search(d: &Dataset, q: &mut Query) -> Outcome {
    let needle = q.required_str("q").unwrap_or_default();
    let prefix: String = needle.chars().take(5).collect();
    let mut all: Vec<(String, Value)> = d
        .zips
        .iter()
        .filter(|z| z.code.starts_with(&prefix))
        .map(|z| {
            (
                z.code.clone(),
                json!({"geo_id": z.code, "state": d.state_code(z.state)}),
            )
        })
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    free_page(q, all, Some("zipcodes"))
}

/// `/v2/states/search?q=`: states whose name contains `q` or whose code is `q`.
pub fn state_search(q: &mut Query) -> Outcome {
    let needle = q.required_str("q").unwrap_or_default().to_lowercase();
    let all: Vec<(String, Value)> = US_STATES
        .iter()
        .filter(|(code, name)| name.to_lowercase().contains(&needle) || code.eq_ignore_ascii_case(&needle))
        .map(|(code, name)| (code.to_string(), json!({"geo_id": code, "name": name})))
        .collect();
    free_page(q, all, Some("states"))
}

/// `/v2/jurisdictions/search?q=`: server-capped at 15, never a next page.
pub fn jurisdiction_search(d: &Dataset, q: &mut Query) -> Outcome {
    let needle = q.required_str("q").unwrap_or_default().to_lowercase();
    q.finish()?;
    let mut hits: Vec<&crate::dataset::Jurisdiction> = d
        .jurisdictions
        .iter()
        .filter(|j| j.name.to_lowercase().contains(&needle))
        .collect();
    if hits.is_empty() {
        return Err(no_match("jurisdictions"));
    }
    hits.sort_by(|a, b| a.name.cmp(&b.name));
    let items: Vec<Value> = hits
        .iter()
        .take(JURISDICTION_SEARCH_CAP)
        .map(|j| json!({"geo_id": j.geo_id, "name": j.name, "state": d.state_code(j.state)}))
        .collect();
    Ok(Answer::ok(&Envelope::new(items, None, None)))
}

#[cfg(test)]
mod tests {
    use super::area_key;

    #[test]
    fn area_keys() {
        assert_eq!(area_key("ca").as_deref(), Some("CA"));
        assert_eq!(area_key("90210-1234").as_deref(), Some("90210"));
        assert_eq!(area_key("a4xysKbZwqg").as_deref(), Some("a4xysKbZwqg"));
        assert_eq!(area_key("123 Main St"), None);
        assert_eq!(area_key("XX"), None);
    }
}
