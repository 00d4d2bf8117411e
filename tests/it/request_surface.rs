//! The gateway core: a drop-in /v2 proxy with team tokens in and one
//! upstream key out. Real gateway, real simulator, real sockets.

use crate::support::client::Client;
use crate::support::gateway::{Setup, ADMIN_TOKEN, ALPHA, BETA};
use crate::support::probe::{metrics_text, readyz};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, Samples, SimConfig};
use http::{Method, StatusCode};

/// Every spec endpoint with valid parameters from the dataset (and a few
/// invalid ones whose error must pass through unchanged).
fn endpoint_queries(s: &Samples) -> Vec<Query> {
    let (from, to) = (&s.permit_from, &s.permit_to);
    let months = |q: Query| q.months("2020-01-01", "2026-12-31").tag("all");
    vec![
        Query::state_permits(s).size(5),
        Query::permit_search(&s.zip)
            .window(from, to)
            .size(3)
            .include_count(true),
        Query::contractor_search(&s.county_geo_id).window(from, to).size(4),
        Query::contractor(&s.contractor_id, "permits").size(5),
        months(Query::metrics("addresses", &s.address_geo_id, "monthly")),
        months(Query::metrics("counties", &s.county_geo_id, "monthly")).property_type("all"),
        months(Query::metrics("cities", &s.city_geo_id, "monthly")).property_type("all"),
        Query::metrics("cities", &s.city_geo_id, "current")
            .tag("all")
            .property_type("all"),
        Query::place("counties", &s.county_geo_id),
        Query::place("cities", &s.city_geo_id),
        Query::place("jurisdictions", &s.jurisdiction_geo_id),
        Query::list("zip").size(10),
        Query::text_search("zipcodes", &s.zip[..3]),
        Query::text_search("states", "a"),
        Query::text_search("jurisdictions", "a"),
        Query::coverage("state", &s.state).dates("2020-01-01", "2026-12-31"),
        Query::meta_release(),
        // Errors of the upstream's own pass through as they are (the
        // encoded space written out: it is part of what is refused).
        Query::state_permits(s).size(500),
        Query::permit_search("somewhere%20nice"),
        Query::place("counties", "AAAAAAAAAAA"),
        Query::new("/v2/no/such/endpoint"),
    ]
}

#[tokio::test]
async fn every_spec_endpoint_answers_through_the_gateway_as_the_upstream_does() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let samples = sim.samples();
    let (upstream, alpha) = (Client::upstream(&sim), Client::new(gw.base_url(), ALPHA.1));
    let beta_bearer = Client::bearer(gw.base_url(), BETA.1);
    for path in endpoint_queries(&samples) {
        let direct = upstream.get(&path).await;
        let via_key = alpha.get(&path).await;
        let via_bearer = beta_bearer.get(&path).await;
        for (style, via) in [("x-api-key", &via_key), ("bearer", &via_bearer)] {
            assert_eq!(via.status, direct.status, "{style} {path}: {}", via.text());
            assert_eq!(via.json(), direct.json(), "{style} {path}: body differs");
            assert!(via.header("x-request-id").is_some(), "{path}: x-request-id");
        }
    }
    // Every gateway request reached the upstream with the upstream's own key.
    let log = sim.log();
    assert!(
        log.iter().all(|e| e.api_key_ok),
        "a request reached the upstream without the right key"
    );
}

#[tokio::test]
async fn the_team_sees_its_own_credit_headers_not_the_orgs() {
    let sim = start_sim(SimConfig {
        credit_limit: Some(1_000_000),
        ..unlimited()
    })
    .await;
    let gw = Setup::new().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let reply = alpha.get(Query::state_permits(&sim.samples()).size(4)).await;
    assert_eq!(reply.status, StatusCode::OK);
    let items = reply.json()["items"].as_array().expect("items").len() as u64;
    assert_eq!(reply.credits_request(), Some(items));
    // Alpha is unlimited: no limit headers, and never the org's 1,000,000.
    assert_eq!(reply.header("x-credits-limit"), None);
    assert_eq!(reply.header("x-credits-remaining"), None);
    // Free endpoints cost nothing and say so.
    let free = alpha.get(Query::meta_release()).await;
    assert_eq!(free.status, StatusCode::OK);
    assert_eq!(free.header("x-credits-request"), None);
}

#[tokio::test]
async fn methods_paths_and_credentials_get_upstream_shaped_errors() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let base = gw.base_url();
    let alpha = Client::new(&base, ALPHA.1);
    let release = Query::meta_release();

    let post = alpha.send(Method::POST, &release).body("{}").await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
    assert_eq!(post.json()["detail"], "Method Not Allowed");

    let outside = alpha.get("/v1/permits/search").await;
    assert_eq!(outside.status, StatusCode::NOT_FOUND);
    assert_eq!(outside.json()["detail"], "Not Found");

    let missing = Client::anonymous(&base).get(&release).await;
    assert_eq!(missing.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        missing.json()["detail"][0]["loc"],
        serde_json::json!(["header", "x-api-key"])
    );

    let wrong = Client::new(&base, "not-a-team").get(&release).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.json()["detail"].is_string());

    let conflicting = alpha
        .get(&release)
        .header("authorization", &format!("Bearer {}", BETA.1))
        .await;
    assert_eq!(conflicting.status, StatusCode::UNAUTHORIZED);

    let head = alpha.send(Method::HEAD, &release).await;
    assert_eq!(head.status, StatusCode::OK);
    assert!(head.body.is_empty());

    // None of the refused requests reached the upstream.
    assert_eq!(sim.stats().requests_total, 1, "only the HEAD went upstream");
}

