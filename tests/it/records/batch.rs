//! Id lookups of many apps share one upstream call: the org's ~120 calls a
//! minute are spent on calls of up to 50 ids, not one call per lookup. The
//! simulator and the gateway at 120 calls a minute, as the company runs.

use super::{ids_of, lookup, permit_search};
use crate::support::client::Client;
use crate::support::gateway::{replicas, Setup, Team, ALPHA, BETA, SMALL};
use crate::support::http::Reply;
use crate::support::redis::RedisServer;
use crate::support::sim::{fault, start_sim, FaultKind, Sim, SimConfig};
use crate::support::traffic::{charged_for, charged_to, ledger_used};
use http::StatusCode;
use permit_gateway::Running;
use std::future::IntoFuture;
use std::time::{Duration, Instant};

/// The company's rate on both sides; a gathering window long enough that
/// lookups fired together on a loaded test machine arrive within it.
fn at_company_rate() -> Setup {
    Setup::new().with(|c| {
        c.upstream.requests_per_minute = 120;
        c.upstream.batch_window_ms = 300;
        c.server.team_max_in_flight = 400;
    })
}

/// `n` distinct permit ids the simulator knows, learnt directly.
async fn known_ids(sim: &Sim, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut q = permit_search(sim, 100);
    while ids.len() < n {
        let page = Client::upstream(sim).get(&q).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.text());
        ids.extend(ids_of(&page));
        let Some(cursor) = page.json()["next_cursor"].as_str().map(String::from) else {
            break;
        };
        q = permit_search(sim, 100).param("cursor", cursor);
    }
    assert!(ids.len() >= n, "the sample state has {} permits", ids.len());
    ids.truncate(n);
    ids
}

/// One lookup of one id per request, all fired at once; `who(i)` is the
/// team of the `i`th. Answers in order, with how long the slowest took.
async fn at_once(gw: &Running, ids: &[String], who: impl Fn(usize) -> Team) -> (Vec<Reply>, Duration) {
    let started = Instant::now();
    let calls: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (team, token) = who(i);
            Client::new(gw.base_url(), token)
                .get(lookup("permits", &[id]))
                .request_id(&format!("{team}-{i}"))
                .spawn()
        })
        .collect();
    let mut replies = Vec::new();
    for call in calls {
        replies.push(call.await.expect("lookup task"));
    }
    (replies, started.elapsed())
}

fn half(i: usize) -> Team {
    if i % 2 == 0 {
        ALPHA
    } else {
        BETA
    }
}

fn credits(r: &Reply) -> u64 {
    r.header_u64("x-credits-request").expect("a credits header")
}

