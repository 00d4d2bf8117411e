//! An operator's first hour: the example config admits nobody, admin
//! actions say what they did (a reload names what waits for a restart,
//! every admin call writes an access line), `check-config --no-secrets`,
//! a 402 that says what was needed and what remains, and one ledger
//! whichever directory `serve` starts in.

use crate::support::client::Client;
use crate::support::gateway::{start_config, ChildGateway, Setup, ALPHA, SMALL};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, SimConfig};
use crate::support::traffic::ledger_used;
use http::StatusCode;
use permit_gateway::config::{Config, Source};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const DEMO_TOKENS: [&str; 2] = ["pgw_demo_growth", "pgw_demo_analytics"];

fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// `config/gateway.toml` as shipped, with only the upstream (its key and
/// address), the ports and the ledger's folder made local.
fn example_config(base_url: &str, key: &str, ledger: &Path) -> String {
    let text = std::fs::read_to_string(repo_file("config/gateway.toml")).expect("config/gateway.toml");
    let text: String = text
        .lines()
        .map(|line| match line.split('=').next().map(str::trim) {
            Some("api_key_file") => format!("api_key = {key:?}"),
            Some("base_url") => format!("base_url = {base_url:?}"),
            Some("listen") => "listen = \"127.0.0.1:0\"".into(),
            Some("admin_listen") => "admin_listen = \"127.0.0.1:0\"".into(),
            Some("path") => format!("path = {:?}", ledger.display().to_string()),
            _ => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    text
}

#[tokio::test]
async fn the_example_config_admits_neither_demo_token() {
    let sim = start_sim(unlimited()).await;
    let data = tempfile::tempdir().expect("tmp");
    let text = example_config(&sim.base_url(), sim.api_key(), &data.path().join("ledger"));
    let config = Config::load(Source::Text(&text)).expect("the example loads with a key");
    let placeholders: Vec<&String> = config.warnings().iter().filter(|w| w.contains("placeholder")).collect();
    assert_eq!(placeholders.len(), 2, "one warning per team: {:?}", config.warnings());
    let gw = start_config(config).await;
    for token in DEMO_TOKENS {
        let r = Client::new(gw.base_url(), token).get(Query::meta_release()).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{token}: {}", r.text());
    }
    // The gateway's own read of the data release (free) aside.
    let st = sim.stats();
    let release_reads = st.by_path.get("/v2/meta/release").copied().unwrap_or(0);
    assert_eq!(st.requests_total - release_reads, 0, "nothing reached the upstream");
    // The example as it shipped before: the demo's hashes outside the demo
    // are refused, naming each team.
    let growth = permit_gateway::auth::token_sha256_hex("pgw_demo_growth");
    let analytics = permit_gateway::auth::token_sha256_hex("pgw_demo_analytics");
    let old = text
        .replace(
            "0000000000000000000000000000000000000000000000000000000000000001",
            &growth,
        )
        .replace(
            "0000000000000000000000000000000000000000000000000000000000000002",
            &analytics,
        );
    let problems = Config::load(Source::Text(&old))
        .expect_err("demo tokens refused")
        .to_string();
    for (at, name, token) in [
        ("teams[0]", "growth", "pgw_demo_growth"),
        ("teams[1]", "analytics", "pgw_demo_analytics"),
    ] {
        assert!(
            problems.contains(&format!("{at}.token_sha256: team {name:?}")) && problems.contains(token),
            "{problems}"
        );
    }
}

#[tokio::test]
async fn a_reload_names_the_settings_that_wait_for_a_restart_and_every_admin_call_is_logged() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new();
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let admin = Client::admin(gw.admin_url());
    let reload = admin.post("/admin/reload").await;
    assert_eq!(reload.status, StatusCode::OK, "{}", reload.text());
    assert_eq!(
        reload.json(),
        json!({"reloaded": true, "teams": 2, "applied": [], "restart_required": []})
    );
    // A setting a reload cannot apply, one it applies, and a team change.
    // (The same setup, so the ledger's folder stays the same.)
    let changed = setup
        .with(|c| {
            c.upstream.requests_per_minute = 77;
            c.server.max_connections += 1;
        })
        .teams(&[ALPHA]);
    gw.rewrite(&changed, &sim.base_url(), sim.api_key());
    let reload = admin.post("/admin/reload").await;
    assert_eq!(reload.status, StatusCode::OK, "{}", reload.text());
    assert_eq!(
        reload.json(),
        json!({
            "reloaded": true,
            "teams": 1,
            "applied": ["upstream.requests_per_minute"],
            "restart_required": ["server.max_connections"]
        })
    );
    let refused = Client::bearer(gw.admin_url(), "not-the-admin-token")
        .post("/admin/reload")
        .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    let teams = admin.get("/admin/teams").await;
    assert_eq!(teams.status, StatusCode::OK);
    // The log names the key; the access log has each admin call.
    let logged = crate::support::wait::eventually("the admin lines are logged", Duration::from_secs(10), || async {
        let access = gw.access_lines();
        let admin: Vec<_> = access.iter().filter(|l| l["message"] == "admin").cloned().collect();
        (admin.len() >= 4).then_some(admin)
    })
    .await;
    let line = |path: &str, status: u16| {
        logged
            .iter()
            .filter(|l| l["path"] == path && l["status"] == status)
            .cloned()
            .collect::<Vec<_>>()
    };
    let reloads = line("/admin/reload", 200);
    assert_eq!(reloads.len(), 2, "{logged:?}");
    assert!(reloads.iter().all(|l| l["who"] == "admin" && l["method"] == "POST"));
    assert!(reloads.iter().all(|l| l["duration_ms"].is_number()));
    let refused = line("/admin/reload", 401);
    assert_eq!(refused.len(), 1, "{logged:?}");
    assert_eq!(refused[0]["who"], "unauthenticated");
    assert_eq!(line("/admin/teams", 200).len(), 1, "{logged:?}");
    let logs = gw.log_text();
    assert!(
        logs.lines()
            .any(|l| l.contains("restart_required") && l.contains("server.max_connections")),
        "the reload's log line names the key: {logs}"
    );
    assert!(!logs.contains("not-the-admin-token"), "a refused token was logged");
    // ChildGateway's drop checks every line for the harness's secrets.
}

fn check_config(args: &[&str], path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_permit-gateway"))
        .arg("check-config")
        .args(args)
        .arg("--config")
        .arg(path)
        .env_remove("PERMIT_GATEWAY_UPSTREAM__API_KEY")
        .output()
        .expect("check-config runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn check_config_no_secrets_passes_a_valid_file_without_the_key() {
    let sim = start_sim(unlimited()).await;
    let dir = tempfile::tempdir().expect("tmp");
    let with_key = Setup::new().toml(&sim.base_url(), sim.api_key());
    let without_key: String = with_key
        .lines()
        .filter(|l| !l.starts_with("api_key ="))
        .map(|l| format!("{l}\n"))
        .collect();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, &without_key).expect("write");
    let strict = check_config(&[], &path);
    assert!(!strict.status.success(), "no key: refused without --no-secrets");
    assert!(stderr(&strict).contains("upstream.api_key"), "{}", stderr(&strict));
    let relaxed = check_config(&["--no-secrets"], &path);
    assert!(relaxed.status.success(), "{}", stderr(&relaxed));
    assert!(
        stderr(&relaxed).contains("configuration is valid"),
        "{}",
        stderr(&relaxed)
    );
    // Other problems still fail it, each with its key.
    std::fs::write(
        &path,
        format!("{without_key}\n[[teams]]\nname = \"x\"\ntoken_sha256 = \"abc\"\n"),
    )
    .expect("write");
    let bad = check_config(&["--no-secrets"], &path);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("teams[2].token_sha256"), "{}", stderr(&bad));
    // A key written in the file is accepted, with a warning (never echoed).
    std::fs::write(&path, &with_key).expect("write");
    let warned = check_config(&[], &path);
    assert!(warned.status.success(), "{}", stderr(&warned));
    assert!(
        stderr(&warned).contains("warning: upstream.api_key"),
        "{}",
        stderr(&warned)
    );
    let all = format!("{}{}", String::from_utf8_lossy(&warned.stdout), stderr(&warned));
    assert!(!all.contains(sim.api_key()), "the key was printed");
    // The example as shipped: valid without its key file, teams flagged.
    let example = check_config(&["--no-secrets"], &repo_file("config/gateway.toml"));
    assert!(example.status.success(), "{}", stderr(&example));
    assert!(stderr(&example).contains("placeholder"), "{}", stderr(&example));
}

