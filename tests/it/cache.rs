//! The credit-saving cache: what reaches the upstream, and what it costs.

use crate::support::client::{replies, Client};
use crate::support::gateway::{Setup, ALPHA, BETA};
use crate::support::probe::{metrics_text, redis_errors, wait_cache_redis_ok};
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults};
use crate::support::wait::eventually;
use http::StatusCode;
use permit_gateway::Running;
use std::time::Duration;

/// Team alpha at `gw`.
fn alpha(gw: &Running) -> Client {
    Client::new(gw.base_url(), ALPHA.1)
}

#[tokio::test]
async fn a_repeat_does_not_reach_the_upstream_and_costs_nothing() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let s = sim.samples();
    let alpha = alpha(&gw);
    let query = Query::state_permits(&s).size(7);
    let first = alpha.get(&query).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.x_cache(), Some("MISS"));
    assert_eq!(first.credits_request(), Some(7));

    let again = Client::new(gw.base_url(), BETA.1).get(&query).await;
    assert_eq!(again.x_cache(), Some("HIT"), "another team hits the same entry");
    assert_eq!(again.credits_request(), Some(0));
    assert_eq!(again.body, first.body);
    assert!(again.header_u64("age").is_some());

    // Parameter order, explicit defaults and boolean spellings hit too. The
    // reordered and the `0` spellings are written out: the spelling is what
    // is tested.
    for variant in [
        format!(
            "/v2/permits/search?size=7&permit_to={}&permit_from={}&geo_id={}",
            s.permit_to, s.permit_from, s.state
        ),
        query.clone().include_count(false).to_string(),
        format!(
            "/v2/permits/search?geo_id={}&permit_from={}&permit_to={}&size=7&include_count=0",
            s.state, s.permit_from, s.permit_to
        ),
    ] {
        let r = alpha.get(&variant).await;
        assert_eq!(r.x_cache(), Some("HIT"), "{variant}");
    }
    let default_size = alpha.get(Query::state_permits(&s).size(50)).await;
    assert_eq!(default_size.x_cache(), Some("MISS"));
    let implicit = alpha.get(Query::state_permits(&s)).await;
    assert_eq!(implicit.x_cache(), Some("HIT"), "size=50 equals no size");

    assert_eq!(sim.stats().requests_total, 2, "one upstream request per distinct query");
    let metrics = metrics_text(&gw.admin_url()).await;
    assert!(
        metrics.contains("gateway_credits_saved_total{reason=\"cache\",route=\"permits_search\",team=\"beta\"} 7"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_hundred_concurrent_identical_misses_make_one_upstream_request() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    sim.set_faults(Faults {
        kind: FaultKind::Latency,
        latency_ms: Some(300),
        ..Faults::default()
    });
    let query = Query::state_permits(&sim.samples()).size(5);
    let alpha = alpha(&gw);
    let replies = replies((0..100).map(|_| alpha.get(&query).spawn())).await;
    assert_eq!(sim.stats().requests_total, 1);
    let body = &replies[0].body;
    for r in &replies {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(&r.body, body);
    }
    let charged: u64 = replies.iter().map(|r| r.credits_request().unwrap_or(0)).sum();
    assert_eq!(charged, 5, "only the fetching request pays");
}

#[tokio::test]
async fn two_gateways_on_one_redis_share_entries_and_fetches() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    // Replicas share the Redis ledger too (a file ledger is one replica's).
    let setup = Setup::new().redis(&redis.url());
    let gw1 = setup.start(&sim).await;
    let gw2 = setup.start(&sim).await;

    let s = sim.samples();
    let (on1, on2) = (alpha(&gw1), alpha(&gw2));
    let query = Query::state_permits(&s).size(4);
    let miss = on1.get(&query).await;
    assert_eq!(miss.x_cache(), Some("MISS"));
    let hit = on2.get(&query).await;
    assert_eq!(
        hit.x_cache(),
        Some("HIT"),
        "a miss on one replica is a hit on the other"
    );
    assert_eq!(hit.body, miss.body);
    assert_eq!(sim.stats().requests_total, 1);

    // Concurrent misses across both replicas: one upstream request.
    sim.set_faults(Faults {
        kind: FaultKind::Latency,
        latency_ms: Some(400),
        ..Faults::default()
    });
    let query = Query::state_permits(&s).size(3);
    let tasks = (0..40).map(|i| {
        let replica = if i % 2 == 0 { &on1 } else { &on2 };
        replica.get(&query).spawn()
    });
    let replies = replies(tasks).await;
    assert!(replies.iter().all(|r| r.status == StatusCode::OK));
    assert_eq!(
        sim.stats().requests_total,
        2,
        "one more upstream request for the concurrent burst"
    );
}

