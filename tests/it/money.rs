//! The timing-fault suite (issue 13): no credit lost or overspent when
//! clients hang up, bodies fail, Redis blips, processes die or the upstream
//! lies. Each scenario ends with the upstream calls per key where
//! coalescing applies, and for every team the ledger against what the
//! simulator charged it (equal; after a crash at least that, never above
//! the limit). Where replicas matter, with one and with two.

use crate::support::gateway::{team, ChildGateway, Setup, ALPHA, BETA, SMALL};
use crate::support::http::{get, send, Reply};
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim, SimConfig};
use crate::support::traffic::{as_team, assert_ledger_matches, charged_to, distinct_search, ledger_used, used};
use bytes::Bytes;
use http::{Method, StatusCode};
use permit_gateway::Running;
use std::time::{Duration, Instant};

/// `n` gateways in front of `sim`: one alone (file ledger, no Redis), or
/// replicas sharing a Redis cache, leases and ledger.
async fn replicas(n: usize, sim: &Sim, redis: Option<&RedisServer>, setup: Setup) -> Vec<Running> {
    let setup = match redis {
        Some(r) => setup
            .with("cache", format!("redis_url = {:?}", r.url()))
            .with("quota", "store = \"redis\""),
        None => setup,
    };
    let mut gws = Vec::new();
    for _ in 0..n {
        gws.push(setup.start(sim).await);
    }
    gws
}

fn redis_for(n: usize) -> Option<RedisServer> {
    (n > 1).then(RedisServer::start)
}

fn fault(kind: FaultKind) -> Faults {
    Faults {
        kind,
        ..Faults::default()
    }
}

/// Polls `check` until it holds; fails with `what` after `limit`.
async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Case 1: the call belongs to no request. A client that hangs up neither
/// cancels it nor lets the next caller buy the key a second time.
async fn a_hang_up_buys_nothing_twice(n: usize) {
    let redis = redis_for(n);
    let sim = start_sim(unlimited()).await;
    let gws = replicas(n, &sim, redis.as_ref(), Setup::new()).await;
    let path = distinct_search(&sim, 0, 20);
    sim.set_faults(Faults {
        latency_ms: Some(1_500),
        ..fault(FaultKind::Latency)
    });
    let first = format!("{}{path}", gws[0].base_url());
    let hung_up = tokio::time::timeout(Duration::from_millis(300), as_team(&first, ALPHA.1, "alpha-1")).await;
    assert!(hung_up.is_err(), "the client gave up before the upstream answered");
    let other = format!("{}{path}", gws[n - 1].base_url());
    let r = as_team(&other, BETA.1, "beta-1").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-cache"), Some("HIT"), "beta got the running call's answer");
    assert_eq!(r.header_u64("x-credits-request"), Some(0));
    let again = as_team(&first, ALPHA.1, "alpha-2").await;
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
    let redis = redis_for(n);
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().with("upstream", "timeout_secs = 1\nmax_retries = 0");
    let gws = replicas(n, &sim, redis.as_ref(), setup).await;
    let path = distinct_search(&sim, 1, 20);
    sim.set_faults(Faults {
        delay_ms: Some(3_000),
        count: Some(1),
        ..fault(FaultKind::SlowBody)
    });
    let url = format!("{}{path}", gws[0].base_url());
    let cut = as_team(&url, ALPHA.1, "alpha-1").await;
    assert_eq!(cut.status, StatusCode::GATEWAY_TIMEOUT, "{}", cut.text());
    assert_eq!(charged_to(&sim, "alpha-"), 20, "the upstream billed the cut answer");
    assert_eq!(
        ledger_used(&gws[0].admin_url(), "alpha").await,
        20,
        "and so did the ledger"
    );
    let next = as_team(&format!("{}{path}", gws[n - 1].base_url()), ALPHA.1, "alpha-2").await;
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
    let deadline = Instant::now() + Duration::from_secs(6);
    loop {
        let r = as_team(&free, ALPHA.1, "alpha-after").await;
        if r.status == StatusCode::OK {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pause never ended: {} {}",
            r.status,
            r.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
        wait_until("the gateway serves again", Duration::from_secs(4), || async {
            as_team(&url, ALPHA.1, &format!("alpha-{i}-again")).await.status == StatusCode::OK
        })
        .await;
    }
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
    let url = format!("{}{}", gws[0].base_url(), distinct_search(&sim, 0, 20));
    let call = tokio::spawn(async move { as_team(&url, ALPHA.1, "alpha-1").await });
    let held = held_reservations(&redis, "alpha");
    wait_until("the call holds its reservation", Duration::from_secs(5), held).await;
    redis.restart();
    let r = call.await.expect("call");
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(charged_to(&sim, "alpha-"), 20);
    wait_until("the settle lands", Duration::from_secs(10), || async {
        ledger_used(&gws[n - 1].admin_url(), "alpha").await == 20
    })
    .await;
    assert_ledger_matches(&sim, &gws[n - 1].admin_url(), &["alpha"]).await;
}

/// A check that the team holds a reservation in the Redis ledger.
fn held_reservations(
    redis: &RedisServer,
    team: &str,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
    let client = redis::Client::open(redis.url()).expect("redis url");
    let key = format!("pgw:l:{{{team}}}:held");
    move || {
        let (client, key) = (client.clone(), key.clone());
        Box::pin(async move {
            let Ok(mut c) = client.get_multiplexed_async_connection().await else {
                return false;
            };
            redis::cmd("HLEN")
                .arg(&key)
                .query_async::<u64>(&mut c)
                .await
                .unwrap_or(0)
                > 0
        })
    }
}

#[tokio::test]
async fn a_redis_restart_mid_call_settles_the_spend() {
    a_redis_restart_mid_call_loses_no_spend(1).await;
}

#[tokio::test]
async fn a_redis_restart_mid_call_settles_the_spend_across_replicas() {
    a_redis_restart_mid_call_loses_no_spend(2).await;
}

/// Case 6: SIGKILL between the upstream's charge and the settle. The
/// reservations were written before the calls; after the restart they
/// count as spent: at least the charge, never above the limit.
#[tokio::test]
async fn sigkill_between_charge_and_settle_counts_the_calls_as_spent() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(team(SMALL.0, SMALL.1, "credit_limit = 100"));
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    // The upstream charges at once, then trickles the body for 20 s.
    sim.set_faults(Faults {
        delay_ms: Some(20_000),
        ..fault(FaultKind::SlowBody)
    });
    let base = gw.base_url();
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let url = format!("{base}{}", distinct_search(&sim, i, 30));
            let id = format!("small-{i}");
            tokio::spawn(async move {
                let headers = [("x-api-key", SMALL.1), ("x-request-id", id.as_str())];
                send(Method::GET, &url, &headers, Bytes::new()).await
            })
        })
        .collect();
    wait_until("three calls charged upstream", Duration::from_secs(10), || async {
        charged_to(&sim, "small-") == 90
    })
    .await;
    gw.signal("KILL");
    gw.wait_exit(Duration::from_secs(10));
    for c in calls {
        c.abort();
    }
    sim.clear_faults();
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let spent = used(&gw.base_url(), SMALL.1).await;
    assert_eq!(spent, 90, "every charged call counts (the upstream charged 90)");
    let over = as_team(
        &format!("{}{}", gw.base_url(), distinct_search(&sim, 5, 20)),
        SMALL.1,
        "small-5",
    )
    .await;
    assert_eq!(over.status, StatusCode::PAYMENT_REQUIRED, "90 + 20 > 100");
    let last = as_team(
        &format!("{}{}", gw.base_url(), distinct_search(&sim, 6, 10)),
        SMALL.1,
        "small-6",
    )
    .await;
    assert_eq!(last.status, StatusCode::OK);
    assert_eq!(
        used(&gw.base_url(), SMALL.1).await,
        100,
        "exactly the limit, never above"
    );
    assert_eq!(charged_to(&sim, "small-"), 100);
}

