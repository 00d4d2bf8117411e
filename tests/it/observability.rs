//! Metrics, dashboards and alert rules (issue 6): the contract metrics move
//! on every path, promtool accepts the exposition and the rules, and a real
//! Prometheus scraping a real gateway answers every panel and rule query.

use crate::support::client::Client;
use crate::support::gateway::{Setup, Team, ALPHA, BETA};
use crate::support::probe::{metrics_text, scrape};
use crate::support::prometheus::{
    dashboards_dir, gateway_names, has_data, panel_queries, promtool, substitute, Prometheus,
};
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, FaultKind, Faults, Sim, SimConfig};
use crate::support::wait::eventually;
use http::StatusCode;
use permit_gateway::Running;
use std::collections::BTreeSet;
use std::time::Duration;

/// A team with a small budget (402s) and one with one request a minute (429s).
const GAMMA: Team = ("gamma", "tok-gamma-3c2b1a0f9e8d7c6b");
const DELTA: Team = ("delta", "tok-delta-8d7c6b5a4f3e2d1c");
const DASHBOARDS: [&str; 3] = ["credit-spend.json", "cache-efficiency.json", "upstream-health.json"];

fn sim_config() -> SimConfig {
    SimConfig {
        requests_per_minute: 0,
        credit_limit: Some(1_000_000),
        ..SimConfig::default()
    }
}

/// Four teams, a shared Redis cache, one retry, a short bound on the
/// upstream queue so an upstream 429 turns into a fast refusal, and a
/// company cap.
async fn start_gateway(sim: &Sim, redis: &RedisServer) -> Running {
    Setup::new()
        .teams(&[ALPHA, BETA, GAMMA, DELTA])
        .credit_limit(ALPHA, 100000)
        .credit_limit(GAMMA, 20)
        .team(DELTA, |t| t.requests_per_minute = Some(1))
        .cache_redis(&redis.url())
        .with(|c| {
            c.cache.redis_timeout_ms = 200;
            c.upstream.max_retries = 1;
            c.upstream.max_queue_wait_secs = 1;
            // A company cap far above the traffic: its gauges (and the
            // alert on them) have series.
            c.quota.org_credit_limit = Some(1_000_000);
        })
        .start(sim)
        .await
}

/// A search of `size` records; `q` tells queries of the same size apart
/// (unknown parameters stay in the key).
fn search(sim: &Sim, size: u32, tag: &str) -> Query {
    Query::state_permits(&sim.samples()).size(size).param("q", tag)
}