#[tokio::test]
async fn a_402_says_what_the_call_needed_and_what_remains() {
    let sim = start_sim(SimConfig {
        credit_limit: Some(1_000_000),
        ..unlimited()
    })
    .await;
    let gw = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 30).start(&sim).await;
    let small = Client::new(gw.base_url(), SMALL.1);
    let s = sim.samples();
    let spent = small.get(Query::state_permits(&s).size(4)).await;
    assert_eq!(spent.status, StatusCode::OK, "{}", spent.text());
    let paid = spent.credits_request().expect("a bill");
    let refused = small.get(Query::state_permits(&s).size(40)).await;
    assert_eq!(refused.status, StatusCode::PAYMENT_REQUIRED, "{}", refused.text());
    let detail = &refused.json()["detail"];
    assert_eq!(detail["needed"], 40);
    assert_eq!(detail["remaining"], 30 - paid);
    assert_eq!(detail["limit"], 30);
    assert!(
        detail["error"].is_string() && detail["upgrade_url"].is_string(),
        "{detail}"
    );
}

/// Stops a child gateway with SIGTERM and waits for it.
fn stop(mut gw: ChildGateway) {
    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn serve_from_another_directory_uses_the_ledger_next_to_the_config() {
    let sim = start_sim(SimConfig {
        credit_limit: Some(1_000_000),
        ..unlimited()
    })
    .await;
    // The harness's absolute ledger path replaced by a relative one.
    let setup = Setup::new()
        .teams(&[ALPHA])
        .credit_limit(ALPHA, 1000)
        .with(|c| c.quota.path = "data/ledger".into());
    let text = ChildGateway::file_text(&setup, &sim.base_url(), sim.api_key());
    let home = tempfile::tempdir().expect("tmp");
    let config = home.path().join("gateway.toml");
    std::fs::write(&config, text).expect("write config");
    let elsewhere = tempfile::tempdir().expect("tmp");
    // First from the config's own folder: spend some credits.
    let gw = ChildGateway::spawn_file(&config, Some(home.path()));
    let ledger = home.path().join("data/ledger");
    assert!(
        gw.log_text()
            .lines()
            .any(|l| l.contains("credit ledger: file store") && l.contains(&ledger.display().to_string())),
        "the start-up line names the ledger's absolute path: {}",
        gw.log_text()
    );
    let s = sim.samples();
    let r = Client::new(gw.base_url(), ALPHA.1)
        .get(Query::state_permits(&s).size(5))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let spent = ledger_used(&gw.admin_url(), ALPHA.0).await;
    assert!(spent > 0, "credits were spent");
    stop(gw);
    // Then from another directory, the same file: the same ledger.
    let gw = ChildGateway::spawn_file(&config, Some(elsewhere.path()));
    assert_eq!(
        ledger_used(&gw.admin_url(), ALPHA.0).await,
        spent,
        "a fresh ledger was started"
    );
    assert!(
        !elsewhere.path().join("data").exists(),
        "a ledger was made in the working directory"
    );
    stop(gw);
}

#[tokio::test]
async fn a_reload_of_an_empty_or_team_less_file_is_refused_and_the_teams_keep_working() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new();
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let admin = Client::admin(gw.admin_url());
    let full = std::fs::read_to_string(gw.config_path()).expect("read config");
    let mut table: toml::Table = toml::from_str(&full).expect("the config is TOML");
    assert!(table.remove("teams").is_some(), "the file had teams");
    let without_teams = toml::to_string(&table).expect("TOML");
    for (what, text) in [
        ("an empty file", String::new()),
        ("a file cut before its teams", without_teams),
    ] {
        std::fs::write(gw.config_path(), &text).expect("write");
        let reload = admin.post("/admin/reload").await;
        assert_eq!(
            reload.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{what}: {}",
            reload.text()
        );
        // The cut file still has its upstream key: refused for its teams
        // alone, saying how to mean it.
        if !text.is_empty() {
            assert!(reload.text().contains("teams = []"), "{what}: {}", reload.text());
        }
        gw.signal("HUP");
        assert_eq!(
            alpha.get(Query::meta_release()).await.status,
            StatusCode::OK,
            "{what}: alpha still in"
        );
    }
    // Written on purpose: every team goes.
    table.insert("teams".into(), toml::Value::Array(Vec::new()));
    std::fs::write(gw.config_path(), toml::to_string(&table).expect("TOML")).expect("write");
    let reload = admin.post("/admin/reload").await;
    assert_eq!(reload.status, StatusCode::OK, "{}", reload.text());
    assert_eq!(reload.json()["teams"], 0);
    assert_eq!(alpha.get(Query::meta_release()).await.status, StatusCode::UNAUTHORIZED);
    crate::support::wait::eventually("the SIGHUPs' refusals are logged", Duration::from_secs(10), || async {
        gw.log_text().contains("SIGHUP: reload refused").then_some(())
    })
    .await;
}

