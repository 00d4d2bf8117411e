//! Answers as fresh as the vendor's data (issue 61): the gateway reads the
//! data release (`GET /v2/meta/release`), stamps what it buys with it, buys
//! again what a newer release outdated, and (opted in) keeps an answer of
//! the current release past its route TTL for free.

use crate::support::client::Client;
use crate::support::gateway::{replicas, Setup, ALPHA};
use crate::support::http::Reply;
use crate::support::probe::scrape;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{fault, start_sim, unlimited, FaultKind, Sim};
use crate::support::traffic::assert_ledger_matches;
use crate::support::wait::eventually;
use http::StatusCode;
use permit_gateway::config::Freshness;
use permit_gateway::Running;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Generous: a poll interval of 1 s, then the request.
const WITHIN: Duration = Duration::from_secs(15);

/// A request of team alpha, with an id the simulator's log keeps.
async fn ask(gw: &Running, q: &Query) -> Reply {
    let id = format!("alpha-{}", SEQ.fetch_add(1, Ordering::Relaxed));
    Client::new(gw.base_url(), ALPHA.1).get(q).request_id(&id).await
}

fn calls(sim: &Sim, path: &str) -> u64 {
    sim.stats().by_path.get(path).copied().unwrap_or(0)
}

/// Calls to `path` (exactly), or under it when it names no operation
/// (`/v2/counties`: every county's monthly metrics).
fn calls_under(sim: &Sim, path: &str) -> u64 {
    if path != "/v2/counties" {
        return calls(sim, path);
    }
    let under = format!("{path}/");
    sim.stats()
        .by_path
        .iter()
        .filter(|(p, _)| p.starts_with(&under))
        .map(|(_, n)| n)
        .sum()
}

async fn release_of(sim: &Sim) -> String {
    let r = Client::upstream(sim).get(Query::meta_release()).await;
    r.json()["released_at"].as_str().expect("released_at").to_string()
}

/// A gauge of `gw`, 0 when absent.
async fn gauge(gw: &Running, name: &str) -> f64 {
    scrape(&gw.admin_url()).await.get(name, &[]).unwrap_or(0.0)
}

/// Until `gw` has read the release and the last read succeeded.
async fn release_read(gw: &Running) {
    eventually("the gateway reads the release", WITHIN, || async {
        gauge(gw, "gateway_data_release_timestamp_seconds").await > 0.0
            && gauge(gw, "gateway_data_release_readable").await == 1.0
    })
    .await;
}

/// The county's monthly metrics for 2022.
fn monthly(sim: &Sim) -> Query {
    Query::new(format!("/v2/counties/{}/metrics/monthly", sim.samples().county_geo_id))
        .param("metric_from", "2022-01-01")
        .param("metric_to", "2022-12-31")
        .param("property_type", "all")
        .param("tag", "all")
}

/// Until `q` answers data of release `date` (its header) that differs from
/// `old`: what the gateway bought again.
async fn renewed(gw: &Running, q: &Query, old: &Reply, date: &str) -> Reply {
    eventually("the answer of the new release", WITHIN, || async {
        let r = ask(gw, q).await;
        (r.status == StatusCode::OK && r.header("x-data-release") == Some(date) && r.body != old.body).then_some(r)
    })
    .await
}

