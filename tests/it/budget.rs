//! Hard team budgets, the durable ledger and fair sharing of the upstream
//! rate: asserted against what the simulator really charged.

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, FromFile, Setup, ALPHA, BETA, SMALL};
use crate::support::http::Reply;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim, SimConfig};
use crate::support::traffic::charged_to;
use crate::support::wait::eventually;
use http::StatusCode;
use std::time::Duration;

/// 40 concurrent size=10 searches against a budget of 100, spread over the
/// given gateways; returns the replies.
async fn fire_forty(sim: &Sim, bases: &[String]) -> Vec<Reply> {
    let s = sim.samples();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            Client::new(&bases[i as usize % bases.len()], SMALL.1)
                .get(Query::distinct(&s, i).size(10))
                .request_id(&format!("small-{i}"))
                .spawn()
        })
        .collect();
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.expect("request task"));
    }
    replies
}

fn assert_budget_held(sim: &Sim, replies: &[Reply]) {
    let charged = charged_to(sim, "small-");
    assert!(charged <= 100, "the upstream charged {charged} > budget 100");
    let ok: Vec<_> = replies.iter().filter(|r| r.status == StatusCode::OK).collect();
    let refused: Vec<_> = replies
        .iter()
        .filter(|r| r.status == StatusCode::PAYMENT_REQUIRED)
        .collect();
    assert_eq!(ok.len() + refused.len(), 40, "only 200s and 402s");
    assert_eq!(ok.len(), 10, "exactly the budget's worth was served");
    assert_eq!(charged, 100);
    for r in &refused {
        let body = r.json();
        assert_eq!(body["detail"]["limit"], 100);
        assert!(body["detail"]["upgrade_url"]
            .as_str()
            .is_some_and(|u| u.starts_with("https://")));
        assert!(body["detail"]["error"].is_string());
    }
    for r in replies {
        let remaining = r.header("x-credits-remaining").expect("remaining on 200 and 402");
        assert!(
            remaining.parse::<u64>().is_ok(),
            "remaining {remaining} is never negative"
        );
        assert_eq!(r.header("x-credits-limit"), Some("100"));
    }
}

#[tokio::test]
async fn a_budget_of_100_holds_under_40_concurrent_searches() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 100).start(&sim).await;
    let replies = fire_forty(&sim, &[gw.base_url()]).await;
    assert_budget_held(&sim, &replies);
    assert_eq!(
        Client::new(gw.base_url(), SMALL.1).used().await,
        100,
        "the ledger equals what the upstream charged"
    );
}

#[tokio::test]
async fn a_budget_of_100_holds_across_two_replicas_on_one_redis_ledger() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new()
        .teams(&[SMALL])
        .credit_limit(SMALL, 100)
        .ledger_redis(&redis.url());
    let gw1 = setup.start(&sim).await;
    let gw2 = setup.start(&sim).await;
    let replies = fire_forty(&sim, &[gw1.base_url(), gw2.base_url()]).await;
    assert_budget_held(&sim, &replies);
    assert_eq!(Client::new(gw1.base_url(), SMALL.1).used().await, 100);
    assert_eq!(Client::new(gw2.base_url(), SMALL.1).used().await, 100);
}

#[tokio::test]
async fn free_endpoints_cost_nothing_and_a_small_settle_returns_the_difference() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 100).start(&sim).await;
    let small = Client::new(gw.base_url(), SMALL.1);
    let s = sim.samples();
    for query in [
        Query::meta_release(),
        Query::place("counties", &s.county_geo_id),
        Query::list("zip").size(100),
    ] {
        let r = small.get(&query).request_id("free").await;
        assert_eq!(r.status, StatusCode::OK, "{query}");
    }
    assert_eq!(small.used().await, 0);
    // Reserve 60 for a query that returns 3 records: 57 come back.
    let few = Query::permit_search(&s.address_geo_id)
        .window(&s.permit_from, &s.permit_to)
        .size(60);
    let r = small.get(few).request_id("few").await;
    assert_eq!(r.status, StatusCode::OK);
    let cost = r.credits_request().expect("cost");
    assert!(cost < 60, "an address has few permits ({cost})");
    assert_eq!(r.header_u64("x-credits-remaining"), Some(100 - cost));
    let big = small
        .get(Query::distinct(&s, 1).size(100 - cost as u32))
        .request_id("big")
        .await;
    assert_eq!(
        big.status,
        StatusCode::OK,
        "the difference was returned: {}",
        big.text()
    );
    assert_eq!(small.used().await, 100);
    assert_eq!(charged_to(&sim, ""), 100);
}

