//! Monthly metrics by the month (issue 37): a window whose months are
//! partly held buys only the missing months, and its answer equals, as
//! JSON, the simulator's own answer for the whole window.

use crate::support::client::Client;
use crate::support::gateway::{replicas, Setup, ALPHA, BETA, SMALL};
use crate::support::http::Reply;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{fault, start_sim, unlimited, FaultKind, Faults, Sim};
use crate::support::traffic::{assert_ledger_matches, charged_for, charged_to};
use chrono::{Datelike, Months, NaiveDate};
use http::StatusCode;
use permit_gateway::Running;
use std::sync::atomic::{AtomicU32, Ordering};

static SEQ: AtomicU32 = AtomicU32::new(0);

fn first_of(y: i32, m: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, 1).expect("date")
}

/// `n` whole months from `start` (a first day): its first and last days.
fn months(start: NaiveDate, n: u32) -> (NaiveDate, NaiveDate) {
    let end = start + Months::new(n) - chrono::Days::new(1);
    (start, end)
}

/// The county's monthly metrics for `from..=to`.
fn window(sim: &Sim, from: NaiveDate, to: NaiveDate, property_type: &str, tag: &str) -> Query {
    Query::new(format!("/v2/counties/{}/metrics/monthly", sim.samples().county_geo_id))
        .param("metric_from", from)
        .param("metric_to", to)
        .param("property_type", property_type)
        .param("tag", tag)
}

/// A request of team `who`, with a request id the simulator's log keeps.
async fn ask(gw: &Running, who: (&str, &str), q: &Query) -> (Reply, String) {
    let id = format!("{}-{}", who.0, SEQ.fetch_add(1, Ordering::Relaxed));
    let r = Client::new(gw.base_url(), who.1).get(q).request_id(&id).await;
    (r.expect_status(StatusCode::OK), id)
}

/// The simulator's own answer (no team is charged for it).
async fn direct(sim: &Sim, q: &Query) -> Reply {
    Client::upstream(sim).get(q).await
}

fn rows(r: &Reply) -> usize {
    r.json()["items"].as_array().map_or(0, Vec::len)
}

/// The first month of 13 in a row that all have a row for the county
/// (tag `all`, every property type): a dense stretch of the dataset.
async fn dense_start(sim: &Sim) -> NaiveDate {
    for year in (2016..=2024).rev() {
        let (from, to) = months(first_of(year, 1), 13);
        let r = direct(sim, &window(sim, from, to, "all", "all").size(100)).await;
        if r.status == StatusCode::OK && rows(&r) == 13 {
            return from;
        }
    }
    panic!("no 13 months in a row with rows for the sample county");
}

/// Two windows of 8 months from `start`, the second 4 months later: they
/// share 4 months.
fn overlapping(sim: &Sim, start: NaiveDate) -> (Query, Query) {
    let (from, to) = months(start, 8);
    let early = window(sim, from, to, "all", "all");
    let (from, to) = months(start + Months::new(4), 8);
    (early, window(sim, from, to, "all", "all"))
}

async fn saved(gw: &Running, reason: &str) -> f64 {
    crate::support::probe::scrape(&gw.admin_url())
        .await
        .sum("gateway_credits_saved_total", &[("reason", reason)])
}

#[tokio::test]
async fn a_window_moved_one_month_buys_one_month_and_equals_the_upstreams_answer() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let start = dense_start(&sim).await;
    let (from, to) = months(start, 12);
    let first = window(&sim, from, to, "all", "all");
    let (a, id) = ask(&gw, ALPHA, &first).await;
    assert_eq!((a.x_cache(), a.credits_request()), (Some("MISS"), Some(12)));
    assert_eq!(charged_for(&sim, &id), 12);
    assert_eq!(a.json(), direct(&sim, &first).await.json());

    let (from, to) = months(start + Months::new(1), 12);
    let moved = window(&sim, from, to, "all", "all");
    let calls = sim.stats().requests_total;
    let (b, id) = ask(&gw, ALPHA, &moved).await;
    assert_eq!(
        (b.x_cache(), b.credits_request()),
        (Some("MISS"), Some(1)),
        "one month bought"
    );
    assert_eq!(charged_for(&sim, &id), 1);
    assert_eq!(sim.stats().requests_total, calls + 1, "one upstream call");
    let asked = sim.log().last().expect("a call").query.clone();
    let (m12, m12_end) = months(start + Months::new(12), 1);
    assert!(
        asked.contains(&format!("metric_from={m12}")) && asked.contains(&format!("metric_to={m12_end}")),
        "the smallest window covering the missing month: {asked}"
    );
    assert_eq!(b.json(), direct(&sim, &moved).await.json(), "the upstream's own answer");
    assert_eq!(saved(&gw, "window").await, 11.0);

    let calls = sim.stats().requests_total;
    let (again, _) = ask(&gw, ALPHA, &moved).await;
    assert_eq!((again.x_cache(), again.credits_request()), (Some("HIT"), Some(0)));
    assert_eq!(again.body, b.body);
    assert_eq!(sim.stats().requests_total, calls, "nothing asked upstream");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

