//! The operations of the vendor's OpenAPI beyond the seed spec (searches of
//! places, decisions and properties; people; the tag list; every area's
//! current metrics; contractor metrics) and the fidelity fixes found by
//! validating the simulator against that OpenAPI.

use super::{contractor_search, items, permit_search, sim, v2};
use serde_json::Value;

/// The vendor's `CoverageItem.field` enum.
const COVERAGE_FIELDS: [&str; 10] = [
    "fees",
    "job_value",
    "description",
    "contractor_id",
    "owner_name",
    "property_type",
    "property_year_built",
    "property_building_area",
    "issue_date",
    "file_date",
];

#[tokio::test]
async fn a_multibyte_geo_id_is_a_422_not_a_closed_connection() {
    let sim = sim().await;
    let s = sim.samples();
    // The 5th byte sits inside "é": slicing at it used to panic the handler.
    let bad = "1234%C3%A96789";
    let urls = [
        permit_search(&s, bad, ""),
        contractor_search(&s, bad, ""),
        format!("/v2/meta/coverage?geo_type=zipcode&geo_id={bad}&date_from=2021-01-01&date_to=2021-02-01"),
        format!("/v2/decisions/search?geo_id={bad}&decision_from=2021-01-01&decision_to=2021-02-01"),
        format!("/v2/properties/search?geo_id={bad}"),
    ];
    for url in urls {
        let r = v2(&sim, &url).await;
        assert_eq!(r.status, 422, "{url}: {}", r.text());
        assert_eq!(r.json()["detail"][0]["loc"], serde_json::json!(["query", "geo_id"]));
    }
    assert_eq!(sim.stats().credits_total, 0);
}

#[tokio::test]
async fn integer_fields_are_integers_and_addresses_are_complete() {
    let sim = sim().await;
    let s = sim.samples();
    let permits = items(&v2(&sim, &permit_search(&s, &s.state, "&size=50")).await);
    let area = permits
        .iter()
        .find(|p| !p["property_building_area"].is_null())
        .expect("a permit with a building area");
    assert!(
        area["property_building_area"].is_i64(),
        "{}",
        area["property_building_area"]
    );
    assert!(permits
        .iter()
        .all(|p| p["property_lot_size"].is_null() || p["property_lot_size"].is_i64()));
    for f in ["county", "zip_code_ext", "jurisdiction"] {
        assert!(area["address"][f].is_string(), "permit address lacks {f}");
    }
    assert_eq!(area["address"]["zip_code_ext"].as_str().map(str::len), Some(4));
    let c = items(&v2(&sim, &contractor_search(&s, &s.state, "&size=20")).await);
    assert!(c
        .iter()
        .all(|c| c["avg_construction_duration"].is_null() || c["avg_construction_duration"].is_i64()));
    assert!(c[0]["address"]["county"].is_string() && c[0]["address"]["address_id"].is_string());
}

#[tokio::test]
async fn coverage_reports_only_the_vendors_fields() {
    let sim = sim().await;
    let s = sim.samples();
    let r = v2(
        &sim,
        &format!(
            "/v2/meta/coverage?geo_type=zipcode&geo_id={}&date_from=1990-01-01&date_to=1990-01-31",
            s.zip
        ),
    )
    .await;
    let fields: Vec<String> = items(&r)
        .iter()
        .map(|r| r["field"].as_str().unwrap_or("").to_string())
        .collect();
    let mut expected: Vec<&str> = COVERAGE_FIELDS.to_vec();
    expected.sort_unstable();
    assert_eq!(fields, expected, "an empty window lists every tracked field, by name");
}

