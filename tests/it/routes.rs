//! The route table through the real gateway and simulator: free operations
//! are never refused for budget, lookups reserve one credit per id, bad
//! `size`/`id` lists get the upstream's 422 without reserving or calling,
//! non-canonical paths are the upstream's 404, unknown paths are counted.
//!
//! The simulator does not serve every vendor operation yet (issue #15):
//! where one of them is requested, what is asserted is what reached the
//! upstream and what was reserved, and the status is 200 as soon as the
//! simulator's own router knows the path.

use crate::support::client::Client;
use crate::support::gateway::{Setup, SMALL};
use crate::support::http::Reply;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, Samples, Sim};
use crate::support::traffic::{assert_ledger_matches, charged_to};
use http::StatusCode;
use permit_gateway::route::Route;

/// A request the vendor answers 200 for, per route (`None`: `other`).
fn sample(route: Route, s: &Samples) -> Option<Query> {
    let (from, to) = (&s.permit_from, &s.permit_to);
    let (geo, city, county, jur, addr) = (
        &s.state,
        &s.city_geo_id,
        &s.county_geo_id,
        &s.jurisdiction_geo_id,
        &s.address_geo_id,
    );
    let c = &s.contractor_id;
    let months = |q: Query| q.months("2023-01-01", "2024-12-31");
    // Every property type and tag, two records a page.
    let all = |q: Query| q.property_type("all").tag("all").size(2);
    Some(match route {
        Route::PermitsSearch => Query::state_permits(s).size(2),
        Route::ContractorsSearch => Query::state_contractors(s).size(2),
        Route::ContractorPermits => Query::contractor(c, "permits").size(2),
        Route::AddressMetricsMonthly => months(Query::metrics("addresses", addr, "monthly")).tag("all").size(2),
        Route::CountyMetricsMonthly => all(months(Query::metrics("counties", county, "monthly"))),
        Route::CityMetricsMonthly => all(months(Query::metrics("cities", city, "monthly"))),
        Route::CityMetricsCurrent => all(Query::metrics("cities", city, "current")),
        Route::Counties => Query::place("counties", county),
        Route::Cities => Query::place("cities", city),
        Route::Jurisdictions => Query::place("jurisdictions", jur),
        Route::ListZip => Query::list("zip").size(100),
        Route::ZipcodesSearch => Query::text_search("zipcodes", &s.zip),
        Route::StatesSearch => Query::text_search("states", geo),
        Route::JurisdictionsSearch => Query::text_search("jurisdictions", "a"),
        Route::MetaCoverage => Query::coverage("state", geo).dates(from, to),
        Route::MetaRelease => Query::meta_release(),
        Route::Usage => Query::usage(),
        Route::Other => return None,
        Route::PermitsById => Query::permits_by_id(&["p1", "p2"]),
        Route::ContractorsById => Query::by_id("contractors", &[c]),
        Route::DecisionsSearch => Query::decision_search(geo, from, to).size(2),
        Route::DecisionsById => Query::by_id("decisions", &["d1"]),
        Route::PropertiesSearch => Query::property_search(geo).size(2),
        Route::PropertiesById => Query::by_id("properties", &[addr]),
        Route::ContractorEmployees => Query::contractor(c, "employees").size(2),
        Route::ContractorMetrics => months(Query::contractor(c, "metrics")).property_type("all").tag("all"),
        Route::AddressesSearch => Query::text_search("addresses", 1),
        Route::CitiesSearch => Query::text_search("cities", "a"),
        Route::CountiesSearch => Query::text_search("counties", "a"),
        Route::AddressMetricsCurrent => Query::metrics("addresses", addr, "current").tag("all").size(2),
        Route::CountyMetricsCurrent => all(Query::metrics("counties", county, "current")),
        Route::JurisdictionMetricsMonthly => all(months(Query::metrics("jurisdictions", jur, "monthly"))),
        Route::JurisdictionMetricsCurrent => all(Query::metrics("jurisdictions", jur, "current")),
        Route::AddressResidents => Query::residents(addr).size(2),
        Route::ListTags => Query::list("tags").size(100),
    })
}

/// Whether the simulator serves this path yet.
fn sim_serves(path: &str) -> bool {
    permit_api_sim::router::route(path).is_some()
}

