//! Issue 28: spending less than asked. A complete page answers the same
//! query at any size it fits in, a counted first page answers the uncounted
//! one, and a team that opted in gets the page its remaining credits cover
//! instead of a 402. Each with one gateway and with two replicas sharing
//! Redis (cache, leases, ledger): the second request goes to the other
//! replica, so what answers it is what the first one stored in Redis.

use crate::support::client::Client;
use crate::support::gateway::{replicas, Setup, Team, ALPHA};
use crate::support::http::Reply;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim};
use crate::support::traffic::{assert_ledger_matches, charged_to, ledger_used};
use http::StatusCode;
use permit_gateway::Running;
use serde_json::Value;

/// The upstream's own answer to `query`, asked directly (outside the
/// gateway): what a held answer must equal byte for byte.
async fn upstream(sim: &Sim, query: &Query) -> Reply {
    Client::upstream(sim).get(query).expect_status(StatusCode::OK).await
}

/// Team alpha on the `i`th of `gws` (round robin).
fn alpha_on(gws: &[Running], i: usize) -> Client {
    Client::new(gws[i % gws.len()].base_url(), ALPHA.1)
}

fn records(r: &Reply) -> usize {
    r.json()["items"].as_array().map_or(0, Vec::len)
}

/// A permit search whose whole answer is 2..=40 records (one complete page
/// at `size=100`), and that number. Probed on the simulator directly.
async fn small_search(sim: &Sim) -> (Query, usize) {
    let s = sim.samples();
    for geo in [
        &s.address_geo_id,
        &s.zip,
        &s.city_geo_id,
        &s.jurisdiction_geo_id,
        &s.county_geo_id,
    ] {
        for days in [1u64, 7, 31, 92, 366, 3650] {
            let from =
                chrono::NaiveDate::parse_from_str(&s.permit_to, "%Y-%m-%d").expect("date") - chrono::Days::new(days);
            let path = Query::permit_search(geo).window(from, &s.permit_to);
            let r = upstream(sim, &path.clone().size(100)).await;
            let n = records(&r);
            if (2..=40).contains(&n) && r.json()["next_cursor"].is_null() {
                return (path, n);
            }
        }
    }
    panic!("no small search in the dataset");
}

/// A search of the big state: every page full, a cursor after each.
fn big_search(sim: &Sim) -> Query {
    let s = sim.samples();
    Query::permit_search(&s.big_state).window(&s.permit_from, &s.permit_to)
}

fn assert_hit(r: &Reply, what: &str) {
    assert_eq!(r.status, StatusCode::OK, "{what}: {}", r.text());
    assert_eq!(r.x_cache(), Some("HIT"), "{what}");
    assert_eq!(r.credits_request(), Some(0), "{what}");
}

