//! Reading spend and driving shared loads: used by the budget, fault, rate
//! and replica suites, so that "what the upstream charged a team" means one
//! thing.

use super::client::Client;
use super::query::Query;
use super::sim::Sim;
use super::wait::eventually;
use http::StatusCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `Query::distinct(i)` with `size` records.
pub fn distinct_search(sim: &Sim, i: u32, size: u32) -> Query {
    Query::distinct(&sim.samples(), i).size(size)
}

/// `distinct_search` for `0..n` (the samples are computed once).
pub fn distinct_searches(sim: &Sim, n: u32, size: u32) -> Vec<Query> {
    let s = sim.samples();
    (0..n).map(|i| Query::distinct(&s, i).size(size)).collect()
}

/// Credits the simulator charged for requests whose `X-Request-Id` starts
/// with `prefix` (tests prefix ids with the team's name; the gateway
/// forwards the id of the request that fetched, whose team paid).
pub fn charged_to(sim: &Sim, prefix: &str) -> u64 {
    sim.log()
        .iter()
        .filter(|e| e.request_id.as_deref().is_some_and(|id| id.starts_with(prefix)))
        .map(|e| e.credits)
        .sum()
}

/// Credits the simulator charged for the one request with this id.
pub fn charged_for(sim: &Sim, request_id: &str) -> u64 {
    sim.log()
        .iter()
        .filter(|e| e.request_id.as_deref() == Some(request_id))
        .map(|e| e.credits)
        .sum()
}

/// The `i`th call of a two-team load: alpha and beta take turns, each with
/// a request id that attributes the upstream's charge to its team.
pub fn alternate(i: u32) -> (&'static str, String) {
    use super::gateway::{ALPHA, BETA};
    if i % 2 == 0 {
        (ALPHA.1, format!("alpha-{i}"))
    } else {
        (BETA.1, format!("beta-{i}"))
    }
}

/// A team's spend in its window as the admin API reports it (the ledger,
/// unaffected by the team's own rate limit).
pub async fn ledger_used(admin: &str, team: &str) -> u64 {
    admin_team(admin, team).await["used"].as_u64().expect("used")
}

/// A team's entry of `GET /admin/teams` (its limit, used, remaining, ...).
pub async fn admin_team(admin: &str, team: &str) -> serde_json::Value {
    let r = Client::admin(admin)
        .get("/admin/teams")
        .expect_status(StatusCode::OK)
        .await;
    let teams = r.json()["teams"].as_array().cloned().unwrap_or_default();
    teams
        .into_iter()
        .find(|t| t["name"] == team)
        .unwrap_or_else(|| panic!("no team {team}"))
}

/// `ledger_used`, or `None` while the ledger cannot answer (a Redis
/// ledger that stalls or restarts).
pub async fn ledger_used_now(admin: &str, team: &str) -> Option<u64> {
    let r = Client::admin(admin).get("/admin/teams").await;
    let teams = r.json()["teams"].as_array().cloned().unwrap_or_default();
    teams.iter().find(|t| t["name"] == team)?["used"].as_u64()
}

/// The ledger of each team equals what the upstream charged it.
pub async fn assert_ledger_matches(sim: &Sim, admin: &str, teams: &[&str]) {
    for name in teams {
        let ledger = ledger_used(admin, name).await;
        let upstream = charged_to(sim, &format!("{name}-"));
        assert_eq!(
            ledger, upstream,
            "team {name}: ledger {ledger} != upstream charge {upstream}"
        );
    }
}

