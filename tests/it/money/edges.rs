//! The smaller edges (case 8), one key's header names (issue 20) and the
//! reconciliation of the org's spend with the team ledgers.

use super::revalidating;
use crate::support::client::Client;
use crate::support::gateway::{Setup, ALPHA, BETA};
use crate::support::http::Reply;
use crate::support::probe::metrics_text;
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, SimConfig};
use crate::support::traffic::{assert_ledger_matches, charged_to, distinct_search, ledger_used};
use crate::support::wait::eventually;
use http::{Method, StatusCode};
use std::time::Duration;

/// Case 8: a HEAD never buys anything; it is answered from the cache.
#[tokio::test]
async fn a_head_miss_is_not_a_paid_get() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let query = distinct_search(&sim, 0, 10);
    let head = || alpha.send(Method::HEAD, &query);
    let miss = head().await;
    assert_eq!(miss.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(sim.stats().requests_total, 0, "nothing went upstream");
    assert_eq!(alpha.get(&query).request_id("alpha-1").await.status, StatusCode::OK);
    let hit = head().await;
    assert_eq!((hit.status, hit.header("x-cache")), (StatusCode::OK, Some("HIT")));
    assert!(hit.body.is_empty());
    assert_eq!(sim.stats().requests_total, 1);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

/// Case 8: a stale-while-revalidate refresh that stores nothing does not
/// start another paid refresh on every request; what refreshes cost is in
/// the team's ledger.
#[tokio::test]
async fn a_failed_background_refresh_is_not_repeated_on_every_request() {
    let sim = start_sim(unlimited()).await;
    let gw = revalidating().with(|c| c.upstream.max_retries = 0).start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let query = distinct_search(&sim, 0, 10);
    assert_eq!(alpha.get(&query).request_id("alpha-0").await.x_cache(), Some("MISS"));
    alpha.wait_expired(&query).await;
    sim.set_faults(Faults {
        status: Some(500),
        ..fault(FaultKind::Status)
    });
    for i in 1..6 {
        let r = alpha.get(&query).request_id(&format!("alpha-{i}")).await;
        assert_eq!(r.header("x-cache"), Some("STALE"));
        assert_eq!(
            r.header_u64("x-credits-request"),
            Some(0),
            "the stale answer itself is free"
        );
    }
    eventually(
        "the one refresh reached the upstream",
        Duration::from_secs(5),
        || async { sim.stats().requests_total == 2 },
    )
    .await;
    let settled = alpha.get(&query).request_id("alpha-9").await;
    assert_eq!(settled.header("x-cache"), Some("STALE"));
    assert_eq!(sim.stats().requests_total, 2, "one refresh, not one per request");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

/// Case 8: a stale-while-revalidate refresh is a paid miss of the team
/// that started it: the stale answer itself says 0 credits (it cost
/// nothing), and the refresh's charge is in that team's ledger, exactly.
#[tokio::test]
async fn a_background_refresh_is_charged_to_the_team_that_started_it() {
    let sim = start_sim(unlimited()).await;
    let gw = revalidating().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let query = distinct_search(&sim, 0, 10);
    assert_eq!(alpha.get(&query).request_id("alpha-0").await.x_cache(), Some("MISS"));
    alpha.wait_expired(&query).await;
    let stale = alpha.get(&query).request_id("alpha-1").await;
    assert_eq!(stale.header("x-cache"), Some("STALE"));
    assert_eq!(stale.header_u64("x-credits-request"), Some(0));
    eventually("the refresh is settled", Duration::from_secs(5), || async {
        ledger_used(&gw.admin_url(), "alpha").await == 20
    })
    .await;
    assert_eq!(
        charged_to(&sim, "alpha-1"),
        10,
        "the refresh went out under the stale request's id"
    );
    assert_eq!(sim.stats().requests_total, 2, "the miss and one refresh");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

/// Issue 20, item 2: one key's MISS, HIT and STALE answers carry the same
/// header names, none of them the upstream's own.
#[tokio::test]
async fn miss_hit_and_stale_carry_the_same_header_names() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .route_ttl("permits_search", 1)
        .with(|c| c.upstream.max_retries = 0)
        .start(&sim)
        .await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let query = distinct_search(&sim, 0, 10);
    let names = |r: &Reply| {
        let mut n: Vec<String> = r.headers.keys().map(|k| k.to_string()).collect();
        n.sort();
        n
    };
    let miss = alpha.get(&query).request_id("alpha-0").await;
    let hit = alpha.get(&query).request_id("alpha-1").await;
    alpha.wait_expired(&query).await;
    sim.set_faults(Faults {
        status: Some(500),
        ..fault(FaultKind::Status)
    });
    let stale = alpha.get(&query).request_id("alpha-2").await;
    assert_eq!(
        [miss.header("x-cache"), hit.header("x-cache"), stale.header("x-cache")],
        [Some("MISS"), Some("HIT"), Some("STALE")]
    );
    assert_eq!(names(&miss), names(&hit));
    assert_eq!(names(&miss), names(&stale));
    for upstream_only in ["server", "x-credits-limit", "x-credits-remaining", "set-cookie"] {
        assert!(miss.header(upstream_only).is_none(), "{upstream_only} leaked on a MISS");
    }
}

/// Reconciliation: credits the upstream charged the org that no team
/// ledger holds show in `gateway_untracked_credits`.
#[tokio::test]
async fn spend_outside_the_ledgers_shows_as_untracked_credits() {
    let sim = start_sim(SimConfig {
        credit_limit: Some(1_000_000),
        ..unlimited()
    })
    .await;
    let gw = Setup::new().start(&sim).await;
    let (alpha, beta) = (Client::new(gw.base_url(), ALPHA.1), Client::new(gw.base_url(), BETA.1));
    let r = alpha.get(distinct_search(&sim, 0, 20)).request_id("alpha-0").await;
    assert_eq!(r.status, StatusCode::OK);
    // Someone else spends 7 credits with the org's key, behind our back.
    let direct = Client::upstream(&sim).get(distinct_search(&sim, 1, 7)).await;
    assert_eq!(direct.status, StatusCode::OK);
    let r = beta.get(distinct_search(&sim, 2, 5)).request_id("beta-0").await;
    assert_eq!(r.status, StatusCode::OK);
    let metrics = metrics_text(&gw.admin_url()).await;
    let untracked = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gateway_untracked_credits "))
        .expect("gauge exported");
    assert_eq!(untracked.trim(), "7");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha", "beta"]).await;
}
