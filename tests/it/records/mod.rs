//! The record tier: a record bought once is not bought again. Id lookups
//! (`/v2/permits?id=` and siblings) are answered from the records searches
//! and earlier lookups brought; only the missing ids reach the upstream, and
//! every assembled answer equals what the simulator itself returns.

mod access_log;
mod batch;
mod edges;
mod memory;
mod overlap;

use crate::support::client::Client;
use crate::support::gateway::{Setup, ALPHA};
use crate::support::http::Reply;
use crate::support::probe::{metrics_text, scrape};
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim};
use crate::support::traffic::{assert_ledger_matches, charged_to, ledger_used};
use crate::support::wait::eventually;
use http::StatusCode;
use permit_gateway::Running;
use std::sync::atomic::{AtomicU32, Ordering};

/// `POST /admin/cache/purge` of the permit searches (and the records they
/// brought).
const PURGE_SEARCHES: &str = "/admin/cache/purge?route=permits_search";

/// Request ids `alpha-N`, so the simulator's charges are attributed.
static SEQ: AtomicU32 = AtomicU32::new(0);

async fn alpha(gw: &Running, query: &Query) -> Reply {
    alpha_with(gw, query, &[]).await
}

async fn alpha_with(gw: &Running, query: &Query, extra: &[(&str, &str)]) -> Reply {
    let id = format!("alpha-{}", SEQ.fetch_add(1, Ordering::Relaxed));
    let call = Client::new(gw.base_url(), ALPHA.1).get(query).request_id(&id);
    extra.iter().fold(call, |call, (k, v)| call.header(k, v)).await
}

/// The simulator's own answer, asked directly (no team's request id, so no
/// team is charged for it; tests read the upstream counts before this).
async fn direct(sim: &Sim, query: &Query) -> Reply {
    Client::upstream(sim).get(query).await
}

/// `Query::state_permits` at `size`.
fn permit_search(sim: &Sim, size: u32) -> Query {
    Query::state_permits(&sim.samples()).size(size)
}

/// The ids of a page's items, in order.
pub(crate) fn ids_of(r: &Reply) -> Vec<String> {
    r.json()["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items: {}", r.text()))
        .iter()
        .map(|i| i["id"].as_str().expect("string id").to_string())
        .collect()
}

fn lookup(resource: &str, ids: &[&str]) -> Query {
    Query::by_id(resource, ids)
}

/// The gateway's answer equals, as JSON, the simulator's for the same request.
async fn assert_same_as_upstream(sim: &Sim, query: &Query, got: &Reply) {
    let want = direct(sim, query).await;
    assert_eq!(want.status, StatusCode::OK, "{}", want.text());
    assert_eq!(got.json(), want.json(), "{query}");
}

fn upstream_requests(sim: &Sim) -> u64 {
    sim.stats().requests_total
}

/// The query of the last request that reached the simulator.
fn last_query(sim: &Sim) -> String {
    sim.log().last().map(|e| e.query.clone()).unwrap_or_default()
}

#[tokio::test]
async fn a_lookup_of_searched_ids_costs_nothing_and_stays_home() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let search = alpha(&gw, &permit_search(&sim, 10)).await;
    assert_eq!(search.status, StatusCode::OK, "{}", search.text());
    assert_eq!(search.header_u64("x-credits-request"), Some(10));
    let ids = ids_of(&search);
    let path = lookup("permits", &[&ids[7], &ids[2], &ids[4]]);
    let r = alpha(&gw, &path).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-cache"), Some("HIT"));
    assert_eq!(r.header_u64("x-credits-request"), Some(0));
    assert!(r.header("etag").is_some());
    assert_eq!(upstream_requests(&sim), 1, "only the search reached the upstream");
    assert_eq!(charged_to(&sim, "alpha-"), 10);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    let metrics = metrics_text(&gw.admin_url()).await;
    assert!(
        metrics.contains("gateway_credits_saved_total{reason=\"cache\",route=\"permits_by_id\",team=\"alpha\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gateway_cache_records_total{route=\"permits_by_id\",source=\"cache\"} 3"),
        "{metrics}"
    );
    assert_same_as_upstream(&sim, &path, &r).await;
}

