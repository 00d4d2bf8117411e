//! A HEAD never buys (issue 25, case 3), not even the background refresh
//! of an entry inside the stale-while-revalidate window.

use crate::support::gateway::{Setup, ALPHA};
use crate::support::http::{get, send};
use crate::support::sim::{start_sim, unlimited};
use crate::support::traffic::{as_team, assert_ledger_matches, charged_to, distinct_search};
use crate::support::wait::eventually;
use bytes::Bytes;
use http::{Method, StatusCode};
use std::time::Duration;

/// An expired entry inside the revalidate window: a HEAD is answered from
/// it (STALE) and starts no refresh; the next GET starts the one refresh,
/// paid by the GET's team. The upstream saw the first fetch and the GET's
/// refresh only, and the ledger equals what it charged.
#[tokio::test]
async fn a_head_in_the_revalidate_window_starts_no_paid_refresh() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(
            "cache",
            "stale_while_revalidate_secs = 600\n[cache.route_ttl_secs]\npermits_search = 1",
        )
        .start(&sim)
        .await;
    let url = format!("{}{}", gw.base_url(), distinct_search(&sim, 0, 6));
    assert_eq!(
        as_team(&url, ALPHA.1, "alpha-miss").await.header("x-cache"),
        Some("MISS")
    );
    eventually("the entry expires", Duration::from_secs(5), || async {
        let r = get(&url, &[("x-api-key", ALPHA.1), ("cache-control", "only-if-cached")]).await;
        r.header("x-cache") == Some("STALE")
    })
    .await;
    let head = send(
        Method::HEAD,
        &url,
        &[("x-api-key", ALPHA.1), ("x-request-id", "alpha-head")],
        Bytes::new(),
    )
    .await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.header("x-cache"), Some("STALE"));
    // The HEAD claimed no refresh: this GET starts it (one per key at a time).
    let stale = as_team(&url, ALPHA.1, "alpha-get").await;
    assert_eq!(stale.header("x-cache"), Some("STALE"));
    eventually("the GET's refresh lands", Duration::from_secs(10), || async {
        as_team(&url, ALPHA.1, "alpha-hit").await.header("x-cache") == Some("HIT")
    })
    .await;
    let ids: Vec<_> = sim.log().iter().filter_map(|e| e.request_id.clone()).collect();
    assert_eq!(ids, ["alpha-miss", "alpha-get"], "the HEAD bought nothing");
    assert_eq!(charged_to(&sim, "alpha-head"), 0);
    assert_eq!(charged_to(&sim, "alpha-"), 12);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}
