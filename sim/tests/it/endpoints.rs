//! Every endpoint of the spec answers 200 with its documented shape.

use super::{contractor_search, items, permit_search, sim, v2};
use serde_json::Value;

fn assert_page(v: &Value) {
    for key in ["items", "size", "next_cursor", "total_count"] {
        assert!(v.get(key).is_some(), "page lacks {key}: {v}");
    }
    assert_eq!(v["size"].as_u64(), v["items"].as_array().map(|a| a.len() as u64));
}

#[tokio::test]
async fn permit_search_returns_full_permit_records() {
    let sim = sim().await;
    let s = sim.samples();
    let r = v2(&sim, &permit_search(&s, &s.state, "&size=5")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("server"), Some("uvicorn"));
    let v = r.json();
    assert_page(&v);
    assert_eq!(v["size"], 5);
    let p = &v["items"][0];
    for f in [
        "id",
        "number",
        "description",
        "description_derived",
        "jurisdiction",
        "type",
        "status",
        "job_value",
        "fees",
        "file_date",
        "issue_date",
        "final_date",
        "start_date",
        "end_date",
        "total_duration",
        "construction_duration",
        "approval_duration",
        "inspection_pass_rate",
        "contractor_id",
        "tags",
        "property_type",
        "property_lot_size",
        "property_assess_market_value",
    ] {
        assert!(p.get(f).is_some(), "permit lacks {f}: {p}");
    }
    assert_eq!(p["id"].as_str().map(str::len), Some(16));
    for f in ["street_no", "street", "city", "zip_code", "state", "latlng"] {
        assert!(p["address"].get(f).is_some(), "address lacks {f}");
    }
    for f in ["address_id", "city_id", "county_id", "jurisdiction_id"] {
        assert_eq!(p["geo_ids"][f].as_str().map(str::len), Some(11), "{f}");
    }
    assert_eq!(p["address"]["state"], s.state.as_str());
}

