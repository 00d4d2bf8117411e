//! The upstream's numbers are distrusted: `Retry-After` is clamped, the fair
//! queue's wait is bounded, and budgets hold through the pause (cases 3, 5).

use crate::support::client::Client;
use crate::support::gateway::{replicas, Setup, ALPHA, SMALL};
use crate::support::probe::metrics_text;
use crate::support::redis::RedisServer;
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults};
use crate::support::traffic::{assert_ledger_matches, charged_to, distinct_search};
use crate::support::wait::eventually;
use http::StatusCode;
use std::time::{Duration, Instant};

/// Cases 3 and 5: the upstream's `Retry-After` is clamped, a queued call
/// waits at most `max_queue_wait_secs`, and reservations held through the
/// pause never let a team past its limit.
async fn retry_after_is_bounded_and_the_budget_holds(n: usize) {
    let redis = RedisServer::for_replicas(n);
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[SMALL, ALPHA]).credit_limit(SMALL, 100).with(|c| {
        c.upstream.max_retry_after_secs = 2;
        c.upstream.max_queue_wait_secs = 3;
        c.upstream.max_retries = 0;
    });
    let gws = replicas(n, &sim, redis.as_ref(), setup).await;
    let small = |i: usize| Client::new(gws[i % n].base_url(), SMALL.1);
    sim.set_faults(Faults {
        status: Some(429),
        retry_after_secs: Some(100_000),
        count: Some(1),
        ..fault(FaultKind::Status)
    });
    let refused = small(0).get(distinct_search(&sim, 0, 10)).request_id("small-0").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after = refused.header_u64("retry-after").expect("429 has Retry-After");
    assert!((1..=2).contains(&retry_after), "clamped: {retry_after}");
    // Four 40-credit calls against a 100 budget, queued behind the pause.
    let started = Instant::now();
    let calls: Vec<_> = (1..5)
        .map(|i| {
            small(i as usize)
                .get(distinct_search(&sim, i, 40))
                .request_id(&format!("small-{i}"))
                .spawn()
        })
        .collect();
    let mut ok = 0;
    for call in calls {
        let r = call.await.expect("call");
        match r.status {
            StatusCode::OK => ok += 1,
            StatusCode::PAYMENT_REQUIRED | StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(8), "waits are bounded");
    assert!(ok <= 2, "at most two 40-credit calls fit 100 ({ok})");
    let charged = charged_to(&sim, "small-");
    assert!(charged <= 100, "never past the limit: {charged}");
    assert_ledger_matches(&sim, &gws[0].admin_url(), &["small"]).await;
    // Uncached calls of every team flow again once the clamped pause is over.
    let alpha = Client::new(gws[0].base_url(), ALPHA.1);
    let free = distinct_search(&sim, 50, 1);
    eventually("the pause ends", Duration::from_secs(6), || async {
        let r = alpha.get(&free).request_id("alpha-after").await;
        match r.status {
            StatusCode::OK => Ok(()),
            status => Err(format!("{status} {}", r.text())),
        }
    })
    .await;
}

#[tokio::test]
async fn retry_after_is_clamped_and_a_queued_budget_never_overspends() {
    retry_after_is_bounded_and_the_budget_holds(1).await;
}

#[tokio::test]
async fn retry_after_is_clamped_and_a_queued_budget_never_overspends_across_replicas() {
    retry_after_is_bounded_and_the_budget_holds(2).await;
}

#[tokio::test]
async fn no_retry_after_value_makes_the_gateway_fail() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| {
            c.upstream.max_retry_after_secs = 1;
            c.upstream.max_retries = 1;
            c.upstream.timeout_secs = 5;
        })
        .start(&sim)
        .await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    for (i, (status, value)) in [(503, u64::MAX), (429, u64::MAX), (503, 100_000)]
        .into_iter()
        .enumerate()
    {
        sim.set_faults(Faults {
            status: Some(status),
            retry_after_secs: Some(value),
            count: Some(1),
            ..fault(FaultKind::Status)
        });
        let query = distinct_search(&sim, i as u32, 5);
        let r = alpha.get(&query).request_id(&format!("alpha-{i}")).await;
        assert_ne!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{status} {value}");
        if let Some(secs) = r.header_u64("retry-after") {
            assert!(secs <= 1, "Retry-After passed on clamped: {secs}");
        }
        sim.clear_faults();
        eventually("the gateway serves again", Duration::from_secs(4), || async {
            let again = alpha.get(&query).request_id(&format!("alpha-{i}-again")).await;
            again.status == StatusCode::OK
        })
        .await;
    }
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

/// Issue 25, case 5: a 200 head without `X-Credits-Request` whose body
/// then fails (here: beyond `upstream.max_response_bytes`) may have been
/// billed. It is settled at its reservation and counted as an anomaly,
/// never released: the ledger errs towards counting.
#[tokio::test]
async fn an_unbilled_head_whose_body_fails_is_settled_at_its_reservation() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| {
            c.upstream.max_response_bytes = 2048;
            c.upstream.max_retries = 0;
        })
        .start(&sim)
        .await;
    sim.set_faults(Faults {
        count: Some(1),
        ..fault(FaultKind::MissingCredits)
    });
    let r = Client::new(gw.base_url(), ALPHA.1)
        .get(distinct_search(&sim, 0, 10))
        .request_id("alpha-1")
        .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(charged_to(&sim, "alpha-"), 10, "the upstream billed the call");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    let metrics = metrics_text(&gw.admin_url()).await;
    assert!(
        metrics.contains("gateway_credit_anomalies_total{team=\"alpha\"} 1"),
        "the anomaly is counted"
    );
}