/// Every reply a 200 carrying exactly its own id, charged one credit.
fn each_answered_with_its_record(replies: &[Reply], ids: &[String]) {
    for (r, id) in replies.iter().zip(ids) {
        assert_eq!(r.status, StatusCode::OK, "{id}: {}", r.text());
        assert_eq!(ids_of(r), std::slice::from_ref(id));
        assert_eq!(credits(r), 1, "{id}: its own record");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_single_id_lookups_of_two_teams_at_once_share_two_calls() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = at_company_rate().start(&sim).await;
    let ids = known_ids(&sim, 40).await;
    let calls = sim.stats().requests_total;
    let (replies, took) = at_once(&gw, &ids, half).await;
    each_answered_with_its_record(&replies, &ids);
    let used = sim.stats().requests_total - calls;
    assert!(used <= 2, "{used} upstream calls for 40 ids");
    assert!(took < Duration::from_secs(2), "the slowest answer took {took:?}");
    // Each team charged exactly its own records, and the bills all paid.
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, 20);
    assert_eq!(ledger_used(&gw.admin_url(), "beta").await, 20);
    assert_eq!(charged_to(&sim, "alpha-") + charged_to(&sim, "beta-"), 40);
    let m = crate::support::probe::scrape(&gw.admin_url()).await;
    let saved = m.sum("gateway_upstream_calls_saved_total", &[("route", "permits_by_id")]);
    assert_eq!(saved, 40.0 - used as f64, "every lookup but one a call saved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_single_id_lookups_at_once_are_all_answered_in_a_few_calls() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = at_company_rate().start(&sim).await;
    let ids = known_ids(&sim, 200).await;
    let calls = sim.stats().requests_total;
    let (replies, _) = at_once(&gw, &ids, half).await;
    each_answered_with_its_record(&replies, &ids);
    let used = sim.stats().requests_total - calls;
    assert!(used <= 6, "{used} upstream calls for 200 ids");
    let billed = charged_to(&sim, "alpha-") + charged_to(&sim, "beta-");
    assert_eq!(billed, 200, "each record bought once");
    let (alpha, beta) = (
        ledger_used(&gw.admin_url(), "alpha").await,
        ledger_used(&gw.admin_url(), "beta").await,
    );
    assert_eq!((alpha, beta), (100, 100), "each team its own records");
    assert_eq!(alpha + beta, billed, "the charges sum to the bills");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_asked_by_both_teams_at_once_are_bought_once() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = at_company_rate().start(&sim).await;
    let ids = known_ids(&sim, 10).await;
    let twice: Vec<String> = ids.iter().chain(&ids).cloned().collect();
    let (replies, _) = at_once(&gw, &twice, |i| if i < 10 { ALPHA } else { BETA }).await;
    for (r, id) in replies.iter().zip(&twice) {
        assert_eq!(r.status, StatusCode::OK, "{id}: {}", r.text());
        assert_eq!(ids_of(r), std::slice::from_ref(id));
    }
    assert_eq!(
        charged_to(&sim, "alpha-") + charged_to(&sim, "beta-"),
        10,
        "each bought once"
    );
    let said: u64 = replies.iter().map(credits).sum();
    assert_eq!(said, 10, "charged once, to whichever team bought it");
    let used = ledger_used(&gw.admin_url(), "alpha").await + ledger_used(&gw.admin_url(), "beta").await;
    assert_eq!(used, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_lookup_on_an_idle_gateway_does_not_wait_for_company() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = Setup::new()
        .with(|c| {
            c.upstream.requests_per_minute = 120;
            c.upstream.batch_window_ms = 1000;
        })
        .start(&sim)
        .await;
    let ids = known_ids(&sim, 1).await;
    let started = Instant::now();
    let r = Client::new(gw.base_url(), ALPHA.1)
        .get(lookup("permits", &[&ids[0]]))
        .await;
    let took = started.elapsed();
    assert_eq!(ids_of(&r), ids);
    // A gathering window would have held it a whole second.
    assert!(took < Duration::from_millis(700), "a lone lookup took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_at_its_limit_in_a_batch_gets_402_and_the_others_their_records() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = at_company_rate()
        .teams(&[ALPHA, BETA, SMALL])
        .credit_limit(SMALL, 3)
        .start(&sim)
        .await;
    let ids = known_ids(&sim, 16).await;
    // Ten of alpha's, six of small's, fired together: small can pay for three.
    let (replies, _) = at_once(&gw, &ids, |i| if i < 10 { ALPHA } else { SMALL }).await;
    each_answered_with_its_record(&replies[..10], &ids[..10]);
    let small: Vec<&Reply> = replies[10..].iter().collect();
    let paid = small.iter().filter(|r| r.status == StatusCode::OK).count();
    let refused = small
        .iter()
        .filter(|r| r.status == StatusCode::PAYMENT_REQUIRED)
        .count();
    assert_eq!((paid, refused), (3, 3), "small's budget, exactly");
    for r in small.iter().filter(|r| r.status == StatusCode::PAYMENT_REQUIRED) {
        assert!(
            r.json()["detail"]["limit"].is_u64(),
            "the upstream's 402 shape: {}",
            r.text()
        );
    }
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, 10);
    assert_eq!(ledger_used(&gw.admin_url(), "small").await, 3);
    assert_eq!(charged_to(&sim, "alpha-") + charged_to(&sim, "small-"), 13);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_reaches_every_waiting_lookup_as_a_lone_ones_error() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = at_company_rate().with(|c| c.upstream.max_retries = 0).start(&sim).await;
    let ids = known_ids(&sim, 21).await;
    sim.set_faults(fault(FaultKind::Status));
    // What a lone lookup gets from a failing upstream.
    let lone = Client::new(gw.base_url(), ALPHA.1)
        .get(lookup("permits", &[&ids[20]]))
        .await;
    assert!(lone.status.is_server_error(), "{}", lone.status);
    let (replies, _) = at_once(&gw, &ids[..20], half).await;
    for r in &replies {
        assert_eq!(r.status, lone.status, "{}", r.text());
        assert_eq!(r.json(), lone.json());
    }
    sim.clear_faults();
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, 0, "nothing was billed");
    assert_eq!(ledger_used(&gw.admin_url(), "beta").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_buy_each_id_once() {
    let redis = RedisServer::start();
    let sim = start_sim(SimConfig::default()).await;
    let gws = replicas(2, &sim, Some(&redis), at_company_rate()).await;
    let ids = known_ids(&sim, 12).await;
    let twice: Vec<String> = ids.iter().chain(&ids).cloned().collect();
    let calls: Vec<_> = twice
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let (team, token) = half(i);
            Client::new(gws[i % 2].base_url(), token)
                .get(lookup("permits", &[id]))
                .request_id(&format!("{team}-{i}"))
                .spawn()
        })
        .collect();
    for (call, id) in calls.into_iter().zip(&twice) {
        let r = call.await.expect("lookup");
        assert_eq!(r.status, StatusCode::OK, "{id}: {}", r.text());
        assert_eq!(ids_of(&r), std::slice::from_ref(id));
    }
    assert_eq!(
        charged_to(&sim, "alpha-") + charged_to(&sim, "beta-"),
        12,
        "each id bought once"
    );
}

/// The records a batch bought answer later lookups of any list at 0 credits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_batch_bought_answers_any_later_list() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = at_company_rate().start(&sim).await;
    let ids = known_ids(&sim, 8).await;
    at_once(&gw, &ids, half).await;
    let calls = sim.stats().requests_total;
    let asked: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    let r = Client::new(gw.base_url(), BETA.1).get(lookup("permits", &asked)).await;
    assert_eq!((r.x_cache(), credits(&r)), (Some("HIT"), 0));
    assert_eq!(ids_of(&r), ids.iter().rev().cloned().collect::<Vec<_>>());
    assert_eq!(sim.stats().requests_total, calls);
}

