//! The vendor operations the conformance tests request: one concrete call
//! per GET path of the vendor OpenAPI, with its credit class, built from the
//! simulator's samples; and the fixtures those calls need.

use crate::support::client::Client;
use crate::support::query::Query;
use crate::support::sim::{Samples, Sim};
use serde_json::Value;

/// One vendor operation: its OpenAPI path, a concrete request, and whether
/// the vendor bills it per record (`docs/vendor-api.md`, "Credits").
pub struct Op {
    pub spec_path: &'static str,
    pub query: Query,
    pub metered: bool,
}

fn op(spec_path: &'static str, query: Query, metered: bool) -> Op {
    Op {
        spec_path,
        query,
        metered,
    }
}

/// Every operation, built from the simulator's samples and one permit record
/// (whose address names drive the place searches).
pub fn operations(s: &Samples, permit: &Value, ids: &[&str]) -> Vec<Op> {
    let (from, to) = (&s.permit_from, &s.permit_to);
    let a = &permit["address"];
    let text = |f: &str| a[f].as_str().unwrap_or_default().replace(' ', "%20");
    let c = &s.contractor_id;
    // Every tag and property type, as the vendor's own examples ask.
    let all = |q: Query| q.property_type("all").tag("all");
    vec![
        op("/permits/search", Query::state_permits(s).size(5), true),
        op("/permits", Query::permits_by_id(ids), true),
        op("/contractors/search", Query::state_contractors(s).size(5), true),
        op("/contractors", Query::by_id("contractors", &[c]), true),
        op(
            "/contractors/{id}/permits",
            Query::contractor(c, "permits").size(5),
            true,
        ),
        op("/contractors/{id}/employees", Query::contractor(c, "employees"), true),
        op(
            "/contractors/{id}/metrics",
            all(Query::contractor(c, "metrics").months(from, to)),
            false,
        ),
        op(
            "/decisions/search",
            Query::decision_search(&s.state, from, to).size(5),
            true,
        ),
        op("/decisions", Query::by_id("decisions", &[&s.decision_id]), true),
        op("/properties/search", Query::property_search(&s.zip).size(5), true),
        op("/properties", Query::by_id("properties", &[&s.address_geo_id]), true),
        op(
            "/addresses/{geo_id}/metrics/monthly",
            Query::metrics("addresses", &s.address_geo_id, "monthly")
                .months(from, to)
                .tag("all"),
            true,
        ),
        op(
            "/addresses/{geo_id}/metrics/current",
            Query::metrics("addresses", &s.address_geo_id, "current").tag("all"),
            true,
        ),
        op(
            "/counties/{geo_id}/metrics/monthly",
            all(Query::metrics("counties", &s.county_geo_id, "monthly").months(from, to)),
            true,
        ),
        op(
            "/counties/{geo_id}/metrics/current",
            all(Query::metrics("counties", &s.county_geo_id, "current")),
            true,
        ),
        op(
            "/cities/{geo_id}/metrics/monthly",
            all(Query::metrics("cities", &s.city_geo_id, "monthly").months(from, to)),
            true,
        ),
        op(
            "/cities/{geo_id}/metrics/current",
            all(Query::metrics("cities", &s.city_geo_id, "current")),
            true,
        ),
        op(
            "/jurisdictions/{geo_id}/metrics/monthly",
            all(Query::metrics("jurisdictions", &s.jurisdiction_geo_id, "monthly").months(from, to)),
            true,
        ),
        op(
            "/jurisdictions/{geo_id}/metrics/current",
            all(Query::metrics("jurisdictions", &s.jurisdiction_geo_id, "current")),
            true,
        ),
        op(
            "/addresses/{geo_id}/residents",
            Query::residents(&s.resident_address_geo_id),
            true,
        ),
        op("/counties", Query::place("counties", &s.county_geo_id), false),
        op("/cities", Query::place("cities", &s.city_geo_id), false),
        op(
            "/jurisdictions",
            Query::place("jurisdictions", &s.jurisdiction_geo_id),
            false,
        ),
        op(
            "/addresses/search",
            Query::text_search("addresses", format!("{}%20{}", text("street_no"), text("street"))),
            false,
        ),
        op("/cities/search", Query::text_search("cities", text("city")), false),
        op(
            "/counties/search",
            Query::text_search("counties", text("county")),
            false,
        ),
        op(
            "/jurisdictions/search",
            Query::text_search("jurisdictions", "city"),
            false,
        ),
        op("/zipcodes/search", Query::text_search("zipcodes", &s.zip[..3]), false),
        op("/states/search", Query::text_search("states", "calif"), false),
        op("/list/zip", Query::list("zip"), false),
        op("/list/tags", Query::list("tags").size(100), false),
        op(
            "/meta/coverage",
            Query::coverage("state", &s.state).dates(from, to),
            false,
        ),
        op("/meta/release", Query::meta_release(), false),
        op("/usage", Query::usage(), false),
    ]
}

/// The simulator's samples, one permit record of the small state and three
/// permit ids, read straight from the simulator (no team pays for them).
pub async fn fixtures(sim: &Sim) -> (Samples, Value, Vec<String>) {
    let s = sim.samples();
    let r = Client::upstream(sim)
        .get(Query::state_permits(&s).size(3))
        .request_id("fixture")
        .await;
    let permits = r.json()["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(permits.len(), 3, "{}", r.text());
    let ids = permits
        .iter()
        .filter_map(|p| p["id"].as_str().map(str::to_owned))
        .collect();
    (s, permits[0].clone(), ids)
}