/// Sends 60 distinct one-record searches of team alpha, spread round-robin
/// over `bases` (one gateway replica each), all at once, and asserts that the
/// replicas shared one upstream budget of `requests_per_minute` (the
/// gateway's burst of a tenth of it, then the rate): at most that many
/// calls reached the upstream from the moment the load started, and the
/// queue answered the excess 429. Replicas each pacing at the whole rate
/// would send up to `bases.len()` times the budget.
pub async fn assert_replicas_share_the_upstream_rate(
    sim: &Sim,
    bases: &[String],
    token: &str,
    requests_per_minute: u32,
) {
    // The replicas' `upstream.burst`: a tenth of a minute's worth.
    let burst = f64::from((requests_per_minute / 10).max(1));
    let per_sec = f64::from(requests_per_minute) / 60.0;
    let before = sim.stats().requests_total as f64;
    let s = sim.samples();
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..60u32)
        .map(|i| {
            let alpha = Client::new(&bases[i as usize % bases.len()], token);
            let call = alpha.get(Query::distinct(&s, i).size(1)).request_id("alpha");
            tokio::spawn(async move { call.await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.expect("task"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let upstream = sim.stats().requests_total as f64 - before;
    // One call of slack for the edge of the window.
    let allowed = burst + per_sec * elapsed + 1.0;
    assert!(
        upstream <= allowed,
        "{upstream} upstream calls in {elapsed:.1}s > {allowed:.0}"
    );
    assert!(upstream >= burst, "the burst went through: {upstream}");
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::OK || *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
        "the shared queue refused what it could not serve in time"
    );
}

/// After a Redis primary died under load: the ledger reaches what the
/// upstream charged to `prefix`, less only the settles that failed in flight
/// (each counted; each search costs one credit), and never more. Settles run
/// in tasks of their own and retry until their reservation's `settle_by`,
/// so the last of them may land after the load has ended: waited for, up
/// to the default reservation lease.
pub async fn assert_settled_spend_survived(sim: &Sim, admins: &[String], team: &str, prefix: &str) {
    let charged = charged_to(sim, prefix);
    let (ledger, failed) = eventually(
        "every acknowledged settle survived",
        std::time::Duration::from_secs(65),
        || async {
            let ledger = ledger_used(&admins[0], team).await;
            let mut failed = 0.0;
            for admin in admins {
                let m = crate::support::probe::scrape(admin).await;
                failed += m.sum(
                    "gateway_backend_errors_total",
                    &[("backend", "ledger"), ("op", "settle")],
                );
            }
            let failed = failed as u64;
            if ledger + failed == charged {
                Ok((ledger, failed))
            } else {
                Err(format!(
                    "ledger {ledger} + {failed} failed settles, upstream charged {charged}"
                ))
            }
        },
    )
    .await;
    assert!(
        ledger <= charged,
        "no settle counted twice: ledger {ledger} > charged {charged}"
    );
    assert!(failed <= charged, "{failed} failed settles");
}

/// (time since the load started, replica, status) of every request of a
/// steady load ([`start_load`]).
pub type Log = Arc<Mutex<Vec<(Duration, usize, StatusCode)>>>;

/// Four workers that fire distinct metered searches round-robin at the
/// replicas (one team's client on each, request ids `alpha-{i}`) until
/// `stop`, each pausing 20 ms between requests (a steady load of up to 200
/// requests a second, not a synchronisation), logging every answer.
pub fn start_load(
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

/// Polls until the load has been answered 200 `n` times.
pub async fn wait_load_served(log: &Log, n: usize) {
    eventually("the load gets going", Duration::from_secs(10), || async {
        let log = log.lock().expect("log");
        log.iter().filter(|e| e.2 == StatusCode::OK).count() >= n
    })
    .await;
}

/// Polls until every replica answered 200 after `since`.
pub async fn wait_all_served_after(log: &Log, since: Duration, replicas: usize, what: &str) {
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

/// Every answer of the load that was not a 200 is the ledger's 503 while
/// the Redis primary moved: no earlier than `killed_at`, no later than
/// `bound` after it (`what` moved: "the primary", "the slot").
pub fn assert_only_503s_within(
    log: &[(Duration, usize, StatusCode)],
    killed_at: Duration,
    bound: Duration,
    what: &str,
) {
    for (t, _, status) in log.iter().filter(|e| e.2 != StatusCode::OK) {
        assert_eq!(
            *status,
            StatusCode::SERVICE_UNAVAILABLE,
            "only the ledger's 503 while {what} moves"
        );
        assert!(
            *t >= killed_at && *t <= killed_at + bound,
            "a 503 at {t:?}, outside {bound:?} after the kill at {killed_at:?}"
        );
    }
}