#[tokio::test]
async fn traversal_attempts_stay_inside_v2() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    // Literal paths: each spelling is an attempt of its own.
    for path in [
        "/v2/../admin/teams",
        "/v2/%2e%2e/admin/teams",
        "/v2/%2E%2E/%2E%2E/metrics",
        "/v2/.%2e/healthz",
        "/v2/permits/../../admin/teams",
        "/v2/meta/%2e%2e/%2e%2e/_sim/stats",
    ] {
        let r = alpha.get(path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {}", r.text());
    }
    let encoded_slash = alpha.get("/v2/contractors/a%2F..%2F..%2Fx/permits").await;
    assert_eq!(encoded_slash.status, StatusCode::BAD_REQUEST);
    // Inside /v2 too, a dot-segment is no path of the upstream's: 404 (routes.rs).
    let inside = alpha.get("/v2/meta/x/../release").await;
    assert_eq!(inside.status, StatusCode::NOT_FOUND);
    assert!(sim.log().is_empty(), "nothing reached the upstream");
}

#[tokio::test]
async fn request_ids_are_propagated_upstream_and_back() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let r = alpha.get(Query::meta_release()).request_id("trace-42").await;
    assert_eq!(r.header("x-request-id"), Some("trace-42"));
    let generated = alpha.get(Query::list("zip").size(3)).await;
    let id = generated.header("x-request-id").expect("generated id").to_string();
    let upstream_ids: Vec<Option<String>> = sim.log().into_iter().map(|e| e.request_id).collect();
    assert_eq!(upstream_ids, vec![Some("trace-42".to_string()), Some(id)]);
}

#[tokio::test]
async fn upstream_failures_map_to_502_and_504() {
    use crate::support::sim::{FaultKind, Faults};
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| {
            c.upstream.timeout_secs = 1;
            c.upstream.max_retries = 1;
        })
        .start(&sim)
        .await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    // A different (uncached) page each time: no stale copy to fall back on.
    let page = |n: u32| Query::list("zip").size(n);

    sim.set_faults(Faults {
        kind: FaultKind::Status,
        status: Some(500),
        ..Faults::default()
    });
    let r = alpha.get(page(1)).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert!(r.json()["detail"].is_string());

    sim.set_faults(Faults {
        kind: FaultKind::Status,
        status: Some(503),
        count: Some(1),
        ..Faults::default()
    });
    let retried = alpha.get(page(2)).await;
    assert_eq!(retried.status, StatusCode::OK, "one 503 is retried away");

    sim.set_faults(Faults {
        kind: FaultKind::Hang,
        delay_ms: Some(5_000),
        ..Faults::default()
    });
    let r = alpha.get(page(3)).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    sim.clear_faults();

    drop(sim);
}

#[tokio::test]
async fn http2_cleartext_is_served() {
    use http_body_util::{BodyExt, Empty};
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let client = crate::support::probe::h2c_client();
    let req = http::Request::get(format!("{}{}", gw.base_url(), Query::meta_release()))
        .header("x-api-key", ALPHA.1)
        .body(Empty::new())
        .expect("request");
    let resp = client.request(req).await.expect("h2c request");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("released_at"));
}

#[tokio::test]
async fn admin_listener_serves_health_and_metrics_and_guards_admin() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let admin = Client::anonymous(gw.admin_url());
    assert_eq!(admin.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(readyz(&gw.admin_url()).await.status, StatusCode::OK);
    let _ = Client::new(gw.base_url(), ALPHA.1).get(Query::meta_release()).await;
    let metrics = metrics_text(&gw.admin_url()).await;
    assert!(
        metrics
            .contains("gateway_requests_total{cache=\"miss\",route=\"meta_release\",status=\"200\",team=\"alpha\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("gateway_request_duration_seconds_bucket"));
    assert!(metrics.contains("gateway_build_info"));
    assert_eq!(admin.get("/admin/teams").await.status, StatusCode::UNAUTHORIZED);
    let wrong = Client::bearer(gw.admin_url(), "nope").get("/admin/teams").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let teams = Client::bearer(gw.admin_url(), ADMIN_TOKEN).get("/admin/teams").await;
    assert_eq!(teams.status, StatusCode::OK);
    // The team listener does not serve admin paths.
    let via_team = Client::anonymous(gw.base_url()).get("/metrics").await;
    assert_eq!(via_team.status, StatusCode::NOT_FOUND);
}
