//! Properties (vendor beta): one record per address, its parcel attributes
//! plus aggregates of the address's permits. `/v2/properties/search` (an area
//! and/or legal owners, permit and parcel filters, most recently permitted
//! first) and `/v2/properties?id=` (address geo IDs; see [`crate::lookup`]).
//! One credit per record. Absence queries (a `-` tag) carry `trust` rows
//! and a `trust_summary`; presence-only ones omit both, as the vendor does.

use crate::dataset::names::{PROPERTY_TYPES, STATUSES};
use crate::dataset::{Address, Dataset, GeoRef, Permit};
use crate::lookup;
use crate::pagination::{self, total_count};
use crate::query::{error, Query};
use crate::reply::{Answer, Outcome};
use chrono::{Datelike, NaiveDate};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// The date a permit counts at for "most recent" and `permit_from`.
fn date_of(p: &Permit) -> NaiveDate {
    p.file_date.unwrap_or(p.earliest)
}

fn permits_at<'a>(d: &'a Dataset, a: &Address) -> impl Iterator<Item = &'a Permit> {
    d.area(&a.geo_id).iter().map(|i| &d.permits[*i])
}

fn last_permit(d: &Dataset, a: &Address) -> Option<NaiveDate> {
    permits_at(d, a).map(date_of).max()
}

/// Latest date per key, as `{key: "YYYY-MM-DD"}`.
fn latest(pairs: impl Iterator<Item = (String, NaiveDate)>) -> Map<String, Value> {
    let mut m: BTreeMap<String, NaiveDate> = BTreeMap::new();
    for (k, dt) in pairs {
        let slot = m.entry(k).or_insert(dt);
        *slot = (*slot).max(dt);
    }
    m.into_iter().map(|(k, v)| (k, json!(v.to_string()))).collect()
}

/// The latest unfinaled date of `tag`: its latest non-final permit, when more
/// recent than its latest final one (equal dates count as finaled).
fn unfinaled(d: &Dataset, a: &Address, tag: &str) -> Option<NaiveDate> {
    let of_tag = || permits_at(d, a).filter(move |p| p.tags.contains(&tag));
    let open = of_tag().filter(|p| p.status != "final").map(date_of).max()?;
    let done = of_tag().filter(|p| p.status == "final").map(date_of).max();
    done.is_none_or(|f| open > f).then_some(open)
}

/// The vendor's `PropertiesRead` for an address.
pub fn record(d: &Dataset, a: &Address, trust: bool) -> Value {
    let ps: Vec<&Permit> = permits_at(d, a).collect();
    let pr = &a.property;
    let tags: BTreeSet<&str> = ps.iter().flat_map(|p| p.tags.iter().copied()).collect();
    let statuses: BTreeSet<&str> = ps.iter().map(|p| p.status).collect();
    let pairs = || {
        ps.iter()
            .flat_map(|p| p.tags.iter().map(move |t| (format!("{t}:{}", p.status), date_of(p))))
    };
    let pair_names: BTreeSet<String> = pairs().map(|(k, _)| k).collect();
    let mut tally: BTreeMap<&str, u64> = BTreeMap::new();
    ps.iter()
        .flat_map(|p| p.tags.iter())
        .for_each(|t| *tally.entry(t).or_default() += 1);
    let contractors: HashSet<usize> = ps.iter().filter_map(|p| p.contractor).collect();
    let unfin: Map<String, Value> = tags
        .iter()
        .filter_map(|t| unfinaled(d, a, t).map(|dt| (t.to_string(), json!(dt.to_string()))))
        .collect();
    let mut v = json!({
        "id": a.geo_id, "street_no": a.street_no, "street": a.street,
        "city": d.cities[a.city].name, "city_id": d.cities[a.city].geo_id,
        "zip_code": d.zips[a.zip].code, "zip_code_ext": a.zip_code_ext(),
        "county": d.counties[a.county].name, "county_id": d.counties[a.county].geo_id,
        "state": d.state_code(a.state), "lat": a.latlng[0], "long": a.latlng[1],
        "permit_count": ps.len(), "untagged_permit_count": ps.iter().filter(|p| p.tags.is_empty()).count(),
        "total_job_value": ps.iter().filter_map(|p| p.job_value).sum::<i64>(),
        "contractor_count": contractors.len(), "tags": tags, "tag_status_pairs": pair_names,
        "statuses": statuses, "tag_tally": tally,
        "last_date_by_tag": latest(ps.iter().flat_map(|p| p.tags.iter().map(|t| (t.to_string(), date_of(p))))),
        "last_unfinaled_date_by_tag": unfin,
        "last_date_by_pair": latest(pairs()),
        "last_date_by_status": latest(ps.iter().map(|p| (p.status.to_string(), date_of(p)))),
        "last_permit_date": ps.iter().map(|p| date_of(p)).max(),
        "apn": format!("{}-{}", pr.census_tract.get(5..).unwrap_or_default(), a.street_no),
        "property_type": pr.ptype, "property_type_detail": pr.detail,
        "year_built": pr.year_built, "lot_size": pr.lot_size, "story_count": pr.story_count,
        "unit_count": pr.unit_count, "building_area": pr.building_area,
        "assess_market_value": pr.market_value, "owner_type": pr.owner_type,
        "legal_owner": pr.legal_owner,
    });
    if trust {
        v["trust"] = json!({
            "unresolved_rate": 0.05, "coverage_tier": "high", "data_horizon": d.released_at.to_string(),
            "horizon_basis": "measured", "trust_jurisdiction_basis": "own",
            "trust_jurisdiction_error_bar": 0.0, "footprint_basis": "matched", "flags": [],
        });
    }
    v
}

