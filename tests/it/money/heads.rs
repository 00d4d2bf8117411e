//! A HEAD never buys (issue 25, case 3), not even the background refresh
//! of an entry inside the stale-while-revalidate window.

use super::revalidating;
use crate::support::client::Client;
use crate::support::gateway::ALPHA;
use crate::support::sim::{start_sim, unlimited};
use crate::support::traffic::{assert_ledger_matches, charged_to, distinct_search};
use crate::support::wait::eventually;
use http::{Method, StatusCode};
use std::time::Duration;

/// An expired entry inside the revalidate window: a HEAD is answered from
/// it (STALE) and starts no refresh; the next GET starts the one refresh,
/// paid by the GET's team. The upstream saw the first fetch and the GET's
/// refresh only, and the ledger equals what it charged.
#[tokio::test]
async fn a_head_in_the_revalidate_window_starts_no_paid_refresh() {
    let sim = start_sim(unlimited()).await;
    let gw = revalidating().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let query = distinct_search(&sim, 0, 6);
    assert_eq!(alpha.get(&query).request_id("alpha-miss").await.x_cache(), Some("MISS"));
    alpha.wait_expired(&query).await;
    let head = alpha.send(Method::HEAD, &query).request_id("alpha-head").await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.header("x-cache"), Some("STALE"));
    // The HEAD claimed no refresh: this GET starts it (one per key at a time).
    let stale = alpha.get(&query).request_id("alpha-get").await;
    assert_eq!(stale.header("x-cache"), Some("STALE"));
    eventually("the GET's refresh lands", Duration::from_secs(10), || async {
        alpha.get(&query).request_id("alpha-hit").await.x_cache() == Some("HIT")
    })
    .await;
    let ids: Vec<_> = sim.log().iter().filter_map(|e| e.request_id.clone()).collect();
    assert_eq!(ids, ["alpha-miss", "alpha-get"], "the HEAD bought nothing");
    assert_eq!(charged_to(&sim, "alpha-head"), 0);
    assert_eq!(charged_to(&sim, "alpha-"), 12);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}