#[tokio::test]
async fn geo_searches_with_no_match_are_404_and_free() {
    let sim = sim().await;
    for (path, what) in [
        ("/v2/addresses/search?q=zzqx", "addresses"),
        ("/v2/cities/search?q=zzqx", "cities"),
        ("/v2/counties/search?q=zzqx", "counties"),
        ("/v2/jurisdictions/search?q=zzqx", "jurisdictions"),
        ("/v2/states/search?q=zzqx", "states"),
        ("/v2/zipcodes/search?q=00000", "zipcodes"),
    ] {
        let r = v2(&sim, path).await;
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert_eq!(
            r.json()["detail"],
            format!("The specified search query didn't match any {what}")
        );
    }
}

#[tokio::test]
async fn place_searches_resolve_names_to_the_datasets_geo_ids_for_free() {
    let sim = sim().await;
    let s = sim.samples();
    let at_address = items(&v2(&sim, &permit_search(&s, &s.address_geo_id, "")).await);
    let p = &at_address[0];
    let a = &p["address"];
    let street = format!(
        "{} {}",
        a["street_no"].as_str().unwrap_or(""),
        a["street"].as_str().unwrap_or("")
    );
    let cases = [
        (
            format!(
                "/v2/addresses/search?q={street} {}",
                a["zip_code"].as_str().unwrap_or("")
            ),
            "address_id",
            20,
        ),
        (
            format!("/v2/cities/search?q={}", a["city"].as_str().unwrap_or("")),
            "city_id",
            15,
        ),
        (
            format!("/v2/counties/search?q={}", a["county"].as_str().unwrap_or("")),
            "county_id",
            15,
        ),
    ];
    for (url, id_field, cap) in cases {
        let r = v2(&sim, &url.replace(' ', "%20")).await;
        assert_eq!(r.status, 200, "{url}: {}", r.text());
        assert!(r.header("x-credits-request").is_none(), "geo searches are free");
        let v = r.json();
        assert!(v["next_cursor"].is_null());
        let found = items(&r);
        assert!(found.len() <= cap);
        assert!(
            found.iter().any(|i| i["geo_id"] == p["geo_ids"][id_field]),
            "{url} finds {}",
            p["geo_ids"][id_field]
        );
    }
    let metered = at_address.len() as u64;
    assert_eq!(sim.stats().credits_total, metered, "only the permit search was metered");
}

#[tokio::test]
async fn tags_list_every_tag_the_permits_carry() {
    let sim = sim().await;
    let s = sim.samples();
    let r = v2(&sim, "/v2/list/tags?size=100").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("x-credits-request").is_none());
    let tags: Vec<String> = items(&r)
        .iter()
        .map(|t| t["id"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(items(&r).iter().all(|t| t["description"].is_string()));
    for p in items(&v2(&sim, &permit_search(&s, &s.state, "&size=100")).await) {
        for t in p["tags"].as_array().into_iter().flatten() {
            assert!(tags.iter().any(|x| x == t), "tag {t} is listed");
        }
    }
    let paged = v2(&sim, "/v2/list/tags?size=5").await.json();
    assert_eq!(paged["size"], 5);
    assert!(paged["next_cursor"].is_string());
}

#[tokio::test]
async fn people_are_stable_metered_and_404_without_residents() {
    let sim = sim().await;
    let s = sim.samples();
    let url = format!("/v2/contractors/{}/employees", s.contractor_id);
    let (a, b) = (v2(&sim, &url).await, v2(&sim, &url).await);
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.body, b.body, "the same people every time");
    let staff = items(&a);
    assert!(!staff.is_empty() && staff.iter().all(|e| e["contractor_id"] == s.contractor_id.as_str()));
    assert_eq!(a.header_u64("x-credits-request"), Some(staff.len() as u64));
    let r = v2(&sim, &format!("/v2/addresses/{}/residents", s.resident_address_geo_id)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header_u64("x-credits-request"), Some(items(&r).len() as u64));
    let none = v2(&sim, &format!("/v2/addresses/{}/residents", s.city_geo_id)).await;
    assert_eq!(none.status, 404);
}

