//! Issue 48: many apps per team. A team's apps each have a token
//! (`[[teams.tokens]]`): each is attributed (usage.csv's `app` column, the
//! access line, `/v2/usage`), may have a budget of its own inside the
//! team's, and can be rotated with an overlap (`not_after`); the company's
//! cap (`quota.org_credit_limit`) binds the sum of every team's spend.
//! Each test starts the real gateway and the simulator, and compares what
//! the ledger says with what reached the upstream.

use crate::support::client::Client;
use crate::support::gateway::{
    app_token, replicas, ChildGateway, FromFile, Setup, ALPHA, BATCH, BETA, NEXT, SMALL, WEB,
};
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::traffic::{charged_to, ledger_used};
use crate::support::wait::eventually;
use http::StatusCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Team alpha with apps web and batch (and its own token as `default`).
fn alpha_with_apps(setup: Setup) -> Setup {
    setup.team(ALPHA, |t| t.tokens = vec![app_token(WEB), app_token(BATCH)])
}

/// The rows of usage.csv, without its header.
async fn usage_rows(admin: &str) -> Vec<String> {
    let csv = Client::admin(admin)
        .get("/admin/usage.csv")
        .expect_status(StatusCode::OK)
        .await;
    let text = csv.text();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("team,date,route,credits_spent,credits_saved,app"));
    lines.map(str::to_string).collect()
}

/// The credits usage.csv gives `team`'s `app`.
fn spent_of(rows: &[String], team: &str, app: &str) -> u64 {
    rows.iter()
        .map(|r| r.split(',').collect::<Vec<_>>())
        .filter(|cells| cells.first() == Some(&team) && cells.get(5) == Some(&app))
        .filter_map(|cells| cells.get(3)?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn two_apps_of_a_team_buy_with_their_own_tokens_and_their_spend_is_attributed() {
    let sim = start_sim(unlimited()).await;
    let setup = alpha_with_apps(Setup::new());
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let s = sim.samples();
    for (who, i, size) in [(WEB, 0u32, 4u32), (BATCH, 1, 6), (ALPHA, 2, 3), (WEB, 3, 2)] {
        let r = Client::new(gw.base_url(), who.1)
            .get(Query::distinct(&s, i).size(size))
            .request_id(&format!("alpha-{}-{i}", who.0))
            .await;
        assert_eq!(
            (r.status, r.credits_request()),
            (StatusCode::OK, Some(u64::from(size))),
            "{}",
            r.text()
        );
    }
    // Beta, a team of one token, as before.
    let b = Client::new(gw.base_url(), BETA.1)
        .get(Query::distinct(&s, 4).size(5))
        .request_id("beta-0")
        .await;
    assert_eq!(b.status, StatusCode::OK);
    let (web, batch, default) = (
        charged_to(&sim, "alpha-web-"),
        charged_to(&sim, "alpha-batch-"),
        charged_to(&sim, "alpha-alpha-"),
    );
    assert_eq!((web, batch, default), (6, 6, 3), "what the upstream billed each app");
    let rows = usage_rows(&gw.admin_url()).await;
    assert_eq!(spent_of(&rows, "alpha", "web"), web, "{rows:#?}");
    assert_eq!(spent_of(&rows, "alpha", "batch"), batch, "{rows:#?}");
    assert_eq!(spent_of(&rows, "alpha", "default"), default, "{rows:#?}");
    assert_eq!(spent_of(&rows, "beta", "default"), 5, "{rows:#?}");
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, web + batch + default);
    // The access line names the app; a team of one token's names none.
    assert_eq!(gw.access_line("alpha-batch-1").await["app"], "batch");
    assert_eq!(gw.access_line("alpha-web-3").await["app"], "web");
    assert!(gw.access_line("beta-0").await.get("app").is_none());
    // /v2/usage with an app's token: the team's view and the app's own.
    let usage = Client::new(gw.base_url(), WEB.1).get(Query::usage()).await;
    assert_eq!(usage.json()["credits_used"], web + batch + default);
    assert_eq!(usage.json()["app"]["name"], "web");
    assert_eq!(usage.json()["app"]["credits_used"], web);
    // /admin/teams: each token, when last used.
    let teams = Client::admin(gw.admin_url()).get("/admin/teams").await.json();
    let alpha = teams["teams"]
        .as_array()
        .expect("teams")
        .iter()
        .find(|t| t["name"] == "alpha")
        .cloned();
    let tokens = alpha.expect("alpha")["tokens"].clone();
    let names: Vec<&str> = tokens
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["default", "web", "batch"]);
    for t in tokens.as_array().expect("tokens") {
        assert!(t["last_used"].is_string(), "{t}");
    }
    assert_eq!(tokens[1]["used"], web);
}