/// `gateway_untracked_credits` now: the org's spend the upstream reports
/// minus the team ledgers.
async fn untracked(gw: &Running) -> f64 {
    crate::support::probe::scrape(&gw.admin_url())
        .await
        .sum("gateway_untracked_credits", &[])
}

/// Three teams' lookups fired together after a call on the route (so they
/// gather into one call): `lists[t]` is team `t`'s list; the upstream calls
/// it took and each reply.
async fn three_teams_in_one_call(
    gw: &Running,
    sim: &Sim,
    (warm, faulty): (&str, FaultKind),
    lists: [&[String]; 3],
) -> (u64, Vec<Reply>) {
    // A call on the route a moment ago: the next lookups gather company.
    let r = Client::new(gw.base_url(), ALPHA.1)
        .get(lookup("permits", &[warm]))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    sim.set_faults(fault(faulty));
    let calls = sim.stats().requests_total;
    let teams = [ALPHA, BETA, SMALL];
    let spawned: Vec<_> = lists
        .iter()
        .zip(teams)
        .map(|(ids, (team, token))| {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            Client::new(gw.base_url(), token)
                .get(lookup("permits", &ids))
                .request_id(&format!("{team}-batch"))
                .spawn()
        })
        .collect();
    let mut replies = Vec::new();
    for call in spawned {
        replies.push(call.await.expect("lookup task"));
    }
    sim.clear_faults();
    (sim.stats().requests_total - calls, replies)
}