#[tokio::test]
async fn a_lookup_of_held_and_new_ids_buys_only_the_new_ones() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    // Ids the gateway has not seen: further down the same search, asked directly.
    let deeper = ids_of(&direct(&sim, &permit_search(&sim, 15)).await);
    let before = upstream_requests(&sim);
    let held = ids_of(&alpha(&gw, &permit_search(&sim, 10)).await);
    assert_eq!(held[..], deeper[..10]);
    let asked = [&deeper[12], &held[3], &held[0], &deeper[10], &held[9]].map(String::as_str);
    let path = lookup("permits", &asked);
    let r = alpha(&gw, &path).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-cache"), Some("MISS"));
    assert_eq!(r.header_u64("x-credits-request"), Some(2));
    assert_eq!(upstream_requests(&sim) - before, 2);
    assert_eq!(
        last_query(&sim),
        format!("id={}&id={}", deeper[12], deeper[10]),
        "exactly the two new ids, in one call"
    );
    assert_eq!(charged_to(&sim, "alpha-"), 12);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    assert_same_as_upstream(&sim, &path, &r).await;

    // Now all five are held, asked in another order with a repeat.
    let before = upstream_requests(&sim);
    let again = [&deeper[10], &held[0], &deeper[10], &deeper[12]].map(String::as_str);
    let path = lookup("permits", &again);
    let r = alpha(&gw, &path).await;
    assert_eq!(r.header("x-cache"), Some("HIT"));
    assert_eq!(upstream_requests(&sim), before);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    assert_same_as_upstream(&sim, &path, &r).await;
}

#[tokio::test]
async fn unknown_ids_are_remembered_as_absent() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let held = ids_of(&alpha(&gw, &permit_search(&sim, 3)).await);
    let path = lookup("permits", &["ffffffffffffffff", &held[1], "a,b"]);
    let first = alpha(&gw, &path).await;
    assert_eq!(first.header("x-cache"), Some("MISS"));
    assert_eq!(first.header_u64("x-credits-request"), Some(0));
    assert_eq!(ids_of(&first), [held[1].clone()]);
    assert_eq!(
        last_query(&sim),
        "id=ffffffffffffffff&id=a%2Cb",
        "a comma list is one id"
    );
    let requests = upstream_requests(&sim);
    let second = alpha(&gw, &path).await;
    assert_eq!(second.header("x-cache"), Some("HIT"));
    assert_eq!(upstream_requests(&sim), requests, "the absent ids were not asked again");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    assert_same_as_upstream(&sim, &path, &second).await;
}

#[tokio::test]
async fn records_expire_with_the_page_that_brought_them() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().route_ttl("permits_search", 1).start(&sim).await;
    let held = ids_of(&alpha(&gw, &permit_search(&sim, 5)).await);
    let path = lookup("permits", &[&held[0], &held[1], &held[2]]);
    let only_cached = [("cache-control", "only-if-cached")];
    assert_eq!(alpha_with(&gw, &path, &only_cached).await.status, StatusCode::OK);
    wait_until_expired(&gw, &path).await;
    assert_eq!(upstream_requests(&sim), 1);
    let r = alpha(&gw, &path).await;
    assert_eq!(r.header("x-cache"), Some("MISS"));
    assert_eq!(r.header_u64("x-credits-request"), Some(3));
    assert_eq!(charged_to(&sim, "alpha-"), 8);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

/// Until the lookup's records are no longer fresh (`Client::wait_expired`).
async fn wait_until_expired(gw: &Running, query: &Query) {
    Client::new(gw.base_url(), ALPHA.1).wait_expired(query).await;
}

#[tokio::test]
async fn stale_records_stand_in_when_the_upstream_fails() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().route_ttl("permits_search", 1).start(&sim).await;
    let held = ids_of(&alpha(&gw, &permit_search(&sim, 5)).await);
    let path = lookup("permits", &[&held[4], &held[1]]);
    wait_until_expired(&gw, &path).await;
    sim.set_faults(Faults {
        kind: FaultKind::Status,
        status: Some(500),
        ..Faults::default()
    });
    let r = alpha(&gw, &path).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-cache"), Some("STALE"));
    assert_eq!(r.header_u64("x-credits-request"), Some(0));
    assert!(upstream_requests(&sim) >= 2, "the upstream was asked first");
    sim.clear_faults();
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    assert_same_as_upstream(&sim, &path, &r).await;
}

