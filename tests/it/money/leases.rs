//! The cross-replica lease belongs to its owner (case 7).

use crate::support::client::Client;
use crate::support::flight;
use crate::support::gateway::{replicas, Setup, ALPHA, BETA};
use crate::support::probe::metrics_text;
use crate::support::redis::RedisServer;
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults};
use crate::support::traffic::{assert_ledger_matches, distinct_search};
use crate::support::wait::eventually;
use http::StatusCode;
use std::time::Duration;

/// Case 7: the cross-replica lease is deleted only by its owner. A replica
/// that gave up waiting and fetched on its own leaves it, so a third
/// replica still waits for the owner instead of buying the key again.
#[tokio::test]
async fn a_lease_is_released_only_by_its_owner() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let owners = replicas(1, &sim, Some(&redis), Setup::new()).await;
    // The shortest wait validation allows: its own queue bound (0), its
    // upstream deadline (1 s) and the settle margin (5 s) — shorter than
    // the owner's slow call.
    let impatient = replicas(
        1,
        &sim,
        Some(&redis),
        Setup::new().with(|c| {
            c.cache.coalesce_wait_ms = 6000;
            c.upstream.timeout_secs = 1;
            c.upstream.max_queue_wait_secs = 0;
        }),
    )
    .await;
    let patient = replicas(1, &sim, Some(&redis), Setup::new()).await;
    let query = distinct_search(&sim, 0, 10);
    // Past the impatient replica's 6 s wait, with room for the third
    // replica to come while the owner still buys.
    sim.set_faults(Faults {
        latency_ms: Some(9_000),
        count: Some(1),
        ..fault(FaultKind::Latency)
    });
    let owner = Client::new(owners[0].base_url(), ALPHA.1)
        .get(&query)
        .request_id("alpha-owner")
        .spawn();
    eventually("the owner holds the lease", Duration::from_secs(5), || async {
        redis.leases().await == 1
    })
    .await;
    // Gives up after 6 s, fetches itself without storing, releases nothing.
    let own = Client::new(impatient[0].base_url(), BETA.1)
        .get(&query)
        .request_id("beta-own")
        .cache_control("no-store")
        .await;
    assert_eq!(own.status, StatusCode::OK);
    assert_eq!(
        redis.leases().await,
        1,
        "the owner's lease survived the other replica's release"
    );
    let third = Client::new(patient[0].base_url(), BETA.1)
        .get(&query)
        .request_id("beta-third")
        .await;
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
    assert_eq!(redis.leases().await, 0, "the owner released its lease");
    assert_ledger_matches(&sim, &owners[0].admin_url(), &["alpha", "beta"]).await;
}

/// Case 8: a request that waited on a flight which ended without an answer
/// for it (here: the leader's own budget refused) leads the next flight,
/// and first looks at the cache again: the answer another replica stored
/// meanwhile is not bought a second time.
#[tokio::test]
async fn a_new_leader_looks_at_the_cache_again_before_it_buys() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let gws = replicas(2, &sim, Some(&redis), Setup::new()).await;
    let (a, b) = (&gws[0], &gws[1]);
    let query = distinct_search(&sim, 0, 10);
    // A flight for the key on replica B that the test holds open.
    let held = flight::lead(&b.proxy.flights, &query.cache_key());
    // B's request misses both tiers and waits on the held flight; A's call
    // is slow enough that B has looked up before A stores.
    sim.set_faults(Faults {
        latency_ms: Some(500),
        count: Some(1),
        ..fault(FaultKind::Latency)
    });
    let waiting = Client::new(b.base_url(), BETA.1)
        .get(&query)
        .request_id("beta-1")
        .spawn();
    let first = Client::new(a.base_url(), ALPHA.1)
        .get(&query)
        .request_id("alpha-1")
        .await;
    assert_eq!(first.header("x-cache"), Some("MISS"));
    // The held flight ends without an answer B may take as its own.
    flight::fail(held);
    let r = waiting.await.expect("B's request");
    assert_eq!(
        r.header("x-cache"),
        Some("HIT"),
        "B bought the key again ({})",
        r.status
    );
    assert_eq!(sim.stats().requests_total, 1, "the key was bought once");
    let metrics = metrics_text(&b.admin_url()).await;
    assert!(
        metrics.contains("gateway_coalesced_requests_total{route=\"permits_search\"} 1"),
        "B was answered by the new flight's look at the cache, not by its own lookup"
    );
    assert_ledger_matches(&sim, &a.admin_url(), &["alpha", "beta"]).await;
}

/// Case 7: a lease outlives its TTL while its owner works (renewed), is
/// refused to others meanwhile, and goes with its owner's release.
#[tokio::test]
async fn a_lease_is_renewed_while_its_owner_works() {
    use permit_gateway::cache::lease::{Acquired, Leases};
    let redis = RedisServer::start();
    let backend = permit_gateway::redis_backend::RedisBackend::new(
        &redis.url(),
        Duration::from_secs(1),
        std::sync::Arc::new(permit_gateway::metrics::Metrics::new()),
    )
    .expect("redis backend");
    let leases = Leases::new(Some(std::sync::Arc::new(backend)), "pgw:", Duration::from_secs(1));
    let Acquired::Owned(lease) = leases.acquire("k").await else {
        panic!("the first caller owns the lease")
    };
    // Three TTLs long, the lease stays, and stays someone else's to wait on.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        assert_eq!(redis.leases().await, 1, "the lease lapsed while its owner worked");
        assert!(matches!(leases.acquire("k").await, Acquired::Taken));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lease.release().await;
    assert_eq!(redis.leases().await, 0, "released by its owner");
}
