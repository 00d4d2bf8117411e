//! The smaller edges (case 8), one key's header names (issue 20) and the
//! reconciliation of the org's spend with the team ledgers.

use super::{fault, wait_until};
use crate::support::gateway::{Setup, ALPHA, BETA};
use crate::support::http::{get, send, Reply};
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, SimConfig};
use crate::support::traffic::{as_team, assert_ledger_matches, charged_to, distinct_search, ledger_used};
use bytes::Bytes;
use http::{Method, StatusCode};
use std::time::Duration;

/// Case 8: a HEAD never buys anything; it is answered from the cache.
#[tokio::test]
async fn a_head_miss_is_not_a_paid_get() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let url = format!("{}{}", gw.base_url(), distinct_search(&sim, 0, 10));
    let head = || send(Method::HEAD, &url, &[("x-api-key", ALPHA.1)], Bytes::new());
    let miss = head().await;
    assert_eq!(miss.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(sim.stats().requests_total, 0, "nothing went upstream");
    assert_eq!(as_team(&url, ALPHA.1, "alpha-1").await.status, StatusCode::OK);
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
    let gw = Setup::new()
        .with(
            "cache",
            "stale_while_revalidate_secs = 600\n[cache.route_ttl_secs]\npermits_search = 1",
        )
        .with("upstream", "max_retries = 0")
        .start(&sim)
        .await;
    let url = format!("{}{}", gw.base_url(), distinct_search(&sim, 0, 10));
    assert_eq!(as_team(&url, ALPHA.1, "alpha-0").await.header("x-cache"), Some("MISS"));
    let only_cached = || get(&url, &[("x-api-key", ALPHA.1), ("cache-control", "only-if-cached")]);
    wait_until("the entry expires", Duration::from_secs(5), || async {
        only_cached().await.header("x-cache") == Some("STALE")
    })
    .await;
    sim.set_faults(Faults {
        status: Some(500),
        ..fault(FaultKind::Status)
    });
    for i in 1..6 {
        let r = as_team(&url, ALPHA.1, &format!("alpha-{i}")).await;
        assert_eq!(r.header("x-cache"), Some("STALE"));
        assert_eq!(
            r.header_u64("x-credits-request"),
            Some(0),
            "the stale answer itself is free"
        );
    }
    wait_until(
        "the one refresh reached the upstream",
        Duration::from_secs(5),
        || async { sim.stats().requests_total == 2 },
    )
    .await;
    let settled = as_team(&url, ALPHA.1, "alpha-9").await;
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
    let gw = Setup::new()
        .with(
            "cache",
            "stale_while_revalidate_secs = 600\n[cache.route_ttl_secs]\npermits_search = 1",
        )
        .start(&sim)
        .await;
    let url = format!("{}{}", gw.base_url(), distinct_search(&sim, 0, 10));
    assert_eq!(as_team(&url, ALPHA.1, "alpha-0").await.header("x-cache"), Some("MISS"));
    wait_until("the entry expires", Duration::from_secs(5), || async {
        get(&url, &[("x-api-key", ALPHA.1), ("cache-control", "only-if-cached")])
            .await
            .header("x-cache")
            == Some("STALE")
    })
    .await;
    let stale = as_team(&url, ALPHA.1, "alpha-1").await;
    assert_eq!(stale.header("x-cache"), Some("STALE"));
    assert_eq!(stale.header_u64("x-credits-request"), Some(0));
    wait_until("the refresh is settled", Duration::from_secs(5), || async {
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
        .with("cache", "[cache.route_ttl_secs]\npermits_search = 1")
        .with("upstream", "max_retries = 0")
        .start(&sim)
        .await;
    let url = format!("{}{}", gw.base_url(), distinct_search(&sim, 0, 10));
    let names = |r: &Reply| {
        let mut n: Vec<String> = r.headers.keys().map(|k| k.to_string()).collect();
        n.sort();
        n
    };
    let miss = as_team(&url, ALPHA.1, "alpha-0").await;
    let hit = as_team(&url, ALPHA.1, "alpha-1").await;
    wait_until("the entry expires", Duration::from_secs(5), || async {
        get(
            &url,
            &[("x-api-key", ALPHA.1), ("cache-control", "max-stale, only-if-cached")],
        )
        .await
        .header("x-cache")
            == Some("STALE")
    })
    .await;
    sim.set_faults(Faults {
        status: Some(500),
        ..fault(FaultKind::Status)
    });
    let stale = as_team(&url, ALPHA.1, "alpha-2").await;
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
    let base = gw.base_url();
    assert_eq!(
        as_team(&format!("{base}{}", distinct_search(&sim, 0, 20)), ALPHA.1, "alpha-0")
            .await
            .status,
        StatusCode::OK
    );
    // Someone else spends 7 credits with the org's key, behind our back.
    let direct = get(
        &format!("{}{}", sim.base_url(), distinct_search(&sim, 1, 7)),
        &[("x-api-key", sim.api_key())],
    )
    .await;
    assert_eq!(direct.status, StatusCode::OK);
    assert_eq!(
        as_team(&format!("{base}{}", distinct_search(&sim, 2, 5)), BETA.1, "beta-0")
            .await
            .status,
        StatusCode::OK
    );
    let metrics = get(&format!("{}/metrics", gw.admin_url()), &[]).await.text();
    let untracked = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gateway_untracked_credits "))
        .expect("gauge exported");
    assert_eq!(untracked.trim(), "7");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha", "beta"]).await;
}