#[tokio::test]
async fn an_app_at_its_own_limit_gets_402_while_another_app_of_the_team_still_buys() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().team(ALPHA, |t| {
        t.credit_limit = Some(100);
        let mut web = app_token(WEB);
        web.credit_limit = Some(10);
        t.tokens = vec![web, app_token(BATCH)];
    });
    let gw = setup.start(&sim).await;
    let s = sim.samples();
    let (web, batch) = (Client::new(gw.base_url(), WEB.1), Client::new(gw.base_url(), BATCH.1));
    let spent = web.get(Query::distinct(&s, 0).size(10)).request_id("alpha-web-0").await;
    assert_eq!(spent.status, StatusCode::OK, "{}", spent.text());
    let calls = sim.stats().requests_total;
    let refused = web.get(Query::distinct(&s, 1).size(1)).request_id("alpha-web-1").await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED, "{}", refused.text());
    let detail = &refused.json()["detail"];
    assert_eq!(
        (detail["budget"].as_str(), detail["app"].as_str()),
        (Some("app"), Some("web")),
        "{detail}"
    );
    assert_eq!(
        (detail["limit"].as_u64(), detail["remaining"].as_u64()),
        (Some(10), Some(0))
    );
    assert_eq!(sim.stats().requests_total, calls, "nothing bought for the refused app");
    let other = batch
        .get(Query::distinct(&s, 2).size(30))
        .request_id("alpha-batch-2")
        .await;
    assert_eq!(
        (other.status, other.credits_request()),
        (StatusCode::OK, Some(30)),
        "{}",
        other.text()
    );
    // The team's own token is the team's app `default`: no limit of its own.
    let own = Client::new(gw.base_url(), ALPHA.1)
        .get(Query::distinct(&s, 3).size(5))
        .await;
    assert_eq!(own.status, StatusCode::OK);
    assert_eq!(
        ledger_used(&gw.admin_url(), "alpha").await,
        charged_to(&sim, "alpha-") + 5
    );
}

/// Starts `n` misses with `token` on `gw`, `size` credits each, at once.
fn spawn_misses(
    gw: &str,
    token: &'static str,
    sim: &Sim,
    first: u32,
    n: u32,
    size: u32,
    prefix: &str,
) -> Vec<tokio::task::JoinHandle<crate::support::http::Reply>> {
    let s = sim.samples();
    (first..first + n)
        .map(|i| {
            Client::new(gw, token)
                .get(Query::distinct(&s, i).size(size))
                .request_id(&format!("{prefix}{i}"))
                .spawn()
        })
        .collect()
}

/// The statuses of misses started by [`spawn_misses`].
async fn statuses(calls: Vec<tokio::task::JoinHandle<crate::support::http::Reply>>) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for c in calls {
        out.push(c.await.expect("a miss").status);
    }
    out
}

