//! Issue 19: replicas herding on the same searches buy each search once.
//!
//! The replicas benchmark's herd run (the same searches sent to every
//! replica at once) showed 1–6 % more upstream calls than searches. Two
//! windows let a replica buy what a peer had just stored: it took the lease
//! after the peer released it without looking at L2 again, or it saw the
//! peer's entry missing just before the peer stored it and the lease gone
//! just after the peer released it. Replicas whose Redis answers late (a
//! relay holding back every reply) stretch both windows from microseconds
//! to milliseconds, so a regression shows in every run, not one in fifty.

use crate::support::client::Client;
use crate::support::gateway::{Setup, ALPHA, BETA};
use crate::support::monitor::Monitor;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::relay::SlowRelay;
use crate::support::sim::{start_sim, unlimited, SimConfig};
use crate::support::traffic::{assert_ledger_matches, charged_to, distinct_search, distinct_searches};
use http::StatusCode;
use permit_gateway::cache::lease::Acquired;
use permit_gateway::cache::Entry;
use permit_gateway::Running;
use std::sync::Arc;
use std::time::Duration;

/// Searches asked of every replica at once, per round.
const SEARCHES: u32 = 12;
const ROUNDS: u32 = 8;
/// Records per search: the simulator charges one credit per record.
const SIZE: u32 = 3;

/// Three replicas on one Redis with the shared key prefix (cache, leases,
/// ledger): one with a direct connection, two through relays whose replies
/// come late by different amounts. Upstream calls take 10–40 ms, about a
/// slow replica's few Redis round trips, which is where the windows open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_herding_on_the_same_searches_buy_each_once() {
    let redis = RedisServer::start();
    let sim = start_sim(SimConfig {
        latency_ms: 10,
        latency_jitter_ms: 30,
        ..unlimited()
    })
    .await;
    let relays = [
        SlowRelay::start(redis.socket()).await,
        SlowRelay::start(redis.socket()).await,
    ];
    relays[0].set_delay(Duration::from_millis(7));
    relays[1].set_delay(Duration::from_millis(13));
    let urls = [redis.url(), relays[0].url(), relays[1].url()];
    let mut gws = Vec::new();
    for url in &urls {
        gws.push(on_redis(url).start(&sim).await);
    }
    let searches = distinct_searches(&sim, SEARCHES * ROUNDS, SIZE);
    for (round, batch) in searches.chunks(SEARCHES as usize).enumerate() {
        herd(&gws, batch, round).await;
    }
    let stats = sim.stats();
    let bought: u64 = (SEARCHES * ROUNDS).into();
    assert_eq!(
        stats.requests_total, bought,
        "{} upstream calls for {bought} distinct searches",
        stats.requests_total
    );
    assert_eq!(
        stats.credits_total,
        bought * u64::from(SIZE),
        "each search charged once"
    );
    assert_eq!(
        charged_to(&sim, "alpha-") + charged_to(&sim, "beta-"),
        stats.credits_total,
        "every call was made for a team"
    );
    assert_ledger_matches(&sim, &gws[0].admin_url(), &["alpha", "beta"]).await;
}

/// A replica's config on the Redis at `url`; a Redis call may take long
/// (the relay's delay, queued replies) without reading as a failure.
fn on_redis(url: &str) -> Setup {
    Setup::new().redis(url).with(|c| {
        c.cache.redis_timeout_ms = 3000;
        c.quota.redis_timeout_ms = 5000;
    })
}

/// Every search of `batch` asked of every replica at once, alternately by
/// alpha and beta; all are answered.
async fn herd(gws: &[Running], batch: &[Query], round: usize) {
    let mut calls = Vec::new();
    for (i, query) in batch.iter().enumerate() {
        for (j, gw) in gws.iter().enumerate() {
            let (token, team) = if (i + j) % 2 == 0 {
                (ALPHA.1, "alpha")
            } else {
                (BETA.1, "beta")
            };
            let id = format!("{team}-{round}-{i}-{j}");
            calls.push(Client::new(gw.base_url(), token).get(query).request_id(&id).spawn());
        }
    }
    for call in calls {
        let r = call.await.expect("request task");
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
}

/// The second window, step by step: replica B waits on its peer's lease
/// and looks at L2 just before the peer stores; the peer stores and
/// releases before B looks at the lease. B must answer with the peer's
/// entry (one more look at L2 once the lease is gone), not buy the key.
/// The test plays the peer with replica A's own lease and cache, and acts
/// when Redis MONITOR shows B's look at L2: B's replies come 400 ms late,
/// so its look at the lease runs long after the peer's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_takes_the_entry_stored_just_before_the_lease_went() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let relay = SlowRelay::start(redis.socket()).await;
    let peer = on_redis(&redis.url()).start(&sim).await;
    let late = on_redis(&relay.url()).start(&sim).await;
    relay.set_delay(Duration::from_millis(400));
    let query = distinct_search(&sim, 0, SIZE);
    let (target, key) = (query.target(), query.cache_key());
    let mut monitor = Monitor::start(&redis).await;
    let Acquired::Owned(lease) = peer.app.leases.acquire(&key).await else {
        panic!("the peer takes the free lease")
    };
    let waiting = Client::new(late.base_url(), BETA.1)
        .get(&query)
        .request_id("beta-late")
        .spawn();
    // Once B has looked at the lease it polls; its next look at L2 misses.
    monitor.until("EXISTS", "pgw:lease:").await;
    monitor.until("GET", "pgw:c:").await;
    let body = bytes::Bytes::from_static(br#"{"items":[],"next_cursor":null,"stored_by":"the peer"}"#);
    let ttl = peer.app.cache.ttl(target.route).expect("searches are cached");
    let entry = Entry::new(body.clone(), u64::from(SIZE), ttl, target.route);
    peer.app.cache.store(&key, Arc::new(entry)).await;
    lease.release().await;
    let r = waiting.await.expect("B's request");
    assert_eq!(sim.stats().requests_total, 0, "B bought the key its peer had stored");
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.body, body, "B answered with the peer's entry");
    assert_eq!(r.header("x-cache"), Some("HIT"));
}
