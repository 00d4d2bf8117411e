//! The access log of every answer says what that request cost its team
//! (issue 24): the `credits` field of the gateway's access-log line for a
//! MISS that bought a page, for a HIT (0), and for a lookup of held and new
//! ids (only the new ones) — each equal to the answer's `X-Credits-Request`
//! and to what the upstream charged under the request's id.

use super::{direct, ids_of, lookup, permit_search};
use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA};
use crate::support::sim::{start_sim, unlimited};
use crate::support::traffic::{charged_for, charged_to, ledger_used};
use http::StatusCode;

#[tokio::test]
async fn the_access_log_says_what_each_answer_cost_the_team() {
    let sim = start_sim(unlimited()).await;
    let gw = ChildGateway::spawn(&Setup::new(), &sim.base_url(), sim.api_key());
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let search = permit_search(&sim, 4);
    let miss = alpha.get(&search).request_id("alpha-miss").await;
    assert_eq!(miss.status, StatusCode::OK, "{}", miss.text());
    let hit = alpha.get(&search).request_id("alpha-hit").await;
    // Two ids the search brought and two it did not.
    let held = ids_of(&miss);
    let wider = ids_of(&direct(&sim, &permit_search(&sim, 8)).await);
    let new: Vec<&String> = wider.iter().filter(|id| !held.contains(id)).take(2).collect();
    assert_eq!(new.len(), 2, "{wider:?}");
    let part = alpha
        .get(lookup("permits", &[&held[0], new[0], &held[2], new[1]]))
        .request_id("alpha-part")
        .await;
    for (request_id, reply, cache, cost) in [
        ("alpha-miss", &miss, "MISS", 4),
        ("alpha-hit", &hit, "HIT", 0),
        ("alpha-part", &part, "MISS", 2),
    ] {
        assert_eq!(reply.status, StatusCode::OK, "{request_id}: {}", reply.text());
        assert_eq!(reply.header("x-cache"), Some(cache), "{request_id}");
        assert_eq!(reply.header_u64("x-credits-request"), Some(cost), "{request_id}");
        assert_eq!(
            charged_for(&sim, request_id),
            cost,
            "{request_id}: the upstream's charge"
        );
        let line = gw.access_line(request_id).await;
        assert_eq!(line["credits"].as_u64(), Some(cost), "{line}");
        let logged_cache = line["cache"].as_str().map(str::to_ascii_uppercase);
        assert_eq!(line["team"].as_str(), Some("alpha"), "{line}");
        assert_eq!(logged_cache.as_deref(), Some(cache), "{line}");
    }
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, charged_to(&sim, "alpha-"));
    assert_eq!(charged_to(&sim, "alpha-"), 6);
    gw.assert_logs_clean();
}