#[tokio::test]
async fn a_dead_redis_costs_nothing_and_a_restarted_one_is_used_again() {
    let mut redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new()
        .cache_redis(&redis.url())
        .with(|c| c.cache.redis_timeout_ms = 200);
    let gw = setup.start(&sim).await;
    let other_dir = Setup::new().cache_redis(&redis.url());
    let s = sim.samples();
    let search = |size: u32| Query::state_permits(&s).size(size);
    let alpha = alpha(&gw);
    assert_eq!(alpha.get(search(2)).await.x_cache(), Some("MISS"));

    redis.kill();
    // Requests keep succeeding from memory and from the upstream.
    assert_eq!(alpha.get(search(2)).await.x_cache(), Some("HIT"));
    for size in 10..16 {
        let r = alpha.get(search(size)).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    // Once the breaker is open, Redis is not even tried: errors stop growing.
    let before = redis_errors(&gw.admin_url()).await;
    assert!(before >= 3, "redis failures were counted");
    for size in 20..30 {
        assert_eq!(alpha.get(search(size)).await.status, StatusCode::OK);
    }
    let after = redis_errors(&gw.admin_url()).await;
    assert!(
        after - before <= 2,
        "breaker open: at most a probe tried ({before} → {after})"
    );

    redis.restart();
    wait_cache_redis_ok(&gw.admin_url()).await;
    assert_eq!(alpha.get(search(31)).await.x_cache(), Some("MISS"));
    let other = other_dir.start(&sim).await;
    let r = alpha.at(other.base_url()).get(search(31)).await;
    assert_eq!(r.x_cache(), Some("HIT"), "L2 is written and read again");
}

#[tokio::test]
async fn upstream_failures_serve_a_stale_copy_or_the_mapped_error() {
    let sim = start_sim(unlimited()).await;
    // No org back-off here: each fault is its own case (the back-off has a test of its own).
    let gw = Setup::new()
        .one_attempt(1)
        .with(|c| c.upstream.exhausted_backoff_secs = 0)
        .start(&sim)
        .await;
    let s = sim.samples();
    let alpha = alpha(&gw);
    let cached = Query::state_permits(&s).size(6);
    let fresh = alpha.get(&cached).await;
    assert_eq!(fresh.x_cache(), Some("MISS"));
    let uncached = Query::state_permits(&s).size(8);
    let cases: [(Faults, StatusCode); 6] = [
        // The upstream refused the gateway's own key: an upstream failure
        // (stale if held), never the team's 401.
        (
            Faults {
                kind: FaultKind::Status,
                status: Some(401),
                ..Faults::default()
            },
            StatusCode::BAD_GATEWAY,
        ),
        (
            Faults {
                kind: FaultKind::Status,
                status: Some(403),
                ..Faults::default()
            },
            StatusCode::BAD_GATEWAY,
        ),
        (
            Faults {
                kind: FaultKind::Status,
                status: Some(500),
                ..Faults::default()
            },
            StatusCode::BAD_GATEWAY,
        ),
        (
            Faults {
                kind: FaultKind::Hang,
                delay_ms: Some(3_000),
                ..Faults::default()
            },
            StatusCode::GATEWAY_TIMEOUT,
        ),
        (
            Faults {
                kind: FaultKind::Status,
                status: Some(402),
                ..Faults::default()
            },
            StatusCode::PAYMENT_REQUIRED,
        ),
        // Last: an upstream 429 pauses every upstream call for its Retry-After.
        (
            Faults {
                kind: FaultKind::Status,
                status: Some(429),
                retry_after_secs: Some(30),
                ..Faults::default()
            },
            StatusCode::TOO_MANY_REQUESTS,
        ),
    ];
    for (fault, mapped) in cases {
        sim.set_faults(fault.clone());
        // no-cache forces the upstream call; its failure falls back to the copy.
        let stale = alpha.get(&cached).cache_control("no-cache").await;
        assert_eq!(stale.status, StatusCode::OK, "{fault:?}");
        assert_eq!(stale.x_cache(), Some("STALE"), "{fault:?}");
        assert_eq!(stale.body, fresh.body);
        assert_eq!(stale.credits_request(), Some(0));
        let failed = alpha.get(&uncached).await;
        assert_eq!(failed.status, mapped, "{fault:?}: {}", failed.text());
        if mapped == StatusCode::TOO_MANY_REQUESTS {
            assert!(failed.header_u64("retry-after").is_some_and(|s| s >= 1));
        }
        if mapped == StatusCode::PAYMENT_REQUIRED {
            assert!(failed.json()["detail"]["error"].is_string(), "402 body passes through");
        }
        if matches!(fault.status, Some(401 | 403)) {
            assert_eq!(
                failed.json()["detail"],
                "Upstream refused the gateway's credentials",
                "says what happened"
            );
        }
    }
    sim.clear_faults();
}

#[tokio::test]
async fn expired_entries_are_kept_for_the_grace_period_and_served_on_failure() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| {
            c.cache.stale_grace_secs = 3600;
            c.upstream.max_retries = 0;
        })
        .route_ttl("meta_release", 1)
        .start(&sim)
        .await;
    let alpha = alpha(&gw);
    let release = Query::meta_release();
    assert_eq!(alpha.get(&release).await.x_cache(), Some("MISS"));
    // Wait for the entry to expire: only-if-cached stops accepting it.
    alpha.wait_expired(&release).await;
    let accepted = alpha.get(&release).cache_control("max-stale=600").await;
    assert_eq!(accepted.x_cache(), Some("STALE"), "max-stale accepts an expired entry");
    sim.set_faults(Faults {
        kind: FaultKind::Status,
        status: Some(503),
        ..Faults::default()
    });
    let stale = alpha.get(&release).await;
    assert_eq!(stale.status, StatusCode::OK);
    assert_eq!(stale.x_cache(), Some("STALE"));
    sim.clear_faults();
    let refreshed = alpha.get(&release).await;
    assert_eq!(refreshed.x_cache(), Some("MISS"), "an expired entry is refetched");
}