/// Canonical owner form: case and spacing variants compare equal.
fn canonical(owner: &str) -> String {
    owner.split_whitespace().collect::<Vec<_>>().join(" ").to_uppercase()
}

fn ranged(q: &mut Query, what: &str) -> (Option<i64>, Option<i64>) {
    let min = q.opt_int(&format!("property_min_{what}"), None, None);
    let max = q.opt_int(&format!("property_max_{what}"), None, None);
    (min, max)
}

fn within(v: Option<i64>, (min, max): (Option<i64>, Option<i64>)) -> bool {
    (min.is_none() && max.is_none()) || v.is_some_and(|v| min.is_none_or(|m| v >= m) && max.is_none_or(|m| v <= m))
}

struct Filters {
    scope: Option<String>,
    owners: Vec<String>,
    tags_in: Vec<String>,
    tags_out: Vec<String>,
    statuses: Vec<String>,
    from: Option<NaiveDate>,
    types: Vec<String>,
    unfinaled: Vec<String>,
    ranges: [(Option<i64>, Option<i64>); 5],
}

fn value_error(q: &mut Query, name: &str, input: &str, why: &str) {
    let msg = format!("Value error, {why}");
    q.push(error(
        "value_error",
        json!(["query", name]),
        &msg,
        json!(input),
        Some(json!({"error": why})),
    ));
}

impl Filters {
    fn parse(d: &Dataset, q: &mut Query) -> Filters {
        let scope = q.opt_str("geo_id", None, None).and_then(|raw| {
            let key = crate::geo::area_key(&raw).filter(|k| !matches!(d.geo.get(k), Some(GeoRef::Jurisdiction(_))));
            if key.is_none() {
                q.push(crate::geo::invalid_geo_id("geo_id", &raw));
            }
            key
        });
        let owners: Vec<String> = q
            .list("legal_owner", None, Some(10))
            .iter()
            .map(|o| canonical(o))
            .collect();
        let tags = q.list("permit_tags", None, None);
        let (out, inn): (Vec<String>, Vec<String>) = tags.into_iter().partition(|t| t.starts_with('-'));
        let statuses = q.list("permit_status", Some(STATUSES), None);
        let from = q.has("permit_from").then(|| q.required_date("permit_from")).flatten();
        if let Some(to) = q.opt_str("permit_to", None, None) {
            value_error(
                q,
                "permit_to",
                &to,
                "permit_to is not supported on /properties/search; use /permits/search for a date window",
            );
        }
        let types = q.list("property_type", Some(PROPERTY_TYPES), None);
        let unfinaled = q.list("permit_tags_unfinaled", None, None);
        let ranges = [
            ranged(q, "market_value"),
            ranged(q, "lot_size"),
            ranged(q, "building_area"),
            ranged(q, "unit_count"),
            ranged(q, "year_built"),
        ];
        if !q.has("geo_id") && owners.is_empty() {
            value_error(q, "geo_id", "", "At least one of geo_id and legal_owner is required");
        }
        let tags_out = out.into_iter().map(|t| t[1..].to_string()).collect();
        Filters {
            scope,
            owners,
            tags_in: inn,
            tags_out,
            statuses,
            from,
            types,
            unfinaled,
            ranges,
        }
    }

    fn in_scope(&self, d: &Dataset, i: usize, a: &Address) -> bool {
        let Some(key) = self.scope.as_deref() else { return true };
        match d.geo.get(key) {
            Some(GeoRef::Address(x)) => *x == i,
            Some(GeoRef::City(x)) => *x == a.city,
            Some(GeoRef::County(x)) => *x == a.county,
            Some(_) => false,
            None => d.state_code(a.state) == key || d.zips[a.zip].code == key,
        }
    }