/// Every path a request can take, once: miss, hit, 402, team 429, 401,
/// coalesced, upstream 5xx with and without a stale copy, Redis down, and an
/// upstream 429 that makes the fair queue refuse. Kills `redis` on the way.
async fn traffic(gw: &Running, sim: &Sim, redis: &mut RedisServer) {
    let team = |token: &str| Client::new(gw.base_url(), token);
    let (alpha, beta, gamma, delta) = (team(ALPHA.1), team(BETA.1), team(GAMMA.1), team(DELTA.1));
    let a = search(sim, 5, "a");
    let r = alpha.get(&a).await;
    assert_eq!((r.status, r.x_cache()), (StatusCode::OK, Some("MISS")));
    let r = beta.get(&a).await;
    assert_eq!(r.x_cache(), Some("HIT"));
    assert_eq!(gamma.get(search(sim, 3, "b")).await.status, StatusCode::OK);
    let r = gamma.get(search(sim, 50, "c")).await;
    assert_eq!(
        r.status,
        StatusCode::PAYMENT_REQUIRED,
        "50 credits do not fit a budget of 20"
    );
    assert_eq!(delta.get(&a).await.status, StatusCode::OK);
    assert_eq!(delta.get(&a).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(team("tok-nobody").get(&a).await.status, StatusCode::UNAUTHORIZED);

    // Four identical requests while the upstream is slow: one fetch.
    sim.set_faults(Faults {
        kind: FaultKind::Latency,
        latency_ms: Some(300),
        ..Faults::default()
    });
    let d = search(sim, 2, "d");
    let tasks: Vec<_> = (0..4).map(|_| alpha.get(&d).spawn()).collect();
    for t in tasks {
        assert_eq!(t.await.expect("request task").status, StatusCode::OK);
    }
    sim.clear_faults();

    // Upstream 503s (retried once): the cached query falls back to its stale copy, an
    // uncached one fails.
    sim.set_faults(Faults {
        kind: FaultKind::Status,
        status: Some(503),
        ..Faults::default()
    });
    let r = alpha.get(&a).cache_control("no-cache").await;
    assert_eq!((r.status, r.x_cache()), (StatusCode::OK, Some("STALE")));
    assert!(alpha.get(search(sim, 4, "e")).await.status.is_server_error());
    sim.clear_faults();

    // Redis gone: the cache fails open and counts the errors.
    redis.kill();
    assert_eq!(alpha.get(search(sim, 1, "h")).await.status, StatusCode::OK);

    // The upstream's own 429 pauses the scheduler past its wait bound.
    sim.set_faults(Faults {
        kind: FaultKind::Status,
        status: Some(429),
        retry_after_secs: Some(2),
        count: Some(1),
        ..Faults::default()
    });
    let r = alpha.get(search(sim, 1, "f")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "upstream 429: {}", r.text());
    let r = alpha.get(search(sim, 1, "g")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "queue refusal: {}", r.text());
    sim.clear_faults();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_contract_metric_moves_on_its_path() {
    let sim = start_sim(sim_config()).await;
    let mut redis = RedisServer::start();
    let gw = start_gateway(&sim, &redis).await;
    let before = scrape(&gw.admin_url()).await;
    assert_eq!(before.sum("gateway_requests_total", &[]), 0.0);
    assert_eq!(
        before.get(
            "gateway_build_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", permit_gateway::COMMIT)
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        before.get("gateway_team_credit_limit", &[("team", "gamma")]),
        Some(20.0)
    );
    assert_eq!(
        before.get("gateway_team_credit_limit", &[("team", "beta")]),
        None,
        "unlimited"
    );

    traffic(&gw, &sim, &mut redis).await;
    let m = scrape(&gw.admin_url()).await;
    let v = |name: &str, labels: &[(&str, &str)]| m.sum(name, labels);
    let ps = ("route", "permits_search");

    // Requests, by team and cache state; failures before auth are "unauthenticated".
    let req = "gateway_requests_total";
    assert_eq!(
        v(req, &[("team", "alpha"), ps, ("cache", "miss"), ("status", "200")]),
        3.0
    );
    assert_eq!(
        v(req, &[("team", "alpha"), ps, ("cache", "hit")]),
        3.0,
        "coalesced followers"
    );
    assert_eq!(v(req, &[("team", "alpha"), ("cache", "stale"), ("status", "200")]), 1.0);
    assert_eq!(v(req, &[("team", "beta"), ("cache", "hit")]), 1.0);
    assert_eq!(v(req, &[("team", "gamma"), ("status", "402")]), 1.0);
    assert_eq!(v(req, &[("team", "delta"), ("status", "429")]), 1.0);
    assert_eq!(v(req, &[("team", "alpha"), ("status", "429")]), 2.0);
    assert_eq!(v(req, &[("team", "unauthenticated"), ("status", "401")]), 1.0);
    assert_eq!(v(req, &[]), 16.0);
    // The latency histogram counts exactly the requests, per route and cache state.
    for s in m.matching("gateway_request_duration_seconds_count", &[]) {
        let (route, cache) = (&s.labels["route"], &s.labels["cache"]);
        let requests = v(req, &[("route", route), ("cache", cache)]);
        assert_eq!(s.value, requests, "duration count for {route}/{cache}");
    }

    // Upstream attempts: every one the simulator saw, by status.
    let up = "gateway_upstream_requests_total";
    assert_eq!(v(up, &[]), sim.stats().requests_total as f64);
    assert_eq!(v(up, &[ps, ("status", "503")]), 4.0, "two calls, one retry each");
    assert_eq!(v(up, &[ps, ("status", "429")]), 1.0);
    assert_eq!(v(up, &[ps, ("status", "200")]), 4.0);
    assert_eq!(v("gateway_upstream_retries_total", &[ps]), 2.0);
    assert_eq!(
        v("gateway_upstream_request_duration_seconds_count", &[ps]),
        7.0,
        "one per fetch"
    );
    assert!(
        v("gateway_upstream_request_duration_seconds_sum", &[ps]) >= 0.3,
        "the slow fetch"
    );

    // Credits: spent by the fetching team, saved by hits, followers and stale.
    assert_eq!(
        v("gateway_credits_spent_total", &[("team", "alpha"), ps]),
        8.0,
        "5 + 2 + 1"
    );
    assert_eq!(v("gateway_credits_spent_total", &[("team", "gamma"), ps]), 3.0);
    assert_eq!(v("gateway_credits_spent_total", &[("team", "beta")]), 0.0);
    assert_eq!(v("gateway_credits_saved_total", &[("team", "beta"), ps]), 5.0);
    assert_eq!(
        v("gateway_credits_saved_total", &[("team", "alpha"), ps]),
        3.0 * 2.0 + 5.0
    );
    assert_eq!(v("gateway_credits_saved_total", &[("team", "delta"), ps]), 5.0);
    assert_eq!(v("gateway_team_credits_used", &[("team", "alpha")]), 8.0);
    assert_eq!(v("gateway_team_credits_used", &[("team", "gamma")]), 3.0);
    assert_eq!(v("gateway_team_credit_limit", &[("team", "alpha")]), 100_000.0);
    let org_limit = v("gateway_upstream_credit_limit", &[]);
    assert_eq!(org_limit, 1_000_000.0);
    let org_left = v("gateway_upstream_credits_remaining", &[]);
    assert!(
        org_left > 0.0 && org_left <= org_limit - 11.0,
        "org remaining {org_left}"
    );

    // Refusals.
    assert_eq!(v("gateway_quota_rejections_total", &[("team", "gamma")]), 1.0);
    assert_eq!(v("gateway_quota_rejections_total", &[]), 1.0);
    let limited = "gateway_rate_limited_total";
    assert_eq!(v(limited, &[("team", "delta"), ("scope", "team")]), 1.0);
    // The upstream's own 429 passed on, then the paused queue's refusal.
    assert_eq!(v(limited, &[("team", "alpha"), ("scope", "upstream")]), 2.0);

    // Cache: coalescing, tiers, Redis errors.
    assert_eq!(v("gateway_coalesced_requests_total", &[ps]), 3.0);
    assert_eq!(
        v("gateway_cache_hits_total", &[ps, ("tier", "memory")]),
        2.0,
        "beta and delta"
    );
    assert!(v("gateway_cache_entries", &[("tier", "memory")]) >= 4.0);
    assert!(v("gateway_cache_size_bytes", &[("tier", "memory")]) > 100.0);
    let redis_errors = v("gateway_backend_errors_total", &[("backend", "redis")]);
    assert!(redis_errors >= 1.0, "Redis was killed: {redis_errors}");
    assert_eq!(v("gateway_backend_errors_total", &[("backend", "ledger")]), 0.0);

    // The fair queue: drained, and every granted call waited (perhaps 0 s).
    assert_eq!(m.get("gateway_upstream_queue_depth", &[]), Some(0.0));
    assert_eq!(v("gateway_upstream_queue_wait_seconds_count", &[]), 7.0);

    // Process metrics (memory, fds, CPU).
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_cpu_seconds_total",
    ] {
        assert!(m.get(name, &[]).is_some(), "{name} missing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_the_metrics_and_the_rules() {
    let sim = start_sim(sim_config()).await;
    let mut redis = RedisServer::start();
    let gw = start_gateway(&sim, &redis).await;
    traffic(&gw, &sim, &mut redis).await;
    let text = metrics_text(&gw.admin_url()).await;
    let (ok, out) = promtool(&["check", "metrics"], Some(text.as_bytes()));
    assert!(ok && out.trim().is_empty(), "promtool check metrics:\n{out}");

    let rules = dashboards_dir().join("alerts.yml");
    let (ok, out) = promtool(&["check", "rules", &rules.display().to_string()], None);
    assert!(ok, "promtool check rules:\n{out}");
    // Every alert links its runbook section and says what and why.
    let text = std::fs::read_to_string(&rules).expect("alerts.yml");
    let runbook = std::fs::read_to_string(dashboards_dir().join("../docs/alerts.md")).expect("docs/alerts.md");
    for alert in text.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")) {
        let anchor = alert.to_lowercase();
        assert!(
            text.contains(&format!("runbook_url: \"docs/alerts.md#{anchor}\"")),
            "{alert}: runbook_url"
        );
        assert!(runbook.contains(&format!("## {alert}")), "{alert}: no runbook section");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_answers_every_panel_and_rule_query() {
    let sim = start_sim(sim_config()).await;
    let mut redis = RedisServer::start();
    let gw = start_gateway(&sim, &redis).await;
    let rules = dashboards_dir().join("alerts.yml");
    let prom = Prometheus::start(&gw.admin_addr.to_string(), &rules).await;
    prom.wait_for("gateway target up", Duration::from_secs(15), || async {
        prom.query("up{job=\"permit-gateway\"} == 1")
            .await
            .is_ok_and(|r| has_data(&r))
    })
    .await;

    traffic(&gw, &sim, &mut redis).await;
    // Traffic goes on while Prometheus scrapes: hits, and misses that cost.
    let background = {
        let (alpha, beta) = (Client::new(gw.base_url(), ALPHA.1), Client::new(gw.base_url(), BETA.1));
        let s = sim.samples();
        tokio::spawn(async move {
            for n in 0u64.. {
                let miss = Query::state_permits(&s).size(1).param("q", format!("bg{n}"));
                alpha.get(&miss).await;
                beta.get(&miss).await;
                // Pacing, not synchronisation: a steady trickle between scrapes.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // Rules loaded from the shipped file, all healthy.
    let groups = prom.api("rules").await["groups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let rules_loaded: Vec<(String, String, String)> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("name"), s("type"), s("query"))
        })
        .collect();
    let file = std::fs::read_to_string(&rules).expect("alerts.yml");
    let in_file = file.matches("- record: ").count() + file.matches("- alert: ").count();
    assert_eq!(
        rules_loaded.len(),
        in_file,
        "Prometheus loaded every rule:\n{}",
        prom.log()
    );

    // Every panel query (team = all, and one team) and every rule expression
    // parses; panel queries and recording rules return data once scraped.
    let mut must_have_data = Vec::new();
    for name in DASHBOARDS {
        for q in panel_queries(&dashboards_dir().join(name)) {
            let one_team = substitute(&q.expr, "alpha", "1m");
            if let Err(e) = prom.query(&one_team).await {
                panic!("{}/{}: {one_team}: {e}", q.dashboard, q.panel);
            }
            must_have_data.push((format!("{}/{}", q.dashboard, q.panel), substitute(&q.expr, ".*", "1m")));
        }
    }
    assert!(must_have_data.len() >= 30, "panels found: {}", must_have_data.len());
    for (name, kind, query) in &rules_loaded {
        if let Err(e) = prom.query(query).await {
            panic!("rule {name}: {query}: {e}");
        }
        if kind == "recording" {
            must_have_data.push((format!("recording rule {name}"), name.clone()));
        }
    }
    // Polled (bounded): data appears after a few scrapes and rule evaluations.
    eventually("every panel and rule has data", Duration::from_secs(30), || async {
        let mut empty = String::new();
        for (what, expr) in &must_have_data {
            match prom.query(expr).await {
                Ok(r) if has_data(&r) => {}
                Ok(_) => empty.push_str(&format!("\n{what}: {expr}")),
                Err(e) => panic!("{what}: {expr}: {e}"),
            }
        }
        if empty.is_empty() {
            Ok(())
        } else {
            Err(empty)
        }
    })
    .await;

    // The team variable lists the teams that made requests.
    let teams = prom.api("label/team/values?match[]=gateway_requests_total").await;
    for t in ["alpha", "beta", "gamma", "delta", "unauthenticated"] {
        assert!(
            teams.as_array().is_some_and(|a| a.iter().any(|v| v == t)),
            "{t} in {teams}"
        );
    }

    // Dashboards and rules name only metrics the gateway exports.
    let exported = scrape(&gw.admin_url()).await.names();
    let mut referenced = BTreeSet::new();
    for name in DASHBOARDS {
        let text = std::fs::read_to_string(dashboards_dir().join(name)).expect("dashboard");
        referenced.extend(gateway_names(&text).into_iter().map(|n| (name, n)));
    }
    referenced.extend(gateway_names(&file).into_iter().map(|n| ("alerts.yml", n)));
    let unknown: Vec<_> = referenced.iter().filter(|(_, n)| !exported.contains(n)).collect();
    assert!(unknown.is_empty(), "not exported by the gateway: {unknown:?}");
    assert!(referenced.len() >= 20, "names found: {referenced:?}");
    background.abort();
}

/// Hits from several connections at once, on several worker threads: the
/// hit path's counters and histogram count every one (issue 38: whatever
/// is sharded or batched per core must fold back to the requests made).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hit_metrics_under_concurrent_load_equal_the_requests_made() {
    const TASKS: usize = 8;
    const EACH: usize = 100;
    let sim = start_sim(sim_config()).await;
    let gw = Setup::new().start(&sim).await;
    let query = Query::state_permits(&sim.samples()).size(3);
    let miss = Client::new(gw.base_url(), ALPHA.1).get(&query).await;
    assert_eq!(miss.x_cache(), Some("MISS"));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let team = if i % 2 == 0 { ALPHA } else { BETA };
            let (client, query) = (Client::new(gw.base_url(), team.1), query.clone());
            tokio::spawn(async move {
                for _ in 0..EACH {
                    let r = client.get(&query).await;
                    assert_eq!((r.status, r.x_cache()), (StatusCode::OK, Some("HIT")));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a client task");
    }
    let hits = (TASKS * EACH) as f64;
    let m = scrape(&gw.admin_url()).await;
    let ps = ("route", "permits_search");
    assert_eq!(m.sum("gateway_requests_total", &[ps, ("cache", "hit")]), hits);
    assert_eq!(
        m.sum("gateway_requests_total", &[ps, ("cache", "hit"), ("team", "alpha")]),
        hits / 2.0
    );
    assert_eq!(m.sum("gateway_cache_hits_total", &[ps, ("tier", "memory")]), hits);
    assert_eq!(
        m.sum("gateway_request_duration_seconds_count", &[ps, ("cache", "hit")]),
        hits
    );
    assert_eq!(
        m.sum("gateway_credits_saved_total", &[ps, ("reason", "cache")]),
        hits * 3.0,
        "three credits saved by each hit"
    );
}
