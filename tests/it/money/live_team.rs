//! A reservation follows the team as it is now (issue 25, case 1): a
//! request admitted before a reload that lowered its team's limit, or
//! removed the team, reserves against the reloaded table — with one
//! replica (waiting on an in-process flight) and with two (waiting on the
//! other replica's lease).

use crate::support::client::Client;
use crate::support::flight;
use crate::support::gateway::{replicas, FromFile, Setup, ALPHA, SMALL};
use crate::support::monitor::Monitor;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::traffic::{charged_to, distinct_search, ledger_used};
use http::StatusCode;
use permit_gateway::cache::lease::Acquired;

/// Teams small (100 credits) and alpha.
fn small_and_alpha() -> Setup {
    Setup::new().teams(&[SMALL, ALPHA]).credit_limit(SMALL, 100)
}

/// Rewrites the gateway's file with `setup` and reloads it.
async fn reload(file: &FromFile, setup: Setup, sim: &Sim) -> Setup {
    file.rewrite(&setup, sim);
    let r = file.reload().await;
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
        let setup = small_and_alpha();
        let file = FromFile::start(&setup, &sim).await;
        let query = distinct_search(&sim, 0, 10);
        let held = flight::lead(&file.gw.proxy.flights, &query.cache_key());
        let waiting = Client::new(file.gw.base_url(), SMALL.1)
            .get(&query)
            .request_id("small-1")
            .spawn();
        // Admitted, authenticated and now following the held flight: the
        // reload below comes mid-wait, not before the request is in.
        flight::followed(&held, 1).await;
        let setup = match removed {
            true => setup.teams(&[ALPHA]),
            false => setup.credit_limit(SMALL, 1),
        };
        let _setup = reload(&file, setup, &sim).await;
        flight::fail(held);
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
    let a = replicas(1, &sim, Some(&redis), small_and_alpha()).await;
    let setup = small_and_alpha().redis(&redis.url());
    let b = FromFile::start(&setup, &sim).await;
    let query = distinct_search(&sim, 0, 10);
    let Acquired::Owned(lease) = a[0].app.leases.acquire(&query.cache_key()).await else {
        panic!("A takes the free lease")
    };
    let mut monitor = Monitor::start(&redis).await;
    let waiting = Client::new(b.gw.base_url(), SMALL.1)
        .get(&query)
        .request_id("small-1")
        .spawn();
    // B polls A's lease (`Leases::wait_for_peer`; nothing else asks
    // whether a lease exists): it is admitted and waiting.
    monitor.until("EXISTS", "pgw:lease:").await;
    let _setup = reload(&b, setup.credit_limit(SMALL, 1), &sim).await;
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
