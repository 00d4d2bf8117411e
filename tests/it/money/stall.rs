//! Issue 39, point 1: a Redis that stalls under reserves and settles moves
//! no credit. Three replicas share one Redis (cache, leases, ledger); Redis
//! is made busy (`DEBUG SLEEP 2.5`) or stopped (`SIGSTOP`) while a paid
//! call's settle is due and while misses on every replica reserve. The
//! reserves time out (503, nothing sent upstream); Redis runs them when it
//! wakes, after their deadline and behind their callers' end: they hold
//! nothing. Every replica's `/v2/usage` then equals what the upstream
//! charged, no hold is left, and the team can spend its whole remaining
//! budget (before: the late holds blocked it, 402, and became spend at the
//! lease's end: ledger 40 against 15 charged).

use crate::support::client::Client;
use crate::support::gateway::{replicas, Setup, SMALL};
use crate::support::http::Reply;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim};
use crate::support::traffic::{assert_ledger_matches, charged_to, distinct_search, ledger_used};
use crate::support::wait::eventually;
use http::StatusCode;
use permit_gateway::Running;
use std::time::Duration;

const LIMIT: u64 = 60;

/// Team small on replica `gw`.
fn small(gw: &Running) -> Client {
    Client::new(gw.base_url(), SMALL.1)
}

/// One stall: a 10-credit call whose settle falls inside it, and two
/// 5-credit misses per replica whose reserves do. `stall` starts it and
/// returns what ends it.
async fn misses_during_a_stall<S, E>(sim: &Sim, gws: &[Running], redis: &RedisServer, round: u32, stall: S)
where
    S: FnOnce() -> E,
    E: FnOnce(),
{
    sim.set_faults(Faults {
        latency_ms: Some(1_500),
        count: Some(1),
        ..fault(FaultKind::Latency)
    });
    let paid = small(&gws[0])
        .get(distinct_search(sim, 100 * round, 10))
        .request_id("small-paid")
        .spawn();
    redis
        .wait_held("small", "the paid call holds its reservation", Duration::from_secs(5))
        .await;
    let end = stall();
    let mut calls = Vec::new();
    for (i, gw) in gws.iter().enumerate() {
        for j in 0..2u32 {
            let query = distinct_search(sim, 100 * round + 1 + 2 * i as u32 + j, 5);
            let id = format!("small-stalled-{round}-{i}-{j}");
            calls.push(small(gw).get(query).request_id(&id).spawn());
        }
    }
    let mut unavailable = 0;
    for call in calls {
        let r = call.await.expect("a stalled miss");
        assert!(
            matches!(r.status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::OK),
            "{}: {}",
            r.status,
            r.text()
        );
        unavailable += usize::from(r.status == StatusCode::SERVICE_UNAVAILABLE);
    }
    assert!(unavailable > 0, "the stall made reserves time out");
    eprintln!("stall round {round}: {unavailable} of 6 misses answered 503 (reserve timed out)");
    end();
    let paid = paid.await.expect("the paid call");
    assert_eq!(paid.status, StatusCode::OK, "{}", paid.text());
    // Every late reserve and every end has run: no hold is left.
    eventually("no hold is left", Duration::from_secs(10), || async {
        redis.holds("small").await == Some(0)
    })
    .await;
    // Each replica's /v2/usage (once its ledger breaker has closed again).
    for gw in gws {
        eventually(
            "/v2/usage equals the upstream's charge",
            Duration::from_secs(10),
            || async {
                let r = small(gw).get(Query::usage()).request_id("small-usage").await;
                r.status == StatusCode::OK && r.json()["credits_used"].as_u64() == Some(charged_to(sim, "small-"))
            },
        )
        .await;
    }
}

/// The answer once the replica's ledger breaker has closed again (a 503
/// from an open breaker sent nothing to Redis or the upstream).
async fn answered(gw: &Running, query: &Query, request_id: &str) -> Reply {
    eventually("an answer past the breaker", Duration::from_secs(10), || async {
        let r = small(gw).get(query).request_id(request_id).await;
        (r.status != StatusCode::SERVICE_UNAVAILABLE).then_some(r)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_or_stopped_redis_during_reserves_and_settles_moves_no_credit() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[SMALL]).credit_limit(SMALL, LIMIT);
    let gws = replicas(3, &sim, Some(&redis), setup).await;
    // Busy: DEBUG SLEEP 2.5 s.
    misses_during_a_stall(&sim, &gws, &redis, 1, || {
        let sleeper = redis.busy_for(2.5);
        move || sleeper.join().expect("DEBUG SLEEP")
    })
    .await;
    // Stopped: SIGSTOP until every stalled miss has been answered.
    misses_during_a_stall(&sim, &gws, &redis, 2, || {
        redis.pause();
        || redis.resume()
    })
    .await;
    // Nobody's budget is blocked: the team spends exactly what is left,
    // on each replica in turn, and is refused past it.
    let spent = charged_to(&sim, "small-");
    assert!(spent >= 20, "both paid calls were charged: {spent}");
    let left = LIMIT - spent;
    assert!((1..=100).contains(&left), "{left} left");
    let rest = answered(&gws[2], &distinct_search(&sim, 900, left as u32), "small-rest").await;
    assert_eq!(rest.status, StatusCode::OK, "the {left} left: {}", rest.text());
    assert_eq!(rest.header_u64("x-credits-remaining"), Some(0));
    for (i, gw) in gws.iter().enumerate() {
        let query = distinct_search(&sim, 990 + i as u32, 1);
        let over = answered(gw, &query, &format!("small-over-{i}")).await;
        assert_eq!(
            over.status,
            StatusCode::PAYMENT_REQUIRED,
            "replica {i}: {}",
            over.text()
        );
    }
    for gw in &gws {
        assert_eq!(ledger_used(&gw.admin_url(), SMALL.0).await, LIMIT);
        assert_ledger_matches(&sim, &gw.admin_url(), &[SMALL.0]).await;
    }
}