/// Issue 57: the upstream returns one record of three and bills all three
/// (`partial_records`). A lookup alone pays the bill, its reservation
/// covering it; the same lookups of three teams sharing one call pay the
/// same: the call's charges sum to its bill, and the untracked credits do
/// not move (the batch used to charge 1 of 9 and leave 8 untracked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_billed_lookup_costs_the_same_alone_and_in_a_batch() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = at_company_rate().teams(&[ALPHA, BETA, SMALL]).start(&sim).await;
    let ids = known_ids(&sim, 14).await;
    sim.set_faults(fault(FaultKind::PartialRecords));
    let alone = Client::new(gw.base_url(), ALPHA.1)
        .get(lookup("permits", &[&ids[0], &ids[1], &ids[2]]))
        .request_id("alpha-alone")
        .await;
    assert_eq!(alone.status, StatusCode::OK, "{}", alone.text());
    assert_eq!(ids_of(&alone).len(), 1, "one record of three");
    assert_eq!(credits(&alone), 3, "billed 3: the bill, within its reservation");
    assert_eq!(charged_for(&sim, "alpha-alone"), 3);
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, 3);
    sim.clear_faults();
    let before = untracked(&gw).await;
    let faulty = (ids[13].as_str(), FaultKind::PartialRecords);
    let (calls, replies) = three_teams_in_one_call(&gw, &sim, faulty, [&ids[3..6], &ids[6..9], &ids[9..12]]).await;
    assert_eq!(calls, 1, "the three lookups shared one call");
    let charged: Vec<u64> = replies.iter().map(credits).collect();
    let bill = charged_to(&sim, "alpha-batch") + charged_to(&sim, "beta-batch") + charged_to(&sim, "small-batch");
    assert_eq!(bill, 9, "one record, billed as the whole answer");
    assert_eq!(charged, vec![3, 3, 3], "each pays as it would alone");
    for (team, paid) in [("alpha", 3 + 3 + 1), ("beta", 3), ("small", 3)] {
        // alpha: its lone lookup, its share of the batch, the warm-up's record
        // (which counts in the org's spend and alpha's alike).
        assert_eq!(ledger_used(&gw.admin_url(), team).await, paid, "{team}");
    }
    assert_eq!(untracked(&gw).await, before, "every billed credit has its team");
}

/// Issue 57: a batch billed with no records to count (the upstream sent
/// records of other ids, `foreign_records`, and billed its real answer) is
/// split by what each request asked, whatever order they joined in: of
/// 3 + 4 + 2 ids asked, one unknown, the 8 billed go 3 / 3 / 2, each
/// within its reservation (the rule used to fill the reservations in the
/// order the buyers joined).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_billed_without_countable_records_is_split_by_what_each_asked() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = at_company_rate().teams(&[ALPHA, BETA, SMALL]).start(&sim).await;
    let mut ids = known_ids(&sim, 9).await;
    let warm = ids.pop().expect("nine");
    // Alpha's third id does not exist: the upstream bills 8.
    let alpha = vec![ids[0].clone(), ids[1].clone(), "P-DOES-NOT-EXIST-57".to_string()];
    let faulty = (warm.as_str(), FaultKind::ForeignRecords);
    let (calls, replies) = three_teams_in_one_call(&gw, &sim, faulty, [&alpha, &ids[2..6], &ids[6..8]]).await;
    assert_eq!(calls, 1, "the three lookups shared one call");
    let bill = charged_to(&sim, "alpha-batch") + charged_to(&sim, "beta-batch") + charged_to(&sim, "small-batch");
    assert_eq!(bill, 8);
    let charged: Vec<u64> = replies.iter().map(credits).collect();
    // 8 × 3/9, 8 × 4/9, 8 × 2/9 = 2.67, 3.56, 1.78: whole credits 2, 3, 1,
    // the two left to the largest fractions (1.78, 2.67).
    assert_eq!(charged, vec![3, 3, 2]);
    assert_eq!(ledger_used(&gw.admin_url(), "beta").await, 3);
    assert_eq!(ledger_used(&gw.admin_url(), "small").await, 2);
}

