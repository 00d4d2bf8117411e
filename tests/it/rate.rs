//! Sharing the upstream's rate: per-team limits, fair turns between teams,
//! one budget of calls for all replicas, kept when they lose their Redis.

use crate::support::client::Client;
use crate::support::gateway::{Setup, ALPHA, BETA, SMALL};
use crate::support::probe::scrape;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::traffic::{assert_replicas_share_the_upstream_rate, distinct_search};
use crate::support::wait::eventually;
use http::StatusCode;
use permit_gateway::Running;
use std::future::IntoFuture;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_flooding_team_does_not_starve_an_occasional_one() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| {
            c.upstream.requests_per_minute = 60;
            c.upstream.burst = Some(6);
            c.upstream.max_queue_wait_secs = 4;
        })
        .start(&sim)
        .await;
    let (alpha, beta) = (Client::new(gw.base_url(), ALPHA.1), Client::new(gw.base_url(), BETA.1));
    let s = sim.samples();
    // Alpha floods: 40 distinct calls at once against 1/s (burst 6).
    let flood: Vec<_> = (0..40)
        .map(|i| alpha.get(Query::distinct(&s, i).size(1)).request_id("flood").spawn())
        .collect();
    eventually("the burst reaches the upstream", Duration::from_secs(10), || async {
        sim.stats().requests_total >= 6
    })
    .await;
    let started = Instant::now();
    let quiet = beta.get(Query::distinct(&s, 100).size(1)).request_id("quiet").await;
    assert_eq!(
        quiet.status,
        StatusCode::OK,
        "beta was served within the queue bound: {}",
        quiet.text()
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "beta waited {:?}",
        started.elapsed()
    );
    let mut refused = 0;
    for f in flood {
        let r = f.await.expect("flood task");
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
            let retry_after = r.header_u64("retry-after").expect("Retry-After");
            assert!(
                retry_after > 4,
                "Retry-After {retry_after} is at least the wait that was refused"
            );
        } else {
            assert_eq!(r.status, StatusCode::OK);
        }
    }
    assert!(refused > 0, "waits beyond the bound are refused at once");
}

#[tokio::test]
async fn a_team_over_its_own_rate_gets_429_with_retry_after() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .teams(&[SMALL, BETA])
        .team(SMALL, |t| t.requests_per_minute = Some(2))
        .start(&sim)
        .await;
    let small = Client::new(gw.base_url(), SMALL.1);
    let release = Query::meta_release();
    let replies = [
        small.get(&release).request_id("r").await,
        small.get(&release).request_id("r").await,
        small.get(&release).request_id("r").await,
    ];
    assert_eq!(replies[2].status, StatusCode::TOO_MANY_REQUESTS);
    assert!(replies[2].header_u64("retry-after").is_some_and(|s| s >= 1));
    assert!(replies[2].json()["detail"].is_string());
    assert_eq!(
        Client::new(gw.base_url(), BETA.1)
            .get(&release)
            .request_id("b")
            .await
            .status,
        StatusCode::OK,
        "other teams are not limited"
    );
}

#[tokio::test]
async fn replicas_on_one_redis_share_the_upstream_rate() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().redis(&redis.url()).with(|c| {
        c.upstream.requests_per_minute = 120;
        c.upstream.burst = Some(12);
        c.upstream.max_queue_wait_secs = 2;
        // A healthy Redis is this test's premise: on a loaded machine a
        // permit's script can pass the 100 ms default, and three failed
        // calls open the breaker, after which each replica paces alone (as
        // docs/design.md says under `fair_turn`).
        c.cache.redis_timeout_ms = 3000;
    });
    let (gw1, gw2) = (setup.start(&sim).await, setup.start(&sim).await);
    assert_replicas_share_the_upstream_rate(&sim, &[gw1.base_url(), gw2.base_url()], ALPHA.1, 120).await;
}

/// A replica on the shared rate: its cache on `redis` (so the rate too),
/// its own file ledger, and the Redis healthy until the test says
/// otherwise (see `replicas_on_one_redis_share_the_upstream_rate`).
fn rate_replica(redis: &RedisServer, requests_per_minute: u32) -> Setup {
    Setup::new().cache_redis(&redis.url()).with(move |c| {
        c.upstream.requests_per_minute = requests_per_minute;
        c.upstream.burst = Some(requests_per_minute / 10);
        c.upstream.max_queue_wait_secs = 2;
        c.cache.redis_timeout_ms = 3000;
    })
}

/// What the shared rate told this replica last: the replicas it counted.
async fn replicas_seen(gw: &Running) -> Option<f64> {
    scrape(&gw.admin_url()).await.get("gateway_upstream_rate_replicas", &[])
}

