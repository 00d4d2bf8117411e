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
    pub url: String,
    pub metered: bool,
}

fn op(spec_path: &'static str, url: String, metered: bool) -> Op {
    Op {
        spec_path,
        url,
        metered,
    }
}

/// Every operation, built from the simulator's samples and one permit record
/// (whose address names drive the place searches).
pub fn operations(s: &Samples, permit: &Value, ids: &[&str]) -> Vec<Op> {
    let (from, to) = (&s.permit_from, &s.permit_to);
    let window = format!("metric_from={from}&metric_to={to}");
    let a = &permit["address"];
    let text = |f: &str| a[f].as_str().unwrap_or_default().replace(' ', "%20");
    let c = &s.contractor_id;
    let area = |kind: &str, id: &str, what: &str| format!("/v2/{kind}/{id}/metrics/{what}");
    let all = "property_type=all&tag=all";
    vec![
        op("/permits/search", Query::state_permits(s).size(5).to_string(), true),
        op("/permits", Query::permits_by_id(ids).to_string(), true),
        op(
            "/contractors/search",
            Query::state_contractors(s).size(5).to_string(),
            true,
        ),
        op("/contractors", Query::by_id("contractors", &[c]).to_string(), true),
        op(
            "/contractors/{id}/permits",
            format!("/v2/contractors/{c}/permits?size=5"),
            true,
        ),
        op(
            "/contractors/{id}/employees",
            format!("/v2/contractors/{c}/employees"),
            true,
        ),
        op(
            "/contractors/{id}/metrics",
            format!("/v2/contractors/{c}/metrics?{window}&{all}"),
            false,
        ),
        op(
            "/decisions/search",
            format!(
                "/v2/decisions/search?geo_id={}&decision_from={from}&decision_to={to}&size=5",
                s.state
            ),
            true,
        ),
        op(
            "/decisions",
            Query::by_id("decisions", &[&s.decision_id]).to_string(),
            true,
        ),
        op(
            "/properties/search",
            format!("/v2/properties/search?geo_id={}&size=5", s.zip),
            true,
        ),
        op(
            "/properties",
            Query::by_id("properties", &[&s.address_geo_id]).to_string(),
            true,
        ),
        op(
            "/addresses/{geo_id}/metrics/monthly",
            format!("{}?{window}&tag=all", area("addresses", &s.address_geo_id, "monthly")),
            true,
        ),
        op(
            "/addresses/{geo_id}/metrics/current",
            format!("{}?tag=all", area("addresses", &s.address_geo_id, "current")),
            true,
        ),
        op(
            "/counties/{geo_id}/metrics/monthly",
            format!("{}?{window}&{all}", area("counties", &s.county_geo_id, "monthly")),
            true,
        ),
        op(
            "/counties/{geo_id}/metrics/current",
            format!("{}?{all}", area("counties", &s.county_geo_id, "current")),
            true,
        ),
        op(
            "/cities/{geo_id}/metrics/monthly",
            format!("{}?{window}&{all}", area("cities", &s.city_geo_id, "monthly")),
            true,
        ),
        op(
            "/cities/{geo_id}/metrics/current",
            format!("{}?{all}", area("cities", &s.city_geo_id, "current")),
            true,
        ),
        op(
            "/jurisdictions/{geo_id}/metrics/monthly",
            format!(
                "{}?{window}&{all}",
                area("jurisdictions", &s.jurisdiction_geo_id, "monthly")
            ),
            true,
        ),
        op(
            "/jurisdictions/{geo_id}/metrics/current",
            format!("{}?{all}", area("jurisdictions", &s.jurisdiction_geo_id, "current")),
            true,
        ),
        op(
            "/addresses/{geo_id}/residents",
            format!("/v2/addresses/{}/residents", s.resident_address_geo_id),
            true,
        ),
        op("/counties", format!("/v2/counties?geo_id={}", s.county_geo_id), false),
        op("/cities", format!("/v2/cities?geo_id={}", s.city_geo_id), false),
        op(
            "/jurisdictions",
            format!("/v2/jurisdictions?geo_id={}", s.jurisdiction_geo_id),
            false,
        ),
        op(
            "/addresses/search",
            format!("/v2/addresses/search?q={}%20{}", text("street_no"), text("street")),
            false,
        ),
        op("/cities/search", format!("/v2/cities/search?q={}", text("city")), false),
        op(
            "/counties/search",
            format!("/v2/counties/search?q={}", text("county")),
            false,
        ),
        op("/jurisdictions/search", "/v2/jurisdictions/search?q=city".into(), false),
        op(
            "/zipcodes/search",
            format!("/v2/zipcodes/search?q={}", &s.zip[..3]),
            false,
        ),
        op("/states/search", "/v2/states/search?q=calif".into(), false),
        op("/list/zip", "/v2/list/zip".into(), false),
        op("/list/tags", "/v2/list/tags?size=100".into(), false),
        op(
            "/meta/coverage",
            format!(
                "/v2/meta/coverage?geo_type=state&geo_id={}&date_from={from}&date_to={to}",
                s.state
            ),
            false,
        ),
        op("/meta/release", Query::meta_release().to_string(), false),
        op("/usage", Query::usage().to_string(), false),
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