/// Issue 58: one team's lookup with an id the upstream refuses (a city is
/// not an address) shares a call with two other teams' lookups. The batch's
/// 422 names the id's place in the call: that lookup alone gets the
/// upstream's refusal of its own list (its own index, and kept: asked again,
/// no call), and the others go again together. One extra call for the
/// batch, not one per member (the batch used to make every member ask alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_id_costs_one_extra_call_per_batch_not_one_per_member() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = at_company_rate().teams(&[ALPHA, BETA, SMALL]).start(&sim).await;
    let s = sim.samples();
    let page = Client::upstream(&sim)
        .get(crate::support::query::Query::property_search(&s.zip).size(4))
        .await;
    let props = ids_of(&page);
    assert_eq!(props.len(), 4, "{}", page.text());
    // A call on the route a moment ago: the lookups below gather company.
    let warm = Client::new(gw.base_url(), ALPHA.1)
        .get(lookup("properties", &[&props[3]]))
        .await;
    assert_eq!(warm.status, StatusCode::OK, "{}", warm.text());
    let calls = sim.stats().requests_total;
    let bad = lookup("properties", &[&props[0], &s.city_geo_id]);
    let lists = [
        bad.clone(),
        lookup("properties", &[&props[1]]),
        lookup("properties", &[&props[2]]),
    ];
    let spawned: Vec<_> = lists
        .iter()
        .zip([ALPHA, BETA, SMALL])
        .map(|(q, (team, token))| {
            Client::new(gw.base_url(), token)
                .get(q)
                .request_id(&format!("{team}-1"))
                .spawn()
        })
        .collect();
    let mut replies = Vec::new();
    for call in spawned {
        replies.push(call.await.expect("lookup task"));
    }
    let used = sim.stats().requests_total - calls;
    assert_eq!(used, 2, "the refused batch and the others' call again");
    let (refused, beta, small) = (&replies[0], &replies[1], &replies[2]);
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", refused.text());
    assert_eq!(
        refused.json()["detail"][0]["loc"][2],
        1,
        "the city's place in alpha's own list"
    );
    for (r, id) in [(beta, &props[1]), (small, &props[2])] {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(ids_of(r), std::slice::from_ref(id));
        assert_eq!(credits(r), 1);
    }
    // Kept: asked again, the refusal costs no call.
    let again = Client::new(gw.base_url(), ALPHA.1).get(&bad).await;
    assert_eq!((again.status, again.json()), (refused.status, refused.json()));
    assert_eq!(sim.stats().requests_total - calls, 2, "the refusal was kept");
    // The upstream says the same of alpha's list as sent.
    let direct = Client::upstream(&sim).get(&bad).await;
    assert_eq!(refused.json(), direct.json(), "the upstream's own refusal");
    assert_eq!(
        ledger_used(&gw.admin_url(), "alpha").await,
        1,
        "its warm-up record only"
    );
    assert_eq!(ledger_used(&gw.admin_url(), "beta").await, 1);
    assert_eq!(ledger_used(&gw.admin_url(), "small").await, 1);
}

/// Ids no upstream knows: the upstream omits them and bills nothing, so a
/// test can queue as many as it likes.
fn unknown_ids(tag: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("P-UNKNOWN-{tag}-{i}")).collect()
}

/// Issue 58: ids waiting in a batch queue have a deadline. At 60 calls a
/// minute (a burst of 6, then one a second), 600 ids at once need 12 calls;
/// with `max_queue_wait_secs = 2` every request has its final status within
/// 2 s + 1 s: those a call carried by then answered, the rest refused with
/// a 429 and a `Retry-After`, and no call is made for them (the batch used
/// to answer the last ones after 6 s, and would after minutes at 20× the rate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_in_a_batch_queue_are_answered_or_refused_within_their_deadline() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = Setup::new()
        .with(|c| {
            c.upstream.requests_per_minute = 60;
            c.upstream.burst = Some(6);
            c.upstream.max_queue_wait_secs = 2;
            c.upstream.batch_window_ms = 300;
            c.server.team_max_in_flight = 400;
        })
        .start(&sim)
        .await;
    let calls = sim.stats().requests_total;
    let ids = unknown_ids("deadline", 600);
    let spawned: Vec<_> = ids
        .chunks(10)
        .enumerate()
        .map(|(i, chunk)| {
            let client = Client::new(gw.base_url(), half(i).1);
            let q = crate::support::query::Query::by_id("permits", chunk);
            tokio::spawn(async move {
                let started = Instant::now();
                let r = client.get(q).await;
                (r, started.elapsed())
            })
        })
        .collect();
    let (mut answered, mut refused) = (0usize, 0usize);
    for call in spawned {
        let (r, took) = call.await.expect("lookup task");
        assert!(
            took < Duration::from_secs(3),
            "a final status after {took:?}: {}",
            r.status
        );
        match r.status {
            StatusCode::OK => answered += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                let wait = r.header_u64("retry-after").expect("a 429 says when to come back");
                assert!(wait >= 1, "{wait}");
                refused += 1;
            }
            other => panic!("{other}: {}", r.text()),
        }
    }
    assert_eq!(answered + refused, 60);
    assert!(refused > 0 && answered > 0, "{answered} answered, {refused} refused");
    let used = sim.stats().requests_total - calls;
    assert!(
        used as usize <= answered.div_ceil(5) + 1,
        "{used} calls for {answered} answered requests of 10 ids: none for the refused"
    );
    let m = crate::support::probe::scrape(&gw.admin_url()).await;
    let withdrawn = m.sum(
        "gateway_upstream_withdrawn_total",
        &[("route", "permits_by_id"), ("reason", "deadline")],
    );
    // Each deadline's refusal counted; the others were refused at once by
    // the gate, whose predicted wait passed the bound.
    assert!(
        withdrawn > 0.0 && withdrawn <= refused as f64,
        "{withdrawn} of {refused}"
    );
}

