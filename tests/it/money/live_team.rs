//! A reservation follows the team as it is now (issue 25, case 1): a
//! request admitted before a reload that lowered its team's limit, or
//! removed the team, reserves against the reloaded table — with one
//! replica (waiting on an in-process flight) and with two (waiting on the
//! other replica's lease).

use super::replicas;
use crate::support::gateway::{team, FromFile, Setup, ADMIN_TOKEN, ALPHA, SMALL};
use crate::support::http::send;
use crate::support::monitor::Monitor;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::traffic::{as_team, charged_to, distinct_search, ledger_used};
use crate::support::wait::eventually;
use bytes::Bytes;
use http::{Method, StatusCode};
use permit_gateway::cache::lease::Acquired;
use permit_gateway::error::GatewayError;
use permit_gateway::proxy::flight::Join;
use std::time::Duration;

const SMALL_100: &str = "credit_limit = 100";

/// Rewrites the gateway's file with `teams` and reloads it.
async fn reload(file: &FromFile, setup: Setup, sim: &Sim, teams: String) -> Setup {
    let setup = setup.teams(teams);
    file.rewrite(&setup, sim);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let url = format!("{}/admin/reload", file.gw.admin_url());
    let r = send(Method::POST, &url, &[("authorization", &bearer)], Bytes::new()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    setup
}

/// One replica: a request waiting on a flight (held here) whose leader
/// then fails for its own reasons leads the next flight itself; it must
/// reserve against the limit reloaded meanwhile (1, so it is refused), or
/// be refused as unknown when its team was removed.
#[tokio::test]
async fn a_reload_mid_wait_binds_the_waiting_request_on_one_replica() {
    for removed in [false, true] {
        let sim = start_sim(unlimited()).await;
        let setup = Setup::new().teams(team(SMALL.0, SMALL.1, SMALL_100) + &team(ALPHA.0, ALPHA.1, ""));
        let file = FromFile::start(&setup, &sim).await;
        let path = distinct_search(&sim, 0, 10);
        let uri: http::Uri = path.parse().expect("uri");
        let target = permit_gateway::route::classify(&uri, 8192).expect("route");
        let key = permit_gateway::cache::key::cache_key(&target);
        let Join::Leader(held) = file.gw.proxy.flights.join(&key) else {
            panic!("the test leads the first flight")
        };
        let url = format!("{}{path}", file.gw.base_url());
        let waiting = tokio::spawn(async move { as_team(&url, SMALL.1, "small-1").await });
        // Admitted, authenticated and now following the held flight: the
        // reload below comes mid-wait, not before the request is in.
        eventually("the request follows the held flight", Duration::from_secs(5), || {
            let n = held.waiting();
            async move { (n == 1).then_some(()).ok_or(format!("{n} waiting")) }
        })
        .await;
        let teams = match removed {
            true => team(ALPHA.0, ALPHA.1, ""),
            false => team(SMALL.0, SMALL.1, "credit_limit = 1") + &team(ALPHA.0, ALPHA.1, ""),
        };
        let _setup = reload(&file, setup, &sim, teams).await;
        held.complete(Err(GatewayError::QuotaExceeded {
            limit: 0,
            needed: 1,
            remaining: 0,
            upgrade_url: String::new(),
        }));
        let r = waiting.await.expect("the waiting request");
        let expected = match removed {
            true => StatusCode::UNAUTHORIZED,
            false => StatusCode::PAYMENT_REQUIRED,
        };
        assert_eq!(r.status, expected, "removed: {removed}");
        assert_eq!(sim.stats().requests_total, 0, "nothing was bought");
        assert_eq!(charged_to(&sim, "small-"), 0);
        if !removed {
            assert_eq!(r.json()["detail"]["limit"], 1, "refused against the reloaded limit");
            let ledger = ledger_used(&file.gw.admin_url(), "small").await;
            assert_eq!(
                ledger, 0,
                "the ledger holds what the upstream charged, within the limit of 1"
            );
        } else {
            assert_eq!(r.json()["detail"], "Not authenticated", "the upstream's 401 shape");
        }
    }
}

/// Two replicas: replica B's request waits on the key's lease, held (for
/// the test) by replica A; B's limit is lowered to 1 meanwhile, then A
/// lets the lease go without storing anything, so B must buy the key in
/// turn — and its reserve is refused. Before issue 25 it reserved against
/// the limit it was admitted with and spent 10 against a limit of 1.
#[tokio::test]
async fn a_reload_mid_wait_binds_the_waiting_request_on_two_replicas() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let teams = team(SMALL.0, SMALL.1, SMALL_100) + &team(ALPHA.0, ALPHA.1, "");
    let a = replicas(1, &sim, Some(&redis), Setup::new().teams(teams.clone())).await;
    let setup = Setup::new()
        .with("cache", format!("redis_url = {:?}", redis.url()))
        .with("quota", "store = \"redis\"")
        .teams(teams);
    let b = FromFile::start(&setup, &sim).await;
    let path = distinct_search(&sim, 0, 10);
    let uri: http::Uri = path.parse().expect("uri");
    let target = permit_gateway::route::classify(&uri, 8192).expect("route");
    let key = permit_gateway::cache::key::cache_key(&target);
    let Acquired::Owned(lease) = a[0].app.leases.acquire(&key).await else {
        panic!("A takes the free lease")
    };
    let mut monitor = Monitor::start(&redis).await;
    let b_url = format!("{}{path}", b.gw.base_url());
    let waiting = tokio::spawn(async move { as_team(&b_url, SMALL.1, "small-1").await });
    // B polls A's lease (`Leases::wait_for_peer`; nothing else asks
    // whether a lease exists): it is admitted and waiting.
    monitor.until("EXISTS", "pgw:lease:").await;
    let lowered = team(SMALL.0, SMALL.1, "credit_limit = 1") + &team(ALPHA.0, ALPHA.1, "");
    let _setup = reload(&b, setup, &sim, lowered).await;
    assert!(!waiting.is_finished(), "B still waits on the lease");
    lease.release().await;
    let r = waiting.await.expect("B's request");
    assert_eq!(
        r.status,
        StatusCode::PAYMENT_REQUIRED,
        "B bought the key ({:?})",
        r.header("x-cache")
    );
    assert_eq!(r.json()["detail"]["limit"], 1, "refused against the reloaded limit");
    assert_eq!(sim.stats().requests_total, 0, "nothing was bought");
    let small = ledger_used(&b.gw.admin_url(), "small").await;
    assert_eq!(small, charged_to(&sim, "small-"));
    assert!(small <= 1, "ledger {small} within the reloaded limit");
}
