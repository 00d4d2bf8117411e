//! Issue 39, headers that tell the truth: what a billed failure cost is in
//! its answer and its access line (point 5), and a 402's
//! `X-Credits-Remaining` is the budget net of the holds in flight (point 6).

use super::replicas;
use crate::support::gateway::{team, ChildGateway, Setup, ALPHA, SMALL};
use crate::support::http::{get, Reply};
use crate::support::redis::RedisServer;
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim};
use crate::support::traffic::{as_team, assert_ledger_matches, charged_for, distinct_search, ledger_used};
use crate::support::wait::eventually;
use http::StatusCode;
use std::time::Duration;

fn truncated_once() -> Faults {
    Faults {
        count: Some(1),
        ..fault(FaultKind::Truncated)
    }
}

/// The access line of `request_id`, once it is written.
async fn access_line(gw: &ChildGateway, request_id: &str) -> serde_json::Value {
    let what = format!("the access-log line of {request_id}");
    eventually(&what, Duration::from_secs(10), || {
        let found = gw.access_lines().into_iter().find(|l| l["request_id"] == request_id);
        async move { found }
    })
    .await
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
    let line = access_line(gw, request_id).await;
    assert_eq!(line["credits"].as_u64(), Some(cost), "{request_id}: {line}");
}

/// A billed 200 whose body is cut (the upstream sends half of it): 502
/// without a stale copy, STALE with one; both say what the upstream
/// charged, in `X-Credits-Request` and in the access line's `credits`.
#[tokio::test]
async fn a_billed_cut_body_shows_its_charge_in_the_answer_and_the_access_line() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new()
        .with("upstream", "max_retries = 0")
        .with("cache", "[cache.route_ttl_secs]\npermits_search = 1");
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    // No copy held: 502, billed 7.
    let cold = format!("{}{}", gw.base_url(), distinct_search(&sim, 0, 7));
    sim.set_faults(truncated_once());
    let cut = as_team(&cold, ALPHA.1, "alpha-cut").await;
    assert_eq!(cut.status, StatusCode::BAD_GATEWAY, "{}", cut.text());
    assert_cost_told(&sim, &gw, "alpha-cut", &cut, 7).await;
    // A copy held, expired: STALE, billed 9 for the cut refresh.
    let held = format!("{}{}", gw.base_url(), distinct_search(&sim, 1, 9));
    assert_eq!(
        as_team(&held, ALPHA.1, "alpha-buy").await.header("x-cache"),
        Some("MISS")
    );
    eventually("the entry expires", Duration::from_secs(10), || async {
        let r = get(&held, &[("x-api-key", ALPHA.1), ("cache-control", "only-if-cached")]).await;
        r.status != StatusCode::OK
    })
    .await;
    sim.set_faults(truncated_once());
    let stale = as_team(&held, ALPHA.1, "alpha-stale").await;
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
    let setup = Setup::new().teams(team(SMALL.0, SMALL.1, "credit_limit = 50"));
    let gws = replicas(2, &sim, Some(&redis), setup).await;
    sim.set_faults(Faults {
        latency_ms: Some(2_000),
        count: Some(1),
        ..fault(FaultKind::Latency)
    });
    let slow = format!("{}{}", gws[0].base_url(), distinct_search(&sim, 0, 40));
    let call = tokio::spawn(async move { as_team(&slow, SMALL.1, "small-slow").await });
    let client = redis::Client::open(redis.url()).expect("redis url");
    eventually("the slow call holds 40", Duration::from_secs(5), || {
        let client = client.clone();
        async move {
            let mut c = client.get_multiplexed_async_connection().await.ok()?;
            let n: u64 = redis::cmd("HLEN")
                .arg("pgw:l:{small}:held")
                .query_async(&mut c)
                .await
                .ok()?;
            (n > 0).then_some(())
        }
    })
    .await;
    let before = sim.stats().requests_total;
    for (i, gw) in gws.iter().enumerate() {
        let url = format!("{}{}", gw.base_url(), distinct_search(&sim, 1 + i as u32, 15));
        let refused = as_team(&url, SMALL.1, &format!("small-refused-{i}")).await;
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