#[tokio::test]
async fn spend_survives_a_restart_of_the_file_ledger() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 100);
    let gw = setup.start(&sim).await;
    let s = sim.samples();
    let r = Client::new(gw.base_url(), SMALL.1)
        .get(Query::distinct(&s, 0).size(30))
        .request_id("a")
        .await;
    assert_eq!(r.status, StatusCode::OK);
    gw.shutdown().await.expect("graceful stop");
    let again = setup.start(&sim).await;
    let small = Client::new(again.base_url(), SMALL.1);
    assert_eq!(small.used().await, 30);
    let over = small.get(Query::distinct(&s, 1).size(80)).request_id("b").await;
    assert_eq!(
        over.status,
        StatusCode::PAYMENT_REQUIRED,
        "30 + 80 > 100 after the restart"
    );
}

#[tokio::test]
async fn sigkill_mid_load_loses_no_settled_spend_and_lapsed_reservations_count_as_spent() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new()
        .teams(&[SMALL])
        .credit_limit(SMALL, 100)
        .ledger_redis(&redis.url())
        .one_attempt(1)
        .with(|c| {
            c.upstream.max_queue_wait_secs = 1;
            c.quota.reservation_lease_secs = 7;
        });
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let small = Client::new(gw.base_url(), SMALL.1);
    let s = sim.samples();
    // Three calls that settle (30 credits), then three that hang upstream.
    for i in 0..3 {
        let r = small
            .get(Query::distinct(&s, i).size(10))
            .request_id(&format!("done-{i}"))
            .await;
        assert_eq!(r.status, StatusCode::OK);
    }
    // Hung for longer than this test can take, even on a loaded machine: a
    // hang that ended would be charged by the simulator (as the upstream
    // would), which the ledger then covers as lapsed spend but the exact
    // charge asserted below would not.
    sim.set_faults(Faults {
        kind: FaultKind::Hang,
        delay_ms: Some(600_000),
        ..Faults::default()
    });
    let hanging: Vec<_> = (3..6)
        .map(|i| small.get(Query::distinct(&s, i).size(20)).spawn())
        .collect();
    // Wait until the three calls hold their reservations in the ledger.
    eventually("the hanging calls reserve", Duration::from_secs(10), || async {
        match redis.holds("small").await {
            Some(3) => Ok(()),
            held => Err(format!("{held:?} held")),
        }
    })
    .await;
    gw.signal("KILL");
    gw.wait_exit(Duration::from_secs(10));
    for h in hanging {
        h.abort();
    }
    sim.clear_faults();
    // 60 credits were held by the dead process. When their lease runs out
    // they count as spent (the upstream might have charged them): the
    // budget is then 90 used, at least what the upstream charged (30) and
    // never above the limit.
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let small = small.at(gw.base_url());
    assert_eq!(small.used().await, 30, "settled spend survived the kill");
    let lapse = "the killed process's reservations lapse into spend";
    eventually(lapse, Duration::from_secs(20), || async {
        // 20 more never fit (30 + 60 held, or 90 spent): each try runs the
        // reserve script, which turns lapsed reservations into spend.
        let r = small.get(Query::distinct(&s, 9).size(20)).request_id("after").await;
        assert_eq!(r.status, StatusCode::PAYMENT_REQUIRED, "{}", r.text());
        small.used().await == 90
    })
    .await;
    let last = small.get(Query::distinct(&s, 10).size(10)).request_id("last").await;
    assert_eq!(last.status, StatusCode::OK);
    assert_eq!(small.used().await, 100, "exactly the limit");
    // After a crash the ledger may hold more than the upstream charged (the
    // lapsed holds count in full), never less, and never more than the
    // limit. The upstream charged the 3 settled calls and the last one, plus
    // any hung call it answered before the kill landed (seen once on a
    // loaded machine: 60).
    let charged: u64 = sim.log().iter().map(|e| e.credits).sum();
    assert!(
        (40..=100).contains(&charged),
        "the upstream charged 30 + 10 (+ hung calls it answered): {charged}"
    );
}