#[tokio::test]
async fn concurrent_misses_of_two_apps_never_pass_the_team_limit_nor_either_apps() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().team(ALPHA, |t| {
        t.credit_limit = Some(60);
        let (mut web, mut batch) = (app_token(WEB), app_token(BATCH));
        web.credit_limit = Some(40);
        batch.credit_limit = Some(40);
        t.tokens = vec![web, batch];
    });
    let gw = setup.start(&sim).await;
    let base = gw.base_url();
    let web_calls = spawn_misses(&base, WEB.1, &sim, 0, 16, 5, "alpha-web-");
    let batch_calls = spawn_misses(&base, BATCH.1, &sim, 100, 16, 5, "alpha-batch-");
    let (w, b) = (statuses(web_calls).await, statuses(batch_calls).await);
    for s in w.iter().chain(&b) {
        assert!(matches!(*s, StatusCode::OK | StatusCode::PAYMENT_REQUIRED), "{s}");
    }
    let (web, batch) = (charged_to(&sim, "alpha-web-"), charged_to(&sim, "alpha-batch-"));
    eprintln!(
        "two apps at once: web {web} (limit 40), batch {batch} (limit 40), team {} (limit 60)",
        web + batch
    );
    assert!(
        web <= 40 && batch <= 40,
        "an app passed its limit: web {web}, batch {batch}"
    );
    assert!(web + batch <= 60, "the team passed its limit: {}", web + batch);
    assert_eq!(web + batch, 60, "the team's budget is spent to the credit");
    assert_eq!(ledger_used(&gw.admin_url(), "alpha").await, web + batch);
    let rows = usage_rows(&gw.admin_url()).await;
    assert_eq!(
        (spent_of(&rows, "alpha", "web"), spent_of(&rows, "alpha", "batch")),
        (web, batch)
    );
}

/// The app `next`'s token ends `secs` from now.
fn ending_in(secs: i64) -> permit_gateway::config::TokenConfig {
    let mut next = app_token(NEXT);
    next.not_after = Some(chrono::Utc::now() + chrono::Duration::seconds(secs));
    next
}

#[tokio::test]
async fn a_rotation_with_an_overlap_drops_no_request_and_the_old_token_is_refused_after_not_after() {
    let sim = start_sim(unlimited()).await;
    // The app `next` runs on its old token; its replacement `web` comes in
    // a reload, and the old one is given an end 4 s ahead.
    let before = Setup::new().team(ALPHA, |t| t.tokens = vec![app_token(NEXT)]);
    let file = FromFile::start(&before, &sim).await;
    let gw = &file.gw;
    let s = sim.samples();
    let query = Query::distinct(&s, 0).size(2);
    let old = Client::new(gw.base_url(), NEXT.1);
    assert_eq!(old.get(&query).await.status, StatusCode::OK);
    let not_after = chrono::Utc::now() + chrono::Duration::seconds(4);
    let after = Setup::new().team(ALPHA, |t| {
        let mut next = app_token(NEXT);
        next.not_after = Some(not_after);
        t.tokens = vec![next, app_token(WEB)];
    });
    file.rewrite(&after, &sim);
    assert_eq!(file.reload().await.status, StatusCode::OK);
    let new = Client::new(gw.base_url(), WEB.1);
    // Both tokens work until `not_after`; from then on the old one gets 401.
    let (old_ok, new_ok) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let refused = eventually(
        "the old token is refused after its not_after",
        Duration::from_secs(20),
        || async {
            let sent = chrono::Utc::now();
            let (o, n) = (old.get(&query).await, new.get(&query).await);
            assert_eq!(n.status, StatusCode::OK, "the new token always works: {}", n.text());
            new_ok.fetch_add(1, Ordering::Relaxed);
            match o.status {
                StatusCode::OK => {
                    assert!(
                        sent < not_after + chrono::Duration::milliseconds(500),
                        "served after its not_after"
                    );
                    old_ok.fetch_add(1, Ordering::Relaxed);
                    None
                }
                StatusCode::UNAUTHORIZED => {
                    assert!(
                        sent > not_after - chrono::Duration::milliseconds(500),
                        "refused before its not_after"
                    );
                    Some(o)
                }
                other => panic!("the old token got {other}: {}", o.text()),
            }
        },
    )
    .await;
    assert!(refused.text().contains("Token expired"), "{}", refused.text());
    let (old_ok, new_ok) = (old_ok.into_inner(), new_ok.into_inner());
    eprintln!("rotation: the old token answered {old_ok} times before its not_after, the new one {new_ok}");
    assert!(old_ok > 0, "the overlap served the old token");
    // The ending token was used within 7 days of its end: counted, per app.
    let m = crate::support::probe::scrape(&gw.admin_url()).await;
    let counted = m.get(
        "gateway_token_expiring_requests_total",
        &[("team", "alpha"), ("app", "next")],
    );
    assert!(counted.is_some_and(|n| n >= old_ok as f64), "{counted:?}");
    let teams = Client::admin(gw.admin_url()).get("/admin/teams").await.json();
    let tokens = teams["teams"][0]["tokens"].as_array().cloned().unwrap_or_default();
    let next = tokens
        .iter()
        .find(|t| t["name"] == "next")
        .expect("the old token is listed");
    assert!(next["not_after"].is_string() && next["last_used"].is_string(), "{next}");
}