#[tokio::test]
async fn overlapping_windows_of_two_teams_each_pay_only_what_was_not_held() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let start = dense_start(&sim).await;
    let (early, late) = overlapping(&sim, start);
    let (a, _) = ask(&gw, ALPHA, &early).await;
    assert_eq!(a.credits_request(), Some(8));
    let (b, _) = ask(&gw, BETA, &late).await;
    assert_eq!(
        (b.x_cache(), b.credits_request()),
        (Some("MISS"), Some(4)),
        "the 4 months alpha lacked"
    );
    assert_eq!(b.json(), direct(&sim, &late).await.json());
    assert_eq!((charged_to(&sim, "alpha-"), charged_to(&sim, "beta-")), (8, 4));
    // Both windows together: every month held.
    let (from, to) = months(start, 12);
    let both = window(&sim, from, to, "all", "all");
    let (c, _) = ask(&gw, ALPHA, &both).await;
    assert_eq!((c.x_cache(), c.credits_request()), (Some("HIT"), Some(0)));
    assert_eq!(c.json(), direct(&sim, &both).await.json());
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha", "beta"]).await;
}

/// A dashboard's panels: two windows of one series that overlap by four
/// months, asked at once while the upstream is slow, on one gateway or on
/// two replicas sharing Redis. The four shared months are bought once, by
/// whichever window buys first; the other buys only its own months.
async fn overlapping_windows_asked_at_once(n: usize) {
    let redis = RedisServer::for_replicas(n);
    let sim = start_sim(unlimited()).await;
    let gws = replicas(n, &sim, redis.as_ref(), Setup::new()).await;
    let start = dense_start(&sim).await;
    let (early, late) = overlapping(&sim, start);
    sim.set_faults(Faults {
        latency_ms: Some(400),
        ..fault(FaultKind::Latency)
    });
    let alpha = Client::new(gws[0].base_url(), ALPHA.1);
    let beta = Client::new(gws[n - 1].base_url(), BETA.1);
    let a = alpha.get(&early).request_id("alpha-early").spawn();
    let b = beta.get(&late).request_id("beta-late").spawn();
    let (a, b) = (a.await.expect("alpha"), b.await.expect("beta"));
    sim.clear_faults();
    let paid = [a.credits_request(), b.credits_request()];
    assert!(paid == [Some(8), Some(4)] || paid == [Some(4), Some(8)], "{paid:?}");
    assert_eq!(
        charged_to(&sim, "alpha-") + charged_to(&sim, "beta-"),
        12,
        "12 months, each bought once"
    );
    assert_eq!(a.json(), direct(&sim, &early).await.json());
    assert_eq!(b.json(), direct(&sim, &late).await.json());
    assert_ledger_matches(&sim, &gws[0].admin_url(), &["alpha", "beta"]).await;
}

#[tokio::test]
async fn overlapping_windows_asked_at_once_buy_their_shared_months_once() {
    overlapping_windows_asked_at_once(1).await;
}

#[tokio::test]
async fn overlapping_windows_asked_at_once_of_two_replicas_buy_their_shared_months_once() {
    overlapping_windows_asked_at_once(2).await;
}

#[tokio::test]
async fn a_window_of_another_tag_or_property_type_never_takes_these_rows() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let start = dense_start(&sim).await;
    let (from, to) = months(start, 12);
    let all = window(&sim, from, to, "all", "all");
    ask(&gw, ALPHA, &all).await;
    let tag = sim.samples().tag.clone();
    for other in [
        window(&sim, from, to, "residential", "all"),
        window(&sim, from, to, "all", &tag),
        window(&sim, from, to, "residential", &tag),
    ] {
        let want = direct(&sim, &other).await;
        let calls = sim.stats().requests_total;
        let r = Client::new(gw.base_url(), ALPHA.1).get(&other).await;
        if want.status == StatusCode::NOT_FOUND {
            assert_eq!(r.status, StatusCode::NOT_FOUND, "{other}");
        } else {
            let r = r.expect_status(StatusCode::OK);
            assert_eq!(r.x_cache(), Some("MISS"), "{other}");
            assert_eq!(
                r.credits_request(),
                Some(rows(&want) as u64),
                "its own rows, bought: {other}"
            );
            assert_eq!(r.json(), want.json(), "{other}");
        }
        assert_eq!(sim.stats().requests_total, calls + 1, "{other}");
    }
    assert_eq!(saved(&gw, "window").await, 0.0);
}

#[tokio::test]
async fn a_cut_month_is_bought_again_and_a_window_past_a_page_is_a_page() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let start = dense_start(&sim).await;
    let (from, to) = months(start, 12);
    // The first month cut at its 15th: its row counts half the month.
    let cut = window(&sim, from.with_day(15).expect("day"), to, "all", "all");
    let (a, _) = ask(&gw, ALPHA, &cut).await;
    assert_eq!(a.json(), direct(&sim, &cut).await.json());
    let whole = window(&sim, from, to, "all", "all");
    let (b, _) = ask(&gw, ALPHA, &whole).await;
    assert_eq!(b.credits_request(), Some(1), "the cut month, bought whole");
    assert_eq!(b.json(), direct(&sim, &whole).await.json());
    // More rows than the page holds: the upstream's page and its cursor.
    let (from, to) = months(start + Months::new(1), 12);
    let paged = window(&sim, from, to, "all", "all").size(5);
    let (c, _) = ask(&gw, ALPHA, &paged).await;
    let want = direct(&sim, &paged).await;
    assert!(want.json()["next_cursor"].is_string());
    assert_eq!(c.json(), want.json());
    assert_eq!(c.credits_request(), Some(5));
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
}

