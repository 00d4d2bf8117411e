//! Three gateway replicas on a real Redis Cluster (3 primaries, 3
//! replicas): every script and multi-key command works across slots, one
//! upstream call per cold query, one budget, one upstream rate, and a
//! primary killed mid-load fails over without losing settled spend.
//!
//! Each test starts its own cluster (about 3 s) so a failover cannot
//! disturb the others; the whole suite runs in well under a minute.

mod failover;

use crate::support::client::Client;
use crate::support::gateway::{Setup, ALPHA, SMALL};
use crate::support::probe::{readyz, scrape, wait_cache_redis_ok};
use crate::support::query::Query;
use crate::support::redis_cluster::RedisCluster;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim};
use crate::support::traffic::{assert_replicas_share_the_upstream_rate, charged_to, ledger_used};
use crate::support::wait::eventually;
use http::StatusCode;
use permit_gateway::Running;
use std::time::Duration;

/// Cache, leases, ledger and shared rate all on the cluster.
fn on_cluster(cluster: &RedisCluster) -> Setup {
    Setup::new().redis(&cluster.url())
}

async fn three(setup: &Setup, sim: &Sim) -> Vec<Running> {
    vec![setup.start(sim).await, setup.start(sim).await, setup.start(sim).await]
}

/// A team's client on each of `gws`, in order.
fn on_each(gws: &[Running], token: &str) -> Vec<Client> {
    gws.iter().map(|gw| Client::new(gw.base_url(), token)).collect()
}

