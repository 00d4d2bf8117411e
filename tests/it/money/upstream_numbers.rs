//! The upstream's numbers are distrusted: `Retry-After` is clamped, the fair
//! queue's wait is bounded, and budgets hold through the pause (cases 3, 5).

use super::{redis_for, replicas};
use crate::support::gateway::{team, Setup, ALPHA, SMALL};
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults};
use crate::support::traffic::{as_team, assert_ledger_matches, charged_to, distinct_search};
use crate::support::wait::eventually;
use http::StatusCode;
use std::time::{Duration, Instant};

/// Cases 3 and 5: the upstream's `Retry-After` is clamped, a queued call
/// waits at most `max_queue_wait_secs`, and reservations held through the
/// pause never let a team past its limit.
async fn retry_after_is_bounded_and_the_budget_holds(n: usize) {
    let redis = redis_for(n);
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new()
        .teams(team(SMALL.0, SMALL.1, "credit_limit = 100") + &team(ALPHA.0, ALPHA.1, ""))
        .with(
            "upstream",
            "max_retry_after_secs = 2\nmax_queue_wait_secs = 3\nmax_retries = 0",
        );
    let gws = replicas(n, &sim, redis.as_ref(), setup).await;
    sim.set_faults(Faults {
        status: Some(429),
        retry_after_secs: Some(100_000),
        count: Some(1),
        ..fault(FaultKind::Status)
    });
    let refused = as_team(
        &format!("{}{}", gws[0].base_url(), distinct_search(&sim, 0, 10)),
        SMALL.1,
        "small-0",
    )
    .await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after = refused.header_u64("retry-after").expect("429 has Retry-After");
    assert!((1..=2).contains(&retry_after), "clamped: {retry_after}");
    // Four 40-credit calls against a 100 budget, queued behind the pause.
    let started = Instant::now();
    let calls: Vec<_> = (1..5)
        .map(|i| {
            let url = format!("{}{}", gws[i as usize % n].base_url(), distinct_search(&sim, i, 40));
            tokio::spawn(async move { as_team(&url, SMALL.1, &format!("small-{i}")).await })
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
    let free = format!("{}{}", gws[0].base_url(), distinct_search(&sim, 50, 1));
    eventually("the pause ends", Duration::from_secs(6), || async {
        let r = as_team(&free, ALPHA.1, "alpha-after").await;
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
        .with(
            "upstream",
            "max_retry_after_secs = 1\nmax_retries = 1\ntimeout_secs = 5",
        )
        .start(&sim)
        .await;
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
        let url = format!("{}{}", gw.base_url(), distinct_search(&sim, i as u32, 5));
        let r = as_team(&url, ALPHA.1, &format!("alpha-{i}")).await;
        assert_ne!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{status} {value}");
        if let Some(secs) = r.header_u64("retry-after") {
            assert!(secs <= 1, "Retry-After passed on clamped: {secs}");
        }
        sim.clear_faults();
        eventually("the gateway serves again", Duration::from_secs(4), || async {
            as_team(&url, ALPHA.1, &format!("alpha-{i}-again")).await.status == StatusCode::OK
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
        .with("upstream", "max_response_bytes = 2048\nmax_retries = 0")
        .start(&sim)
        .await;
    sim.set_faults(Faults {
        count: Some(1),
        ..fault(FaultKind::MissingCredits)
    });
    let url = format!("{}{}", gw.base_url(), distinct_search(&sim, 0, 10));
    let r = as_team(&url, ALPHA.1, "alpha-1").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(charged_to(&sim, "alpha-"), 10, "the upstream billed the call");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    let metrics = crate::support::http::get(&format!("{}/metrics", gw.admin_url()), &[])
        .await
        .text();
    assert!(
        metrics.contains("gateway_credit_anomalies_total{team=\"alpha\"} 1"),
        "the anomaly is counted"
    );
}