/// Issue 59: a team's own token (`token_sha256`, the app `default`) takes
/// a `not_after` too, and a token past it is refused with a 401 that is
/// logged and counted under its team (and app, for a team that names its
/// apps): the rotation's stragglers are found, never by their token.
#[tokio::test]
async fn an_expired_team_token_gets_401_logged_and_counted_under_its_team_and_app() {
    let sim = start_sim(unlimited()).await;
    let ended = chrono::Utc::now() - chrono::Duration::seconds(60);
    let setup = Setup::new()
        .team(ALPHA, |t| {
            t.not_after = Some(ended);
            t.tokens = vec![app_token(WEB)];
        })
        .team(BETA, |t| t.not_after = Some(ended));
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let s = sim.samples();
    let calls = sim.stats().requests_total;
    for (who, id) in [(ALPHA, "alpha-ended-0"), (BETA, "beta-ended-0")] {
        let r = Client::new(gw.base_url(), who.1)
            .get(Query::distinct(&s, 0).size(1))
            .request_id(id)
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
        assert!(r.text().contains("Token expired"), "{}", r.text());
    }
    assert_eq!(sim.stats().requests_total, calls, "nothing bought for an ended token");
    // The team's other app still works.
    let web = Client::new(gw.base_url(), WEB.1).get(Query::usage()).await;
    assert_eq!(web.status, StatusCode::OK, "{}", web.text());
    // The access line names the team, and the app of a team that names
    // its apps (a team of one token has one: its line names none, as ever).
    let alpha = gw.access_line("alpha-ended-0").await;
    assert_eq!(
        (alpha["team"].as_str(), alpha["app"].as_str(), alpha["status"].as_u64()),
        (Some("alpha"), Some("default"), Some(401)),
        "{alpha}"
    );
    let beta = gw.access_line("beta-ended-0").await;
    assert_eq!(
        (beta["team"].as_str(), beta["status"].as_u64()),
        (Some("beta"), Some(401)),
        "{beta}"
    );
    assert!(beta.get("app").is_none(), "{beta}");
    for line in [&alpha, &beta] {
        let text = line.to_string();
        assert!(!text.contains(ALPHA.1) && !text.contains(BETA.1), "no token in {text}");
    }
    // Counted under the team, not `unauthenticated`.
    let m = crate::support::probe::scrape(&gw.admin_url()).await;
    for team in ["alpha", "beta"] {
        let counted = m.get("gateway_requests_total", &[("team", team), ("status", "401")]);
        assert_eq!(counted, Some(1.0), "{team}");
    }
    assert_eq!(
        m.get(
            "gateway_requests_total",
            &[("team", "unauthenticated"), ("status", "401")]
        ),
        None
    );
    // `/admin/teams` shows the team's token's end.
    let teams = Client::admin(gw.admin_url()).get("/admin/teams").await.json();
    let default = &teams["teams"][0]["tokens"][0];
    assert_eq!(default["name"], "default", "{teams}");
    assert!(default["not_after"].is_string(), "{default}");
}

/// The `used` of each of a team's apps in `/admin/teams`, by name.
async fn apps_used(admin: &str, team: &str) -> (u64, Vec<(String, u64)>) {
    let entry = crate::support::traffic::admin_team(admin, team).await;
    let apps = entry["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| {
            let name = t["name"].as_str().expect("name").to_string();
            (name, t["used"].as_u64().unwrap_or_else(|| panic!("used: {entry}")))
        })
        .collect();
    (entry["used"].as_u64().expect("used"), apps)
}

