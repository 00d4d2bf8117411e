//! Spend is booked on the day it is spent (issue 25, case 4), with the
//! ledger's clock shifted by `quota.clock_offset_secs` so that a month's
//! end comes when the test needs it.

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, SMALL};
use crate::support::redis::RedisServer;
use crate::support::sim::{fault, start_sim, unlimited, FaultKind, Faults};
use crate::support::traffic::{charged_for, charged_to, distinct_search};
use crate::support::wait::eventually;
use chrono::{Datelike, NaiveDate, Utc};
use http::StatusCode;
use permit_gateway::ledger::Window;
use std::time::Duration;

/// Seconds from now to `at` (UTC) on the ledger's clock.
fn offset_to(at: chrono::NaiveDateTime) -> i64 {
    (at.and_utc() - Utc::now()).num_seconds()
}

/// A gateway on the shared Redis ledger, calendar-month budgets, its
/// ledger clock shifted by `offset` seconds.
fn gateway(sim: &crate::support::sim::Sim, redis: &RedisServer, offset: i64) -> ChildGateway {
    let setup = Setup::new()
        .teams(&[SMALL])
        .credit_limit(SMALL, 100)
        .redis(&redis.url())
        .with(move |c| {
            c.upstream.timeout_secs = 5;
            c.upstream.max_queue_wait_secs = 1;
            c.quota.window = Window::CalendarMonth;
            c.quota.reservation_lease_secs = 11;
            c.quota.clock_offset_secs = offset;
        });
    ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key())
}

/// Reserved at 23:59:50 on a month's last day, the replica killed before
/// any settle; the reservation lapses and becomes spend after midnight.
/// It counts in the new month, where it was spent: 40 of that month's 100,
/// so a call of 61 is refused and one of 60 takes the team exactly to its
/// limit. Before issue 25 it counted in the month that had closed, and the
/// team could spend 140 in the new month against a limit of 100.
#[tokio::test]
async fn a_reservation_across_midnight_counts_on_the_day_it_becomes_spend() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let today = Utc::now().date_naive();
    let next_month = match today.month() {
        12 => NaiveDate::from_ymd_opt(today.year() + 1, 1, 1),
        m => NaiveDate::from_ymd_opt(today.year(), m + 1, 1),
    }
    .expect("a date");
    let last_day = next_month.pred_opt().expect("a date");
    let before = offset_to(last_day.and_hms_opt(23, 59, 50).expect("a time"));
    let mut gw = gateway(&sim, &redis, before);
    // The upstream answers after 3 s: past midnight on the ledger's clock.
    sim.set_faults(Faults {
        latency_ms: Some(3_000),
        count: Some(1),
        ..fault(FaultKind::Latency)
    });
    let call = Client::new(gw.base_url(), SMALL.1)
        .get(distinct_search(&sim, 0, 40))
        .request_id("small-0")
        .spawn();
    eventually("the reservation is held", Duration::from_secs(10), || async {
        redis.holds("small").await == Some(1)
    })
    .await;
    gw.signal("KILL");
    gw.wait_exit(Duration::from_secs(10));
    call.abort();
    sim.clear_faults();
    // A minute into the new month: the reservation's lease (11 s) is over.
    let after = offset_to(next_month.and_hms_opt(0, 1, 0).expect("a time"));
    let gw = gateway(&sim, &redis, after);
    let small = Client::new(gw.base_url(), SMALL.1);
    let over = small.get(distinct_search(&sim, 1, 61)).request_id("small-1").await;
    assert_eq!(
        over.status,
        StatusCode::PAYMENT_REQUIRED,
        "40 lapsed into this month + 61 > 100"
    );
    assert_eq!(small.used().await, 40, "booked in the new month");
    let last = small.get(distinct_search(&sim, 2, 60)).request_id("small-2").await;
    assert_eq!(last.status, StatusCode::OK, "{}", last.text());
    let spent = small.used().await;
    assert_eq!(spent, 100, "exactly the limit, never above");
    // What the simulator charged, call by call: the refused call reached
    // nothing, the last one was billed its 60. The killed call is billed
    // 40 if the simulator finished it after the gateway died, 0 if it
    // dropped it with the connection; either way the ledger counted its
    // full reservation, so it holds the upstream's charge plus whatever
    // of that reservation was never billed — never less.
    assert_eq!(charged_for(&sim, "small-1"), 0, "refused before the upstream");
    assert_eq!(charged_for(&sim, "small-2"), 60);
    let killed = charged_for(&sim, "small-0");
    eprintln!("midnight: the killed call was billed {killed} by the upstream; ledger {spent}");
    assert!(killed == 0 || killed == 40, "the killed call billed {killed}");
    let charged = charged_to(&sim, "small-");
    assert_eq!(charged, 60 + killed);
    assert_eq!(
        spent,
        charged + (40 - killed),
        "the ledger is the upstream's charge plus the lapsed reservation's unbilled part"
    );
}

/// The Redis ledger alone: a reservation made today lapses at a reserve
/// made tomorrow (a replica whose clock is a day on) and counts there, on
/// the day it became spend; its settle, arriving after the lapse with a
/// charge above the reservation, adds just the excess, once.
#[tokio::test]
async fn a_lapsed_reservation_counts_tomorrow_and_a_late_settle_adds_its_excess() {
    use permit_gateway::clock::Clock;
    use permit_gateway::ledger::redis::RedisLedger;
    use permit_gateway::ledger::{Ledger, Reserved, Window};
    use permit_gateway::redis_backend::RedisBackend;
    use permit_gateway::route::Route;
    use std::sync::Arc;
    let redis = RedisServer::start();
    let open = |clock: Clock| {
        let metrics = Arc::new(permit_gateway::metrics::Metrics::new());
        let backend = RedisBackend::new(&redis.url(), Duration::from_secs(5), metrics).expect("backend");
        let lease = Duration::from_secs(60);
        Ledger::Redis(RedisLedger::new(Arc::new(backend), "pgw:", Window::Rolling30d, lease).with_clock(clock))
    };
    let today = open(Clock::default());
    let tomorrow = open(Clock::shifted(86_400 + 120));
    let Ok(Reserved::Granted(r)) = today.reserve("t", Some(100), 40).await else {
        panic!("granted")
    };
    // A day on, the hold's lease is long over: the reserve converts it.
    let Ok(Reserved::Rejected { used, .. }) = tomorrow.reserve("t", Some(100), 61).await else {
        panic!("40 lapsed + 61 > 100")
    };
    assert_eq!(used, 40);
    let usage = tomorrow.usage("t").await.expect("usage");
    assert_eq!(
        usage.daily,
        vec![(tomorrow.today(), 40)],
        "booked on the day it became spend"
    );
    assert_eq!(
        today.usage("t").await.expect("usage").used,
        0,
        "not on the reserve's day"
    );
    // The settle after the lapse: the upstream billed 45 for the 40 held.
    today.settle(r, 45, Route::PermitsSearch).await.expect("settle");
    assert_eq!(
        tomorrow.usage("t").await.expect("usage").used,
        45,
        "the excess of 5 added"
    );
}
