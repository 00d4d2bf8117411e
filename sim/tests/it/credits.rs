//! Credit metering: headers, 402, the rolling window, free endpoints.

use super::{items, permit_search, sim, sim_with, v2};
use crate::support::sim::SimConfig;
use serde_json::json;

#[tokio::test]
async fn metered_search_charges_one_credit_per_record() {
    let sim = sim_with(SimConfig {
        credit_limit: Some(100),
        requests_per_minute: 0,
        ..SimConfig::default()
    })
    .await;
    let s = sim.samples();
    let r = v2(&sim, &permit_search(&s, &s.state, "&size=7")).await;
    assert_eq!(r.header_u64("x-credits-request"), Some(7));
    assert_eq!(r.header_u64("x-credits-limit"), Some(100));
    assert_eq!(r.header_u64("x-credits-remaining"), Some(93));
    let usage = v2(&sim, "/v2/usage").await.json();
    assert_eq!(usage["credits_used"], 7);
    assert_eq!(usage["credit_limit"], 100);
}

#[tokio::test]
async fn unlimited_accounts_get_only_the_request_header() {
    let sim = sim().await;
    let s = sim.samples();
    let r = v2(&sim, &permit_search(&s, &s.state, "&size=2")).await;
    assert_eq!(r.header_u64("x-credits-request"), Some(2));
    assert!(r.header("x-credits-limit").is_none() && r.header("x-credits-remaining").is_none());
}

#[tokio::test]
async fn exceeding_the_limit_is_402_charges_nothing_and_remaining_never_goes_negative() {
    let sim = sim_with(SimConfig {
        credit_limit: Some(12),
        requests_per_minute: 0,
        ..SimConfig::default()
    })
    .await;
    let s = sim.samples();
    let r = v2(&sim, &permit_search(&s, &s.state, "&size=10")).await;
    assert_eq!(r.header_u64("x-credits-remaining"), Some(2));
    let r = v2(&sim, &permit_search(&s, &s.state, "&size=5")).await;
    assert_eq!(r.status, 402);
    assert_eq!(
        r.json(),
        json!({"detail": {"error": "Monthly credit limit exceeded.", "limit": 12, "upgrade_url": "https://upstream.example/upgrade"}})
    );
    assert!(r.header("x-credits-request").is_none());
    let r = v2(&sim, &permit_search(&s, &s.state, "&size=2")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header_u64("x-credits-remaining"), Some(0));
    let usage = v2(&sim, "/v2/usage").await.json();
    assert_eq!(usage["credits_used"], 12);
    assert_eq!(usage["is_over_limit"], true);
    assert!(usage["available_at"].is_string());
    assert_eq!(sim.stats().credits_total, 12);
}

#[tokio::test]
async fn free_endpoints_carry_no_credit_headers_and_cost_nothing() {
    let sim = sim_with(SimConfig {
        credit_limit: Some(50),
        requests_per_minute: 0,
        ..SimConfig::default()
    })
    .await;
    let s = sim.samples();
    for path in [
        format!("/v2/counties?geo_id={}", s.county_geo_id),
        "/v2/list/zip".to_string(),
        "/v2/states/search?q=tex".to_string(),
        "/v2/jurisdictions/search?q=city".to_string(),
        "/v2/meta/release".to_string(),
        format!(
            "/v2/meta/coverage?geo_type=state&geo_id={}&date_from=2021-01-01&date_to=2025-01-01",
            s.state
        ),
        "/v2/usage".to_string(),
    ] {
        let r = v2(&sim, &path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert!(r.header("x-credits-request").is_none(), "{path} is free");
    }
    assert_eq!(sim.stats().credits_total, 0);
    assert_eq!(v2(&sim, "/v2/usage").await.json()["credits_used"], 0);
}

#[tokio::test]
async fn validation_errors_cost_nothing() {
    let sim = sim().await;
    let r = v2(&sim, "/v2/permits/search?geo_id=CA").await;
    assert_eq!(r.status, 422);
    assert_eq!(sim.stats().credits_total, 0);
}

#[tokio::test]
async fn spend_drops_out_of_the_rolling_window_after_thirty_days() {
    let sim = sim_with(SimConfig {
        credit_limit: Some(20),
        requests_per_minute: 0,
        ..SimConfig::default()
    })
    .await;
    let s = sim.samples();
    assert_eq!(v2(&sim, &permit_search(&s, &s.state, "&size=20")).await.status, 200);
    assert_eq!(v2(&sim, &permit_search(&s, &s.state, "&size=1")).await.status, 402);
    let usage = v2(&sim, "/v2/usage").await.json();
    let day = &usage["daily_usage"][0];
    assert_eq!(day["credits"], 20);
    let date = chrono::NaiveDate::parse_from_str(day["date"].as_str().unwrap_or(""), "%Y-%m-%d").expect("date");
    assert_eq!(day["expires"], (date + chrono::Days::new(30)).to_string());
    sim.advance_clock(31 * 86_400);
    let usage = v2(&sim, "/v2/usage").await.json();
    assert_eq!(usage["credits_used"], 0);
    assert_eq!(usage["daily_usage"], json!([]));
    assert_eq!(sim.stats().credits_window_used, 0);
    let r = v2(&sim, &permit_search(&s, &s.state, "&size=3")).await;
    assert_eq!(r.status, 200);
    assert_eq!(items(&r).len(), 3);
    assert_eq!(r.header_u64("x-credits-remaining"), Some(17));
}

#[tokio::test]
async fn runtime_limit_change_applies_to_the_next_request() {
    let sim = sim().await;
    let s = sim.samples();
    sim.set_credit_limit(Some(1));
    assert_eq!(v2(&sim, &permit_search(&s, &s.state, "&size=2")).await.status, 402);
    sim.set_credit_limit(None);
    assert_eq!(v2(&sim, &permit_search(&s, &s.state, "&size=2")).await.status, 200);
}
