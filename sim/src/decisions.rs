//! Zoning and land-use decisions: `/v2/decisions/search` (date window and
//! area required, filters ANDed, newest first) and `/v2/decisions?id=`
//! (see [`crate::lookup`] for the id rules). One credit per record.

use crate::dataset::decisions::Decision;
use crate::dataset::{Dataset, GeoRef};
use crate::geo;
use crate::lookup;
use crate::pagination::{self, total_count, Envelope, COUNT_CAP};
use crate::query::{error, Query};
use crate::reply::Outcome;
use chrono::{Datelike, NaiveDate};
use serde::Serialize;

/// The vendor's `DecisionsRead`, in its field order.
#[derive(Serialize)]
pub struct DecisionOut<'a> {
    address_id: &'a str,
    city_id: &'a str,
    county_id: &'a str,
    jurisdiction_id: &'a str,
    street: String,
    city: &'a str,
    state: &'a str,
    latitude: f64,
    longitude: f64,
    id: &'a str,
    title: &'a str,
    decision_date: NaiveDate,
    description: &'a str,
    source_url: String,
    asset_class: &'a str,
    category: &'a str,
    subcategory: &'a str,
    property_type: &'a str,
    why_it_matters: String,
    applicant_name: &'a str,
    owner_name: &'a str,
    representative_name: Option<&'a str>,
    developer_name: Option<&'a str>,
    zoning_previous: &'a str,
    zoning_new: &'a str,
    allowed_uses: &'a str,
    project_value: Option<i64>,
    lot_size: Option<i64>,
}

impl<'a> DecisionOut<'a> {
    pub fn new(d: &'a Dataset, x: &'a Decision) -> Self {
        let a = &d.addresses[x.address];
        DecisionOut {
            address_id: &a.geo_id,
            city_id: &d.cities[a.city].geo_id,
            county_id: &d.counties[a.county].geo_id,
            jurisdiction_id: &d.jurisdictions[a.jurisdiction].geo_id,
            street: format!("{} {}", a.street_no, a.street),
            city: &d.cities[a.city].name,
            state: d.state_code(a.state),
            latitude: a.latlng[0],
            longitude: a.latlng[1],
            id: &x.id,
            title: &x.title,
            decision_date: x.date,
            description: &x.description,
            source_url: format!("https://records.example.gov/decisions/{}", x.id),
            asset_class: x.asset_class,
            category: x.category,
            subcategory: x.subcategory,
            property_type: a.property.ptype,
            why_it_matters: format!("{} changes what can be built at this parcel", x.category),
            applicant_name: &x.applicant,
            owner_name: &x.owner,
            representative_name: None,
            developer_name: Some(&x.applicant),
            zoning_previous: x.zoning_previous,
            zoning_new: x.zoning_new,
            allowed_uses: x.allowed_uses,
            project_value: x.project_value,
            lot_size: x.lot_size,
        }
    }
}

struct Filters {
    from: NaiveDate,
    to: NaiveDate,
    area: String,
    asset_class: Vec<String>,
    category: Vec<String>,
    subcategory: Vec<String>,
    property_type: Vec<String>,
    min_value: Option<i64>,
    max_value: Option<i64>,
    /// Lower-cased words, every one required (plainto_tsquery's AND).
    words: Vec<String>,
}

/// The area key for a decisions `geo_id`: a state or a geo ID; ZIPs are
/// rejected (the vendor's rezone source has no ZIP information).
fn area(q: &mut Query) -> String {
    let Some(raw) = q.required_str("geo_id") else {
        return String::new();
    };
    match geo::area_key(&raw) {
        Some(k) if !k.bytes().all(|b| b.is_ascii_digit()) => k,
        Some(_) => {
            let why = "ZIP and ZIP+4 inputs are not supported: decisions carry no ZIP information";
            let msg = format!("Value error, {why}");
            let ctx = Some(serde_json::json!({ "error": why }));
            q.push(error(
                "value_error",
                serde_json::json!(["query", "geo_id"]),
                &msg,
                serde_json::json!(raw),
                ctx,
            ));
            String::new()
        }
        None => {
            q.push(geo::invalid_geo_id("geo_id", &raw));
            String::new()
        }
    }
}