#[tokio::test]
async fn rows_of_past_months_keep_their_own_ttl() {
    let sim = start_sim(unlimited()).await;
    let kept = Setup::new()
        .route_ttl("county_metrics_monthly", 1)
        .with(|c| c.cache.past_month_ttl_secs = 3600)
        .start(&sim)
        .await;
    let plain = Setup::new().route_ttl("county_metrics_monthly", 1).start(&sim).await;
    let start = dense_start(&sim).await;
    let (from, to) = months(start, 12);
    let past = window(&sim, from, to, "all", "all");
    assert_eq!(ask(&kept, ALPHA, &past).await.0.credits_request(), Some(12));
    assert_eq!(ask(&plain, ALPHA, &past).await.0.credits_request(), Some(12));
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    // Months long ended: their rows outlive the route's TTL of 1 s.
    let (hit, _) = ask(&kept, ALPHA, &past).await;
    assert_eq!((hit.x_cache(), hit.credits_request()), (Some("HIT"), Some(0)));
    let (miss, _) = ask(&plain, ALPHA, &past).await;
    assert_eq!((miss.x_cache(), miss.credits_request()), (Some("MISS"), Some(12)));
}

#[tokio::test]
async fn a_window_cut_mid_month_asked_again_by_a_third_team_costs_nothing() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().teams(&[ALPHA, BETA, SMALL]).start(&sim).await;
    let start = dense_start(&sim).await;
    // Eleven whole months, then the same window run on into the 15th of
    // the twelfth: its cut month is bought whole by the second team.
    let (from, to) = months(start, 11);
    let whole = window(&sim, from, to, "all", "all");
    assert_eq!(ask(&gw, ALPHA, &whole).await.0.credits_request(), Some(11));
    let cut_end = start + Months::new(11) + chrono::Days::new(14);
    let cut = window(&sim, from, cut_end, "all", "all");
    let (b, id) = ask(&gw, BETA, &cut).await;
    assert_eq!(
        (b.credits_request(), charged_for(&sim, &id)),
        (Some(1), 1),
        "the cut month"
    );
    // A third team, the same window: every piece is held, the cut month's
    // answer among them (the page the second team's call stored).
    let calls = sim.stats().requests_total;
    let (c, id) = ask(&gw, SMALL, &cut).await;
    assert_eq!((c.x_cache(), c.credits_request()), (Some("HIT"), Some(0)));
    assert_eq!(charged_for(&sim, &id), 0);
    assert_eq!(sim.stats().requests_total, calls, "nothing asked upstream");
    assert_eq!(c.json(), direct(&sim, &cut).await.json(), "the upstream's own answer");
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha", "beta", "small"]).await;
}

#[tokio::test]
async fn every_windows_credits_header_is_what_the_upstream_billed_for_it_two_calls_included() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let start = dense_start(&sim).await;
    let (from, to) = months(start, 3);
    let held = window(&sim, from, to, "all", "all");
    let (a, id) = ask(&gw, ALPHA, &held).await;
    assert_eq!((a.credits_request(), charged_for(&sim, &id)), (Some(3), 3));
    // Three months held, nine missing, five rows a page: the call for the
    // missing months (two rows asked) has a cursor, so the window is then
    // bought as a page: two calls, both the request's.
    let (from, to) = months(start, 12);
    let paged = window(&sim, from, to, "all", "all").size(5);
    let calls = sim.stats().requests_total;
    let (b, id) = ask(&gw, ALPHA, &paged).await;
    assert_eq!(
        sim.stats().requests_total,
        calls + 2,
        "the missing months, then the page"
    );
    let billed = charged_for(&sim, &id);
    assert_eq!(billed, 7, "two rows, then a page of five");
    assert_eq!(b.credits_request(), Some(billed), "the header is the sum of both bills");
    assert_eq!(b.json(), direct(&sim, &paged).await.json());
    // Asked again: the page is held.
    let (c, id) = ask(&gw, ALPHA, &paged).await;
    assert_eq!((c.credits_request(), charged_for(&sim, &id)), (Some(0), 0));
    // Windows of every shape against what the upstream billed each.
    for (m, n) in [(2, 4), (0, 13), (5, 3), (1, 12)] {
        let (from, to) = months(start + Months::new(m), n);
        let q = window(&sim, from, to, "all", "all");
        let (r, id) = ask(&gw, BETA, &q).await;
        assert_eq!(r.credits_request(), Some(charged_for(&sim, &id)), "{q}");
        assert_eq!(r.json(), direct(&sim, &q).await.json(), "{q}");
    }
    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha", "beta"]).await;
}
