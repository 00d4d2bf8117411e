//! What a lookup may learn from an answer, and the smaller edges of the
//! record tier (issue 24, points 3 and 4).

use super::{alpha, alpha_with, direct, ids_of, last_query, lookup, permit_search, upstream_requests};
use super::{assert_same_as_upstream, wait_until_expired};
use crate::support::client::Client;
use crate::support::gateway::{Setup, BETA, SMALL};
use crate::support::http::Reply;
use crate::support::probe::scrape;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim};
use crate::support::traffic::{assert_ledger_matches, charged_to, ledger_used};
use http::StatusCode;
use permit_gateway::Running;

async fn beta(gw: &Running, query: &Query) -> Reply {
    Client::new(gw.base_url(), BETA.1).get(query).request_id("beta-1").await
}

fn once(kind: FaultKind) -> Faults {
    Faults {
        kind,
        count: Some(1),
        ..Faults::default()
    }
}

/// Three real ids the gateway has not seen (asked of the simulator directly).
async fn fresh_ids(sim: &Sim) -> Vec<String> {
    ids_of(&direct(sim, &permit_search(sim, 3)).await)
}

#[tokio::test]
async fn foreign_records_are_never_filed_and_mark_nothing_absent() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let ids = fresh_ids(&sim).await;
    let path = lookup("permits", &[&ids[0], &ids[1], &ids[2]]);
    sim.set_faults(once(FaultKind::ForeignRecords));
    let r = alpha(&gw, &path).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(ids_of(&r), Vec::<String>::new(), "no record of an id not asked");
    assert_eq!(r.header_u64("x-credits-request"), Some(3), "what the upstream charged");
    assert_eq!(charged_to(&sim, "alpha-"), 3);
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    let m = scrape(&gw.admin_url()).await;
    let foreign = [("route", "permits_by_id"), ("source", "foreign")];
    assert_eq!(m.sum("gateway_cache_records_total", &foreign), 3.0);

    // The asked ids were not filed absent: the next team's lookup buys them.
    let requests = upstream_requests(&sim);
    let r = beta(&gw, &lookup("permits", &[&ids[1], &ids[0]])).await;
    assert_eq!(r.header("x-cache"), Some("MISS"), "{}", r.text());
    assert_eq!(ids_of(&r), [ids[1].clone(), ids[0].clone()]);
    assert_eq!(upstream_requests(&sim), requests + 1);
    // Nor were the foreign records filed under their own ids.
    let foreign_id = format!("{}-foreign", ids[2]);
    let r = beta(&gw, &lookup("permits", &[&foreign_id])).await;
    assert_eq!(r.header("x-cache"), Some("MISS"));
    assert_eq!(last_query(&sim), format!("id={foreign_id}"));
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha", "beta"]).await;
}

#[tokio::test]
async fn a_partial_answer_files_no_absence() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let ids = fresh_ids(&sim).await;
    let path = lookup("permits", &[&ids[0], &ids[1], &ids[2]]);
    sim.set_faults(once(FaultKind::PartialRecords));
    let r = alpha(&gw, &path).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(ids_of(&r), [ids[0].clone()], "what the upstream sent");
    assert_eq!(r.header_u64("x-credits-request"), Some(3), "billed for three");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;

    let path = lookup("permits", &[&ids[2], &ids[1]]);
    let r = beta(&gw, &path).await;
    assert_eq!(r.header("x-cache"), Some("MISS"), "not a HIT of 0 records");
    assert_eq!(last_query(&sim), format!("id={}&id={}", ids[2], ids[1]));
    assert_same_as_upstream(&sim, &path, &r).await;
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha", "beta"]).await;
}

#[tokio::test]
async fn a_parameter_the_upstream_ignores_still_uses_the_records() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let held = ids_of(&alpha(&gw, &permit_search(&sim, 3)).await);
    let requests = upstream_requests(&sim);
    let path = Query::permits_by_id(&[&held[2]]).param("foo", 1).param("id", &held[0]);
    let r = alpha(&gw, &path).await;
    assert_eq!(r.header("x-cache"), Some("HIT"), "{}", r.text());
    assert_eq!(r.header_u64("x-credits-request"), Some(0));
    assert_eq!(upstream_requests(&sim), requests);
    assert_same_as_upstream(&sim, &path, &r).await;
}

