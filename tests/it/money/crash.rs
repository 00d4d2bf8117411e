//! A crash between the upstream's charge and the settle (case 6).

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, SMALL};
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults};
use crate::support::traffic::{charged_to, distinct_search};
use crate::support::wait::eventually;
use http::StatusCode;
use std::time::Duration;

/// Case 6: SIGKILL while the upstream streams three answers it already
/// billed. Their charges are settled from the billed heads before the
/// bodies (and the reservations were written before the calls, so one
/// killed before its head counts as spent at restart): afterwards the
/// ledger holds at least the charge, never above the limit.
#[tokio::test]
async fn sigkill_between_charge_and_settle_counts_the_calls_as_spent() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 100);
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    // The upstream charges at once, then trickles the body for 20 s.
    sim.set_faults(Faults {
        delay_ms: Some(20_000),
        ..fault(FaultKind::SlowBody)
    });
    let small = Client::new(gw.base_url(), SMALL.1);
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let id = format!("small-{i}");
            small.get(distinct_search(&sim, i, 30)).request_id(&id).spawn()
        })
        .collect();
    eventually("three calls charged upstream", Duration::from_secs(10), || async {
        charged_to(&sim, "small-") == 90
    })
    .await;
    gw.signal("KILL");
    gw.wait_exit(Duration::from_secs(10));
    for c in calls {
        c.abort();
    }
    sim.clear_faults();
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let small = Client::new(gw.base_url(), SMALL.1);
    let spent = small.used().await;
    assert_eq!(spent, 90, "every charged call counts (the upstream charged 90)");
    let over = small.get(distinct_search(&sim, 5, 20)).request_id("small-5").await;
    assert_eq!(over.status, StatusCode::PAYMENT_REQUIRED, "90 + 20 > 100");
    let last = small.get(distinct_search(&sim, 6, 10)).request_id("small-6").await;
    assert_eq!(last.status, StatusCode::OK);
    assert_eq!(small.used().await, 100, "exactly the limit, never above");
    assert_eq!(charged_to(&sim, "small-"), 100);
}