async fn complete_page_answers_other_sizes(n_replicas: usize) {
    let redis = RedisServer::for_replicas(n_replicas);
    let sim = start_sim(unlimited()).await;
    let (path, n) = small_search(&sim).await;
    let gws = replicas(n_replicas, &sim, redis.as_ref(), Setup::new()).await;
    let before = sim.stats().requests_total;
    let bought = alpha_on(&gws, 0)
        .get(path.clone().size(n + 5))
        .request_id("alpha-buy")
        .expect_status(StatusCode::OK)
        .await;
    assert_eq!(bought.credits_request(), Some(n as u64));
    assert!(bought.json()["next_cursor"].is_null(), "complete");
    let mut sizes = vec![n, 100];
    if n <= 50 {
        sizes.push(50); // no `size`: the default
    }
    for (i, size) in sizes.into_iter().enumerate() {
        let asked = if size == 50 {
            path.clone()
        } else {
            path.clone().size(size)
        };
        let r = alpha_on(&gws, i + 1)
            .get(&asked)
            .request_id(&format!("alpha-{i}"))
            .await;
        assert_hit(&r, &asked.to_string());
        assert_eq!(r.json()["items"], bought.json()["items"], "{asked}: same records");
        assert_eq!(r.body, bought.body, "{asked}: the same bytes");
    }
    assert_eq!(
        sim.stats().requests_total - before,
        1,
        "one upstream call for all sizes"
    );
    // Fewer than n: that page has a cursor; it is bought, not derived.
    let fewer = path.clone().size(n - 1);
    let r = alpha_on(&gws, 0).get(fewer).request_id("alpha-fewer").await;
    assert_eq!(r.x_cache(), Some("MISS"), "size {} < {n}", n - 1);
    assert_eq!(records(&r), n - 1);
    assert!(r.json()["next_cursor"].is_string());
    assert_eq!(sim.stats().requests_total - before, 2);
    // What the gateway answered is what the upstream sends for that size.
    assert_eq!(upstream(&sim, &path.size(100)).await.body, bought.body);
    assert_ledger_matches(&sim, &gws[0].admin_url(), &["alpha"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_page_answers_smaller_and_larger_sizes_for_free() {
    complete_page_answers_other_sizes(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_page_answers_other_sizes_on_two_replicas() {
    complete_page_answers_other_sizes(2).await;
}

async fn counted_page_answers_the_plain_one(n_replicas: usize) {
    let redis = RedisServer::for_replicas(n_replicas);
    let sim = start_sim(unlimited()).await;
    let (small, n) = small_search(&sim).await;
    let gws = replicas(n_replicas, &sim, redis.as_ref(), Setup::new()).await;
    let before = sim.stats().requests_total;
    // A page with a cursor: only the very same size is held.
    let big = big_search(&sim).size(5);
    let counted = alpha_on(&gws, 0)
        .get(big.clone().include_count(true))
        .request_id("alpha-c1")
        .await;
    assert_eq!(counted.credits_request(), Some(5), "{}", counted.text());
    assert!(counted.json()["total_count"].is_object());
    let plain = alpha_on(&gws, 1).get(&big).request_id("alpha-p1").await;
    assert_hit(&plain, "the uncounted page");
    assert_eq!(plain.json()["items"], counted.json()["items"]);
    assert_eq!(plain.json()["next_cursor"], counted.json()["next_cursor"]);
    assert!(plain.json()["next_cursor"].is_string());
    assert_eq!(plain.json()["total_count"], Value::Null);
    // A complete counted page answers the plain query at any size ≥ n.
    let c2 = small.clone().size(n + 3).include_count(true);
    let counted_small = alpha_on(&gws, 0).get(c2).request_id("alpha-c2").await;
    assert_eq!(counted_small.credits_request(), Some(n as u64));
    let plain_small = alpha_on(&gws, 1)
        .get(small.clone().size(100))
        .request_id("alpha-p2")
        .await;
    assert_hit(&plain_small, "the uncounted complete page at another size");
    assert_eq!(plain_small.json()["items"], counted_small.json()["items"]);
    assert_eq!(
        sim.stats().requests_total - before,
        2,
        "only the counted pages were bought"
    );
    // Byte for byte what the upstream sends uncounted.
    assert_eq!(upstream(&sim, &big).await.body, plain.body);
    assert_eq!(upstream(&sim, &small.size(100)).await.body, plain_small.body);
    // The reverse is never derived: the count is not in the plain page.
    let other = big_search(&sim).size(4);
    alpha_on(&gws, 0).get(&other).request_id("alpha-p3").await;
    let r = alpha_on(&gws, 1)
        .get(other.include_count(true))
        .request_id("alpha-c3")
        .await;
    assert_eq!(r.x_cache(), Some("MISS"));
    assert!(r.json()["total_count"].is_object());
    assert_ledger_matches(&sim, &gws[0].admin_url(), &["alpha"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counted_first_page_answers_the_plain_one_for_free() {
    counted_page_answers_the_plain_one(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counted_first_page_answers_the_plain_one_on_two_replicas() {
    counted_page_answers_the_plain_one(2).await;
}

const BATCH: Team = ("batch", "tok-batch-4b5c6d7e8f901a2b");
const PLAIN: Team = ("plain", "tok-plain-9e8d7c6b5a4f3e2d");
const LIMIT: u64 = 30;

async fn clamped_pages(n_replicas: usize) {
    let redis = RedisServer::for_replicas(n_replicas);
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new()
        .teams(&[BATCH, PLAIN])
        .team(BATCH, |t| {
            t.credit_limit = Some(LIMIT);
            t.clamp_to_budget = true;
        })
        .credit_limit(PLAIN, LIMIT);
    let gws = replicas(n_replicas, &sim, redis.as_ref(), setup).await;
    let on = |i: usize, token: &str| Client::new(gws[i % gws.len()].base_url(), token);
    let s = sim.samples();
    let search = |i: u32, size: u32| Query::distinct(&s, i).size(size);
    // Batch spends 12, then asks 100 with 18 left: it gets 18 and a cursor.
    let first = on(0, BATCH.1).get(search(0, 12)).request_id("batch-0").await;
    assert_eq!(first.credits_request(), Some(12), "{}", first.text());
    assert_eq!(first.header("x-gateway-clamped"), None, "it fit");
    let r = on(1, BATCH.1).get(search(1, 100)).request_id("batch-1").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-gateway-clamped"), Some("100"));
    let remaining = LIMIT - 12;
    assert!(records(&r) as u64 <= remaining, "{} records", records(&r));
    assert_eq!(records(&r) as u64, remaining);
    assert!(r.json()["next_cursor"].is_string(), "the upstream's cursor");
    assert_eq!(r.credits_request(), Some(remaining));
    assert_eq!(r.header_u64("x-credits-remaining"), Some(0));
    let sent = sim
        .log()
        .into_iter()
        .find(|e| e.request_id.as_deref() == Some("batch-1"));
    assert!(
        sent.is_some_and(|e| e.query.contains(&format!("size={remaining}")) && !e.query.contains("size=100")),
        "the upstream was asked for what the team can pay"
    );
    // Nothing left: the upstream's 402, nothing sent.
    let calls = sim.stats().requests_total;
    let broke = on(0, BATCH.1).get(search(2, 10)).request_id("batch-2").await;
    assert_eq!(broke.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(broke.json()["detail"]["limit"], LIMIT);
    assert!(broke.json()["detail"]["error"].is_string());
    assert_eq!(broke.header("x-gateway-clamped"), None);
    // A team without the opt-in: 402 as before, nothing sent.
    let p = on(1, PLAIN.1).get(search(3, 100)).request_id("plain-0").await;
    assert_eq!(p.status, StatusCode::PAYMENT_REQUIRED, "{}", p.text());
    assert!(p.json()["detail"]["upgrade_url"].is_string());
    assert_eq!(p.header("x-gateway-clamped"), None);
    assert_eq!(sim.stats().requests_total, calls, "no 402 reached the upstream");
    assert_eq!(charged_to(&sim, "plain-"), 0);
    assert_eq!(ledger_used(&gws[0].admin_url(), "plain").await, 0);
    assert_ledger_matches(&sim, &gws[0].admin_url(), &["batch", "plain"]).await;
    assert_eq!(ledger_used(&gws[0].admin_url(), "batch").await, LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clamped_team_gets_what_its_credits_cover_and_a_cursor() {
    clamped_pages(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clamped_team_gets_what_its_credits_cover_on_two_replicas() {
    clamped_pages(2).await;
}

/// Issue 39, point 4: the upstream answers a search with fewer records
/// than it holds (the first one only), no cursor, billed for all of them.
/// That page is served as it is to the query that bought it, but it is no
/// complete answer: another size of the same search, on either replica,
/// goes to the upstream and gets the whole answer.
async fn a_page_billed_above_its_records_answers_no_other_size(n_replicas: usize) {
    let redis = RedisServer::for_replicas(n_replicas);
    let sim = start_sim(unlimited()).await;
    let (path, n) = small_search(&sim).await;
    let gws = replicas(n_replicas, &sim, redis.as_ref(), Setup::new()).await;
    let before = sim.stats().requests_total;
    sim.set_faults(Faults {
        kind: FaultKind::PartialRecords,
        count: Some(1),
        ..Default::default()
    });
    let cut = alpha_on(&gws, 0)
        .get(path.clone().size(n + 5))
        .request_id("alpha-cut")
        .expect_status(StatusCode::OK)
        .await;
    assert_eq!(records(&cut), 1, "the upstream sent one record");
    assert!(cut.json()["next_cursor"].is_null());
    assert_eq!(cut.credits_request(), Some(n as u64), "billed for {n}");
    for (i, size) in [100, n].into_iter().enumerate() {
        let r = alpha_on(&gws, i + 1)
            .get(path.clone().size(size))
            .request_id(&format!("alpha-whole-{i}"))
            .expect_status(StatusCode::OK)
            .await;
        assert_eq!(r.x_cache(), Some(if i == 0 { "MISS" } else { "HIT" }), "size {size}");
        assert_eq!(records(&r), n, "size {size}: the whole answer, not the cut page");
    }
    assert_eq!(
        sim.stats().requests_total - before,
        2,
        "the cut page and one honest page (which then answers size n)"
    );
    assert_ledger_matches(&sim, &gws[0].admin_url(), &["alpha"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_billed_above_its_records_is_not_served_for_another_size() {
    a_page_billed_above_its_records_answers_no_other_size(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_billed_above_its_records_is_not_served_for_another_size_on_two_replicas() {
    a_page_billed_above_its_records_answers_no_other_size(2).await;
}