/// Starts one gateway per setup, waits until Redis counts every one (each
/// renews its membership at start), then has each make one upstream call
/// (distinct searches from `first`), which tells it the count.
async fn counted_replicas(redis: &RedisServer, sim: &Sim, setups: &[Setup], first: u32) -> Vec<Running> {
    let mut gws = Vec::new();
    for setup in setups {
        gws.push(setup.start(sim).await);
    }
    let n = setups.len() as u64;
    eventually("Redis counts every replica", Duration::from_secs(10), || async {
        redis.rate_replicas().await == Some(n)
    })
    .await;
    for (i, gw) in gws.iter().enumerate() {
        let query = distinct_search(sim, first + i as u32, 1);
        let r = Client::new(gw.base_url(), ALPHA.1)
            .get(query)
            .request_id("alpha-count")
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    gws
}

/// The rate script counts the replicas in the permit's round trip: three
/// gateways each see 3, plus a replica quiet for a minute (still counted);
/// one not seen for longer than the 2 minutes is dropped.
#[tokio::test]
async fn the_shared_rate_counts_live_replicas_and_drops_one_not_seen_for_two_minutes() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setups: Vec<Setup> = (0..3).map(|_| rate_replica(&redis, 120)).collect();
    let gws = counted_replicas(&redis, &sim, &setups, 0).await;
    for gw in &gws {
        assert_eq!(replicas_seen(gw).await, Some(3.0), "every replica counts three");
    }
    redis.rate_replica_seen("quiet", Duration::from_secs(60)).await;
    redis.rate_replica_seen("gone", Duration::from_secs(121)).await;
    for (i, gw) in gws.iter().enumerate() {
        let query = distinct_search(&sim, 10 + i as u32, 1);
        let r = Client::new(gw.base_url(), ALPHA.1)
            .get(query)
            .request_id("alpha-again")
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(replicas_seen(gw).await, Some(4.0), "three and the quiet one");
    }
    assert!(redis.rate_replica_held("quiet").await);
    assert!(
        !redis.rate_replica_held("gone").await,
        "not seen for 2 minutes: dropped"
    );
}

/// Two replicas counted by the shared rate lose their Redis (killed): each
/// paces alone at half the rate (and half the burst), so together they
/// still send about the upstream's limit over a burst of misses, not twice
/// it, and the fallback shows in the rate's error counter.
#[tokio::test]
async fn replicas_that_lose_redis_pace_at_their_share_not_each_at_the_whole_rate() {
    let mut redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let rpm = 120;
    let setups = [rate_replica(&redis, rpm), rate_replica(&redis, rpm)];
    // The searches the load sends are 0..60: the counting calls come after.
    let gws = counted_replicas(&redis, &sim, &setups, 100).await;
    for gw in &gws {
        assert_eq!(replicas_seen(gw).await, Some(2.0), "counted before Redis goes");
    }
    redis.kill();
    let bases: Vec<String> = gws.iter().map(Running::base_url).collect();
    assert_replicas_share_the_upstream_rate(&sim, &bases, ALPHA.1, rpm).await;
    for gw in &gws {
        let m = scrape(&gw.admin_url()).await;
        let failed = m.get("gateway_backend_errors_total", &[("backend", "redis"), ("op", "rate")]);
        assert!(failed.is_some_and(|n| n >= 1.0), "the fallback is visible: {failed:?}");
        assert_eq!(replicas_seen(gw).await, Some(2.0), "the count last seen stays");
    }
}

/// A 429 is counted where it reaches the client, once: the upstream's own
/// 429 passed on counts, and so does the paused queue's refusal of a new
/// call, but a refusal rescued by a stale copy (a 200 `STALE`) does not.
#[tokio::test]
async fn only_429s_that_reach_the_client_are_counted_as_rate_limited() {
    use crate::support::sim::{FaultKind, Faults};
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .teams(&[ALPHA])
        .with(|c| {
            c.upstream.max_retries = 0;
            c.upstream.max_queue_wait_secs = 1;
        })
        .start(&sim)
        .await;
    let limited = || async {
        scrape(&gw.admin_url()).await.sum(
            "gateway_rate_limited_total",
            &[("team", ALPHA.0), ("scope", "upstream")],
        )
    };
    let (alpha, s) = (Client::new(gw.base_url(), ALPHA.1), sim.samples());
    let search = |i| Query::distinct(&s, i).size(3);
    let cached = search(1);
    assert_eq!(alpha.get(&cached).request_id("warm").await.x_cache(), Some("MISS"));
    sim.set_faults(Faults {
        kind: FaultKind::Status,
        status: Some(429),
        retry_after_secs: Some(30),
        ..Faults::default()
    });
    let passed_on = alpha.get(search(2)).request_id("up").await;
    assert_eq!(passed_on.status, StatusCode::TOO_MANY_REQUESTS, "{}", passed_on.text());
    assert_eq!(limited().await, 1.0, "the upstream's 429, passed on");
    let upstream_calls = sim.log().len();
    // The queue is paused for 30 s: it refuses at once, and the copy answers.
    let reply = alpha.get(&cached).cache_control("no-cache").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.x_cache(), Some("STALE"));
    assert_eq!(sim.log().len(), upstream_calls, "the paused queue sent nothing");
    assert_eq!(limited().await, 1.0, "a rescued refusal is no 429 to the client");
    let refused = alpha.get(search(3)).request_id("q").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.text());
    assert_eq!(limited().await, 2.0, "the queue's refusal, passed on");
    let m = scrape(&gw.admin_url()).await;
    let why = |reason| m.sum("gateway_gate_refusals_total", &[("team", ALPHA.0), ("reason", reason)]);
    assert_eq!(
        (why("upstream_429"), why("predicted"), why("deadline")),
        (1.0, 1.0, 0.0),
        "each refusal by its reason"
    );
}

