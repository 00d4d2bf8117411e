//! `/v2/meta/*`: per-field coverage of an area and the data release date.
//! Both are free (no credits), like upstream.

use crate::dataset::names::COVERAGE_FIELDS;
use crate::dataset::{Dataset, GeoRef, Permit};
use crate::geo;
use crate::query::{error, Query};
use crate::reply::{Answer, Outcome};
use serde_json::{json, Value};

const GEO_TYPES: &[&str] = &["state", "county", "city", "zipcode", "jurisdiction"];
/// A fill rate at or above this is "reliable" and never returned.
const RELIABLE: f64 = 0.8;

fn filled(p: &Permit, d: &Dataset, field: &str) -> bool {
    let pr = &d.addresses[p.address].property;
    match field {
        "contractor_id" => p.contractor.is_some(),
        "description" => !p.description.is_empty(),
        "fees" => p.fees.is_some(),
        "file_date" => p.file_date.is_some(),
        "issue_date" => p.issue_date.is_some(),
        "job_value" => p.job_value.is_some(),
        "owner_name" => !pr.legal_owner.is_empty(),
        "property_building_area" => pr.building_area.is_some(),
        "property_type" => !pr.ptype.is_empty(),
        "property_year_built" => pr.year_built.is_some(),
        _ => false,
    }
}

/// Whether `key` (already normalised) names an area of `geo_type`.
fn kind_fits(d: &Dataset, geo_type: &str, key: &str) -> bool {
    let digits = key.len() == 5 && key.bytes().all(|b| b.is_ascii_digit());
    match geo_type {
        "state" => key.len() == 2,
        "zipcode" => digits,
        _ => key.len() == 11 && !matches!(d.geo.get(key), Some(GeoRef::Address(_))),
    }
}

/// `/v2/meta/coverage`: partial and missing fields of the permits that
/// started in the window, ordered by tier then field.
pub fn coverage(d: &Dataset, q: &mut Query) -> Outcome {
    let geo_type = q.required_enum("geo_type", GEO_TYPES);
    let raw = q.required_str("geo_id");
    let from = q.required_date("date_from");
    let to = q.required_date("date_to");
    let key = raw.as_deref().and_then(geo::area_key);
    if let (Some(raw), Some(t)) = (&raw, &geo_type) {
        if !key.as_deref().is_some_and(|k| kind_fits(d, t, k)) {
            q.push(geo::invalid_geo_id("geo_id", raw));
        }
    }
    if let (Some(f), Some(t)) = (from, to) {
        if t < f {
            let why = "date_to must be on or after date_from";
            let msg = format!("Value error, {why}");
            q.push(error(
                "value_error",
                json!(["query", "date_to"]),
                &msg,
                json!(t.to_string()),
                Some(json!({"error": why})),
            ));
        }
    }
    q.finish()?;
    let (Some(key), Some(from), Some(to)) = (key, from, to) else {
        return Err(Answer::not_found());
    };
    let in_window: Vec<&Permit> = d
        .area(&key)
        .iter()
        .map(|i| &d.permits[*i])
        .filter(|p| p.start_date.is_some_and(|s| s >= from && s <= to))
        .collect();
    let total = in_window.len();
    let mut partial = Vec::new();
    let mut missing = Vec::new();
    for field in COVERAGE_FIELDS {
        let n = in_window.iter().filter(|p| filled(p, d, field)).count();
        let pct = if total == 0 { 0.0 } else { n as f64 / total as f64 };
        let pct = (pct * 1000.0).round() / 1000.0;
        let row = |tier: &str| json!({"field": field, "tier": tier, "fill_pct": pct, "permits_total": total});
        if n == 0 {
            missing.push(row("missing"));
        } else if pct < RELIABLE {
            partial.push(row("partial"));
        }
    }
    partial.extend(missing);
    Ok(Answer::ok(&json!({ "items": partial })))
}

/// `/v2/meta/release`.
/// `released_at`: the current release's date (or a garbled text a test set,
/// `Shared::garble_release`).
pub fn release(released_at: &str) -> Answer {
    let body: Value = json!({"released_at": released_at});
    Answer::ok(&body)
}