#[tokio::test]
async fn an_exhausted_org_pauses_metered_calls_and_charges_no_team() {
    let sim = start_sim(SimConfig {
        credit_limit: Some(20),
        ..unlimited()
    })
    .await;
    let gw = Setup::new().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let s = sim.samples();
    let cached = Query::distinct(&s, 0).size(20);
    assert_eq!(alpha.get(&cached).request_id("a").await.status, StatusCode::OK);
    // All 20 spent: the next call is refused upstream with 402.
    let refused = alpha.get(Query::distinct(&s, 1).size(10)).request_id("b").await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED);
    assert!(
        refused.json()["detail"]["error"].is_string(),
        "the upstream's 402 body passes through"
    );
    let upstream_calls = sim.stats().requests_total;
    // Paused: the next metered miss does not reach the upstream.
    let paused = alpha.get(Query::distinct(&s, 2).size(1)).request_id("c").await;
    assert_eq!(paused.status, StatusCode::PAYMENT_REQUIRED);
    // A cached answer asked fresh falls back to its copy.
    let stale = alpha.get(&cached).cache_control("no-cache").await;
    assert_eq!(stale.x_cache(), Some("STALE"));
    let metered_after: Vec<String> = sim
        .log()
        .into_iter()
        .skip(upstream_calls as usize)
        .map(|e| e.path)
        .filter(|p| p != "/v2/usage")
        .collect();
    assert!(
        metered_after.is_empty(),
        "metered calls reached the upstream while paused: {metered_after:?}"
    );
    // Free calls still go through.
    assert_eq!(
        alpha.get(Query::meta_release()).request_id("d").await.status,
        StatusCode::OK
    );
    assert_eq!(alpha.used().await, 20, "nothing charged for refused calls");
}

#[tokio::test]
async fn admin_reports_budgets_and_chargeback_rows() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .teams(&[SMALL, BETA])
        .credit_limit(SMALL, 100)
        .start(&sim)
        .await;
    let search = Query::distinct(&sim.samples(), 0).size(7);
    Client::new(gw.base_url(), SMALL.1).get(&search).request_id("x").await;
    Client::new(gw.base_url(), BETA.1).get(&search).request_id("y").await;
    let admin = Client::admin(gw.admin_url());
    let teams = admin.get("/admin/teams").await.json();
    let small = teams["teams"]
        .as_array()
        .expect("teams")
        .iter()
        .find(|t| t["name"] == "small")
        .expect("small")
        .clone();
    assert_eq!(small["used"], 7);
    assert_eq!(small["remaining"], 93);
    assert_eq!(small["window"], "rolling_30d");
    assert_eq!(small["requests"], 1);
    let csv = admin.get("/admin/usage.csv").await;
    assert_eq!(csv.header("content-type"), Some("text/csv; charset=utf-8"));
    let text = csv.text();
    let today = chrono::Utc::now().date_naive();
    assert!(text.starts_with("team,date,route,credits_spent,credits_saved,app\n"));
    assert!(
        text.contains(&format!("small,{today},permits_search,7,0,default")),
        "{text}"
    );
    // Beta's hit saved 7 (written in the background: poll for it).
    eventually("the saved credits are recorded", Duration::from_secs(5), || async {
        let text = admin.get("/admin/usage.csv").await.text();
        match text.contains(&format!("beta,{today},permits_search,0,7,default")) {
            true => Ok(()),
            false => Err(text),
        }
    })
    .await;
    let bad = admin.get("/admin/usage.csv?from=yesterday").await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn hot_reload_changes_a_budget_and_adds_a_team_without_dropping_requests() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 100);
    let file = FromFile::start(&setup, &sim).await;
    let gw = &file.gw;
    let (small, beta) = (Client::new(gw.base_url(), SMALL.1), Client::new(gw.base_url(), BETA.1));
    let search = Query::distinct(&sim.samples(), 0).size(5);
    assert_eq!(
        small.get(&search).request_id("s").await.header("x-credits-limit"),
        Some("100")
    );
    // Traffic keeps flowing while the config changes.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (small, stop) = (small.clone(), stop.clone());
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                statuses.push(small.get(Query::meta_release()).request_id("load").await.status);
            }
            statuses
        })
    };
    // The same data dir moves along: the running gateway's ledger lives there.
    let setup = setup.teams(&[SMALL, BETA]).credit_limit(SMALL, 500);
    file.rewrite(&setup, &sim);
    let reload = file.reload().await;
    assert_eq!(reload.status, StatusCode::OK, "{}", reload.text());
    assert_eq!(reload.json()["teams"], 2);
    assert_eq!(
        beta.get(&search).request_id("new").await.status,
        StatusCode::OK,
        "the new team is in"
    );
    let after = small.get(&search).request_id("s2").await;
    assert_eq!(after.header("x-credits-limit"), Some("500"));
    assert_eq!(
        after.header("x-credits-remaining"),
        Some("495"),
        "spend kept across the reload"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let statuses = load.await.expect("load task");
    assert!(!statuses.is_empty());
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "a request failed during reload: {statuses:?}"
    );
    // A broken file is refused and the old teams stay.
    std::fs::write(&file.path, "[server]\nlisten = 1\n").expect("break");
    let refused = file.reload().await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        beta.get(Query::meta_release()).request_id("still").await.status,
        StatusCode::OK
    );
}