/// Issue 59: the apps' `used` in `/admin/teams` add up to the team's. The
/// spend a team made before it named its apps (on its `token_sha256`) is
/// the app `default`'s, as in usage.csv: added to that token's own, or an
/// entry `default` of its own once the team's token is gone.
#[tokio::test]
async fn per_app_used_adds_up_to_the_teams_with_the_spend_from_before_the_apps() {
    let sim = start_sim(unlimited()).await;
    let file = FromFile::start(&Setup::new(), &sim).await;
    let gw = &file.gw;
    let s = sim.samples();
    let buy = |token: &'static str, i: u32, size: u32| {
        let base = gw.base_url();
        let query = Query::distinct(&s, i).size(size);
        async move {
            let r = Client::new(base, token).get(query).await;
            assert_eq!((r.status, r.credits_request()), (StatusCode::OK, Some(u64::from(size))));
        }
    };
    buy(ALPHA.1, 0, 7).await;
    // Alpha names its apps, keeping its own token as `default`.
    let named = Setup::new().team(ALPHA, |t| t.tokens = vec![app_token(WEB), app_token(BATCH)]);
    file.rewrite(&named, &sim);
    assert_eq!(file.reload().await.status, StatusCode::OK);
    buy(WEB.1, 1, 4).await;
    buy(ALPHA.1, 2, 3).await;
    buy(BATCH.1, 3, 2).await;
    let (team, apps) = apps_used(&gw.admin_url(), "alpha").await;
    assert_eq!(team, 16);
    let want = [("default", 10), ("web", 4), ("batch", 2)].map(|(n, u)| (n.to_string(), u));
    assert_eq!(apps, want, "default: 7 before the apps, 3 after");
    // The team's token goes: its spend stays the app `default`'s.
    let without = Setup::new().team(ALPHA, |t| {
        t.token_sha256 = None;
        t.tokens = vec![app_token(WEB), app_token(BATCH)];
    });
    file.rewrite(&without, &sim);
    assert_eq!(file.reload().await.status, StatusCode::OK);
    let (team, apps) = apps_used(&gw.admin_url(), "alpha").await;
    let want = [("web", 4), ("batch", 2), ("default", 10)].map(|(n, u)| (n.to_string(), u));
    assert_eq!((team, apps), (16, want.to_vec()));
    let entry = crate::support::traffic::admin_team(&gw.admin_url(), "alpha").await;
    let default = &entry["tokens"][2];
    assert!(
        default["not_after"].is_null() && default["last_used"].is_null(),
        "{default}"
    );
    // usage.csv tells the same per app.
    let rows = usage_rows(&gw.admin_url()).await;
    assert_eq!(
        (spent_of(&rows, "alpha", "default"), spent_of(&rows, "alpha", "web")),
        (10, 4),
        "{rows:#?}"
    );
}

#[tokio::test]
async fn an_ending_token_still_used_is_logged_once_a_day() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().team(ALPHA, |t| t.tokens = vec![ending_in(3 * 86_400)]);
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let next = Client::new(gw.base_url(), NEXT.1);
    for _ in 0..3 {
        assert_eq!(next.get(Query::usage()).await.status, StatusCode::OK);
    }
    let logged = || {
        gw.log_text()
            .matches("a token that ends within 7 days is still used")
            .count()
    };
    eventually("the warning is logged", Duration::from_secs(10), || async {
        (logged() > 0).then_some(())
    })
    .await;
    assert_eq!(logged(), 1, "once a day, not once a request");
}

