//! The cross-replica lease belongs to its owner (case 7).

use super::replicas;
use crate::support::gateway::{Setup, ALPHA, BETA};
use crate::support::http::get;
use crate::support::redis::RedisServer;
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults};
use crate::support::traffic::{as_team, assert_ledger_matches, distinct_search};
use crate::support::wait::eventually;
use http::StatusCode;
use permit_gateway::error::GatewayError;
use permit_gateway::proxy::flight::Join;
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
        Setup::new()
            .with("cache", "coalesce_wait_ms = 6000")
            .with("upstream", "timeout_secs = 1\nmax_queue_wait_secs = 0"),
    )
    .await;
    let patient = replicas(1, &sim, Some(&redis), Setup::new()).await;
    let path = distinct_search(&sim, 0, 10);
    // Past the impatient replica's 6 s wait, with room for the third
    // replica to come while the owner still buys.
    sim.set_faults(Faults {
        latency_ms: Some(9_000),
        count: Some(1),
        ..fault(FaultKind::Latency)
    });
    let owner_url = format!("{}{path}", owners[0].base_url());
    let owner = tokio::spawn(async move { as_team(&owner_url, ALPHA.1, "alpha-owner").await });
    let leases = lease_count(&redis);
    eventually("the owner holds the lease", Duration::from_secs(5), || async {
        leases().await == 1
    })
    .await;
    // Gives up after 6 s, fetches itself without storing, releases nothing.
    let url = format!("{}{path}", impatient[0].base_url());
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
    assert_ledger_matches(&sim, &owners[0].admin_url(), &["alpha", "beta"]).await;
}

pub(super) fn lease_count(
    redis: &RedisServer,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = usize> + Send>> {
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
    let path = distinct_search(&sim, 0, 10);
    // A flight for the key on replica B that the test holds open.
    let uri: http::Uri = path.parse().expect("uri");
    let target = permit_gateway::route::classify(&uri, 8192).expect("route");
    let key = permit_gateway::cache::key::cache_key(&target);
    let Join::Leader(held) = b.proxy.flights.join(&key) else {
        panic!("the test leads the first flight")
    };
    // B's request misses both tiers and waits on the held flight; A's call
    // is slow enough that B has looked up before A stores.
    sim.set_faults(Faults {
        latency_ms: Some(500),
        count: Some(1),
        ..fault(FaultKind::Latency)
    });
    let b_url = format!("{}{path}", b.base_url());
    let waiting = tokio::spawn(async move { as_team(&b_url, BETA.1, "beta-1").await });
    let first = as_team(&format!("{}{path}", a.base_url()), ALPHA.1, "alpha-1").await;
    assert_eq!(first.header("x-cache"), Some("MISS"));
    // The held flight ends without an answer B may take as its own.
    held.complete(Err(GatewayError::QuotaExceeded {
        limit: 0,
        needed: 1,
        remaining: 0,
        upgrade_url: String::new(),
    }));
    let r = waiting.await.expect("B's request");
    assert_eq!(
        r.header("x-cache"),
        Some("HIT"),
        "B bought the key again ({})",
        r.status
    );
    assert_eq!(sim.stats().requests_total, 1, "the key was bought once");
    let metrics = get(&format!("{}/metrics", b.admin_url()), &[]).await.text();
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
    let count = lease_count(&redis);
    // Three TTLs long, the lease stays, and stays someone else's to wait on.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        assert_eq!(count().await, 1, "the lease lapsed while its owner worked");
        assert!(matches!(leases.acquire("k").await, Acquired::Held));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lease.release().await;
    assert_eq!(count().await, 0, "released by its owner");
}
