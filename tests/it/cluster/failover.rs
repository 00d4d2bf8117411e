//! A primary killed under load: the replica of the ledger's slot takes
//! over, the gateways follow on their own, 503s stay inside the documented
//! window (docs/operations.md, "During a failover"), settled spend is kept,
//! `/readyz` says when the ledger cannot know, and the old primary rejoins
//! as a replica.

use super::{cluster, on_cluster, three};
use crate::support::client::Client;
use crate::support::gateway::ALPHA;
use crate::support::http::get;
use crate::support::query::Query;
use crate::support::redis_cluster::NODE_TIMEOUT_MS;
use crate::support::sim::{start_sim, unlimited};
use crate::support::traffic::assert_settled_spend_survived;
use crate::support::wait::eventually;
use http::StatusCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long after the kill a 5xx may still be answered: the node timeout
/// before the primary counts as failed, up to 2 s of election, and the
/// ledger breaker's 2 s cool-down (docs/operations.md), plus 1 s of slack
/// for a loaded machine. Measured here: about 4.5 s with a 1 s timeout.
const BOUND: Duration = Duration::from_millis(NODE_TIMEOUT_MS + 2000 + 2000 + 1000);

/// A key of alpha's ledger: the victim is the primary of its slot.
const LEDGER_KEY: &str = "pgw:l:{alpha}:days";

/// (time since start, replica, status) of every request of the load.
type Log = Arc<Mutex<Vec<(Duration, usize, StatusCode)>>>;

/// Four workers that fire distinct metered searches round-robin at the
/// replicas (alpha's client on each) until `stop`, each pausing 20 ms
/// between requests (a steady load of up to 200 requests a second, not a
/// synchronisation).
fn start_load(
    replicas: &Arc<Vec<Client>>,
    queries: Arc<Vec<Query>>,
    stop: &Arc<AtomicBool>,
    log: &Log,
) -> Vec<tokio::task::JoinHandle<()>> {
    let start = Instant::now();
    let next = Arc::new(AtomicU32::new(0));
    (0..4)
        .map(|_| {
            let (replicas, queries, stop, log, next) = (
                replicas.clone(),
                queries.clone(),
                stop.clone(),
                log.clone(),
                next.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Acquire) {
                    let i = next.fetch_add(1, Ordering::AcqRel) as usize;
                    let Some(query) = queries.get(i) else { return };
                    let replica = i % replicas.len();
                    let status = replicas[replica]
                        .get(query)
                        .request_id(&format!("alpha-{i}"))
                        .await
                        .status;
                    log.lock().expect("log").push((start.elapsed(), replica, status));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect()
}

/// Polls until every replica answered 200 after `since`.
async fn wait_all_served_after(log: &Log, since: Duration, replicas: usize, what: &str) {
    let what = format!("{what}: every replica serves again");
    eventually(&what, Duration::from_secs(20), || async {
        (0..replicas).all(|r| {
            log.lock()
                .expect("log")
                .iter()
                .any(|(t, rep, s)| *t > since && *rep == r && *s == StatusCode::OK)
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_mid_load_fails_over_and_keeps_settled_spend() {
    let cluster = Arc::new(Mutex::new(cluster().await));
    let sim = start_sim(unlimited()).await;
    let setup = on_cluster(&cluster.lock().expect("cluster"));
    let gws = three(&setup, &sim).await;
    let alphas: Arc<Vec<Client>> = Arc::new(gws.iter().map(|gw| Client::new(gw.base_url(), ALPHA.1)).collect());
    let victim = cluster.lock().expect("cluster").primary_for(LEDGER_KEY);
    let s = sim.samples();
    let queries = Arc::new((0..3000).map(|i| Query::distinct(&s, i).size(1)).collect());
    let (stop, log): (Arc<AtomicBool>, Log) = Default::default();
    let start = Instant::now();
    let workers = start_load(&alphas, queries, &stop, &log);
    eventually("the load gets going", Duration::from_secs(10), || async {
        let log = log.lock().expect("log");
        log.iter().filter(|e| e.2 == StatusCode::OK).count() >= 30
    })
    .await;

    let killed_at = start.elapsed();
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.lock().expect("cluster").kill(victim))
        .await
        .expect("kill");
    // /readyz says the ledger cannot know while the slot has no primary.
    let admin = gws[0].admin_url();
    eventually("readyz reports the lost primary", Duration::from_secs(10), || async {
        let r = get(&format!("{admin}/readyz"), &[]).await;
        if r.status != StatusCode::SERVICE_UNAVAILABLE {
            return Err(r.text());
        }
        assert!(r.json()["checks"]["ledger"].is_string(), "{}", r.text());
        Ok(())
    })
    .await;
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        c.lock()
            .expect("cluster")
            .wait_failover(LEDGER_KEY, victim, Duration::from_secs(15))
    })
    .await
    .expect("failover");
    let promoted_at = start.elapsed();
    wait_all_served_after(&log, promoted_at, gws.len(), "after the failover").await;
    let ready = get(&format!("{admin}/readyz"), &[]).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
    assert!(
        ready.json()["checks"]["ledger"]
            .as_str()
            .is_some_and(|note| note.contains("no replica in sync")),
        "the promoted primary has no replica yet: {}",
        ready.text()
    );

    // The old primary comes back and rejoins as a replica of its successor.
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        let mut c = c.lock().expect("cluster");
        c.restart(victim);
        c.wait_role(victim, "slave", Duration::from_secs(15));
        c.wait_ok(Duration::from_secs(15));
    })
    .await
    .expect("rejoin");
    let rejoined_at = start.elapsed();
    wait_all_served_after(&log, rejoined_at, gws.len(), "after the rejoin").await;
    stop.store(true, Ordering::Release);
    for w in workers {
        w.await.expect("worker");
    }

    let log = log.lock().expect("log").clone();
    let failures: Vec<_> = log.iter().filter(|e| e.2 != StatusCode::OK).collect();
    eprintln!(
        "failover: {} requests, {} not 200, killed at {killed_at:?}, cluster ok at {promoted_at:?}, last failure at {:?}",
        log.len(),
        failures.len(),
        failures.last().map(|e| e.0)
    );
    for (t, _, status) in &failures {
        assert_eq!(
            *status,
            StatusCode::SERVICE_UNAVAILABLE,
            "only the ledger's 503 while the slot moves"
        );
        assert!(
            *t >= killed_at && *t <= killed_at + BOUND,
            "a 503 at {t:?}, outside the bound after the kill at {killed_at:?}"
        );
    }
    // Ready on its own, and durable again once the old primary has synced.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = get(&format!("{admin}/readyz"), &[]).await;
        if ready.status == StatusCode::OK && ready.json()["checks"]["ledger"] == "ok" {
            break;
        }
        assert!(Instant::now() < deadline, "never fully ready again: {}", ready.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let admins: Vec<String> = gws.iter().map(|gw| gw.admin_url()).collect();
    assert_settled_spend_survived(&sim, &admins, "alpha", "alpha-").await;
}