#[tokio::test]
async fn every_area_has_current_metrics_and_contractor_metrics_are_free() {
    let sim = sim().await;
    let s = sim.samples();
    let current = [
        format!("/v2/addresses/{}/metrics/current?tag=all", s.address_geo_id),
        format!(
            "/v2/counties/{}/metrics/current?property_type=all&tag=all",
            s.county_geo_id
        ),
        format!(
            "/v2/jurisdictions/{}/metrics/current?property_type=all&tag=all",
            s.jurisdiction_geo_id
        ),
    ];
    for url in current {
        let r = v2(&sim, &url).await;
        assert_eq!(r.status, 200, "{url}: {}", r.text());
        assert_eq!(r.header_u64("x-credits-request"), Some(1), "{url}");
        assert!(items(&r)[0]["permit_active_count"].is_u64());
    }
    let range = format!("metric_from={}&metric_to={}", s.permit_from, s.permit_to);
    let r = v2(
        &sim,
        &format!(
            "/v2/jurisdictions/{}/metrics/monthly?{range}&property_type=all&tag=all",
            s.jurisdiction_geo_id
        ),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let url = format!(
        "/v2/contractors/{}/metrics?{range}&property_type=all&tag=all&size=100",
        s.contractor_id
    );
    let r = v2(&sim, &url).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("x-credits-request").is_none(), "contractor metrics are free");
    let counted: u64 = items(&r).iter().filter_map(|m| m["permit_count"].as_u64()).sum();
    let (mut started, mut cursor) = (0, String::new());
    loop {
        let page = v2(
            &sim,
            &format!("/v2/contractors/{}/permits?size=100{cursor}", s.contractor_id),
        )
        .await;
        started += items(&page).iter().filter(|p| !p["start_date"].is_null()).count();
        match page.json()["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(
        counted, started as u64,
        "monthly rows count the contractor's started permits"
    );
    let unknown = v2(&sim, &url.replace(&s.contractor_id, "NOSUCHID00")).await;
    assert_eq!(unknown.status, 404);
}

#[tokio::test]
async fn decision_and_property_searches_filter_and_page() {
    let sim = sim().await;
    let s = sim.samples();
    let base = format!(
        "/v2/decisions/search?geo_id={}&decision_from=2022-01-01&decision_to=2023-12-31",
        s.state
    );
    let all = items(&v2(&sim, &format!("{base}&size=100")).await);
    assert!(!all.is_empty());
    let dates: Vec<&str> = all.iter().filter_map(|d| d["decision_date"].as_str()).collect();
    assert!(dates.windows(2).all(|w| w[0] >= w[1]), "newest first");
    assert!(dates.iter().all(|d| ("2022-01-01".."2024-01-01").contains(d)));
    let zip = v2(
        &sim,
        &base.replace(&format!("geo_id={}", s.state), &format!("geo_id={}", s.zip)),
    )
    .await;
    assert_eq!(zip.status, 422, "decisions take no ZIP");

    let props = format!("/v2/properties/search?geo_id={}&size=20", s.zip);
    let r = v2(&sim, &props).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let rows = items(&r);
    assert!(rows.iter().all(|p| p["zip_code"] == s.zip.as_str()));
    let last: Vec<&str> = rows.iter().filter_map(|p| p["last_permit_date"].as_str()).collect();
    assert!(last.windows(2).all(|w| w[0] >= w[1]), "most recently permitted first");
    assert!(r.json().get("trust_summary").is_none(), "presence-only omits trust");
    let absent = v2(&sim, &format!("{props}&permit_tags=-solar")).await;
    assert!(absent.json()["trust_summary"].is_object());
    assert!(items(&absent)
        .iter()
        .all(|p| !p["tags"].as_array().is_some_and(|t| t.contains(&Value::from("solar")))));
    let jur = v2(&sim, &format!("/v2/properties/search?geo_id={}", s.jurisdiction_geo_id)).await;
    assert_eq!(jur.status, 422, "jurisdiction ids are not accepted");
}