/// Issue 58: no call for a request nobody waits for. The gate's burst used
/// up, lookups queue for the next turn; their clients hang up first. When
/// the turn comes their ids leave the queue without a call, their credits
/// released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_whose_clients_left_cost_no_call() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = Setup::new()
        .teams(&[ALPHA, SMALL])
        .credit_limit(SMALL, 1_000)
        .with(|c| {
            c.upstream.requests_per_minute = 12;
            c.upstream.burst = Some(1);
            c.upstream.batch_window_ms = 50;
        })
        .start(&sim)
        .await;
    // The burst of 12 a minute is 1: one call spends it, the next waits ~5 s.
    let first = Client::new(gw.base_url(), ALPHA.1)
        .get(crate::support::query::Query::by_id("permits", &unknown_ids("first", 1)))
        .await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let calls = sim.stats().requests_total;
    let left: Vec<_> = (0..5)
        .map(|i| {
            let q = crate::support::query::Query::by_id("permits", &unknown_ids(&format!("left{i}"), 10));
            let call = Client::new(gw.base_url(), SMALL.1).get(q).into_future();
            tokio::spawn(async move { tokio::time::timeout(Duration::from_millis(300), call).await.is_err() })
        })
        .collect();
    for hung_up in left {
        assert!(hung_up.await.expect("client task"), "the client gave up first");
    }
    // The turn comes (about 10 s on): the abandoned ids leave, uncalled.
    crate::support::wait::eventually("the abandoned lookups withdrawn", Duration::from_secs(20), || async {
        let m = crate::support::probe::scrape(&gw.admin_url()).await;
        let n = m.sum(
            "gateway_upstream_withdrawn_total",
            &[("route", "permits_by_id"), ("reason", "abandoned")],
        );
        (n >= 5.0).then_some(())
    })
    .await;
    assert_eq!(sim.stats().requests_total, calls, "no call for clients that left");
    let small = crate::support::traffic::admin_team(&gw.admin_url(), "small").await;
    assert_eq!(small["remaining"], 1_000, "every reservation released: {small}");
}

/// Issue 58: each team's lookups hold that team's place at the gate. One
/// team queues eight searches and a lookup at one call a second; a second
/// team's lookup then takes its own turn, next in the round-robin, and is
/// answered while most of alpha's line still waits (the batch used to
/// queue as the team whose ids waited longest, behind its eight searches).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_teams_lookup_takes_its_own_turn_not_the_floods() {
    let sim = start_sim(SimConfig::default()).await;
    let gw = Setup::new()
        .with(|c| {
            c.upstream.requests_per_minute = 60;
            c.upstream.burst = Some(6);
            c.upstream.batch_window_ms = 20;
            c.server.team_max_in_flight = 400;
        })
        .start(&sim)
        .await;
    // The burst of 6 spent, then alpha's eight searches and one lookup wait.
    let flood: Vec<_> = (0..14)
        .map(|i| {
            Client::new(gw.base_url(), ALPHA.1)
                .get(crate::support::traffic::distinct_search(&sim, i, 1))
                .spawn()
        })
        .collect();
    crate::support::wait::eventually("alpha's searches queued", Duration::from_secs(10), || async {
        let m = crate::support::probe::scrape(&gw.admin_url()).await;
        (m.sum("gateway_upstream_queue_depth", &[]) >= 6.0).then_some(())
    })
    .await;
    let alpha_lookup = Client::new(gw.base_url(), ALPHA.1)
        .get(crate::support::query::Query::by_id(
            "permits",
            &unknown_ids("flood", 50),
        ))
        .spawn();
    let started = Instant::now();
    let beta = Client::new(gw.base_url(), BETA.1)
        .get(crate::support::query::Query::by_id("permits", &unknown_ids("light", 1)))
        .await;
    let took = started.elapsed();
    assert_eq!(beta.status, StatusCode::OK, "{}", beta.text());
    // Order, not a clock: beta was answered while most of alpha's line
    // still waited (behind that line, it came after all of it).
    let waiting = flood.iter().filter(|call| !call.is_finished()).count();
    assert!(
        waiting >= 4,
        "beta's lookup came after alpha's line: {waiting} of alpha's calls still waiting ({took:?})"
    );
    for call in flood {
        let r = call.await.expect("search");
        assert!(matches!(r.status.as_u16(), 200 | 429), "{}", r.status);
    }
    let r = alpha_lookup.await.expect("lookup");
    assert!(matches!(r.status.as_u16(), 200 | 429), "{}", r.status);
}

