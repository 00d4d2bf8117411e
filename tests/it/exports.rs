//! Issue 59: the exports keep their readers. `/admin/usage.csv` keeps the
//! first release's columns where they were (`team,date,route,
//! credits_spent,credits_saved`) with `app` after them, so a pipeline that
//! reads columns by position gets each team's spend; and no export (the
//! CSV, `/admin/teams`, `/v2/usage`, `/metrics`) lists the ledger's
//! internal accounts (the company's `*org`, an app's `team/app`) as teams.
//! Each test starts the real gateway and the simulator, with a company cap
//! and a team of apps, so that both kinds of internal account hold spend.

use crate::support::client::Client;
use crate::support::gateway::{app_token, replicas, Setup, ALPHA, BATCH, BETA, WEB};
use crate::support::probe::metrics_text;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::traffic::{charged_to, ledger_used};
use http::StatusCode;
use std::collections::{BTreeMap, BTreeSet};

/// The header of the first release's usage.csv, which readers were
/// written against.
const FIRST_RELEASE_HEADER: [&str; 5] = ["team", "date", "route", "credits_spent", "credits_saved"];

/// Alpha with apps web and batch (and its own token, app `default`), beta
/// of one token, a company cap: spend in every kind of account.
fn every_kind_of_account() -> Setup {
    Setup::new()
        .team(ALPHA, |t| t.tokens = vec![app_token(WEB), app_token(BATCH)])
        .with(|c| c.quota.org_credit_limit = Some(10_000))
}

/// Misses of every token of both teams; answers what the simulator billed
/// each team.
async fn spend_with_every_token(base_url: &str, sim: &Sim) -> BTreeMap<&'static str, u64> {
    let s = sim.samples();
    let callers = [(ALPHA, WEB), (ALPHA, BATCH), (ALPHA, ALPHA), (BETA, BETA), (ALPHA, WEB)];
    for (i, (team, token)) in callers.into_iter().enumerate() {
        let r = Client::new(base_url, token.1)
            .get(Query::distinct(&s, i as u32).size(3 + i as u32))
            .request_id(&format!("{}-{}-{i}", team.0, token.0))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    // A hit, so that saved credits are in the ledger too.
    let hit = Client::new(base_url, BETA.1).get(Query::distinct(&s, 0).size(3)).await;
    assert_eq!(hit.x_cache(), Some("HIT"));
    [ALPHA, BETA]
        .map(|team| (team.0, charged_to(sim, &format!("{}-", team.0))))
        .into()
}

/// usage.csv as a reader written for the first release reads it: the
/// header's first five cells, and each row's first five by position.
fn first_five_columns(csv: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = csv
        .lines()
        .map(|l| l.split(',').take(5).map(str::to_string).collect::<Vec<_>>());
    let header = lines.next().expect("a header line");
    (header, lines.collect())
}

#[tokio::test]
async fn an_old_usage_csv_reader_reading_by_position_gets_each_teams_spend() {
    let sim = start_sim(unlimited()).await;
    let gw = every_kind_of_account().start(&sim).await;
    let billed = spend_with_every_token(&gw.base_url(), &sim).await;
    let csv = Client::admin(gw.admin_url())
        .get("/admin/usage.csv")
        .expect_status(StatusCode::OK)
        .await
        .text();
    assert!(
        csv.starts_with("team,date,route,credits_spent,credits_saved,app\n"),
        "the first release's columns, then app: {csv}"
    );
    let (header, rows) = first_five_columns(&csv);
    assert_eq!(header, FIRST_RELEASE_HEADER);
    // Column 4 summed per team (column 1): what the team was billed, and
    // its ledger's `used`.
    let mut spent: BTreeMap<String, u64> = BTreeMap::new();
    for row in &rows {
        let credits = row[3]
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("column 4 is credits: {row:?}\n{csv}"));
        *spent.entry(row[0].clone()).or_default() += credits;
    }
    for (team, bill) in &billed {
        assert_eq!(spent.get(*team), Some(bill), "{team}: {csv}");
        assert_eq!(ledger_used(&gw.admin_url(), team).await, *bill, "{team}");
    }
    assert_eq!(spent.len(), 2, "two teams, nothing else: {csv}");
    // A team of one token has one row per day and route, as before apps:
    // an old reader keyed by (team, date, route) reads it whole.
    let beta: Vec<_> = rows.iter().filter(|r| r[0] == BETA.0).collect();
    let keys: BTreeSet<_> = beta.iter().map(|r| (&r[1], &r[2])).collect();
    assert_eq!(keys.len(), beta.len(), "{csv}");
    for row in &rows {
        assert!(
            row[1].len() == 10 && row[1].as_bytes()[4] == b'-',
            "column 2 is the date: {row:?}"
        );
        assert!(row[4].parse::<u64>().is_ok(), "column 5 is credits saved: {row:?}");
    }
}

/// Every place a team name is exported, from `gw`'s two ports: asserts no
/// internal account is among them.
async fn assert_only_teams_are_exported(base_url: &str, admin_url: &str) {
    let teams = BTreeSet::from([ALPHA.0, BETA.0]);
    let internal = |text: &str| text.contains("*org") || text.contains("alpha/") || text.contains("beta/");
    let admin = Client::admin(admin_url);
    let csv = admin.get("/admin/usage.csv").expect_status(StatusCode::OK).await.text();
    assert!(!internal(&csv), "usage.csv: {csv}");
    for line in csv.lines().skip(1) {
        let team = line.split(',').next().unwrap_or_default();
        assert!(teams.contains(team), "usage.csv lists {team:?} as a team: {csv}");
    }
    let listed = admin.get("/admin/teams").expect_status(StatusCode::OK).await.json();
    let names: BTreeSet<&str> = listed["teams"]
        .as_array()
        .expect("teams")
        .iter()
        .map(|t| t["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, teams, "/admin/teams: {listed}");
    for token in [ALPHA, BETA, WEB, BATCH] {
        let usage = Client::new(base_url, token.1).get(Query::usage()).await;
        assert_eq!(usage.status, StatusCode::OK);
        assert!(!internal(&usage.text()), "/v2/usage of {}: {}", token.0, usage.text());
    }
    let metrics = metrics_text(admin_url).await;
    let labelled: BTreeSet<&str> = metrics
        .split("team=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect();
    let known: BTreeSet<&str> = teams.iter().copied().chain(["unauthenticated"]).collect();
    assert!(labelled.is_subset(&known), "team labels of /metrics: {labelled:?}");
    assert!(!internal(&metrics), "/metrics names an internal account");
}

#[tokio::test]
async fn no_export_lists_an_internal_account_as_a_team_on_the_file_ledger() {
    let sim = start_sim(unlimited()).await;
    let gw = every_kind_of_account().start(&sim).await;
    spend_with_every_token(&gw.base_url(), &sim).await;
    let org = Client::admin(gw.admin_url()).get("/admin/teams").await.json()["org"]["used"].clone();
    assert!(
        org.as_u64().is_some_and(|u| u > 0),
        "the company's account holds spend: {org}"
    );
    assert_only_teams_are_exported(&gw.base_url(), &gw.admin_url()).await;
}

#[tokio::test]
async fn no_export_lists_an_internal_account_as_a_team_on_the_redis_ledger() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let gws = replicas(1, &sim, Some(&redis), every_kind_of_account()).await;
    spend_with_every_token(&gws[0].base_url(), &sim).await;
    assert_only_teams_are_exported(&gws[0].base_url(), &gws[0].admin_url()).await;
}