#[tokio::test]
async fn a_new_release_buys_a_page_a_record_and_a_monthly_row_again() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().with(|c| c.cache.release_poll_secs = 1).start(&sim).await;
    release_read(&gw).await;
    let old_date = release_of(&sim).await;
    let s = sim.samples();
    // A record bought on its own: an id of another search, asked of the
    // simulator directly (charged to no team).
    let other = Client::upstream(&sim)
        .get(
            Query::permit_search(&s.big_state)
                .window(&s.permit_from, &s.permit_to)
                .size(1),
        )
        .await;
    let id = other.json()["items"][0]["id"].as_str().expect("an id").to_string();
    let paths = ["/v2/permits", "/v2/permits/search", "/v2/counties"];
    let counts = |sim: &Sim| paths.map(|p| calls_under(sim, p));
    let at_start = counts(&sim);
    let (record, page, rows) = (
        Query::permits_by_id(&[&id]),
        Query::state_permits(&s).size(5),
        monthly(&sim),
    );
    let mut before = Vec::new();
    for q in [&record, &page, &rows] {
        let r = ask(&gw, q).await;
        assert_eq!(r.status, StatusCode::OK, "{q}: {}", r.text());
        assert_eq!(r.x_cache(), Some("MISS"), "{q}");
        assert_eq!(r.header("x-data-release"), Some(old_date.as_str()), "{q}");
        let again = ask(&gw, q).await;
        assert_eq!(again.x_cache(), Some("HIT"), "{q}");
        assert_eq!(
            again.header("x-data-release"),
            Some(old_date.as_str()),
            "a hit says its release"
        );
        before.push(r);
    }
    let bought = |sim: &Sim| {
        let now = counts(sim);
        [0, 1, 2].map(|i| now[i] - at_start[i])
    };
    assert_eq!(bought(&sim), [1, 1, 1], "each bought once");

    let new_date = sim.publish_release(7).to_string();
    let mut renewed_answers = Vec::new();
    for (q, old) in [&record, &page, &rows].into_iter().zip(&before) {
        renewed_answers.push(renewed(&gw, q, old, &new_date).await);
    }
    assert_eq!(bought(&sim), [2, 2, 2], "each bought once more");
    for (q, r) in [&record, &page, &rows].into_iter().zip(&renewed_answers) {
        assert_eq!(r.body, Client::upstream(&sim).get(q).await.body, "{q}: the new data");
    }
    let m = scrape(&gw.admin_url()).await;
    for route in ["permits_search", "permits_by_id", "county_metrics_monthly"] {
        assert!(
            m.sum("gateway_release_refreshes_total", &[("route", route)]) >= 1.0,
            "{route} counted as refreshed by the release"
        );
    }
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

#[tokio::test]
async fn release_bound_freshness_keeps_a_page_past_its_ttl_until_the_release_is_unreadable() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| {
            c.cache.release_poll_secs = 1;
            c.cache.freshness = Freshness::Release;
        })
        .route_ttl("permits_search", 1)
        .start(&sim)
        .await;
    release_read(&gw).await;
    let page = Query::state_permits(&sim.samples()).size(4);
    let first = ask(&gw, &page).await;
    assert_eq!(first.x_cache(), Some("MISS"));
    // Past its 1 s TTL (only-if-cached never reaches the upstream).
    let client = Client::new(gw.base_url(), ALPHA.1);
    eventually("the page is older than its TTL", WITHIN, || async {
        let r = client.get(&page).cache_control("only-if-cached").await;
        r.header_u64("age").is_some_and(|age| age >= 2)
    })
    .await;
    let saved = || async {
        scrape(&gw.admin_url())
            .await
            .sum("gateway_credits_saved_total", &[("reason", "release")])
    };
    let saved_before = saved().await;
    let kept = ask(&gw, &page).await;
    assert_eq!(kept.x_cache(), Some("HIT"), "same release: still fresh");
    assert_eq!(kept.credits_request(), Some(0));
    assert_eq!(calls(&sim, "/v2/permits/search"), 1, "no call");
    assert_eq!(saved().await - saved_before, 4.0, "saved by release-bound freshness");

    // A body that does not parse: the route TTL rules again.
    sim.garble_release(Some("soon"));
    eventually("the release reads as unreadable", WITHIN, || async {
        gauge(&gw, "gateway_data_release_readable").await == 0.0
    })
    .await;
    let ttl_again = ask(&gw, &page).await;
    assert_eq!(ttl_again.x_cache(), Some("MISS"), "bought again under the TTL");
    assert_eq!(calls(&sim, "/v2/permits/search"), 2);

    // Read again, then the upstream down: the held copy is stale (served
    // as such on the failure), not fresh.
    sim.garble_release(None);
    release_read(&gw).await;
    eventually("the new copy is older than its TTL", WITHIN, || async {
        let r = client.get(&page).cache_control("only-if-cached").await;
        r.x_cache() == Some("HIT") && r.header_u64("age").is_some_and(|age| age >= 2)
    })
    .await;
    sim.set_faults(fault(FaultKind::Status));
    eventually("the release reads as unreadable", WITHIN, || async {
        gauge(&gw, "gateway_data_release_readable").await == 0.0
    })
    .await;
    let before = sim.stats().requests_total;
    let down = ask(&gw, &page).await;
    assert_eq!(down.x_cache(), Some("STALE"), "{}", down.text());
    assert!(sim.stats().requests_total > before, "the route TTL sent it upstream");
    sim.clear_faults();
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

