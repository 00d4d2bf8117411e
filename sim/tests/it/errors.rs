//! Error answers in the upstream's shapes and in the upstream's order of checks.

use super::{permit_search, sim, sim_with, v2};
use crate::support::http::{get, send};
use crate::support::sim::SimConfig;
use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};

fn detail(r: &crate::support::http::Reply) -> Vec<Value> {
    r.json()["detail"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("detail is not an array: {}", r.text()))
}

fn find<'a>(errs: &'a [Value], field: &str) -> &'a Value {
    errs.iter()
        .find(|e| e["loc"][1] == field)
        .unwrap_or_else(|| panic!("no error for {field}: {errs:?}"))
}

#[tokio::test]
async fn missing_params_are_all_reported_at_once() {
    let sim = sim().await;
    let r = v2(&sim, "/v2/permits/search").await;
    assert_eq!(r.status, 422);
    let errs = detail(&r);
    for f in ["permit_from", "permit_to", "geo_id"] {
        let e = find(&errs, f);
        assert_eq!(e["type"], "missing");
        assert_eq!(e["msg"], "Field required");
        assert_eq!(e["loc"], json!(["query", f]));
        assert!(e["input"].is_null());
    }
}

#[tokio::test]
async fn bad_values_get_pydantic_errors() {
    let sim = sim().await;
    let s = sim.samples();
    let r = v2(
        &sim,
        &permit_search(
            &s,
            &s.state,
            "&size=101&permit_status=open&contractor_name=ab&property_type=castle",
        ),
    )
    .await;
    assert_eq!(r.status, 422);
    let errs = detail(&r);
    let size = find(&errs, "size");
    assert_eq!(size["type"], "less_than_equal");
    assert_eq!(size["input"], "101");
    assert_eq!(size["ctx"]["le"], 100);
    let status = find(&errs, "permit_status");
    assert_eq!(status["type"], "literal_error");
    assert_eq!(status["loc"], json!(["query", "permit_status", 0]));
    assert_eq!(find(&errs, "contractor_name")["type"], "string_too_short");
    assert_eq!(find(&errs, "property_type")["type"], "literal_error");

    let r = v2(&sim, &permit_search(&s, &s.state, "&size=0")).await;
    assert_eq!(find(&detail(&r), "size")["type"], "greater_than_equal");
    let r = v2(&sim, &permit_search(&s, &s.state, "&size=ten")).await;
    assert_eq!(find(&detail(&r), "size")["type"], "int_parsing");
}

#[tokio::test]
async fn bad_date_and_free_text_geo_id_are_422() {
    let sim = sim().await;
    let r = v2(
        &sim,
        "/v2/permits/search?geo_id=123%20Main%20St&permit_from=01-01-2025&permit_to=2025-02-30",
    )
    .await;
    assert_eq!(r.status, 422);
    let errs = detail(&r);
    let from = find(&errs, "permit_from");
    assert_eq!(from["type"], "date_from_datetime_parsing");
    assert_eq!(
        from["msg"],
        "Input should be a valid date or datetime, invalid character in year"
    );
    assert_eq!(from["input"], "01-01-2025");
    assert_eq!(find(&errs, "permit_to")["type"], "date_from_datetime_parsing");
    let geo = find(&errs, "geo_id");
    assert_eq!(geo["type"], "value_error");
    assert_eq!(geo["input"], "123 Main St");
}

#[tokio::test]
async fn unknown_but_well_formed_geo_id_is_an_empty_200() {
    let sim = sim().await;
    let s = sim.samples();
    for geo in ["WY", "00001", "AAAAAAAAAAA"] {
        let r = v2(&sim, &permit_search(&s, geo, "")).await;
        assert_eq!(r.status, 200, "{geo}");
        assert_eq!(r.json()["items"], json!([]));
        assert_eq!(r.header_u64("x-credits-request"), Some(0));
    }
}

#[tokio::test]
async fn coverage_date_to_before_date_from_is_422() {
    let sim = sim().await;
    let r = v2(
        &sim,
        "/v2/meta/coverage?geo_type=state&geo_id=CA&date_from=2024-02-01&date_to=2024-01-01",
    )
    .await;
    assert_eq!(r.status, 422);
    let errs = detail(&r);
    assert_eq!(find(&errs, "date_to")["type"], "value_error");
    let r = v2(
        &sim,
        "/v2/meta/coverage?geo_type=zip&geo_id=CA&date_from=2024-01-01&date_to=2024-02-01",
    )
    .await;
    assert_eq!(find(&detail(&r), "geo_type")["type"], "literal_error");
}

#[tokio::test]
async fn missing_key_is_422_on_the_header_and_wrong_key_401() {
    let sim = sim().await;
    let url = format!("{}/v2/usage", sim.base_url());
    let r = get(&url, &[]).await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.json(),
        json!({"detail":[{"type":"missing","loc":["header","x-api-key"],"msg":"Field required","input":null}]})
    );
    let r = get(&url, &[("x-api-key", "nope")]).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json(), json!({"detail": "Not authenticated"}));
}

#[tokio::test]
async fn route_comes_before_auth_and_non_get_is_405() {
    let sim = sim().await;
    let r = get(&format!("{}/v2/nope", sim.base_url()), &[]).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json(), json!({"detail": "Not Found"}));
    let r = send(
        Method::POST,
        &format!("{}/v2/usage", sim.base_url()),
        &[("x-api-key", sim.api_key())],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, 405);
    assert_eq!(r.json(), json!({"detail": "Method Not Allowed"}));
}

#[tokio::test]
async fn over_the_request_rate_is_429_with_retry_after() {
    let sim = sim_with(SimConfig {
        requests_per_minute: 3,
        ..SimConfig::default()
    })
    .await;
    for _ in 0..3 {
        assert_eq!(v2(&sim, "/v2/meta/release").await.status, 200);
    }
    let r = v2(&sim, "/v2/meta/release").await;
    assert_eq!(r.status, 429);
    assert_eq!(r.json(), json!({"detail": "Rate limit exceeded"}));
    assert!(r.header_u64("retry-after").is_some_and(|s| s >= 1));
    // Auth comes before the limiter: a wrong key is still a 401.
    let wrong = get(&format!("{}/v2/meta/release", sim.base_url()), &[("x-api-key", "nope")]).await;
    assert_eq!(wrong.status, 401);
    sim.set_requests_per_minute(0);
    assert_eq!(v2(&sim, "/v2/meta/release").await.status, 200);
}