/// Three teams' misses at once against a company cap of 50.
async fn three_teams_against_the_company_cap(gws: &[permit_gateway::Running], sim: &Sim) {
    let tokens = [ALPHA, BETA, SMALL];
    // Team `t` asks through this replica, its searches from this index on.
    let replica = |t: usize| gws[t % gws.len()].base_url();
    let first = |t: usize| 200 * t as u32;
    let calls: Vec<_> = tokens
        .iter()
        .enumerate()
        .map(|(t, who)| spawn_misses(&replica(t), who.1, sim, first(t), 8, 5, &format!("{}-", who.0)))
        .collect();
    let mut refused = 0;
    // A miss that was answered (which ones are is the race's to decide):
    // its page is held, and asked again it is a hit.
    let mut answered = None;
    for (t, team) in calls.into_iter().enumerate() {
        for (i, s) in statuses(team).await.into_iter().enumerate() {
            assert!(matches!(s, StatusCode::OK | StatusCode::PAYMENT_REQUIRED), "{s}");
            refused += usize::from(s == StatusCode::PAYMENT_REQUIRED);
            if s == StatusCode::OK {
                answered = answered.or(Some((t, first(t) + i as u32)));
            }
        }
    }
    let charged: u64 = tokens.iter().map(|t| charged_to(sim, &format!("{}-", t.0))).sum();
    let mut ledgers = 0;
    for t in tokens {
        ledgers += ledger_used(&gws[0].admin_url(), t.0).await;
    }
    eprintln!("company cap 50: three teams charged {charged} in all, {refused} misses refused");
    assert_eq!(
        charged, 50,
        "the company's budget is spent to the credit, never past it"
    );
    assert_eq!(ledgers, charged, "the team ledgers = the upstream's bill");
    // Past the cap: a 402 naming the company; a hit and a free call still work.
    let s = sim.samples();
    let more = Client::new(gws[0].base_url(), BETA.1)
        .get(Query::distinct(&s, 999).size(1))
        .await;
    assert_eq!(more.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(more.json()["detail"]["budget"], "org", "{}", more.text());
    assert_eq!(more.json()["detail"]["error"], "Company credit limit exceeded.");
    // Asked of the replica that bought it, by the team that did.
    let (t, i) = answered.expect("some misses were answered");
    let hit = Client::new(replica(t), tokens[t].1)
        .get(Query::distinct(&s, i).size(5))
        .await;
    assert_eq!(
        (hit.status, hit.x_cache()),
        (StatusCode::OK, Some("HIT")),
        "a hit is unaffected"
    );
    let free = Client::new(gws[0].base_url(), BETA.1).get(Query::usage()).await;
    assert_eq!(free.status, StatusCode::OK);
    let org = Client::admin(gws[0].admin_url()).get("/admin/teams").await.json()["org"].clone();
    assert_eq!(
        (org["credit_limit"].as_u64(), org["used"].as_u64()),
        (Some(50), Some(50)),
        "{org}"
    );
}

fn capped(setup: Setup) -> Setup {
    setup
        .teams(&[ALPHA, BETA, SMALL])
        .with(|c| c.quota.org_credit_limit = Some(50))
}

#[tokio::test]
async fn the_company_cap_binds_the_sum_of_three_teams_under_concurrent_misses() {
    let sim = start_sim(unlimited()).await;
    let gw = capped(Setup::new()).start(&sim).await;
    three_teams_against_the_company_cap(&[gw], &sim).await;
}

#[tokio::test]
async fn the_company_cap_binds_two_replicas_on_the_redis_ledger() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let gws = replicas(2, &sim, Some(&redis), capped(Setup::new())).await;
    three_teams_against_the_company_cap(&gws, &sim).await;
}

#[tokio::test]
async fn a_clamped_team_clamps_an_app_to_the_apps_own_remaining_credits() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().team(ALPHA, |t| {
        t.credit_limit = Some(100);
        t.clamp_to_budget = true;
        let mut web = app_token(WEB);
        web.credit_limit = Some(12);
        t.tokens = vec![web];
    });
    let gw = setup.start(&sim).await;
    let s = sim.samples();
    let web = Client::new(gw.base_url(), WEB.1);
    let first = web.get(Query::distinct(&s, 0).size(5)).request_id("alpha-web-0").await;
    assert_eq!(first.status, StatusCode::OK);
    let clamped = web.get(Query::distinct(&s, 1).size(30)).request_id("alpha-web-1").await;
    assert_eq!(clamped.status, StatusCode::OK, "{}", clamped.text());
    assert_eq!(clamped.header("x-gateway-clamped"), Some("30"));
    assert_eq!(
        clamped.credits_request(),
        Some(7),
        "the app's 7 left, not the team's 95"
    );
    assert_eq!(charged_to(&sim, "alpha-web-"), 12);
}

