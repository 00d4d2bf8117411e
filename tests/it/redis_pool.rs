//! The cache's Redis over several connections (`cache.redis_connections`,
//! issue 38): calls are spread over all of them, and a connection Redis
//! drops costs no request.

use crate::support::client::{replies, Client};
use crate::support::gateway::{ChildGateway, Setup, ALPHA};
use crate::support::http::Reply;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::start_sim;
use crate::support::sim::unlimited;
use crate::support::wait::eventually;
use http::StatusCode;
use std::time::Duration;

/// Connections of the cache tier in the tests below.
const CONNECTIONS: usize = 5;

/// A gateway whose cache is on `redis` over `connections` connections,
/// with a timeout no loaded machine reaches (the tests count connections,
/// not timeouts).
fn pooled(redis: &RedisServer, connections: usize) -> Setup {
    Setup::new().cache_redis(&redis.url()).with(move |c| {
        c.cache.redis_connections = connections;
        c.cache.redis_timeout_ms = 2000;
    })
}

/// The ids of the normal clients connected to `redis`, not counting the
/// connection that asks.
fn client_ids(redis: &RedisServer) -> Vec<u64> {
    let client = redis::Client::open(redis.url()).expect("redis url");
    let mut c = client.get_connection().expect("a connection");
    let me: u64 = redis::cmd("CLIENT").arg("ID").query(&mut c).expect("CLIENT ID");
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("normal")
        .query(&mut c)
        .expect("CLIENT LIST");
    list.lines()
        .filter_map(|line| line.strip_prefix("id=")?.split(' ').next()?.parse().ok())
        .filter(|id| *id != me)
        .collect()
}

/// Requests for `sizes` (1 to 100, what the upstream takes), all at once: each a miss, so each reads and writes
/// Redis (entry, fetch lease).
async fn burst(alpha: &Client, query: impl Fn(u32) -> Query, sizes: std::ops::Range<u32>) -> Vec<Reply> {
    replies(sizes.map(|size| alpha.get(query(size)).spawn())).await
}

#[tokio::test]
async fn the_cache_reaches_redis_over_every_configured_connection() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let gw = pooled(&redis, CONNECTIONS).start(&sim).await;
    let s = sim.samples();
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let query = |size: u32| Query::state_permits(&s).size(size);
    let replies = burst(&alpha, query, 1..41).await;
    assert!(replies.iter().all(|r| r.status == StatusCode::OK));
    // Connections are opened on first use; the shared upstream rate may
    // hold one more of its own.
    let ids = client_ids(&redis);
    assert!(
        ids.len() >= CONNECTIONS,
        "{} gateway connections, {CONNECTIONS} configured",
        ids.len()
    );
}

#[tokio::test]
async fn a_redis_connection_killed_under_load_loses_no_request() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let gw = pooled(&redis, CONNECTIONS).start(&sim).await;
    let s = sim.samples();
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let query = |size: u32| Query::state_permits(&s).size(size);
    assert!(burst(&alpha, query, 1..21)
        .await
        .iter()
        .all(|r| r.status == StatusCode::OK));
    let before = client_ids(&redis);
    assert!(before.len() >= CONNECTIONS, "{before:?}");

    // One connection dropped by Redis while requests are in flight: the
    // first to connect, a cache one (its lookup precedes any upstream call
    // and so any call of the shared rate).
    let in_flight: Vec<_> = (21..61).map(|size| alpha.get(query(size)).spawn()).collect();
    let client = redis::Client::open(redis.url()).expect("redis url");
    let mut c = client.get_connection().expect("a connection");
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(before[0])
        .query(&mut c)
        .expect("CLIENT KILL");
    assert_eq!(killed, 1);
    let mut replies = replies(in_flight).await;
    replies.extend(burst(&alpha, query, 61..91).await);
    let failed: Vec<_> = replies.iter().filter(|r| r.status != StatusCode::OK).collect();
    assert!(failed.is_empty(), "{} of {} failed", failed.len(), replies.len());
    // Hits are still hits.
    for size in [5, 30, 80] {
        assert_eq!(alpha.get(query(size)).await.x_cache(), Some("HIT"));
    }

    // The dropped connection comes back (at its next call, one of these),
    // and the Redis tier still serves: a fresh replica finds what this one
    // bought after the kill.
    drop(c);
    let more = burst(&alpha, query, 91..101).await;
    let statuses: Vec<_> = more.iter().map(|r| r.status).collect();
    assert!(statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
    eventually("the pool reconnects", Duration::from_secs(10), || async {
        let ids = client_ids(&redis);
        match ids.len() >= before.len() {
            true => Ok(()),
            false => Err(format!("connections {ids:?}, before the kill {before:?}")),
        }
    })
    .await;
    // Its own data dir (a file ledger is one replica's), the same Redis.
    let other = Setup::new().cache_redis(&redis.url()).start(&sim).await;
    let r = alpha.at(other.base_url()).get(query(90)).await;
    assert_eq!(r.x_cache(), Some("HIT"), "written to Redis after the kill");
}

/// `cache.redis_connections = 0` (the default): one connection per worker
/// thread of the runtime the gateway runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn by_default_the_pool_has_one_connection_per_worker_thread() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let gw = pooled(&redis, 0).start(&sim).await;
    let s = sim.samples();
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let query = |size: u32| Query::state_permits(&s).size(size);
    // Sequential misses: every worker's turn comes, but never more than
    // the pool's connections are opened.
    for size in 1..31 {
        assert_eq!(alpha.get(query(size)).await.status, StatusCode::OK);
    }
    // Three for the cache, at most one more for the shared upstream rate.
    let ids = client_ids(&redis);
    assert!((3..=4).contains(&ids.len()), "{ids:?}");
}

/// Every socket of the pool is kept out of the client connections'
/// descriptors: 64 connections of the cache's and the shared rate's one
/// pass the fixed reserve of 64 alone, and a Redis connection that cannot
/// reconnect for want of a descriptor makes every hit of its tier a paid
/// miss. Too large a pool for `ulimit -n` refuses the start, naming the key.
#[tokio::test]
async fn the_pools_sockets_are_kept_out_of_the_clients_descriptors() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let wide = pooled(&redis, 64);
    let gw = ChildGateway::spawn_limited(&wide, &sim.base_url(), sim.api_key(), 512);
    let warning = gw.clamp_warning();
    // The cache's 64 and the shared rate's one, on top of the fixed 64.
    assert!(
        warning.contains("129 descriptors are kept for the upstream pool, Redis (65 sockets)"),
        "{warning}"
    );
    let s = sim.samples();
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    assert_eq!(alpha.get(Query::state_permits(&s).size(3)).await.status, StatusCode::OK);

    // Its own data dir: the first holds its ledger.
    let (status, logs) = ChildGateway::refused(&pooled(&redis, 64), &sim.base_url(), sim.api_key(), Some(128));
    assert!(!status.success(), "exits non-zero ({status}): {logs}");
    assert!(
        logs.contains("RLIMIT_NOFILE is 128") && logs.contains("cache.redis_connections"),
        "{logs}"
    );
}