    fn permits_ok(&self, d: &Dataset, a: &Address) -> bool {
        let since = |p: &Permit| self.from.is_none_or(|f| date_of(p) >= f);
        let status_ok = |p: &Permit| self.statuses.is_empty() || self.statuses.iter().any(|s| s == p.status);
        let has = |t: &str| permits_at(d, a).any(|p| p.tags.contains(&t) && status_ok(p) && since(p));
        let positive = !self.tags_in.is_empty() || !self.statuses.is_empty();
        // An exclusion is "none since the date" alone, "never" beside a positive filter.
        let excluded =
            |t: &str| permits_at(d, a).any(|p| p.tags.contains(&t) && (positive || self.from.is_none() || since(p)));
        let tags_ok = self.tags_in.iter().all(|t| has(t)) && !self.tags_out.iter().any(|t| excluded(t));
        let status_alone = self.tags_in.is_empty() && !self.statuses.is_empty();
        let statuses_ok = !status_alone || permits_at(d, a).any(|p| status_ok(p) && since(p));
        let recent_ok = positive
            || !self.tags_out.is_empty()
            || self.from.is_none_or(|f| last_permit(d, a).is_some_and(|l| l >= f));
        let unfin_ok = self
            .unfinaled
            .iter()
            .all(|t| unfinaled(d, a, t).is_some_and(|u| self.from.is_none_or(|f| u >= f)));
        tags_ok && statuses_ok && recent_ok && unfin_ok
    }

    fn matches(&self, d: &Dataset, i: usize, a: &Address) -> bool {
        let pr = &a.property;
        let values = [
            pr.market_value,
            pr.lot_size,
            pr.building_area,
            pr.unit_count,
            pr.year_built,
        ];
        self.in_scope(d, i, a)
            && (self.owners.is_empty() || self.owners.contains(&canonical(&pr.legal_owner)))
            && (self.types.is_empty() || self.types.iter().any(|t| t == pr.ptype))
            && values.iter().zip(&self.ranges).all(|(v, r)| within(*v, *r))
            && self.permits_ok(d, a)
    }
}

/// Most recently permitted first (never-permitted last), then geo ID.
fn order_key(d: &Dataset, a: &Address) -> String {
    let rank = last_permit(d, a).map_or(99_999_999, |l| {
        99_999_999 - (l.year() * 10_000 + l.month() as i32 * 100 + l.day() as i32)
    });
    format!("{rank:08}|{}", a.geo_id)
}

/// `/v2/properties/search`.
pub fn search(d: &Dataset, q: &mut Query) -> Outcome {
    let f = Filters::parse(d, q);
    let after = q.cursor();
    let size = q.size();
    let want_count = q.opt_bool("include_total_count").unwrap_or(false) && !q.has("cursor");
    q.finish()?;
    let mut all: Vec<(String, usize)> = d
        .addresses
        .iter()
        .enumerate()
        .filter(|(i, a)| f.matches(d, *i, a))
        .map(|(i, a)| (order_key(d, a), i))
        .collect();
    all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let total = want_count.then(|| total_count(all.len()));
    let (page, next) = pagination::page(all, after.as_deref(), size);
    let absence = !f.tags_out.is_empty();
    let items: Vec<Value> = page.into_iter().map(|i| record(d, &d.addresses[i], absence)).collect();
    let n = items.len();
    let mut body = json!({"items": items, "size": n, "next_cursor": next, "total_count": total});
    if absence {
        body["trust_summary"] = json!({"rows_flagged": 0, "row_weighted_unresolved_rate": 0.05,
            "expected_miss_rate": 0.0, "suppressed_scopes": 0});
    }
    Ok(Answer::metered(&body, n))
}

/// `/v2/properties?id=`: address geo IDs; a city, county or jurisdiction ID
/// is a 422, an unknown ID is omitted.
pub fn by_id(d: &Dataset, q: &mut Query) -> Outcome {
    let ids = lookup::ids(q);
    for (i, id) in ids.iter().enumerate() {
        if matches!(d.geo.get(id), Some(r) if !matches!(r, GeoRef::Address(_))) {
            let why = format!("'{id}' is not an address geolocation ID");
            let msg = format!("Value error, {why}");
            q.push(error(
                "value_error",
                json!(["query", "id", i]),
                &msg,
                json!(id),
                Some(json!({"error": why})),
            ));
        }
    }
    q.finish()?;
    let items: Vec<Value> = ids
        .iter()
        .filter_map(|id| match d.geo.get(id) {
            Some(GeoRef::Address(i)) => Some(record(d, &d.addresses[*i], false)),
            _ => None,
        })
        .collect();
    Ok(lookup::answer(items))
}