#[tokio::test]
async fn purge_drops_records_from_both_tiers() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = || Setup::new().cache_redis(&redis.url());
    let gw = setup().start(&sim).await;
    let held = ids_of(&alpha(&gw, &permit_search(&sim, 4)).await);
    let path = lookup("permits", &[&held[0], &held[3]]);
    // A second replica finds the records in Redis.
    let peer = setup().start(&sim).await;
    let r = alpha(&peer, &path).await;
    assert_eq!(r.header("x-cache"), Some("HIT"), "{}", r.text());
    assert_eq!(upstream_requests(&sim), 1);

    let purge = Client::admin(gw.admin_url()).post(PURGE_SEARCHES).await;
    assert_eq!(purge.status, StatusCode::OK, "{}", purge.text());
    assert_eq!(purge.json()["redis_keys"], 5, "the page and its four records");
    let r = alpha(&gw, &path).await;
    assert_eq!(r.header("x-cache"), Some("MISS"));
    assert_eq!(r.header_u64("x-credits-request"), Some(2));
    assert_eq!(upstream_requests(&sim), 2);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    assert_same_as_upstream(&sim, &path, &r).await;
}

/// Entries in a replica's memory tier (pages and records), as its
/// `/metrics` reports them.
async fn memory_entries(gw: &Running) -> f64 {
    let m = scrape(&gw.admin_url()).await;
    m.get("gateway_cache_entries", &[("tier", "memory")]).unwrap_or(0.0)
}

/// A purge asked of one replica reaches the others' memory tiers: replica
/// B holds two records in L1 (promoted from Redis by its own lookup), A
/// purges `permits_search`, and B's next lookup of those ids is bought
/// again. Before, B answered it from L1 as a HIT for the records' whole
/// TTL (a day): the purge emptied only Redis and A's memory.
#[tokio::test]
async fn purge_drops_records_from_a_peers_memory_tier() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = || Setup::new().cache_redis(&redis.url());
    let (a, b) = (setup().start(&sim).await, setup().start(&sim).await);
    let held = ids_of(&alpha(&a, &permit_search(&sim, 4)).await);
    let path = lookup("permits", &[&held[0], &held[3]]);
    let r = alpha(&b, &path).await;
    assert_eq!(r.header("x-cache"), Some("HIT"), "{}", r.text());
    assert_eq!(upstream_requests(&sim), 1);
    assert_eq!(memory_entries(&b).await, 2.0, "B holds the two records in memory");

    let purge = Client::admin(a.admin_url()).post(PURGE_SEARCHES).await;
    assert_eq!(purge.status, StatusCode::OK, "{}", purge.text());
    // B applies the purge at its next look at Redis (every second).
    let limit = permit_gateway::cache::purge::FOLLOW_EVERY * 5;
    eventually("B dropped the purged records from memory", limit, || async {
        let n = memory_entries(&b).await;
        if n == 0.0 {
            Ok(())
        } else {
            Err(format!("{n} entries"))
        }
    })
    .await;
    let r = alpha(&b, &path).await;
    assert_eq!(r.header("x-cache"), Some("MISS"), "{}", r.text());
    assert_eq!(r.header_u64("x-credits-request"), Some(2));
    assert_eq!(upstream_requests(&sim), 2, "B bought the purged records again");
    assert_eq!(charged_to(&sim, "alpha-"), 6);
    // Each replica keeps its own (file) ledger: A's search, B's lookup.
    assert_eq!(ledger_used(&a.admin_url(), "alpha").await, 4);
    assert_eq!(ledger_used(&b.admin_url(), "alpha").await, 2);
    assert_same_as_upstream(&sim, &path, &r).await;
}

