//! A call's life belongs to no request: a client that hangs up, a body that
//! fails after a billed head, Redis restarting under a settle (cases 1, 2, 4).

use crate::support::client::Client;
use crate::support::gateway::{replicas, Setup, ALPHA, BETA};
use crate::support::redis::RedisServer;
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults};
use crate::support::traffic::{assert_ledger_matches, charged_to, distinct_search, ledger_used};
use crate::support::wait::eventually;
use http::StatusCode;
use std::future::IntoFuture;
use std::time::Duration;

/// Case 1: the call belongs to no request. A client that hangs up neither
/// cancels it nor lets the next caller buy the key a second time.
async fn a_hang_up_buys_nothing_twice(n: usize) {
    let redis = RedisServer::for_replicas(n);
    let sim = start_sim(unlimited()).await;
    let gws = replicas(n, &sim, redis.as_ref(), Setup::new()).await;
    let query = distinct_search(&sim, 0, 20);
    sim.set_faults(Faults {
        latency_ms: Some(1_500),
        ..fault(FaultKind::Latency)
    });
    let first = Client::new(gws[0].base_url(), ALPHA.1);
    let call = first.get(&query).request_id("alpha-1").into_future();
    let hung_up = tokio::time::timeout(Duration::from_millis(300), call).await;
    assert!(hung_up.is_err(), "the client gave up before the upstream answered");
    let other = Client::new(gws[n - 1].base_url(), BETA.1);
    let r = other.get(&query).request_id("beta-1").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-cache"), Some("HIT"), "beta got the running call's answer");
    assert_eq!(r.header_u64("x-credits-request"), Some(0));
    let again = first.get(&query).request_id("alpha-2").await;
    assert_eq!(
        again.header("x-cache"),
        Some("HIT"),
        "the retry after the timeout is free"
    );
    assert_eq!(sim.stats().requests_total, 1, "one upstream call for the key");
    assert_eq!(charged_to(&sim, "alpha-"), 20, "the hung-up caller's team paid");
    assert_ledger_matches(&sim, &gws[0].admin_url(), &["alpha", "beta"]).await;
}

#[tokio::test]
async fn a_client_that_hangs_up_does_not_buy_the_key_twice() {
    a_hang_up_buys_nothing_twice(1).await;
}

#[tokio::test]
async fn a_client_that_hangs_up_does_not_buy_the_key_twice_across_replicas() {
    a_hang_up_buys_nothing_twice(2).await;
}

/// Case 2: an answer billed in its headers whose body then fails (the
/// whole-call deadline) is settled, not released, and never cached.
async fn a_billed_answer_is_settled_when_its_body_fails(n: usize) {
    let redis = RedisServer::for_replicas(n);
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().one_attempt(1);
    let gws = replicas(n, &sim, redis.as_ref(), setup).await;
    let query = distinct_search(&sim, 1, 20);
    sim.set_faults(Faults {
        delay_ms: Some(3_000),
        count: Some(1),
        ..fault(FaultKind::SlowBody)
    });
    let cut = Client::new(gws[0].base_url(), ALPHA.1)
        .get(&query)
        .request_id("alpha-1")
        .await;
    assert_eq!(cut.status, StatusCode::GATEWAY_TIMEOUT, "{}", cut.text());
    assert_eq!(charged_to(&sim, "alpha-"), 20, "the upstream billed the cut answer");
    assert_eq!(
        cut.header_u64("x-credits-request"),
        Some(20),
        "the error says what it cost"
    );
    assert_eq!(
        ledger_used(&gws[0].admin_url(), "alpha").await,
        20,
        "and so did the ledger"
    );
    let next = Client::new(gws[n - 1].base_url(), ALPHA.1)
        .get(&query)
        .request_id("alpha-2")
        .await;
    assert_eq!(next.header("x-cache"), Some("MISS"), "the cut answer was not cached");
    assert_ledger_matches(&sim, &gws[0].admin_url(), &["alpha"]).await;
}

#[tokio::test]
async fn a_billed_answer_whose_body_fails_is_settled_not_released() {
    a_billed_answer_is_settled_when_its_body_fails(1).await;
}

#[tokio::test]
async fn a_billed_answer_whose_body_fails_is_settled_across_replicas() {
    a_billed_answer_is_settled_when_its_body_fails(2).await;
}

/// Issue 24, point 4: a billed answer whose body fails, for a key with a
/// stale copy. The stale copy answers, and says (as the ledger does) what
/// the failed call cost.
#[tokio::test]
async fn a_stale_copy_for_a_billed_failure_says_what_it_cost() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .one_attempt(1)
        .route_ttl("permits_search", 1)
        .start(&sim)
        .await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let query = distinct_search(&sim, 2, 20);
    assert_eq!(alpha.get(&query).request_id("alpha-1").await.x_cache(), Some("MISS"));
    alpha.wait_expired(&query).await;
    sim.set_faults(Faults {
        delay_ms: Some(3_000),
        count: Some(1),
        ..fault(FaultKind::SlowBody)
    });
    let stale = alpha.get(&query).request_id("alpha-2").await;
    assert_eq!(stale.status, StatusCode::OK, "{}", stale.text());
    assert_eq!(stale.header("x-cache"), Some("STALE"));
    assert_eq!(charged_to(&sim, "alpha-2"), 20, "the upstream billed the cut answer");
    assert_eq!(
        stale.header_u64("x-credits-request"),
        Some(20),
        "and the answer says so"
    );
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, 40);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

/// Case 4: Redis restarts while a call is in flight; the settle is retried
/// until it lands, once.
async fn a_redis_restart_mid_call_loses_no_spend(n: usize) {
    let mut redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let gws = replicas(n, &sim, Some(&redis), Setup::new()).await;
    sim.set_faults(Faults {
        latency_ms: Some(1_500),
        count: Some(1),
        ..fault(FaultKind::Latency)
    });
    let call = Client::new(gws[0].base_url(), ALPHA.1)
        .get(distinct_search(&sim, 0, 20))
        .request_id("alpha-1")
        .spawn();
    redis
        .wait_held("alpha", "the call holds its reservation", Duration::from_secs(5))
        .await;
    redis.restart();
    let r = call.await.expect("call");
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(charged_to(&sim, "alpha-"), 20);
    eventually("the settle lands", Duration::from_secs(10), || async {
        ledger_used(&gws[n - 1].admin_url(), "alpha").await == 20
    })
    .await;
    assert_ledger_matches(&sim, &gws[n - 1].admin_url(), &["alpha"]).await;
}

#[tokio::test]
async fn a_redis_restart_mid_call_settles_the_spend() {
    a_redis_restart_mid_call_loses_no_spend(1).await;
}

#[tokio::test]
async fn a_redis_restart_mid_call_settles_the_spend_across_replicas() {
    a_redis_restart_mid_call_loses_no_spend(2).await;
}