/// A gateway whose `small` team has `limit` credits, and that team's token.
async fn gateway_with_budget(sim: &Sim, limit: u64) -> permit_gateway::Running {
    Setup::new().teams(&[SMALL]).credit_limit(SMALL, limit).start(sim).await
}

/// Spends exactly `credits` of the team's budget on one full page.
async fn spend(team: &Client, sim: &Sim, credits: u32) -> Reply {
    let r = team
        .get(Query::distinct(&sim.samples(), 7).size(credits))
        .request_id("small-spend")
        .expect_status(StatusCode::OK)
        .await;
    assert_eq!(r.credits_request(), Some(u64::from(credits)));
    r
}

fn reached_upstream(sim: &Sim, path: &str) -> bool {
    sim.log().iter().any(|e| e.path == path)
}

#[tokio::test]
async fn a_team_with_no_credits_left_can_call_every_free_operation() {
    let sim = start_sim(unlimited()).await;
    let gw = gateway_with_budget(&sim, 10).await;
    let small = Client::new(gw.base_url(), SMALL.1);
    let s = sim.samples();
    spend(&small, &sim, 10).await;
    assert_eq!(small.used().await, 10);
    // Nothing metered is left: even one record is refused, before the upstream.
    let before = sim.stats().requests_total;
    let one = small.get(Query::distinct(&s, 8).size(1)).request_id("small-one").await;
    assert_eq!(one.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(sim.stats().requests_total, before);

    let mut free = 0;
    for route in Route::ALL.into_iter().filter(|r| !r.is_metered() && *r != Route::Usage) {
        let path = sample(route, &s).expect("every operation has a sample");
        let r = small.get(&path).request_id("small-free").await;
        assert_ne!(
            r.status,
            StatusCode::PAYMENT_REQUIRED,
            "{path}: a free call refused for budget"
        );
        assert!(reached_upstream(&sim, path.path()), "{path} did not reach the upstream");
        // Issue 39: no budget headers either, for a team with a limit (the
        // upstream sends none on credit-exempt operations).
        for name in ["x-credits-request", "x-credits-limit", "x-credits-remaining"] {
            assert_eq!(r.header(name), None, "{path} ({}): {name} on a free route", r.status);
        }
        if sim_serves(path.path()) {
            assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
            assert_eq!(
                r.header("x-credits-request"),
                None,
                "{path}: free answers carry no cost"
            );
        }
        free += 1;
    }
    assert_eq!(free, 14, "the table's free operations, usage aside");
    // The team's own usage: the budget is in the body, no header carries it.
    let usage = small.get(Query::usage()).request_id("small-usage").await;
    assert_eq!(usage.status, StatusCode::OK);
    assert_eq!(usage.json()["credit_limit"], 10);
    for name in ["x-credits-request", "x-credits-limit", "x-credits-remaining"] {
        assert_eq!(usage.header(name), None, "/v2/usage: {name}");
    }
    // The budget stays visible where money is at stake: on the 402 above.
    assert_eq!(one.header("x-credits-limit"), Some("10"));
    assert_eq!(one.header_u64("x-credits-remaining"), Some(0));
    assert_eq!(small.used().await, 10, "free calls cost nothing");
    assert_ledger_matches(&sim, &gw.admin_url(), &[SMALL.0]).await;
}

#[tokio::test]
async fn an_id_lookup_reserves_one_credit_per_id() {
    let sim = start_sim(unlimited()).await;
    // Reuse off: the lookups below ask for ids the search bought, which
    // record reuse (tests/it/records/) would answer for nothing.
    let gw = Setup::new()
        .teams(&[SMALL])
        .credit_limit(SMALL, 13)
        .with(|c| c.cache.record_reuse = false)
        .start(&sim)
        .await;
    let small = Client::new(gw.base_url(), SMALL.1);
    let page = spend(&small, &sim, 10).await.json();
    let ids: Vec<String> = page["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|p| p["id"].as_str().map(str::to_owned))
        .collect();
    assert!(ids.len() >= 4, "a full page has ids");
    let lookup = |n: usize| Query::permits_by_id(&ids[..n]);
    // A comma list is one id to the upstream (unknown, free): it reserves one.
    let comma = Query::permits_by_id(&[ids[..4].join(",")]);
    let r = small
        .get(&comma)
        .request_id("small-comma")
        .expect_status(StatusCode::OK)
        .await;
    assert_eq!(r.credits_request(), Some(0));
    // 3 credits left: four ids are refused before the upstream...
    let before = sim.stats().requests_total;
    let r = small.get(lookup(4)).request_id("small-four").await;
    assert_eq!(r.status, StatusCode::PAYMENT_REQUIRED, "{}", r.text());
    assert_eq!(r.json()["detail"]["limit"], 13);
    // An unknown path reserves nothing: the vendor's free 404 (issue 39).
    let unknown = small
        .get(Query::by_id("permit_records", &["a", "b", "c", "d"]))
        .request_id("small-unknown")
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.text());
    assert_eq!(
        sim.stats().requests_total,
        before,
        "refused lookups never reach the upstream"
    );
    // ...three fit exactly.
    let r = small.get(lookup(3)).request_id("small-three").await;
    assert_ne!(r.status, StatusCode::PAYMENT_REQUIRED, "{}", r.text());
    assert_eq!(sim.stats().requests_total, before + 1);
    if sim_serves("/v2/permits") {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(r.credits_request(), Some(3));
    }
    // The ledger settled to what the upstream charged, whatever it was.
    assert_eq!(small.used().await, charged_to(&sim, "small-"));
    assert_ledger_matches(&sim, &gw.admin_url(), &[SMALL.0]).await;
}

#[tokio::test]
async fn a_size_the_upstream_would_refuse_is_its_422_without_reserving_or_calling() {
    let sim = start_sim(unlimited()).await;
    // 10 credits: less than the 50 a missing or mangled size used to reserve.
    let gw = gateway_with_budget(&sim, 10).await;
    let small = Client::new(gw.base_url(), SMALL.1);
    let search = Query::state_permits(&sim.samples());
    // Written out and appended as they are: each spelling is a case.
    let bad = [
        "size=3&size=",
        "size=1%26size%3D100",
        "size=",
        "size=0",
        "size=101",
        "size=abc",
        "size=-1",
    ];
    let mut answers = Vec::new();
    for q in bad {
        let r = small.get(format!("{search}&{q}")).request_id("small-bad").await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{q}: {}", r.text());
        assert_eq!(
            r.json()["detail"][0]["loc"],
            serde_json::json!(["query", "size"]),
            "{q}"
        );
        answers.push(r.json());
    }
    assert_eq!(sim.stats().requests_total, 0, "none reached the upstream");
    assert_eq!(small.used().await, 0, "nothing reserved, nothing spent");
    // Exactly the body the upstream gives for the same request.
    let upstream = Client::upstream(&sim);
    for (q, ours) in bad.iter().zip(&answers) {
        let theirs = upstream.get(format!("{search}&{q}")).await;
        assert_eq!(theirs.status, StatusCode::UNPROCESSABLE_ENTITY, "{q}");
        assert_eq!(&theirs.json(), ours, "{q}");
    }
    // The estimate is the validated (last) value: 10 fits a budget of 10.
    let twice = search.clone().param("size", 500).param("size", 10);
    small
        .get(twice)
        .request_id("small-ok")
        .expect_status(StatusCode::OK)
        .await;
    // Lookups: no id, or more than 50, are the upstream's 422 too (written
    // out: an empty query, and a trailing `&`).
    let many: String = (0..51).map(|i| format!("id=p{i}&")).collect();
    for (q, kind) in [("", "missing"), (many.as_str(), "too_long")] {
        let r = small.get(format!("/v2/permits?{q}")).request_id("small-ids").await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
        assert_eq!(r.json()["detail"][0]["type"], kind);
        assert_eq!(r.json()["detail"][0]["loc"], serde_json::json!(["query", "id"]));
    }
    assert!(!reached_upstream(&sim, "/v2/permits"));
    assert_ledger_matches(&sim, &gw.admin_url(), &[SMALL.0]).await;
}

#[tokio::test]
async fn non_canonical_paths_are_the_upstreams_404_and_never_cached() {
    let sim = start_sim(unlimited()).await;
    let gw = gateway_with_budget(&sim, 1000).await;
    let (small, upstream) = (Client::new(gw.base_url(), SMALL.1), Client::upstream(&sim));
    let permits = Query::state_permits(&sim.samples()).size(2);
    let places = Query::text_search("jurisdictions", "a");
    // The paths are written out: each spelling is a case.
    let shapes = [
        permits.clone().on_path("/v2/permits/search/"),
        permits.clone().on_path("//v2/permits/search"),
        permits.clone().on_path("/v2//permits/search"),
        permits.clone().on_path("/v2/./permits/search"),
        permits.clone().on_path("/v2/x/../permits/search"),
        places.clone().on_path("/v2/jurisdictions/search/"),
        places.clone().on_path("/v2/./jurisdictions/search"),
        places.clone().on_path("/v2/jurisdictions/%2e/search"),
        places.clone().on_path("/v2/%2e%2e/v2/jurisdictions/search"),
    ];
    for shape in shapes {
        let path = shape.path();
        let r = small.get(&shape).request_id("small-path").await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {}", r.text());
        let theirs = upstream.get(&shape).await;
        assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{path} upstream");
        assert_eq!(r.json(), theirs.json(), "{path}: the upstream's body");
        assert_eq!(r.x_cache(), None, "{path}: no cache involved");
    }
    let forwarded = sim
        .log()
        .iter()
        .filter(|e| e.request_id.as_deref() == Some("small-path"))
        .count();
    assert_eq!(forwarded, 0, "none went upstream");
    assert_eq!(small.used().await, 0, "nothing reserved or spent");
    // The canonical path was never cached by them: its first call is a MISS.
    let first = small.get(&places).request_id("small-canon").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.x_cache(), Some("MISS"));
    // An encoded letter is the same path to the vendor's server (uvicorn
    // decodes before routing): the same answer, from the same entry.
    let encoded = small
        .get(places.clone().on_path("/v2/jurisdictions/se%61rch"))
        .request_id("small-enc")
        .await;
    assert_eq!(encoded.status, StatusCode::OK);
    assert_eq!(encoded.x_cache(), Some("HIT"));
    assert_eq!(encoded.body, first.body);
    let search = small.get(&permits).request_id("small-canon").await;
    assert_eq!(search.x_cache(), Some("MISS"));
    let encoded = small
        .get(permits.clone().on_path("/v2/%70ermits/search"))
        .request_id("small-enc")
        .await;
    assert_eq!(encoded.x_cache(), Some("HIT"));
    assert_eq!(encoded.body, search.body);
    // A 404 needs no token, like the upstream's (a spelling of the above).
    let anonymous = Client::anonymous(gw.base_url()).get("/v2/jurisdictions/search/").await;
    assert_eq!(anonymous.status, StatusCode::NOT_FOUND);
}

