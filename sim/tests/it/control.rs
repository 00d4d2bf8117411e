//! Stats, log and the `/_sim/*` control endpoints.

use super::{permit_search, sim, v2};
use crate::support::http::{get, post_json, send};
use bytes::Bytes;
use http::Method;
use serde_json::json;

#[tokio::test]
async fn stats_and_log_count_requests_credits_and_request_ids() {
    let sim = sim().await;
    let s = sim.samples();
    let url = format!("{}{}", sim.base_url(), permit_search(&s, &s.state, "&size=3"));
    let r = get(&url, &[("x-api-key", sim.api_key()), ("x-request-id", "team-a-1")]).await;
    assert_eq!(r.status, 200);
    get(&format!("{}/v2/usage", sim.base_url()), &[("x-api-key", "wrong")]).await;
    get(&format!("{}/_sim/stats", sim.base_url()), &[]).await;
    let stats = sim.stats();
    assert_eq!(stats.requests_total, 2, "control requests are not counted");
    assert_eq!(stats.by_path.get("/v2/permits/search"), Some(&1));
    assert_eq!(stats.by_status.get(&401), Some(&1));
    assert_eq!(stats.credits_total, 3);
    assert_eq!(stats.credits_window_used, 3);
    let log = sim.log();
    assert_eq!(log[0].request_id.as_deref(), Some("team-a-1"));
    assert_eq!(
        (log[0].seq, log[0].status, log[0].credits, log[0].api_key_ok),
        (1, 200, 3, true)
    );
    assert!(log[0].query.contains("size=3"));
    assert_eq!((log[1].status, log[1].api_key_ok), (401, false));
    let over_http = get(&format!("{}/_sim/stats", sim.base_url()), &[]).await.json();
    assert_eq!(over_http["requests_total"], 2);
    assert_eq!(
        get(&format!("{}/_sim/log", sim.base_url()), &[]).await.json()[0]["request_id"],
        "team-a-1"
    );
    sim.reset();
    assert_eq!(sim.stats().requests_total, 0);
    assert!(sim.log().is_empty());
}

#[tokio::test]
async fn control_endpoints_drive_faults() {
    let sim = sim().await;
    let base = sim.base_url();
    let ok = post_json(
        &format!("{base}/_sim/faults"),
        &[],
        &json!({"kind": "status", "status": 502, "count": 1}),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(v2(&sim, "/v2/meta/release").await.status, 502);
    assert_eq!(v2(&sim, "/v2/meta/release").await.status, 200);
    post_json(&format!("{base}/_sim/faults"), &[], &json!({"kind": "status"})).await;
    assert_eq!(v2(&sim, "/v2/meta/release").await.status, 500);
    send(Method::DELETE, &format!("{base}/_sim/faults"), &[], Bytes::new()).await;
    assert_eq!(v2(&sim, "/v2/meta/release").await.status, 200);
    let bad = post_json(&format!("{base}/_sim/faults"), &[], &json!({"kind": "gremlins"})).await;
    assert_eq!(bad.status, 400);
}

#[tokio::test]
async fn control_endpoints_drive_config_clock_samples_and_reset() {
    let sim = sim().await;
    let s = sim.samples();
    let base = sim.base_url();

    post_json(&format!("{base}/_sim/config"), &[], &json!({"credit_limit": 5})).await;
    assert_eq!(
        v2(&sim, &permit_search(&s, &s.state, "&size=4"))
            .await
            .header_u64("x-credits-remaining"),
        Some(1)
    );
    post_json(
        &format!("{base}/_sim/clock"),
        &[],
        &json!({"advance_secs": 31 * 86_400}),
    )
    .await;
    assert_eq!(sim.stats().credits_window_used, 0);
    post_json(
        &format!("{base}/_sim/config"),
        &[],
        &json!({"credit_limit": null, "requests_per_minute": 1}),
    )
    .await;
    assert_eq!(v2(&sim, "/v2/meta/release").await.status, 200);
    assert_eq!(v2(&sim, "/v2/meta/release").await.status, 429);

    let samples = get(&format!("{base}/_sim/samples"), &[]).await.json();
    assert_eq!(samples["big_state"], s.big_state.as_str());
    assert_eq!(
        send(Method::POST, &format!("{base}/_sim/reset"), &[], Bytes::new())
            .await
            .status,
        200
    );
    assert_eq!(sim.stats().requests_total, 0);
}

#[tokio::test]
async fn same_seed_same_data_across_simulators() {
    let a = sim().await;
    let b = sim().await;
    let s = a.samples();
    let pa = v2(&a, &permit_search(&s, &s.state, "&size=5")).await.json();
    let pb = v2(&b, &permit_search(&s, &s.state, "&size=5")).await.json();
    assert_eq!(pa, pb);
    a.shutdown().await;
    assert_eq!(
        v2(&b, "/v2/meta/release").await.status,
        200,
        "one sim stopping leaves the other"
    );
}

#[tokio::test]
async fn a_published_release_moves_the_date_and_the_data() {
    let sim = sim().await;
    let base = sim.base_url();
    let s = sim.samples();
    let before = v2(&sim, "/v2/meta/release").await.json()["released_at"].clone();
    let page = permit_search(&s, &s.state, "&size=5");
    let old_page = v2(&sim, &page).await.text();
    let published = post_json(&format!("{base}/_sim/release"), &[], &json!({"days": 7})).await;
    assert_eq!(published.status, 200, "{}", published.text());
    let after = v2(&sim, "/v2/meta/release").await.json()["released_at"].clone();
    assert_eq!(published.json()["released_at"], after);
    let (b, a) = (before.as_str().unwrap(), after.as_str().unwrap());
    let days = chrono::NaiveDate::parse_from_str(a, "%Y-%m-%d").unwrap()
        - chrono::NaiveDate::parse_from_str(b, "%Y-%m-%d").unwrap();
    assert_eq!(days.num_days(), 7, "{b} -> {a}");
    assert_ne!(
        v2(&sim, &page).await.text(),
        old_page,
        "the data changed with the release"
    );
    assert!(sim.publish_release(1).to_string().as_str() > a);
    // A garbled release text until the next publish.
    post_json(&format!("{base}/_sim/release"), &[], &json!({"released_at": "soon"})).await;
    assert_eq!(v2(&sim, "/v2/meta/release").await.json()["released_at"], "soon");
    let bad = post_json(&format!("{base}/_sim/release"), &[], &json!({"days": 0})).await;
    assert_eq!(bad.status, 400);
    sim.publish_release(7);
    assert_ne!(v2(&sim, "/v2/meta/release").await.json()["released_at"], "soon");
}