#[tokio::test]
async fn two_replicas_on_one_redis_make_one_release_call_per_interval() {
    let sim = start_sim(unlimited()).await;
    let redis = RedisServer::start();
    let setup = Setup::new().with(|c| c.cache.release_poll_secs = 60);
    let gws = replicas(2, &sim, Some(&redis), setup).await;
    for gw in &gws {
        release_read(gw).await;
    }
    assert_eq!(
        calls(&sim, "/v2/meta/release"),
        1,
        "one replica read it; the other took what it saw"
    );
    let page = Query::state_permits(&sim.samples()).size(3);
    let date = release_of(&sim).await;
    for gw in &gws {
        let r = ask(gw, &page).await;
        assert_eq!(r.header("x-data-release"), Some(date.as_str()));
    }
    assert_eq!(
        calls(&sim, "/v2/permits/search"),
        1,
        "the second replica hit the shared entry"
    );
    assert_ledger_matches(&sim, &gws[0].admin_url(), &["alpha"]).await;
}

#[tokio::test]
async fn while_the_gate_is_scarce_an_outdated_page_is_served_at_once_and_refreshed_behind() {
    let sim = start_sim(unlimited()).await;
    // 30 calls a minute: after 17, less than half the window is free (and
    // room is left for a read a second and the refresh).
    let gw = Setup::new()
        .with(|c| {
            c.cache.release_poll_secs = 1;
            c.upstream.requests_per_minute = 30;
        })
        .start(&sim)
        .await;
    release_read(&gw).await;
    let old_date = release_of(&sim).await;
    let s = sim.samples();
    let pages: Vec<Query> = (0..16).map(|i| Query::distinct(&s, i).size(2)).collect();
    let mut old = Vec::new();
    for q in &pages {
        let r = ask(&gw, q).await;
        assert_eq!(r.x_cache(), Some("MISS"), "{}", r.text());
        old.push(r);
    }
    let new_date = sim.publish_release(7).to_string();
    eventually("the gateway reads the new release", WITHIN, || async {
        let day = chrono::NaiveDate::parse_from_str(&new_date, "%Y-%m-%d").expect("date");
        let secs = day.and_hms_opt(0, 0, 0).expect("midnight").and_utc().timestamp() as f64;
        gauge(&gw, "gateway_data_release_timestamp_seconds").await == secs
    })
    .await;
    let bought = calls(&sim, "/v2/permits/search");
    let first = ask(&gw, &pages[0]).await;
    assert_eq!(first.x_cache(), Some("STALE"), "answered at once from the old copy");
    assert_eq!(first.credits_request(), Some(0));
    assert_eq!(first.header("x-data-release"), Some(old_date.as_str()));
    assert_eq!(first.body, old[0].body);
    let renewed = renewed(&gw, &pages[0], &old[0], &new_date).await;
    assert_eq!(renewed.x_cache(), Some("HIT"), "the background refresh stored it");
    assert_eq!(calls(&sim, "/v2/permits/search"), bought + 1, "one refresh");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}