#[tokio::test]
async fn contractor_search_and_contractor_permits_answer() {
    let sim = sim().await;
    let s = sim.samples();
    let r = v2(&sim, &contractor_search(&s, &s.state, "&size=3")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_page(&v);
    let c = &v["items"][0];
    for f in [
        "id",
        "license",
        "name",
        "business_name",
        "status_tally",
        "tag_tally",
        "permit_count",
        "total_job_value",
        "address",
    ] {
        assert!(c.get(f).is_some(), "contractor lacks {f}");
    }
    assert!(c["address"]["address_id"].is_string());
    let r = v2(&sim, &format!("/v2/contractors/{}/permits?size=4", s.contractor_id)).await;
    assert_eq!(r.status, 200);
    let ps = items(&r);
    assert_eq!(ps.len(), 4);
    assert!(ps.iter().all(|p| p["contractor_id"] == s.contractor_id.as_str()));
    let unknown = v2(&sim, "/v2/contractors/NOSUCHID00/permits").await;
    assert_eq!(unknown.status, 200);
    assert!(items(&unknown).is_empty());
}

#[tokio::test]
async fn metrics_endpoints_answer_and_404_without_rows() {
    let sim = sim().await;
    let s = sim.samples();
    let range = "metric_from=2021-01-01&metric_to=2026-12-31";
    let r = v2(
        &sim,
        &format!(
            "/v2/cities/{}/metrics/monthly?{range}&property_type=all&tag=all",
            s.city_geo_id
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let rows = items(&r);
    assert!(!rows.is_empty());
    for f in [
        "geo_id",
        "tag",
        "permit_count",
        "contractor_count",
        "avg_construction_duration",
        "total_job_value",
        "date",
        "property_type",
    ] {
        assert!(rows[0].get(f).is_some(), "row lacks {f}");
    }
    assert!(r.header_u64("x-credits-request").is_some());
    let r = v2(
        &sim,
        &format!(
            "/v2/counties/{}/metrics/monthly?{range}&property_type=residential&tag=all",
            s.county_geo_id
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = v2(
        &sim,
        &format!("/v2/addresses/{}/metrics/monthly?{range}&tag=all", s.address_geo_id),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(items(&r)[0].get("property_type").is_none());
    let r = v2(
        &sim,
        &format!("/v2/cities/{}/metrics/current?property_type=all&tag=all", s.city_geo_id),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let row = &items(&r)[0];
    assert!(row.get("permit_active_count").is_some() && row.get("date").is_none());
    let none = v2(
        &sim,
        &format!(
            "/v2/cities/{}/metrics/monthly?metric_from=1990-01-01&metric_to=1990-12-31&property_type=all&tag=all",
            s.city_geo_id
        ),
    )
    .await;
    assert_eq!(none.status, 404);
    assert_eq!(none.json()["detail"], "No city metrics found.");
}

#[tokio::test]
async fn geography_details_are_bare_objects_and_unknown_is_404() {
    let sim = sim().await;
    let s = sim.samples();
    let county = v2(&sim, &format!("/v2/counties?geo_id={}", s.county_geo_id))
        .await
        .json();
    assert_eq!(county["geo_id"], s.county_geo_id.as_str());
    assert!(county["cities"].is_object() && county["zipcodes"].is_array());
    let city = v2(&sim, &format!("/v2/cities?geo_id={}", s.city_geo_id)).await.json();
    assert!(city["counties"]
        .as_object()
        .is_some_and(|m| m.values().any(|v| v == s.county_geo_id.as_str())));
    let jur = v2(&sim, &format!("/v2/jurisdictions?geo_id={}", s.jurisdiction_geo_id))
        .await
        .json();
    assert_eq!(jur["state"], s.state.as_str());
    let missing = v2(&sim, "/v2/counties?geo_id=AAAAAAAAAAA").await;
    assert_eq!(missing.status, 404);
    assert!(missing.json()["detail"].is_string());
}

#[tokio::test]
async fn free_lists_and_searches_answer() {
    let sim = sim().await;
    let s = sim.samples();
    let zips = v2(&sim, "/v2/list/zip?size=10").await;
    assert_eq!(zips.status, 200);
    assert_page(&zips.json());
    assert!(items(&zips)[0]["zip_code"].is_string());
    let z = v2(&sim, &format!("/v2/zipcodes/search?q={}", &s.zip[..3])).await;
    assert!(items(&z).iter().any(|i| i["geo_id"] == s.zip.as_str()));
    let st = v2(&sim, "/v2/states/search?q=calif").await;
    assert_eq!(items(&st)[0]["geo_id"], "CA");
    let j = v2(&sim, "/v2/jurisdictions/search?q=o").await.json();
    assert!(j["items"].as_array().is_some_and(|a| !a.is_empty() && a.len() <= 15));
    assert!(j["next_cursor"].is_null());
    let release = v2(&sim, "/v2/meta/release").await.json();
    assert_eq!(release["released_at"].as_str().map(str::len), Some(10));
    let usage = v2(&sim, "/v2/usage").await.json();
    for f in [
        "credits_used",
        "credit_limit",
        "is_over_limit",
        "available_at",
        "daily_usage",
    ] {
        assert!(usage.get(f).is_some(), "usage lacks {f}");
    }
    assert!(usage["credit_limit"].is_null());
}

#[tokio::test]
async fn coverage_follows_its_rules() {
    let sim = sim().await;
    let s = sim.samples();
    let url = |geo_type: &str, geo: &str, from: &str, to: &str| {
        format!("/v2/meta/coverage?geo_type={geo_type}&geo_id={geo}&date_from={from}&date_to={to}")
    };
    let r = v2(&sim, &url("state", &s.state, "2021-01-01", "2026-12-31")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "only items: {v}");
    let rows = items(&r);
    assert!(!rows.is_empty());
    let tiers: Vec<&str> = rows.iter().filter_map(|r| r["tier"].as_str()).collect();
    assert!(tiers.iter().all(|t| *t == "partial" || *t == "missing"));
    assert!(rows.iter().all(|r| r["fill_pct"].as_f64().is_some_and(|f| f < 0.8)));
    let empty = v2(&sim, &url("zipcode", &s.zip4, "1990-01-01", "1990-01-31")).await;
    let rows = items(&empty);
    assert!(rows.len() >= 5 && rows.iter().all(|r| r["tier"] == "missing" && r["permits_total"] == 0));
    let city = v2(&sim, &url("city", &s.city_geo_id, "2021-01-01", "2026-12-31")).await;
    assert_eq!(city.status, 200);
}
