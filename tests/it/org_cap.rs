//! Issue 59: the company cap (`quota.org_credit_limit`), seen and whole.
//! The company's account (`*org`) starts from the teams' spend already in
//! the window when a release that keeps it first meets a ledger written
//! before it (the teams' own accounts hold that spend), on the file ledger
//! and on Redis, once however many replicas start; and the cap is seen:
//! gauges of the company's spend and limit, 402s counted by the budget that
//! refused, the access line's `budget`. Each test spends through the real
//! gateway and the simulator, and compares with what reached the upstream.

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, Team, ALPHA, BETA};
use crate::support::http::Reply;
use crate::support::probe::scrape;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::traffic::charged_to;
use http::StatusCode;
use std::path::Path;

/// The cap, and its spend before the upgrade: alpha 30, beta 29.
const CAP: u64 = 150;
const BEFORE: [(Team, u32); 2] = [(ALPHA, 30), (BETA, 29)];

/// One distinct search of `size` records by `who`, its request id
/// `<team>-<tag>` (what the simulator charges it under).
async fn search(base: &str, sim: &Sim, who: Team, i: u32, size: u32, tag: &str) -> Reply {
    Client::new(base, who.1)
        .get(Query::distinct(&sim.samples(), i).size(size))
        .request_id(&format!("{}-{tag}", who.0))
        .await
}

/// The spend of [`BEFORE`], bought.
async fn spend_before(base: &str, sim: &Sim) {
    for (i, (who, size)) in BEFORE.into_iter().enumerate() {
        let r = search(base, sim, who, i as u32, size, "before").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    assert_eq!(charged_to(sim, ""), 59);
}

/// `ledger.redb` as 0.1.0 leaves it: the teams' spend alone, in `spend`
/// (ledger format 1). The tables later releases added (the company's and
/// the apps' accounts, the format record) are dropped.
#[expect(clippy::disallowed_methods, reason = "the test writes the file as 0.1.0 left it")]
fn as_0_1_0_left_it(file: &Path) {
    let db = redb::Database::open(file).expect("opens");
    let txn = db.begin_write().expect("writes");
    let spend: redb::TableDefinition<(&str, u32, &str), (u64, u64)> = redb::TableDefinition::new("account_spend");
    let held: redb::TableDefinition<u64, (&str, u64, u32)> = redb::TableDefinition::new("account_held");
    let meta: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("meta");
    assert!(
        txn.delete_table(spend).expect("drop"),
        "this release kept the company's account"
    );
    txn.delete_table(held).expect("drop");
    assert!(txn.delete_table(meta).expect("drop"), "and its format");
    txn.commit().expect("commits");
}

/// The company's account as `/admin/teams` and the gauges show it:
/// (used, limit) of each.
async fn company(admin: &str) -> [(Option<u64>, Option<u64>); 2] {
    let org = Client::admin(admin).get("/admin/teams").await.json()["org"].clone();
    let m = scrape(admin).await;
    let gauge = |name: &str| m.get(name, &[]).map(|v| v as u64);
    [
        (org["used"].as_u64(), org["credit_limit"].as_u64()),
        (gauge("gateway_org_credits_used"), gauge("gateway_org_credit_limit")),
    ]
}

/// After the upgrade, with the cap: alpha buys 80 through `alpha_at`
/// (59 + 80 = 139), then beta's 20 through `beta_at` would pass 150: the
/// company refuses it. Answers beta's 402.
async fn the_cap_binds_the_whole_window(alpha_at: &str, beta_at: &str, sim: &Sim) -> Reply {
    let r = search(alpha_at, sim, ALPHA, 10, 80, "after").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let refused = search(beta_at, sim, BETA, 11, 20, "over").await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED, "{}", refused.text());
    let detail = &refused.json()["detail"];
    assert_eq!(
        (detail["budget"].as_str(), detail["remaining"].as_u64()),
        (Some("org"), Some(11)),
        "the company's 11 left of 150: {detail}"
    );
    assert_eq!(
        charged_to(sim, ""),
        139,
        "the upstream billed the window's 139, no more"
    );
    refused
}

/// The refusal counted by budget, beside the contract's count by team.
async fn assert_counted_by_budget(admin: &str) {
    let m = scrape(admin).await;
    let refusals = |budget: &str| m.get("gateway_budget_refusals_total", &[("team", "beta"), ("budget", budget)]);
    assert_eq!(
        (refusals("org"), refusals("team"), refusals("app")),
        (Some(1.0), Some(0.0), Some(0.0)),
        "one 402, by the company's budget"
    );
    assert_eq!(
        m.get("gateway_quota_rejections_total", &[("team", "beta")]),
        Some(1.0),
        "the contract's count is unchanged"
    );
    assert_eq!(m.get("gateway_org_credits_used", &[]), Some(139.0));
}

#[tokio::test]
async fn the_company_account_counts_the_spend_before_the_upgrade_on_the_file_ledger() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new();
    let gw = setup.start(&sim).await;
    spend_before(&gw.base_url(), &sim).await;
    gw.shutdown().await.expect("graceful stop");
    as_0_1_0_left_it(&setup.data_dir().join("ledger").join("ledger.redb"));

    // The upgrade, with a cap configured for the first time.
    let setup = setup.with(|c| c.quota.org_credit_limit = Some(CAP));
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    assert_eq!(
        company(&gw.admin_url()).await,
        [(Some(59), Some(CAP)); 2],
        "the 59 spent before the upgrade are in the company's account, in /admin/teams and the gauges"
    );
    the_cap_binds_the_whole_window(&gw.base_url(), &gw.base_url(), &sim).await;
    assert_counted_by_budget(&gw.admin_url()).await;
    let line = gw.access_line("beta-over").await;
    assert_eq!(
        (line["status"].as_u64(), line["budget"].as_str()),
        (Some(402), Some("org")),
        "{line}"
    );
    let bought = gw.access_line("alpha-after").await;
    assert!(bought.get("budget").is_none(), "only a 402 names a budget: {bought}");
}

#[tokio::test]
async fn two_replicas_seed_the_company_account_on_redis_once() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().ledger_redis(&redis.url());
    let gw = setup.start(&sim).await;
    spend_before(&gw.base_url(), &sim).await;
    gw.shutdown().await.expect("graceful stop");
    // What 0.1.0 leaves in Redis: the teams' keys, none of the company's.
    assert!(redis.delete_matching("pgw:l:{[*]org}:*").await > 0);

    let setup = setup.with(|c| c.quota.org_credit_limit = Some(CAP));
    let gws = [setup.start(&sim).await, setup.start(&sim).await];
    // Both replicas read the company's account at once: each seeds it
    // before its first read, and one seed lands.
    let admins = [gws[0].admin_url(), gws[1].admin_url()];
    let (a, b) = tokio::join!(company(&admins[0]), company(&admins[1]));
    assert_eq!([a, b], [[(Some(59), Some(CAP)); 2]; 2], "59, not 118");
    let refused = the_cap_binds_the_whole_window(&gws[0].base_url(), &gws[1].base_url(), &sim).await;
    assert_eq!(refused.json()["detail"]["budget"], "org");
    assert_counted_by_budget(&gws[1].admin_url()).await;
    // A restart finds the account seeded: nothing added.
    let again = setup.start(&sim).await;
    assert_eq!(company(&again.admin_url()).await, [(Some(139), Some(CAP)); 2]);
}
