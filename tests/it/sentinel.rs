//! The gateway on a real Sentinel setup (a primary, a replica, three
//! Sentinels): cache, ledger and shared rate through
//! `redis+sentinel://s1,s2,s3/mymaster`; the primary killed under load, the
//! Sentinels promote the replica and the gateways follow without a restart;
//! the ledger keeps what the upstream charged; `/readyz` reports a Sentinel
//! that cannot name a primary.

use crate::support::gateway::{Setup, ALPHA};
use crate::support::http::get;
use crate::support::query::Query;
use crate::support::redis_sentinel::{RedisSentinel, DOWN_AFTER_MS};
use crate::support::sim::{start_sim, unlimited};
use crate::support::traffic::{as_team, assert_settled_spend_survived, charged_to, distinct_searches, ledger_used};
use crate::support::wait::eventually;
use http::StatusCode;
use permit_gateway::Running;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The bound: answers flow again within 10 s of the kill. Expected:
/// `down-after-milliseconds` + about a second of election + the ledger
/// breaker's 2 s cool-down.
const BOUND: Duration = Duration::from_secs(10);

/// (time since start, replica, status) of every request of the load.
type Log = Arc<Mutex<Vec<(Duration, usize, StatusCode)>>>;

fn on_sentinel(url: &str) -> Setup {
    Setup::new()
        .with("cache", format!("redis_url = {url:?}"))
        .with("quota", "store = \"redis\"")
}