/// Case 7: the cross-replica lease is deleted only by its owner. A replica
/// that gave up waiting and fetched on its own leaves it, so a third
/// replica still waits for the owner instead of buying the key again.
#[tokio::test]
async fn a_lease_is_released_only_by_its_owner() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let impatient = replicas(
        2,
        &sim,
        Some(&redis),
        Setup::new().with("cache", "coalesce_wait_ms = 200"),
    )
    .await;
    let patient = replicas(
        1,
        &sim,
        Some(&redis),
        Setup::new().with("cache", "coalesce_wait_ms = 10000"),
    )
    .await;
    let path = distinct_search(&sim, 0, 10);
    sim.set_faults(Faults {
        latency_ms: Some(2_000),
        count: Some(1),
        ..fault(FaultKind::Latency)
    });
    let owner_url = format!("{}{path}", impatient[0].base_url());
    let owner = tokio::spawn(async move { as_team(&owner_url, ALPHA.1, "alpha-owner").await });
    let leases = lease_count(&redis);
    wait_until("the owner holds the lease", Duration::from_secs(5), || async {
        leases().await == 1
    })
    .await;
    // Gives up after 200 ms, fetches itself without storing, releases nothing.
    let url = format!("{}{path}", impatient[1].base_url());
    let own = get(
        &url,
        &[
            ("x-api-key", BETA.1),
            ("x-request-id", "beta-own"),
            ("cache-control", "no-store"),
        ],
    )
    .await;
    assert_eq!(own.status, StatusCode::OK);
    assert_eq!(
        leases().await,
        1,
        "the owner's lease survived the other replica's release"
    );
    let third = as_team(&format!("{}{path}", patient[0].base_url()), BETA.1, "beta-third").await;
    assert_eq!(
        third.header("x-cache"),
        Some("HIT"),
        "the third replica waited for the owner"
    );
    assert_eq!(owner.await.expect("owner").header("x-cache"), Some("MISS"));
    assert_eq!(
        sim.stats().requests_total,
        2,
        "the owner and the impatient replica, not the third"
    );
    assert_eq!(leases().await, 0, "the owner released its lease");
    assert_ledger_matches(&sim, &impatient[0].admin_url(), &["alpha", "beta"]).await;
}

fn lease_count(redis: &RedisServer) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = usize> + Send>> {
    let client = redis::Client::open(redis.url()).expect("redis url");
    move || {
        let client = client.clone();
        Box::pin(async move {
            let mut c = client.get_multiplexed_async_connection().await.expect("redis");
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("pgw:lease:*")
                .query_async(&mut c)
                .await
                .expect("KEYS");
            keys.len()
        })
    }
}

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