/// The by-id calls the simulator served after its `seq`th request: each
/// call's ids, in order.
fn lookup_calls_since(sim: &Sim, seq: u64) -> Vec<Vec<String>> {
    sim.log()
        .into_iter()
        .filter(|e| e.seq > seq && e.path == "/v2/permits")
        .map(|e| {
            e.query
                .split('&')
                .filter_map(|p| p.strip_prefix("id="))
                .map(String::from)
                .collect()
        })
        .collect()
}

/// Issue 58: calls leave full when a crowd arrives. A steady 100
/// single-id lookups a second of two teams, open loop for 8 s, against an
/// upstream that allows 60 calls in any 60 s and answers in 100–300 ms:
/// twice what full calls carry at one call a second, so the calls stay
/// full on a machine too busy to send more than half of them in time
/// (issue 59: at 120 a minute, exactly what full calls carry, a load of 6
/// on 2 cores left 40 a call; BENCHMARKS.md has that rate's numbers). The
/// first lookup goes at once (alone on an idle gateway); the crowd is seen
/// within tens of milliseconds, and from then on each call waits for 50
/// ids: the calls between the first and the last all carry 50, but for
/// two (and two more for each stall of this test's sending), where a
/// fixed 20 ms window spends the gate's burst on two or three ids each.
/// Every lookup is answered with its record, and each team's ledger holds
/// exactly what the upstream billed for its records.
/// A gap in the test's own sending, ten ticks long, that can leave a call
/// part full.
const STALL: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_crowd_of_lookups_leaves_in_full_calls() {
    let sim = start_sim(SimConfig {
        latency_ms: 100,
        latency_jitter_ms: 200,
        rate_window: permit_api_sim::ratelimit::Window::Strict,
        ..SimConfig::default()
    })
    .await;
    let gw = Setup::new()
        .with(|c| {
            c.upstream.requests_per_minute = 60;
            c.server.team_max_in_flight = 400;
        })
        .start(&sim)
        .await;
    let ids = known_ids(&sim, 800).await;
    let seq = sim.stats().requests_total;
    // Open loop: one lookup every 10 ms, whatever the answers do.
    let mut pace = tokio::time::interval(Duration::from_millis(10));
    let mut spawned = Vec::with_capacity(ids.len());
    // Where this test's own sending stalled (a busy machine): the ids
    // then come in a burst after a gap, and the call gathering during the
    // gap may leave part full, as it should.
    let mut stalls = 0;
    let mut last = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        pace.tick().await;
        stalls += usize::from(last.elapsed() > STALL);
        last = Instant::now();
        let (team, token) = half(i);
        let call = Client::new(gw.base_url(), token)
            .get(lookup("permits", &[id]))
            .request_id(&format!("{team}-{i}"))
            .into_future();
        spawned.push(tokio::spawn(async move {
            let started = Instant::now();
            let reply = call.await;
            (reply, started.elapsed())
        }));
    }
    let mut replies = Vec::with_capacity(ids.len());
    let mut took = Vec::with_capacity(ids.len());
    for call in spawned {
        let (reply, t) = call.await.expect("lookup task");
        replies.push(reply);
        took.push(t);
    }
    each_answered_with_its_record(&replies, &ids);
    let calls = lookup_calls_since(&sim, seq);
    let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
    let asked: usize = sizes.iter().sum();
    took.sort();
    eprintln!(
        "{} calls for {asked} ids ({:.1} a call; after the first {:.1}); latency p50 {:?}, p90 {:?}, max {:?}; calls: {sizes:?}",
        calls.len(),
        asked as f64 / calls.len() as f64,
        (asked - sizes[0]) as f64 / (calls.len() - 1) as f64,
        took[took.len() / 2],
        took[took.len() * 9 / 10],
        took[took.len() - 1],
    );
    assert_eq!(asked, ids.len(), "each id asked once");
    // Counted, not averaged: every call between the first (alone on an
    // idle gateway) and the last (the crowd's tail) leaves full, but for
    // two, and two more for each stall of the sending.
    let part_full = sizes[1..sizes.len() - 1].iter().filter(|n| **n < 50).count();
    assert!(
        part_full <= 2 + 2 * stalls,
        "{part_full} calls left part full, the sending stalled {stalls} times: {sizes:?}"
    );
    // Money: each team its own records, and every billed credit has its team.
    let billed = charged_to(&sim, "alpha-") + charged_to(&sim, "beta-");
    assert_eq!(billed, 800, "each record billed once");
    let alpha = ledger_used(&gw.admin_url(), "alpha").await;
    let beta = ledger_used(&gw.admin_url(), "beta").await;
    assert_eq!((alpha, beta), (400, 400), "each team its own records");
    assert_eq!(alpha + beta, billed, "the charges sum to the bills");
}