#[tokio::test]
async fn client_cache_control_is_honoured() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let alpha = alpha(&gw);
    let query = Query::state_permits(&sim.samples()).size(3);

    let only = alpha.get(&query).cache_control("only-if-cached").await;
    assert_eq!(only.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(sim.stats().requests_total, 0, "only-if-cached never goes upstream");

    let not_stored = alpha.get(&query).cache_control("no-store").await;
    assert_eq!(not_stored.status, StatusCode::OK);
    assert_eq!(
        alpha.get(&query).await.x_cache(),
        Some("MISS"),
        "no-store was not stored"
    );
    assert_eq!(alpha.get(&query).await.x_cache(), Some("HIT"));

    let bypass = alpha.get(&query).cache_control("no-cache").await;
    assert_eq!(bypass.x_cache(), Some("BYPASS"));
    assert_eq!(sim.stats().requests_total, 3);

    assert_eq!(
        alpha.get(&query).cache_control("only-if-cached").await.status,
        StatusCode::OK
    );

    // ETag and If-None-Match: 304 from the cache with no body.
    let hit = alpha.get(&query).await;
    let etag = hit.header("etag").expect("etag on hits").to_string();
    let cond = alpha.get(&query).header("if-none-match", &etag).await;
    assert_eq!(cond.status, StatusCode::NOT_MODIFIED);
    assert!(cond.body.is_empty());
}

