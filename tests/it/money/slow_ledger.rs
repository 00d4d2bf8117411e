//! A ledger that stalls or restarts never costs a paid answer (issue 25,
//! cases 2 and 5): the upstream call is driven to its end while the settle
//! waits for Redis, and the first reserve after a Redis restart is retried
//! on a fresh connection instead of refused.

use crate::support::client::Client;
use crate::support::gateway::{replicas, Setup, ALPHA, SMALL};
use crate::support::redis::RedisServer;
use crate::support::sim::{fault, start_sim, unlimited, FaultKind, Faults};
use crate::support::traffic::{charged_to, distinct_search, ledger_used, ledger_used_now};
use crate::support::wait::eventually;
use http::StatusCode;
use std::time::Duration;

/// Case 2: Redis freezes (SIGSTOP) after the reserve and stays frozen
/// while the upstream sends a billed head and then a 100-record body over
/// 2 s, against a 5 s deadline. The answer is delivered (200, stored) while
/// the settle waits; once Redis thaws the settle lands, and the ledger
/// equals the charge. Before issue 25 the settle, awaited in the call's
/// `select!`, left the call unpolled past its deadline: 504, and the retry
/// bought the key again.
#[tokio::test]
async fn a_frozen_ledger_during_the_settle_still_delivers_the_paid_answer() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 150).one_attempt(5);
    let gws = replicas(1, &sim, Some(&redis), setup).await;
    let small = Client::new(gws[0].base_url(), SMALL.1);
    let query = distinct_search(&sim, 0, 100);
    sim.set_faults(Faults {
        latency_ms: Some(1_500),
        delay_ms: Some(2_000),
        count: Some(1),
        ..fault(FaultKind::SlowBody)
    });
    let started = std::time::Instant::now();
    let call = small.get(&query).request_id("small-1").spawn();
    eventually("the reservation is held", Duration::from_secs(5), || async {
        redis.holds("small").await == Some(1)
    })
    .await;
    redis.pause();
    let r = call.await.expect("the paid call");
    let took = started.elapsed();
    assert_eq!(r.status, StatusCode::OK, "the paid answer was delivered");
    // 1.5 s to the head + 2 s of body + at most 1 s waiting for the settle
    // + the budget headers' ledger read timing out (1 s): not the settle's
    // own bound (the lease, 60 s).
    assert!(
        took < Duration::from_secs(9),
        "the answer waited for the ledger: {took:?}"
    );
    assert_eq!(r.header("x-cache"), Some("MISS"));
    let items = r.json()["items"].as_array().map_or(0, Vec::len);
    assert_eq!(items, 100, "the whole paid body");
    assert_eq!(charged_to(&sim, "small-"), 100);
    // Answered again from the cache while Redis is still frozen: the paid
    // body was stored, and nothing is bought twice.
    let again = small.get(&query).request_id("small-2").await;
    assert_eq!(again.header("x-cache"), Some("HIT"));
    redis.resume();
    let admin = gws[0].admin_url();
    eventually("the settle lands once Redis thaws", Duration::from_secs(20), || async {
        ledger_used_now(&admin, "small").await == Some(100)
    })
    .await;
    assert_eq!(sim.stats().requests_total, 1, "the key was bought once");
    assert_eq!(ledger_used(&admin, "small").await, charged_to(&sim, "small-"));
    assert!(charged_to(&sim, "small-") <= 150, "within the limit");
}

/// Case 5: Redis restarts (its data lost, every connection dead). A replica
/// that sat idle meanwhile reserves on its next miss: the dead connection
/// is retried once on a fresh one, so the team gets its answer, not a 503.
/// The team's limit (10) is exactly that miss: the retried reserve holds
/// it once (a second hold would refuse it), and after it the limit binds on
/// both replicas.
#[tokio::test]
async fn the_first_reserve_after_a_redis_restart_on_an_idle_replica_succeeds() {
    const LIMIT: u64 = 10;
    let mut redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[ALPHA]).credit_limit(ALPHA, LIMIT);
    let gws = replicas(2, &sim, Some(&redis), setup).await;
    let alpha = |i: usize| Client::new(gws[i].base_url(), ALPHA.1);
    // Both replicas have live ledger connections to the first Redis (a
    // metered miss each; that spend goes with the restarted Redis's data).
    for i in 0..gws.len() {
        let r = alpha(i)
            .get(distinct_search(&sim, i as u32, 1))
            .request_id("warm")
            .await;
        assert_eq!(r.status, StatusCode::OK);
    }
    redis.restart();
    let r = alpha(1).get(distinct_search(&sim, 5, 10)).request_id("alpha-1").await;
    assert_eq!(r.status, StatusCode::OK, "not refused: {}", r.json()["detail"]);
    assert_eq!(r.header("x-cache"), Some("MISS"));
    // The restarted Redis holds only what was spent since; the other
    // replica reads it once its own connection is back.
    let charged = charged_to(&sim, "alpha-");
    assert_eq!(charged, 10);
    for gw in &gws {
        let admin = gw.admin_url();
        eventually(
            "every replica's ledger equals the upstream's charge",
            Duration::from_secs(10),
            || async { ledger_used_now(&admin, "alpha").await == Some(charged) },
        )
        .await;
    }
    assert!(
        charged <= LIMIT,
        "the upstream charged {charged} past the limit {LIMIT}"
    );
    // The limit is spent: a one-record miss on either replica is refused,
    // and nothing more reaches the upstream.
    for i in 0..gws.len() {
        let over = alpha(i)
            .get(distinct_search(&sim, 6 + i as u32, 1))
            .request_id(&format!("alpha-over-{i}"))
            .await;
        assert_eq!(over.status, StatusCode::PAYMENT_REQUIRED, "{}", over.text());
        assert_eq!(over.json()["detail"]["limit"], LIMIT);
    }
    assert_eq!(charged_to(&sim, "alpha-"), charged, "nothing bought past the limit");
    assert_eq!(ledger_used(&gws[0].admin_url(), "alpha").await, charged);
}