/// Issue 58: `Prefer: wait=N` (RFC 7240) bounds a request's wait at the
/// gate. Alpha queues what its deadline allows, one call every 3 s; beta asking with
/// `Prefer: wait=1` when the gate predicts more (its turn comes after
/// alpha's next: 3 s at least, a margin a busy machine does not eat) is
/// refused at once, on the prediction (429, `Retry-After` the predicted
/// wait, counted as `predicted`, not as a wait that ran out), and the same
/// request without it is answered in its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_wait_is_refused_at_once_when_the_predicted_wait_is_longer() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| {
            c.upstream.requests_per_minute = 20;
            c.upstream.burst = Some(2);
        })
        .start(&sim)
        .await;
    let (alpha, beta) = (Client::new(gw.base_url(), ALPHA.1), Client::new(gw.base_url(), BETA.1));
    let s = sim.samples();
    let flood: Vec<_> = (0..8)
        .map(|i| alpha.get(Query::distinct(&s, i).size(1)).spawn())
        .collect();
    eventually("alpha's calls queued", Duration::from_secs(10), || async {
        (scrape(&gw.admin_url()).await.sum("gateway_upstream_queue_depth", &[]) >= 3.0).then_some(())
    })
    .await;
    // The gate's pressure, per team: alpha's line, and what beta would meet.
    let m = scrape(&gw.admin_url()).await;
    assert!(m.sum("gateway_upstream_team_waiting", &[("team", "alpha")]) >= 2.0);
    assert!(m.sum("gateway_upstream_team_oldest_wait_seconds", &[("team", "alpha")]) > 0.0);
    assert_eq!(m.sum("gateway_upstream_team_waiting", &[("team", "beta")]), 0.0);
    let predicted = m.sum("gateway_upstream_team_predicted_wait_seconds", &[("team", "beta")]);
    assert!(predicted > 1.0, "beta would wait {predicted} s");
    let calls = sim.stats().requests_total;
    let hurried = beta
        .get(Query::distinct(&s, 100).size(1))
        .header("Prefer", "wait=1")
        .await;
    assert_eq!(hurried.status, StatusCode::TOO_MANY_REQUESTS, "{}", hurried.text());
    let m = scrape(&gw.admin_url()).await;
    let why = |reason| m.sum("gateway_gate_refusals_total", &[("team", BETA.0), ("reason", reason)]);
    assert_eq!(
        (why("predicted"), why("deadline")),
        (1.0, 0.0),
        "refused at once on the prediction, not after waiting"
    );
    let retry = hurried.header_u64("retry-after").expect("Retry-After");
    assert!(retry >= 2, "the predicted wait: {retry}");
    let patient = beta.get(Query::distinct(&s, 100).size(1)).await;
    assert_eq!(patient.status, StatusCode::OK, "{}", patient.text());
    assert!(sim.stats().requests_total > calls);
    for call in flood {
        let r = call.await.expect("flood");
        assert!(matches!(r.status.as_u16(), 200 | 429), "{}", r.status);
    }
}

/// Issue 58: no call for a request nobody waits for. The gate's burst
/// spent, three distinct misses queue for their turns; their clients hang
/// up first. When the turns come, no call starts for them and their
/// reservations are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misses_whose_clients_left_while_queued_cost_no_call() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .credit_limit(BETA, 1_000)
        .with(|c| {
            c.upstream.requests_per_minute = 60;
            c.upstream.burst = Some(6);
        })
        .start(&sim)
        .await;
    let s = sim.samples();
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    // The burst of 6: spent.
    for i in 0..6 {
        assert_eq!(alpha.get(Query::distinct(&s, i).size(1)).await.status, StatusCode::OK);
    }
    let calls = sim.stats().requests_total;
    let left: Vec<_> = (0..3)
        .map(|i| {
            let call = Client::new(gw.base_url(), BETA.1)
                .get(Query::distinct(&s, 50 + i).size(5))
                .into_future();
            tokio::spawn(async move { tokio::time::timeout(Duration::from_millis(300), call).await.is_err() })
        })
        .collect();
    for hung_up in left {
        assert!(hung_up.await.expect("client task"), "the client gave up first");
    }
    eventually("the abandoned misses withdrawn", Duration::from_secs(15), || async {
        let n = scrape(&gw.admin_url()).await.sum(
            "gateway_upstream_withdrawn_total",
            &[("route", "permits_search"), ("reason", "abandoned")],
        );
        (n >= 3.0).then_some(())
    })
    .await;
    assert_eq!(sim.stats().requests_total, calls, "no call for clients that left");
    let beta = crate::support::traffic::admin_team(&gw.admin_url(), "beta").await;
    assert_eq!(beta["remaining"], 1_000, "every reservation released: {beta}");
}