/// Issue 39, point 8: a path no vendor operation has is the vendor's free
/// 404, answered before any reservation, for a team with no credit left as
/// for any other; nothing reaches the upstream and nothing is spent.
#[tokio::test]
async fn unknown_v2_paths_are_the_vendors_free_404_and_reserve_nothing() {
    let sim = start_sim(unlimited()).await;
    let gw = gateway_with_budget(&sim, 10).await;
    let small = Client::new(gw.base_url(), SMALL.1);
    spend(&small, &sim, 10).await;
    let before = sim.stats().requests_total;
    let paths = [
        Query::metrics("states", "CA", "monthly").size(3),
        Query::by_id("permit_records", &["a", "b"]),
        Query::new("/v2/permits/search/extra").size(100),
        Query::new("/v2/nothing"),
        Query::contractor("x", "reviews").size(50),
    ];
    let mut bodies = Vec::new();
    for path in &paths {
        let r = small.get(path).request_id("small-unknown").await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {}", r.text());
        assert_eq!(r.json()["detail"], "Not Found", "{path}");
        for name in ["x-credits-request", "x-credits-limit", "x-credits-remaining"] {
            assert_eq!(r.header(name), None, "{path}: {name}");
        }
        bodies.push(r.body);
    }
    assert_eq!(sim.stats().requests_total, before, "nothing reached the upstream");
    assert_eq!(small.used().await, 10, "nothing reserved or spent");
    // What the vendor answers for the same paths, byte for byte.
    for (path, body) in paths.iter().zip(&bodies) {
        let direct = Client::upstream(&sim).get(path).await;
        assert_eq!(direct.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(&direct.body, body, "{path}: the vendor's body");
    }
    let metrics = crate::support::probe::scrape(&gw.admin_url()).await;
    let requests = metrics.sum("gateway_requests_total", &[("route", "other"), ("status", "404")]);
    assert_eq!(requests, 5.0, "counted under route=\"other\"");
    assert_ledger_matches(&sim, &gw.admin_url(), &[SMALL.0]).await;
}