/// The two budget headers of an answer.
fn budget_heads(r: &crate::support::http::Reply) -> (Option<u64>, Option<u64>) {
    (r.header_u64("x-credits-limit"), r.header_u64("x-credits-remaining"))
}

/// Issue 57: the budget headers tell the budget that binds the token — the
/// app's, the team's or the company's, whichever has least left — on a
/// 200 and on a 402 alike, and `/v2/usage`'s `is_over_limit` says what
/// every metered call would meet.
#[tokio::test]
async fn the_budget_headers_and_usage_tell_the_app_budget_that_binds() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().team(ALPHA, |t| {
        t.credit_limit = Some(100);
        let mut web = app_token(WEB);
        web.credit_limit = Some(5);
        t.tokens = vec![web, app_token(BATCH)];
    });
    let gw = setup.start(&sim).await;
    let s = sim.samples();
    let (web, batch) = (Client::new(gw.base_url(), WEB.1), Client::new(gw.base_url(), BATCH.1));
    let first = web.get(Query::distinct(&s, 0).size(4)).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert_eq!(budget_heads(&first), (Some(5), Some(1)), "the app's: 1 left of 5");
    let refused = web.get(Query::distinct(&s, 1).size(3)).await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED, "{}", refused.text());
    let detail = &refused.json()["detail"];
    assert_eq!(
        (detail["limit"].as_u64(), detail["remaining"].as_u64()),
        (Some(5), Some(1))
    );
    assert_eq!(
        budget_heads(&refused),
        (Some(5), Some(1)),
        "the headers say what the body says"
    );
    // The team's other app is bound by the team's budget: 96 left of 100.
    let other = batch.get(Query::distinct(&s, 2).size(1)).await;
    assert_eq!(budget_heads(&other), (Some(100), Some(95)));
    // The app spends its last credit; then every metered call is refused,
    // and its usage says so.
    let last = web.get(Query::distinct(&s, 3).size(1)).await;
    assert_eq!((last.status, budget_heads(&last)), (StatusCode::OK, (Some(5), Some(0))));
    let usage = web.get(Query::usage()).await.json();
    assert_eq!(usage["is_over_limit"], true, "{usage}");
    assert_eq!(usage["budget"], "app", "{usage}");
    assert_eq!(usage["app"]["is_over_limit"], true, "{usage}");
    let batch_usage = batch.get(Query::usage()).await.json();
    assert_eq!(batch_usage["is_over_limit"], false, "{batch_usage}");
    assert_eq!(batch_usage["budget"], "team", "{batch_usage}");
}

/// Issue 57: a 402 of the company's cap tells the company's budget in its
/// headers (it used to show the team's 94 left while its body said 0), and
/// every team's `/v2/usage` says it is over.
#[tokio::test]
async fn a_company_cap_402_tells_the_company_budget() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .credit_limit(BETA, 100)
        .with(|c| c.quota.org_credit_limit = Some(10))
        .start(&sim)
        .await;
    let s = sim.samples();
    let (alpha, beta) = (Client::new(gw.base_url(), ALPHA.1), Client::new(gw.base_url(), BETA.1));
    let spent = alpha.get(Query::distinct(&s, 0).size(10)).await;
    assert_eq!(spent.status, StatusCode::OK, "{}", spent.text());
    assert_eq!(budget_heads(&spent), (Some(10), Some(0)), "the company's binds alpha");
    let refused = beta.get(Query::distinct(&s, 1).size(5)).await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED, "{}", refused.text());
    assert_eq!(refused.json()["detail"]["budget"], "org", "{}", refused.text());
    assert_eq!(budget_heads(&refused), (Some(10), Some(0)));
    let usage = beta.get(Query::usage()).await.json();
    assert_eq!(
        (usage["is_over_limit"].as_bool(), usage["budget"].as_str()),
        (Some(true), Some("org")),
        "{usage}"
    );
    assert_eq!(usage["credits_used"], 0, "beta's own spend is still its own");
}
