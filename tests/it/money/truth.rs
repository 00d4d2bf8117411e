//! Issue 39, headers that tell the truth: what a billed failure cost is in
//! its answer and its access line (point 5), and a 402's
//! `X-Credits-Remaining` is the budget net of the holds in flight (point 6).

use crate::support::client::Client;
use crate::support::gateway::{replicas, ChildGateway, Setup, ALPHA, SMALL};
use crate::support::http::Reply;
use crate::support::redis::RedisServer;
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim};
use crate::support::traffic::{assert_ledger_matches, charged_for, distinct_search, ledger_used};
use http::StatusCode;
use std::time::Duration;

fn truncated_once() -> Faults {
    Faults {
        count: Some(1),
        ..fault(FaultKind::Truncated)
    }
}

/// The answer, the access line and the upstream agree on what `request_id`
/// cost, and it is not 0.
async fn assert_cost_told(sim: &Sim, gw: &ChildGateway, request_id: &str, reply: &Reply, cost: u64) {
    assert_eq!(
        charged_for(sim, request_id),
        cost,
        "{request_id}: the upstream billed it"
    );
    assert_eq!(
        reply.header_u64("x-credits-request"),
        Some(cost),
        "{request_id}: the answer says what it cost"
    );
    let line = gw.access_line(request_id).await;
    assert_eq!(line["credits"].as_u64(), Some(cost), "{request_id}: {line}");
}

/// A billed 200 whose body is cut (the upstream sends half of it): 502
/// without a stale copy, STALE with one; both say what the upstream
/// charged, in `X-Credits-Request` and in the access line's `credits`.
#[tokio::test]
async fn a_billed_cut_body_shows_its_charge_in_the_answer_and_the_access_line() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new()
        .with(|c| c.upstream.max_retries = 0)
        .route_ttl("permits_search", 1);
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    // No copy held: 502, billed 7.
    let cold = distinct_search(&sim, 0, 7);
    sim.set_faults(truncated_once());
    let cut = alpha.get(&cold).request_id("alpha-cut").await;
    assert_eq!(cut.status, StatusCode::BAD_GATEWAY, "{}", cut.text());
    assert_cost_told(&sim, &gw, "alpha-cut", &cut, 7).await;
    // A copy held, expired: STALE, billed 9 for the cut refresh.
    let held = distinct_search(&sim, 1, 9);
    assert_eq!(alpha.get(&held).request_id("alpha-buy").await.x_cache(), Some("MISS"));
    alpha.wait_expired(&held).await;
    sim.set_faults(truncated_once());
    let stale = alpha.get(&held).request_id("alpha-stale").await;
    assert_eq!(stale.status, StatusCode::OK, "{}", stale.text());
    assert_eq!(stale.header("x-cache"), Some("STALE"));
    assert_cost_told(&sim, &gw, "alpha-stale", &stale, 9).await;
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, 7 + 9 + 9);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    gw.assert_logs_clean();
}

/// Point 6: team small (limit 50) has a 40-credit call in flight (held in
/// the shared Redis ledger, the upstream slow to answer); a 15-credit
/// request on either replica is refused, and its 402 says 10 remain
/// (50 − 0 spent − 40 held), not 50. Nothing refused reaches the upstream;
/// once the call ends the ledger is what the upstream charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_402_shows_the_budget_net_of_the_holds_in_flight() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 50);
    let gws = replicas(2, &sim, Some(&redis), setup).await;
    sim.set_faults(Faults {
        latency_ms: Some(2_000),
        count: Some(1),
        ..fault(FaultKind::Latency)
    });
    let call = Client::new(gws[0].base_url(), SMALL.1)
        .get(distinct_search(&sim, 0, 40))
        .request_id("small-slow")
        .spawn();
    redis
        .wait_held("small", "the slow call holds 40", Duration::from_secs(5))
        .await;
    let before = sim.stats().requests_total;
    for (i, gw) in gws.iter().enumerate() {
        let refused = Client::new(gw.base_url(), SMALL.1)
            .get(distinct_search(&sim, 1 + i as u32, 15))
            .request_id(&format!("small-refused-{i}"))
            .await;
        assert_eq!(
            refused.status,
            StatusCode::PAYMENT_REQUIRED,
            "replica {i}: {}",
            refused.text()
        );
        assert_eq!(refused.header("x-credits-limit"), Some("50"), "replica {i}");
        assert_eq!(
            refused.header_u64("x-credits-remaining"),
            Some(10),
            "replica {i}: 50 − 0 spent − 40 held"
        );
    }
    assert_eq!(sim.stats().requests_total, before, "no refusal reached the upstream");
    let done = call.await.expect("the slow call");
    assert_eq!(done.status, StatusCode::OK, "{}", done.text());
    assert_eq!(done.header_u64("x-credits-remaining"), Some(10));
    for gw in &gws {
        assert_eq!(ledger_used(&gw.admin_url(), SMALL.0).await, 40);
        assert_ledger_matches(&sim, &gw.admin_url(), &[SMALL.0]).await;
    }
}