/// Issue 58: ids are looked up in the cache once more as their call
/// leaves. Two lookups wait in a gathering batch (the route was called a
/// moment ago; the longest window, 1 s); meanwhile a search brings the
/// records of all of alpha's ids and of one of beta's two. Alpha's lookup
/// is answered from those records, charged nothing, and leaves the call;
/// the call asks beta's other id alone (it used to ask all five).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_a_search_brought_while_their_lookup_waited_are_not_asked() {
    // Every answer takes 400 ms: a search sent with the lookups files its
    // records long after they looked for them and joined, and long before
    // their window ends.
    let sim = start_sim(SimConfig {
        latency_ms: 400,
        ..SimConfig::default()
    })
    .await;
    let gw = Setup::new()
        .with(|c| {
            c.upstream.requests_per_minute = 120;
            c.upstream.batch_window_ms = 1000;
        })
        .start(&sim)
        .await;
    // The search's page: the first ids of the permits' first page.
    let ids = known_ids(&sim, 12).await;
    let (found, warm, other) = (&ids[..5], &ids[10], &ids[11]);
    let r = Client::new(gw.base_url(), ALPHA.1)
        .get(lookup("permits", &[warm]))
        .request_id("alpha-warm")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let seq = sim.stats().requests_total;
    // Within a second of that call: these gather for the window.
    let alpha = Client::new(gw.base_url(), ALPHA.1)
        .get(lookup("permits", &[&found[0], &found[1], &found[2]]))
        .request_id("alpha-lookup")
        .spawn();
    let beta = Client::new(gw.base_url(), BETA.1)
        .get(lookup("permits", &[&found[3], other]))
        .request_id("beta-lookup")
        .spawn();
    let search = Client::new(gw.base_url(), BETA.1)
        .get(permit_search(&sim, 5))
        .request_id("beta-search")
        .await;
    assert_eq!(ids_of(&search), found, "{}", search.text());
    let (alpha, beta) = (alpha.await.expect("alpha"), beta.await.expect("beta"));
    assert_eq!(alpha.status, StatusCode::OK, "{}", alpha.text());
    assert_eq!(ids_of(&alpha), found[..3]);
    assert_ne!(
        alpha.x_cache(),
        Some("HIT"),
        "it was waiting in the batch, not held at its look"
    );
    assert_eq!(credits(&alpha), 0, "answered from the search's records");
    assert_eq!(beta.status, StatusCode::OK, "{}", beta.text());
    assert_eq!(ids_of(&beta), vec![found[3].clone(), other.clone()]);
    assert_eq!(credits(&beta), 1, "its one record bought");
    assert_eq!(
        lookup_calls_since(&sim, seq),
        vec![vec![other.clone()]],
        "one call, for the one id nothing brought"
    );
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, charged_to(&sim, "alpha-"));
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, 1, "its warm-up record");
    assert_eq!(ledger_used(&gw.admin_url(), "beta").await, charged_to(&sim, "beta-"));
    assert_eq!(ledger_used(&gw.admin_url(), "beta").await, 5 + 1);
}
