//! A crash between the upstream's charge and the settle (case 6).

use super::{fault, wait_until};
use crate::support::gateway::{team, ChildGateway, Setup, SMALL};
use crate::support::http::send;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults};
use crate::support::traffic::{as_team, charged_to, distinct_search, used};
use bytes::Bytes;
use http::{Method, StatusCode};
use std::time::Duration;

/// Case 6: SIGKILL while the upstream streams three answers it already
/// billed. Their charges are settled from the billed heads before the
/// bodies (and the reservations were written before the calls, so one
/// killed before its head counts as spent at restart): afterwards the
/// ledger holds at least the charge, never above the limit.
#[tokio::test]
async fn sigkill_between_charge_and_settle_counts_the_calls_as_spent() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(team(SMALL.0, SMALL.1, "credit_limit = 100"));
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    // The upstream charges at once, then trickles the body for 20 s.
    sim.set_faults(Faults {
        delay_ms: Some(20_000),
        ..fault(FaultKind::SlowBody)
    });
    let base = gw.base_url();
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let url = format!("{base}{}", distinct_search(&sim, i, 30));
            let id = format!("small-{i}");
            tokio::spawn(async move {
                let headers = [("x-api-key", SMALL.1), ("x-request-id", id.as_str())];
                send(Method::GET, &url, &headers, Bytes::new()).await
            })
        })
        .collect();
    wait_until("three calls charged upstream", Duration::from_secs(10), || async {
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
    let spent = used(&gw.base_url(), SMALL.1).await;
    assert_eq!(spent, 90, "every charged call counts (the upstream charged 90)");
    let over = as_team(
        &format!("{}{}", gw.base_url(), distinct_search(&sim, 5, 20)),
        SMALL.1,
        "small-5",
    )
    .await;
    assert_eq!(over.status, StatusCode::PAYMENT_REQUIRED, "90 + 20 > 100");
    let last = as_team(
        &format!("{}{}", gw.base_url(), distinct_search(&sim, 6, 10)),
        SMALL.1,
        "small-6",
    )
    .await;
    assert_eq!(last.status, StatusCode::OK);
    assert_eq!(
        used(&gw.base_url(), SMALL.1).await,
        100,
        "exactly the limit, never above"
    );
    assert_eq!(charged_to(&sim, "small-"), 100);
}
