//! The vendor operations the conformance tests request: one concrete call
//! per GET path of the vendor OpenAPI, with its credit class, built from the
//! simulator's samples; and the fixtures those calls need.

use crate::support::http::get;
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
    let search = format!("geo_id={}&permit_from={from}&permit_to={to}&size=5", s.state);
    let c = &s.contractor_id;
    let area = |kind: &str, id: &str, what: &str| format!("/v2/{kind}/{id}/metrics/{what}");
    let all = "property_type=all&tag=all";
    vec![
        op("/permits/search", format!("/v2/permits/search?{search}"), true),
        op("/permits", format!("/v2/permits?id={}", ids.join("&id=")), true),
        op("/contractors/search", format!("/v2/contractors/search?{search}"), true),
        op("/contractors", format!("/v2/contractors?id={c}"), true),
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
        op("/decisions", format!("/v2/decisions?id={}", s.decision_id), true),
        op(
            "/properties/search",
            format!("/v2/properties/search?geo_id={}&size=5", s.zip),
            true,
        ),
        op("/properties", format!("/v2/properties?id={}", s.address_geo_id), true),
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
        op("/meta/release", "/v2/meta/release".into(), false),
        op("/usage", "/v2/usage".into(), false),
    ]
}

/// The simulator's samples, one permit record of the small state and three
/// permit ids, read straight from the simulator (no team pays for them).
pub async fn fixtures(sim: &Sim) -> (Samples, Value, Vec<String>) {
    let s = sim.samples();
    let url = format!(
        "{}/v2/permits/search?geo_id={}&permit_from={}&permit_to={}&size=3",
        sim.base_url(),
        s.state,
        s.permit_from,
        s.permit_to
    );
    let r = get(&url, &[("x-api-key", sim.api_key()), ("x-request-id", "fixture")]).await;
    let permits = r.json()["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(permits.len(), 3, "{}", r.text());
    let ids = permits
        .iter()
        .filter_map(|p| p["id"].as_str().map(str::to_owned))
        .collect();
    (s, permits[0].clone(), ids)
}