/// Redis and ledger errors a replica counted (CROSSSLOT, MOVED not
/// followed, timeouts all land here).
async fn backend_errors(gw: &Running) -> f64 {
    let m = scrape(&gw.admin_url()).await;
    m.sum("gateway_backend_errors_total", &[("backend", "redis")])
        + m.sum("gateway_backend_errors_total", &[("backend", "ledger")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_and_multi_key_command_runs_on_a_real_cluster() {
    let cluster = RedisCluster::start_async().await;
    let sim = start_sim(unlimited()).await;
    // Generous timeouts: on a loaded machine a slow call must not pass for
    // a failed one; only real errors (CROSSSLOT, MOVED not followed) count.
    let setup = on_cluster(&cluster).with(|c| c.cache.redis_timeout_ms = 3000);
    let gws = three(&setup, &sim).await;
    // Misses: reserve, lease (SET NX, DEL), rate script, settle, cache SET;
    // spread over many keys, so over every primary.
    // Each page also files its records (one key per permit id, see
    // cache::records), so purge finds those too.
    let (alpha, s) = (on_each(&gws, ALPHA.1), sim.samples());
    let mut records = std::collections::BTreeSet::new();
    for i in 0..12 {
        let r = alpha[i % 3]
            .get(Query::distinct(&s, i as u32).size(2))
            .request_id(&format!("alpha-{i}"))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let items = r.json()["items"].as_array().cloned().unwrap_or_default();
        records.extend(items.iter().filter_map(|p| p["id"].as_str().map(str::to_owned)));
    }
    // An L2 hit on another replica; its saved credits go out as a pipeline.
    let hit = alpha[1]
        .get(Query::distinct(&s, 0).size(2))
        .request_id("alpha-hit")
        .await;
    assert_eq!(hit.x_cache(), Some("HIT"), "{:?}", hit.headers);
    // A failed upstream call releases its reservation; a 429 pauses every replica.
    for (status, i) in [(500, 40), (429, 41)] {
        sim.set_faults(Faults {
            kind: FaultKind::Status,
            status: Some(status),
            count: Some(1),
            retry_after_secs: Some(1),
            ..Faults::default()
        });
        let r = alpha[2]
            .get(Query::distinct(&s, i).size(2))
            .request_id(&format!("alpha-{i}"))
            .await;
        assert!(
            r.status.is_client_error() || r.status.is_server_error(),
            "{status}: {}",
            r.status
        );
        sim.clear_faults();
    }
    // The chargeback rows (HGETALL per team) show the saved credits once flushed.
    eventually("the saved credits are written", Duration::from_secs(10), || async {
        let csv = Client::admin(gws[1].admin_url()).get("/admin/usage.csv").await;
        assert_eq!(csv.status, StatusCode::OK);
        let saved: u64 = csv
            .text()
            .lines()
            .skip(1)
            .filter_map(|l| l.split(',').nth(4)?.parse::<u64>().ok())
            .sum();
        if saved > 0 {
            Ok(())
        } else {
            Err(csv.text())
        }
    })
    .await;
    // Purge scans every primary: all twelve entries and their records go,
    // whichever node holds them.
    let purged = Client::admin(gws[0].admin_url())
        .post("/admin/cache/purge?all=true")
        .await;
    assert_eq!(purged.json()["redis_keys"], 12 + records.len(), "{}", purged.text());
    let again = alpha[2]
        .get(Query::distinct(&s, 3).size(2))
        .request_id("alpha-after-purge")
        .await;
    assert_eq!(again.x_cache(), Some("MISS"), "the purge reached L2");
    assert_eq!(
        ledger_used(&gws[0].admin_url(), "alpha").await,
        charged_to(&sim, "alpha-")
    );
    let ready = readyz(&gws[2].admin_url()).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
    assert_eq!(ready.json()["checks"]["ledger"], "ok", "AOF is on on every primary");
    for gw in &gws {
        assert_eq!(backend_errors(gw).await, 0.0, "no Redis call failed (no CROSSSLOT)");
    }
    // The shared rate's state and pause keys live together under `{rate}`.
    let slots: Vec<i64> = ["pgw:{rate}:upstream", "pgw:{rate}:upstream:pause"]
        .iter()
        .map(|k| cluster.query_any(redis::cmd("CLUSTER").arg("KEYSLOT").arg(*k)))
        .collect();
    assert_eq!(slots[0], slots[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_query_fired_at_three_replicas_at_once_reaches_the_upstream_once() {
    let cluster = RedisCluster::start_async().await;
    let sim = start_sim(unlimited()).await;
    let gws = three(&on_cluster(&cluster), &sim).await;
    let alpha = on_each(&gws, ALPHA.1);
    let query = Query::distinct(&sim.samples(), 7).size(5);
    let tasks: Vec<_> = (0..9)
        .map(|i| alpha[i % 3].get(&query).request_id(&format!("alpha-{i}")).spawn())
        .collect();
    let mut bodies = Vec::new();
    for t in tasks {
        let r = t.await.expect("task");
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        bodies.push(r.body);
    }
    assert_eq!(sim.stats().requests_total, 1, "one upstream call for nine requests");
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "every replica answered the same body"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_concurrent_searches_over_three_replicas_never_overspend() {
    let cluster = RedisCluster::start_async().await;
    let sim = start_sim(unlimited()).await;
    let setup = on_cluster(&cluster).teams(&[SMALL]).credit_limit(SMALL, 100);
    let gws = three(&setup, &sim).await;
    let (small, s) = (on_each(&gws, SMALL.1), sim.samples());
    let tasks: Vec<_> = (0..42)
        .map(|i| {
            small[i % 3]
                .get(Query::distinct(&s, i as u32).size(10))
                .request_id(&format!("small-{i}"))
                .spawn()
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.expect("task").status {
            StatusCode::OK => ok += 1,
            StatusCode::PAYMENT_REQUIRED => {}
            other => panic!("only 200 and 402 expected, got {other}"),
        }
    }
    assert_eq!(ok, 10, "exactly the budget's worth was served");
    assert_eq!(
        charged_to(&sim, "small-"),
        100,
        "the upstream charged the budget, no more"
    );
    for team in &small {
        assert_eq!(team.used().await, 100, "every replica reads one ledger");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_a_cluster_share_the_upstream_rate() {
    let cluster = RedisCluster::start_async().await;
    let sim = start_sim(unlimited()).await;
    let setup = on_cluster(&cluster).with(|c| {
        c.upstream.requests_per_minute = 120;
        c.upstream.burst = Some(12);
        c.upstream.max_queue_wait_secs = 2;
        // A healthy Redis is this test's premise: on a loaded machine a
        // permit's script can pass the 100 ms default, and three failed
        // calls open the breaker, after which each replica paces alone (as
        // docs/design.md says under `fair_turn`).
        c.cache.redis_timeout_ms = 3000;
    });
    let gws = three(&setup, &sim).await;
    let bases: Vec<String> = gws.iter().map(Running::base_url).collect();
    assert_replicas_share_the_upstream_rate(&sim, &bases, ALPHA.1, 120).await;
    // The rate script's three keys, the replicas' set among them, run in
    // one slot: every replica was told three.
    for gw in &gws {
        let m = scrape(&gw.admin_url()).await;
        assert_eq!(m.get("gateway_upstream_rate_replicas", &[]), Some(3.0));
        assert_eq!(m.sum("gateway_backend_errors_total", &[("op", "rate")]), 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_before_its_cluster_uses_it_once_it_is_up() {
    let mut cluster = RedisCluster::reserve();
    let sim = start_sim(unlimited()).await;
    // The cache only: the ledger fails closed, the cache fails open.
    let gw = Setup::new()
        .cache_redis(&cluster.url())
        .with(|c| c.cache.memory_max_bytes = 0)
        .start(&sim)
        .await;
    let (alpha, s) = (Client::new(gw.base_url(), ALPHA.1), sim.samples());
    let first = alpha.get(Query::distinct(&s, 1).size(2)).request_id("alpha-1").await;
    assert_eq!(
        first.status,
        StatusCode::OK,
        "served without its cluster: {}",
        first.text()
    );
    let ready = readyz(&gw.admin_url()).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
    assert_ne!(ready.json()["checks"]["cache_redis"], "ok");

    cluster = tokio::task::spawn_blocking(move || {
        cluster.create();
        cluster
    })
    .await
    .expect("cluster up");
    wait_cache_redis_ok(&gw.admin_url()).await;
    // Written to the cluster by one request, read back by the next (no L1).
    eventually("the cluster is used", Duration::from_secs(10), || async {
        let query = Query::distinct(&s, 2).size(2);
        let _ = alpha.get(&query).request_id("alpha-2").await;
        alpha.get(&query).request_id("alpha-3").await.x_cache() == Some("HIT")
    })
    .await;
    drop(cluster);
}