#[tokio::test]
async fn errors_and_usage_are_never_cached_but_a_refusal_is_kept_a_while() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let alpha = alpha(&gw);
    for query in [Query::place("counties", "AAAAAAAAAAA"), Query::usage()] {
        let first = alpha.get(&query).await;
        let second = alpha.get(&query).await;
        assert_ne!(second.x_cache(), Some("HIT"), "{query}: {}", first.status);
    }
    assert_eq!(
        sim.stats().requests_total,
        2,
        "the 404 went upstream twice; usage never"
    );
    // The upstream's 422 (no permit dates: the geography is the
    // upstream's to judge, so it is asked) is kept and answered again.
    let refused = Query::permit_search("CA").size(5);
    let first = alpha.get(&refused).await;
    let second = alpha.get(&refused).await;
    assert_eq!(first.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", first.text());
    assert_eq!((second.status, second.json()), (first.status, first.json()));
    // Answered without a call, but no hit of any data (issue 57).
    assert_eq!(second.x_cache(), Some("BYPASS"));
    assert_eq!(sim.stats().requests_total, 3, "the 422 went upstream once");
}

#[tokio::test]
async fn purge_empties_both_tiers_all_or_by_route() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().cache_redis(&redis.url()).start(&sim).await;
    let alpha = alpha(&gw);
    let search = Query::state_permits(&sim.samples()).size(2);
    let release = Query::meta_release();
    alpha.get(&search).await;
    alpha.get(&release).await;
    let admin = Client::admin(gw.admin_url());
    let purge = |q: &str| admin.post(format!("/admin/cache/purge{q}"));
    assert_eq!(
        Client::anonymous(gw.admin_url())
            .post("/admin/cache/purge")
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    let by_route = purge("?route=meta_release").await;
    assert_eq!(by_route.status, StatusCode::OK);
    assert_eq!(by_route.json()["redis_keys"], 1);
    assert_eq!(alpha.get(&search).await.x_cache(), Some("HIT"));
    assert_eq!(alpha.get(&release).await.x_cache(), Some("MISS"));
    assert_eq!(purge("?route=nope").await.status, StatusCode::UNPROCESSABLE_ENTITY);
    let all = purge("?all=true").await;
    assert_eq!(
        all.json()["redis_keys"],
        4,
        "the search page, its two records, the release"
    );
    assert_eq!(alpha.get(&search).await.x_cache(), Some("MISS"));
}

#[tokio::test]
async fn stale_while_revalidate_answers_at_once_and_refreshes_once_behind() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| c.cache.stale_while_revalidate_secs = 600)
        .route_ttl("meta_release", 1)
        .start(&sim)
        .await;
    let alpha = alpha(&gw);
    let release = Query::meta_release();
    assert_eq!(alpha.get(&release).await.x_cache(), Some("MISS"));
    // Wait for expiry (only-if-cached never triggers the refresh).
    alpha.wait_expired(&release).await;
    assert_eq!(sim.stats().requests_total, 1);
    // Five callers at once: all answered from the stale copy, one refresh.
    sim.set_faults(Faults {
        kind: FaultKind::Latency,
        latency_ms: Some(300),
        ..Faults::default()
    });
    let tasks: Vec<_> = (0..5).map(|_| alpha.get(&release).spawn()).collect();
    let replies = replies(tasks).await;
    assert!(
        replies.iter().all(|r| r.x_cache() == Some("STALE")),
        "stale answers at once"
    );
    eventually("the background refresh lands", Duration::from_secs(10), || async {
        alpha.get(&release).await.x_cache() == Some("HIT")
    })
    .await;
    assert_eq!(sim.stats().requests_total, 2, "one fetch, one background refresh");
}