/// Four workers firing distinct metered searches round-robin at the
/// gateways until `stop`, 20 ms apart (a steady load, not a synchronisation).
fn start_load(
    gws: &Arc<Vec<Running>>,
    paths: Arc<Vec<String>>,
    stop: &Arc<AtomicBool>,
    log: &Log,
) -> Vec<tokio::task::JoinHandle<()>> {
    let start = Instant::now();
    let next = Arc::new(AtomicU32::new(0));
    (0..4)
        .map(|_| {
            let (gws, paths, stop, log, next) = (gws.clone(), paths.clone(), stop.clone(), log.clone(), next.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Acquire) {
                    let i = next.fetch_add(1, Ordering::AcqRel) as usize;
                    let Some(path) = paths.get(i) else { return };
                    let replica = i % gws.len();
                    let url = format!("{}{path}", gws[replica].base_url());
                    let status = as_team(&url, ALPHA.1, &format!("alpha-{i}")).await.status;
                    log.lock().expect("log").push((start.elapsed(), replica, status));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_under_load_is_followed_and_the_ledger_kept() {
    let redis = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .expect("sentinels up");
    let redis = Arc::new(Mutex::new(redis));
    let url = redis
        .lock()
        .expect("setup")
        .url(crate::support::redis_sentinel::SERVICE);
    let sim = start_sim(unlimited()).await;
    let setup = on_sentinel(&url);
    let gws = Arc::new(vec![setup.start(&sim).await, setup.start(&sim).await]);

    // A service no Sentinel watches: not ready, and /readyz says why.
    let lost_url = redis.lock().expect("setup").url("nosuch");
    let lost = on_sentinel(&lost_url).start(&sim).await;
    let r = get(&format!("{}/readyz", lost.admin_url()), &[]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    let checks = &r.json()["checks"];
    for check in ["ledger", "cache_redis"] {
        assert!(
            checks[check]
                .as_str()
                .is_some_and(|c| c.contains("no Sentinel named a reachable primary for service \"nosuch\"")),
            "{check}: {}",
            r.text()
        );
    }
    drop(lost);

    let paths = Arc::new(distinct_searches(&sim, 3000, 1));
    let (stop, log): (Arc<AtomicBool>, Log) = Default::default();
    let start = Instant::now();
    let workers = start_load(&gws, paths, &stop, &log);
    eventually("the load gets going", Duration::from_secs(10), || async {
        log.lock()
            .expect("log")
            .iter()
            .filter(|e| e.2 == StatusCode::OK)
            .count()
            >= 30
    })
    .await;

    let killed_at = start.elapsed();
    let r = redis.clone();
    let victim = tokio::task::spawn_blocking(move || r.lock().expect("setup").kill_primary())
        .await
        .expect("kill");
    let r = redis.clone();
    tokio::task::spawn_blocking(move || r.lock().expect("setup").wait_failover(victim, Duration::from_secs(20)))
        .await
        .expect("failover");
    let promoted_at = start.elapsed();
    // Every gateway answers 200 again after the promotion.
    eventually("every gateway serves again", Duration::from_secs(20), || async {
        (0..gws.len()).all(|g| {
            log.lock()
                .expect("log")
                .iter()
                .any(|(t, rep, s)| *t > promoted_at && *rep == g && *s == StatusCode::OK)
        })
    })
    .await;
    stop.store(true, Ordering::Release);
    for w in workers {
        w.await.expect("worker");
    }

    let log = log.lock().expect("log").clone();
    let failures: Vec<_> = log.iter().filter(|e| e.2 != StatusCode::OK).collect();
    let first_ok_after = log
        .iter()
        .filter(|e| e.0 > killed_at && e.2 == StatusCode::OK && failures.first().is_some_and(|f| e.0 > f.0))
        .map(|e| e.0)
        .min();
    eprintln!(
        "sentinel failover: {} requests, {} not 200, killed at {killed_at:?}, promoted at {promoted_at:?} \
         (down-after {DOWN_AFTER_MS} ms), last failure at {:?}, first 200 after the failures at {first_ok_after:?}",
        log.len(),
        failures.len(),
        failures.last().map(|e| e.0)
    );
    for (t, _, status) in &failures {
        assert_eq!(
            *status,
            StatusCode::SERVICE_UNAVAILABLE,
            "only the ledger's 503 while the primary moves"
        );
        assert!(
            *t >= killed_at && *t <= killed_at + BOUND,
            "a 503 at {t:?}, outside {BOUND:?} after the kill at {killed_at:?}"
        );
    }
    let ready = get(&format!("{}/readyz", gws[0].admin_url()), &[]).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());

    let admins: Vec<String> = gws.iter().map(|gw| gw.admin_url()).collect();
    assert_settled_spend_survived(&sim, &admins, "alpha", "alpha-").await;
}

/// The team's `/v2/usage` through gateway `gw`: status and credits used.
async fn usage(gw: &Running) -> (StatusCode, Option<u64>) {
    let r = as_team(&format!("{}/v2/usage", gw.base_url()), ALPHA.1, "alpha-usage").await;
    (r.status, r.json()["credits_used"].as_u64())
}

/// Issue 39, point 2: the replica sits behind a link that stops forwarding
/// (its ACKs still flow, so `min-replicas-max-lag` does not trip). Three
/// billed misses (41 credits) are settled on the primary; no replica
/// acknowledges them (`WAIT`), so the gateway keeps them in its journal.
/// The primary is killed and the replica promoted: the journal applies
/// them to the new primary, and the ledger equals what the upstream
/// charged (before: 6 against 47).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn settles_a_stalled_replica_never_got_survive_the_failover() {
    let redis = tokio::task::spawn_blocking(RedisSentinel::start_behind_relay)
        .await
        .expect("sentinels up");
    let redis = Arc::new(Mutex::new(redis));
    let url = redis
        .lock()
        .expect("setup")
        .url(crate::support::redis_sentinel::SERVICE);
    let sim = start_sim(unlimited()).await;
    let gw = on_sentinel(&url).start(&sim).await;
    let s = sim.samples();
    let search = |i: u32, size: u32| format!("{}{}", gw.base_url(), Query::distinct(&s, i).size(size));
    let warm = as_team(&search(0, 6), ALPHA.1, "alpha-warm").await;
    assert_eq!(warm.status, StatusCode::OK, "{}", warm.text());
    redis.lock().expect("setup").stall_replication();
    for (i, size) in [(1, 10), (2, 15), (3, 16)] {
        let r = as_team(&search(i, size), ALPHA.1, &format!("alpha-stalled-{i}")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.credits_request(), Some(u64::from(size)));
    }
    let charged = charged_to(&sim, "alpha-");
    assert_eq!(charged, 47);
    let r = redis.clone();
    let victim = tokio::task::spawn_blocking(move || r.lock().expect("setup").kill_primary())
        .await
        .expect("kill");
    let r = redis.clone();
    tokio::task::spawn_blocking(move || r.lock().expect("setup").wait_failover(victim, Duration::from_secs(20)))
        .await
        .expect("failover");
    let used = eventually(
        "the ledger on the new primary equals the upstream",
        Duration::from_secs(20),
        || async {
            match usage(&gw).await {
                (StatusCode::OK, Some(used)) if used == charged => Some(used),
                _ => None,
            }
        },
    )
    .await;
    eprintln!("stalled replication: ledger {used} after the failover, upstream charged {charged}");
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, charged);
}

/// Issue 39, point 3: a Sentinel failover under load, five times over
/// (the killed primary rejoins as a replica before the next): once the
/// Sentinels name the new primary and the load is served again, the team's
/// `/v2/usage` and a new miss answer 200 on every gateway at the first try.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_ledger_call_after_each_of_five_failovers_succeeds() {
    let redis = tokio::task::spawn_blocking(RedisSentinel::start_for_repeated_failovers)
        .await
        .expect("sentinels up");
    let redis = Arc::new(Mutex::new(redis));
    let url = redis
        .lock()
        .expect("setup")
        .url(crate::support::redis_sentinel::SERVICE);
    let sim = start_sim(unlimited()).await;
    let setup = on_sentinel(&url);
    let gws = Arc::new(vec![setup.start(&sim).await, setup.start(&sim).await]);
    let paths = distinct_searches(&sim, 21000, 1);
    let (load, probes) = paths.split_at(20000);
    let (stop, log): (Arc<AtomicBool>, Log) = Default::default();
    let start = Instant::now();
    let workers = start_load(&gws, Arc::new(load.to_vec()), &stop, &log);
    let mut probe = 0;
    for round in 0..5 {
        let killed_at = start.elapsed();
        let r = redis.clone();
        let victim = tokio::task::spawn_blocking(move || r.lock().expect("setup").kill_primary())
            .await
            .expect("kill");
        let r = redis.clone();
        tokio::task::spawn_blocking(move || r.lock().expect("setup").wait_failover(victim, Duration::from_secs(20)))
            .await
            .expect("failover");
        let promoted_at = start.elapsed();
        eventually(
            "every gateway serves the load again",
            Duration::from_secs(20),
            || async {
                (0..gws.len()).all(|g| {
                    log.lock()
                        .expect("log")
                        .iter()
                        .any(|(t, rep, s)| *t > promoted_at && *rep == g && *s == StatusCode::OK)
                })
            },
        )
        .await;
        eprintln!(
            "failover {round}: promoted {:?} after the kill, served again {:?} after",
            promoted_at - killed_at,
            start.elapsed() - killed_at
        );
        for gw in gws.iter() {
            let (status, _) = usage(gw).await;
            assert_eq!(status, StatusCode::OK, "round {round}: /v2/usage after the failover");
            let url = format!("{}{}", gw.base_url(), probes[probe]);
            let miss = as_team(&url, ALPHA.1, &format!("alpha-probe-{probe}")).await;
            assert_eq!(
                miss.status,
                StatusCode::OK,
                "round {round}: a miss after the failover: {}",
                miss.text()
            );
            probe += 1;
        }
        let r = redis.clone();
        // Sentinels refresh a replica's INFO every 10 s: 30 s was once too
        // short for all three to list it in sync (a fresh Debian root).
        tokio::task::spawn_blocking(move || r.lock().expect("setup").rejoin(victim, Duration::from_secs(60)))
            .await
            .expect("rejoin");
    }
    stop.store(true, Ordering::Release);
    for w in workers {
        w.await.expect("worker");
    }
    let admins: Vec<String> = gws.iter().map(|gw| gw.admin_url()).collect();
    assert_settled_spend_survived(&sim, &admins, "alpha", "alpha-").await;
}
