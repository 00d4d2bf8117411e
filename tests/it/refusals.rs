//! No call spent on an answer already known: a query the vendor's OpenAPI
//! says it will refuse (a required parameter missing) is refused by the
//! gateway in the vendor's own 422 shape without a call, and a query the
//! upstream refused is refused again, for `cache.refusal_ttl_secs`, without
//! another: an app retrying a bad request in a loop costs the company at
//! most one of its calls a minute.

use crate::support::client::Client;
use crate::support::gateway::{Setup, ALPHA};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, Sim};
use http::StatusCode;

/// A permit search, with `geo_id` as given (`None`: left out).
fn search(sim: &Sim, geo_id: Option<&str>) -> Query {
    let s = sim.samples();
    let q = Query::new("/v2/permits/search")
        .param("permit_from", &s.permit_from)
        .param("permit_to", &s.permit_to);
    // Only what the test is about: the required geo_id, or a value of it.
    match geo_id {
        Some(g) => q.param("geo_id", g),
        None => q,
    }
}

/// Asks `q` five times through the gateway: each answer the simulator's own
/// 422, as JSON; returns the upstream calls the five cost.
async fn five_times(sim: &Sim, gw: &permit_gateway::Running, q: &Query) -> u64 {
    let want = Client::upstream(sim).get(q).await;
    assert_eq!(want.status, StatusCode::UNPROCESSABLE_ENTITY, "{q}: {}", want.text());
    let calls = sim.stats().requests_total;
    for _ in 0..5 {
        let r = Client::new(gw.base_url(), ALPHA.1).get(q).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{q}: {}", r.text());
        assert_eq!(r.json(), want.json(), "{q}: the vendor's own 422");
    }
    sim.stats().requests_total - calls
}

#[tokio::test]
async fn a_query_missing_a_required_parameter_costs_no_upstream_call() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    assert_eq!(five_times(&sim, &gw, &search(&sim, None)).await, 0);
    let two = Query::new("/v2/permits/search")
        .param("permit_from", &sim.samples().permit_from)
        .param("size", 0);
    assert_eq!(
        five_times(&sim, &gw, &two).await,
        0,
        "every violation, in the vendor's order"
    );
    // A value the upstream checks in ways its OpenAPI does not say (a
    // geography) beside a missing one: the upstream reports both, once.
    let mixed = Query::new("/v2/permits/search").param("geo_id", "ZZ");
    assert_eq!(five_times(&sim, &gw, &mixed).await, 1);
}

#[tokio::test]
async fn a_value_the_upstream_refuses_costs_one_call_however_often_it_is_retried() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let bad = search(&sim, Some("ZZ"));
    assert!(five_times(&sim, &gw, &bad).await <= 1);
    // Without the memo each retry is a call.
    let every = Setup::new().with(|c| c.cache.refusal_ttl_secs = 0).start(&sim).await;
    assert_eq!(five_times(&sim, &every, &bad).await, 5);
    // A purge drops what was kept.
    let admin = Client::admin(gw.admin_url()).post("/admin/cache/purge?all=true").await;
    assert_eq!(admin.status, StatusCode::OK, "{}", admin.text());
    assert_eq!(five_times(&sim, &gw, &bad).await, 1);
}

/// Issue 57: a refusal kept from an earlier call answers without a call,
/// but it is no hit of any data: `X-Cache: BYPASS`, counted under
/// `cache="bypass"`, never `HIT`.
#[tokio::test]
async fn a_kept_refusal_is_not_reported_as_a_hit() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let q = search(&sim, Some("ZZ"));
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let first = alpha.get(&q).await;
    assert_eq!(first.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", first.text());
    assert_eq!(first.header("x-cache"), Some("MISS"), "the upstream's own refusal");
    let calls = sim.stats().requests_total;
    let again = alpha.get(&q).await;
    assert_eq!(again.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(again.json(), first.json());
    assert_eq!(sim.stats().requests_total, calls, "kept: no call");
    assert_eq!(again.header("x-cache"), Some("BYPASS"), "a kept refusal is no hit");
    let m = crate::support::probe::scrape(&gw.admin_url()).await;
    let hits = m.sum("gateway_requests_total", &[("team", "alpha"), ("cache", "hit")]);
    assert_eq!(hits, 0.0, "no hit counted");
}