#[tokio::test]
async fn no_cache_buys_every_id_again() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let held = ids_of(&alpha(&gw, &permit_search(&sim, 5)).await);
    let path = lookup("permits", &[&held[1], &held[2], &held[3]]);
    let r = alpha_with(&gw, &path, &[("cache-control", "no-cache")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_ne!(r.header("x-cache"), Some("HIT"));
    assert_eq!(r.header_u64("x-credits-request"), Some(3));
    assert_eq!(
        last_query(&sim),
        format!("id={}&id={}&id={}", held[1], held[2], held[3])
    );
    assert_eq!(charged_to(&sim, "alpha-"), 8);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

#[tokio::test]
async fn with_record_reuse_off_a_lookup_is_its_own_query() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().with(|c| c.cache.record_reuse = false).start(&sim).await;
    let held = ids_of(&alpha(&gw, &permit_search(&sim, 5)).await);
    let path = lookup("permits", &[&held[0], &held[4]]);
    let r = alpha(&gw, &path).await;
    assert_eq!(r.header("x-cache"), Some("MISS"));
    assert_eq!(r.header_u64("x-credits-request"), Some(2));
    let r = alpha(&gw, &path).await;
    assert_eq!(r.header("x-cache"), Some("HIT"), "the same query still hits");
    assert_eq!(upstream_requests(&sim), 2);
    assert_eq!(charged_to(&sim, "alpha-"), 7);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

#[tokio::test]
async fn contractor_lookups_reuse_lookups_never_search_tallies() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let search = Query::state_contractors(&sim.samples()).size(3);
    let ids = ids_of(&alpha(&gw, &search).await);
    let path = lookup("contractors", &[&ids[0], &ids[2]]);
    let r = alpha(&gw, &path).await;
    assert_eq!(
        r.header("x-cache"),
        Some("MISS"),
        "search tallies differ from a lookup's"
    );
    assert_eq!(r.header_u64("x-credits-request"), Some(2));
    assert_same_as_upstream(&sim, &path, &r).await;
    let requests = upstream_requests(&sim);
    let other = lookup("contractors", &[&ids[2], &ids[0]]);
    let r = alpha(&gw, &other).await;
    assert_eq!(r.header("x-cache"), Some("HIT"), "but lookups reuse each other");
    assert_eq!(upstream_requests(&sim), requests);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    assert_same_as_upstream(&sim, &other, &r).await;
}

#[tokio::test]
async fn decisions_and_properties_reuse_their_search_records() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let s = sim.samples();
    let searches = [
        (
            "decisions",
            Query::decision_search(&s.state, "2020-01-01", "2026-12-31").size(4),
        ),
        ("properties", Query::property_search(&s.zip).size(4)),
    ];
    for (resource, search) in searches {
        let found = alpha(&gw, &search).await;
        assert_eq!(found.status, StatusCode::OK, "{}", found.text());
        let ids = ids_of(&found);
        assert!(ids.len() >= 2, "{resource}: {}", found.text());
        let requests = upstream_requests(&sim);
        let path = lookup(resource, &[&ids[1], &ids[0]]);
        let r = alpha(&gw, &path).await;
        assert_eq!(r.header("x-cache"), Some("HIT"), "{resource}");
        assert_eq!(upstream_requests(&sim), requests, "{resource}");
        assert_same_as_upstream(&sim, &path, &r).await;
    }
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

#[tokio::test]
async fn a_refused_id_gets_the_upstreams_own_error_for_the_whole_list() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let s = sim.samples();
    let props = ids_of(&alpha(&gw, &Query::property_search(&s.zip).size(2)).await);
    // A city is not an address: the upstream refuses the list, naming its position.
    let path = lookup("properties", &[&props[0], &s.city_geo_id]);
    let r = alpha(&gw, &path).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    let want = direct(&sim, &path).await;
    assert_eq!(r.json(), want.json());
    assert_eq!(
        r.json()["detail"][0]["loc"][2],
        1,
        "the city's place in the list as sent"
    );
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_records_on_a_redis_cluster() {
    use crate::support::redis_cluster::RedisCluster;
    let cluster = RedisCluster::start_async().await;
    let sim = start_sim(unlimited()).await;
    // Each replica its own ledger file; cache and leases on the cluster.
    let setup = || Setup::new().cache_redis(&cluster.url());
    let (one, two) = (setup().start(&sim).await, setup().start(&sim).await);
    let held = ids_of(&alpha(&one, &permit_search(&sim, 6)).await);
    // Six records, each in a slot of its own hash: read back across slots.
    let path = lookup("permits", &[&held[5], &held[0], &held[3], "ffffffffffffffff"]);
    let first = alpha(&two, &path).await;
    assert_eq!(first.header("x-cache"), Some("MISS"), "the unknown id is asked once");
    assert_eq!(first.header_u64("x-credits-request"), Some(0));
    assert_eq!(last_query(&sim), "id=ffffffffffffffff");
    let r = alpha(&one, &path).await;
    assert_eq!(r.header("x-cache"), Some("HIT"), "its absence is shared too");
    assert_eq!(upstream_requests(&sim), 2);
    for gw in [&one, &two] {
        let m = scrape(&gw.admin_url()).await;
        assert_eq!(m.sum("gateway_backend_errors_total", &[("backend", "redis")]), 0.0);
    }
    assert_same_as_upstream(&sim, &path, &r).await;
    // The two replicas keep their own ledgers: together, what was charged.
    let ledgers = ledger_used(&one.admin_url(), "alpha").await + ledger_used(&two.admin_url(), "alpha").await;
    assert_eq!(ledgers, charged_to(&sim, "alpha-"));
    assert_eq!(ledgers, 6);
}