impl Filters {
    fn parse(q: &mut Query) -> Filters {
        let from = q.required_date("decision_from");
        let to = q.required_date("decision_to");
        Filters {
            from: from.unwrap_or(NaiveDate::MIN),
            to: to.unwrap_or(NaiveDate::MAX),
            area: area(q),
            asset_class: q.list("asset_class", None, None),
            category: q.list("category", None, None),
            subcategory: q.list("subcategory", None, None),
            property_type: q.list("property_type", None, None),
            min_value: q.opt_int("min_project_value", Some(0), None),
            max_value: q.opt_int("max_project_value", Some(0), None),
            words: q
                .opt_str("decision_q", None, Some(100))
                .map(|s| s.split_whitespace().map(str::to_lowercase).collect())
                .unwrap_or_default(),
        }
    }

    fn matches(&self, d: &Dataset, x: &Decision) -> bool {
        let any = |list: &[String], v: &str| list.is_empty() || list.iter().any(|l| l.eq_ignore_ascii_case(v));
        let a = &d.addresses[x.address];
        let text = format!("{} {}", x.title, x.description).to_lowercase();
        x.date >= self.from
            && x.date <= self.to
            && in_area(d, x, &self.area)
            && any(&self.asset_class, x.asset_class)
            && any(&self.category, x.category)
            && any(&self.subcategory, x.subcategory)
            && any(&self.property_type, a.property.ptype)
            && self.min_value.is_none_or(|m| x.project_value.is_some_and(|v| v >= m))
            && self.max_value.is_none_or(|m| x.project_value.is_some_and(|v| v <= m))
            && self.words.iter().all(|w| text.contains(w.as_str()))
    }
}

fn in_area(d: &Dataset, x: &Decision, key: &str) -> bool {
    let a = &d.addresses[x.address];
    match d.geo.get(key) {
        Some(GeoRef::Address(i)) => *i == x.address,
        Some(GeoRef::City(i)) => *i == a.city,
        Some(GeoRef::County(i)) => *i == a.county,
        Some(GeoRef::Jurisdiction(i)) => *i == a.jurisdiction,
        None => d.state_code(a.state) == key,
    }
}

/// Newest decision first, then ID.
fn order_key(x: &Decision) -> String {
    let ymd = x.date.year() * 10_000 + x.date.month() as i32 * 100 + x.date.day() as i32;
    format!("{:08}|{}", 99_999_999 - ymd, x.id)
}

/// `/v2/decisions/search`.
pub fn search(d: &Dataset, q: &mut Query) -> Outcome {
    let after = q.cursor();
    let size = q.size();
    let want_count = q.opt_bool("include_count").unwrap_or(false) && !q.has("cursor");
    let f = Filters::parse(q);
    q.finish()?;
    let mut all: Vec<(String, &Decision)> = d
        .decisions
        .iter()
        .filter(|x| f.matches(d, x))
        .map(|x| (order_key(x), x))
        .collect();
    all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let total = want_count.then(|| total_count(all.len().min(COUNT_CAP + 1)));
    let (page, next) = pagination::page(all, after.as_deref(), size);
    let items: Vec<DecisionOut> = page.into_iter().map(|x| DecisionOut::new(d, x)).collect();
    let n = items.len();
    Ok(crate::reply::Answer::metered(&Envelope::new(items, next, total), n))
}

/// `/v2/decisions?id=`.
pub fn by_id(d: &Dataset, q: &mut Query) -> Outcome {
    let ids = lookup::ids(q);
    q.finish()?;
    let items: Vec<DecisionOut> = ids
        .iter()
        .filter_map(|id| d.decisions.binary_search_by(|x| x.id.as_str().cmp(id)).ok())
        .map(|i| DecisionOut::new(d, &d.decisions[i]))
        .collect();
    Ok(lookup::answer(items))
}