#[tokio::test]
async fn check_config_warns_when_no_team_is_configured_and_says_where_the_config_came_from() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, "").expect("write");
    let out = check_config(&["--no-secrets"], &path);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("warning: teams: no team is configured"), "{err}");
    assert!(err.contains(&format!("config: --config {}", path.display())), "{err}");
}

#[tokio::test]
async fn a_reload_applies_a_route_ttl_and_the_upstream_rate_without_a_restart() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().route_ttl("meta_release", 300);
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    // A one-second TTL, and a rate of one call a minute (burst one).
    let changed = setup
        .route_ttl("meta_release", 1)
        .with(|c| c.upstream.requests_per_minute = 1);
    gw.rewrite(&changed, &sim.base_url(), sim.api_key());
    let reload = Client::admin(gw.admin_url()).post("/admin/reload").await;
    assert_eq!(reload.status, StatusCode::OK, "{}", reload.text());
    assert_eq!(reload.json()["restart_required"], json!([]), "{}", reload.text());
    let release = Query::meta_release();
    assert_eq!(alpha.get(&release).await.x_cache(), Some("MISS"));
    // Stored for a second, not five minutes: it goes stale.
    crate::support::wait::eventually(
        "the answer expires after its new TTL",
        Duration::from_secs(10),
        || async {
            let r = alpha.get(&release).await;
            (r.x_cache() != Some("HIT")).then_some(())
        },
    )
    .await;
    // The rate: that call and the refresh took the minute's one call; the
    // next distinct call would wait a minute, past the queue's bound.
    let search = Query::permit_search(sim.samples().state.clone())
        .param("permit_from", &sim.samples().permit_from)
        .param("permit_to", &sim.samples().permit_to);
    let r = alpha.get(&search).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
}