#[tokio::test]
async fn a_comma_list_is_reserved_as_the_one_id_it_is() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 30).start(&sim).await;
    let list: Vec<String> = (0..40).map(|i| format!("p{i}")).collect();
    let r = Client::new(gw.base_url(), SMALL.1)
        .get(Query::permits_by_id(&[list.join(",")]))
        .request_id("small-1")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(ids_of(&r), Vec::<String>::new(), "one unknown id, omitted");
    assert_eq!(r.header_u64("x-credits-request"), Some(0));
    assert_ledger_matches(&sim, &gw.admin_url(), &["small"]).await;
}

#[tokio::test]
async fn the_lookup_routes_ttl_bounds_its_records() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().route_ttl("permits_by_id", 1).start(&sim).await;
    let held = ids_of(&alpha(&gw, &permit_search(&sim, 3)).await);
    let path = lookup("permits", &[&held[0], &held[1]]);
    let only_cached = [("cache-control", "only-if-cached")];
    assert_eq!(alpha_with(&gw, &path, &only_cached).await.status, StatusCode::OK);
    // The search's page lives a day; its records only as long as a lookup's.
    wait_until_expired(&gw, &path).await;
    let r = alpha(&gw, &path).await;
    assert_eq!(r.header("x-cache"), Some("MISS"));
    assert_eq!(r.header_u64("x-credits-request"), Some(2));
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

/// `no-cache` on one replica while another holds the key's lease for its
/// own `no-cache` call: the answer is the peer's new one, not the old L2
/// entry the peer is replacing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cache_waits_for_the_peers_new_answer_not_the_old_entry() {
    use crate::support::monitor::Monitor;
    use crate::support::redis::RedisServer;
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = || Setup::new().cache_redis(&redis.url());
    let (one, two) = (setup().start(&sim).await, setup().start(&sim).await);
    let path = permit_search(&sim, 5);
    assert_eq!(alpha(&one, &path).await.header("x-cache"), Some("MISS"));
    let requests = upstream_requests(&sim);
    let mut monitor = Monitor::start(&redis).await;
    let latency = std::time::Duration::from_millis(800);
    sim.set_faults(Faults {
        kind: FaultKind::Latency,
        latency_ms: Some(latency.as_millis() as u64),
        ..Faults::default()
    });
    let no_cache = [("cache-control", "no-cache")];
    let first = Client::new(one.base_url(), BETA.1)
        .get(&path)
        .request_id("beta-first")
        .cache_control("no-cache")
        .spawn();
    // Replica one holds the lease for its call to the slow upstream.
    monitor.until("SET", "pgw:lease:").await;
    let asked = std::time::Instant::now();
    let second = alpha_with(&two, &path, &no_cache).await;
    let waited = asked.elapsed();
    let first = first.await.expect("first");
    sim.clear_faults();
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert_eq!(second.status, StatusCode::OK, "{}", second.text());
    assert!(
        waited >= latency / 2,
        "answered after {waited:?}: from the old entry, not the peer's call"
    );
    assert_eq!(upstream_requests(&sim), requests + 1, "one call for both");
    assert_eq!(second.header_u64("x-credits-request"), Some(0));
    for team in ["alpha", "beta"] {
        let mut ledgers = 0;
        for gw in [&one, &two] {
            ledgers += ledger_used(&gw.admin_url(), team).await;
        }
        assert_eq!(ledgers, charged_to(&sim, &format!("{team}-")), "team {team}");
    }
}

/// A billed answer whose body fails (the call's deadline), for ids whose
/// records are stale: they stand in, and the answer says (as the ledger
/// does) what the failed call cost.
#[tokio::test]
async fn stale_records_for_a_billed_failure_say_what_it_cost() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .one_attempt(1)
        .route_ttl("permits_search", 1)
        .start(&sim)
        .await;
    let held = ids_of(&alpha(&gw, &permit_search(&sim, 5)).await);
    let path = lookup("permits", &[&held[3], &held[0]]);
    wait_until_expired(&gw, &path).await;
    sim.set_faults(Faults {
        delay_ms: Some(3_000),
        ..once(FaultKind::SlowBody)
    });
    let r = alpha(&gw, &path).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("x-cache"), Some("STALE"));
    assert_eq!(charged_to(&sim, "alpha-"), 7, "5 for the search, 2 for the cut lookup");
    assert_eq!(r.header_u64("x-credits-request"), Some(2), "what the cut lookup cost");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    assert_eq!(ids_of(&r), [held[3].clone(), held[0].clone()]);
}
