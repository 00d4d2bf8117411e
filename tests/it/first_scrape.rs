//! Issue 18: every contract metric exists from the first scrape. A gateway
//! that has served no request exports each family of DESIGN §3.5 at 0, with
//! a child per configured team, route, cache state, scope and backend op, so
//! dashboards and rules have a series to compute on; a reload adds the
//! children of new teams. The label lists behind it follow the code.

use crate::support::gateway::{FromFile, Setup, ALPHA, BETA};
use crate::support::probe::scrape;
use crate::support::prometheus::{dashboards_dir, gateway_names, Exposition};
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited};
use http::StatusCode;
use permit_gateway::cache::Tier;
use permit_gateway::metrics::labels::*;
use permit_gateway::metrics::Metrics;
use permit_gateway::proxy::CacheState;
use permit_gateway::route::Route;
use std::collections::BTreeSet;

/// The contract table of DESIGN §3.5, name for name.
const CONTRACT: [&str; 18] = [
    "gateway_requests_total",
    "gateway_request_duration_seconds",
    "gateway_upstream_requests_total",
    "gateway_upstream_request_duration_seconds",
    "gateway_credits_spent_total",
    "gateway_credits_saved_total",
    "gateway_team_credits_used",
    "gateway_team_credit_limit",
    "gateway_upstream_credits_remaining",
    "gateway_upstream_credit_limit",
    "gateway_quota_rejections_total",
    "gateway_rate_limited_total",
    "gateway_coalesced_requests_total",
    "gateway_cache_entries",
    "gateway_cache_size_bytes",
    "gateway_backend_errors_total",
    "gateway_upstream_queue_depth",
    "gateway_build_info",
];

/// A family is exported when it has a sample: `# TYPE` alone is not enough
/// for Prometheus (no series, "No data").
fn has_samples(m: &Exposition, family: &str) -> bool {
    m.samples
        .iter()
        .any(|s| s.name == family || s.name.strip_prefix(family).is_some_and(|t| t.starts_with('_')))
}

#[tokio::test]
async fn a_fresh_gateway_exports_every_contract_family_at_zero() {
    let sim = start_sim(unlimited()).await;
    let redis = RedisServer::start();
    // A limited team and a company cap: their limit gauges have series
    // (an unlimited team, no cap: none).
    let gw = Setup::new()
        .credit_limit(ALPHA, 1000)
        .with(|c| c.quota.org_credit_limit = Some(5000))
        .cache_redis(&redis.url())
        .start(&sim)
        .await;
    let m = scrape(&gw.admin_url()).await;

    let missing: Vec<_> = CONTRACT.iter().filter(|f| !has_samples(&m, f)).collect();
    assert!(
        missing.is_empty(),
        "families without a sample on a fresh gateway: {missing:?}"
    );
    assert_eq!(sim.stats().requests_total, 0, "the first scrape calls nobody upstream");
    let total = |name: &str| m.sum(name, &[]);
    for counter in CONTRACT.iter().filter(|n| n.ends_with("_total")) {
        assert_eq!(total(counter), 0.0, "{counter} starts at 0");
    }

    // Children per configured team and route, for every cache state and scope.
    for t in [ALPHA.0, BETA.0] {
        for route in Route::ALL.map(Route::as_str) {
            for cache in ["hit", "miss", "stale", "bypass"] {
                let labels = [("team", t), ("route", route), ("cache", cache)];
                assert_eq!(m.get("gateway_requests_total", &labels), Some(0.0), "{labels:?}");
            }
            let labels = [("team", t), ("route", route)];
            assert_eq!(m.get("gateway_credits_spent_total", &labels), Some(0.0), "{labels:?}");
            assert_eq!(m.get("gateway_credits_saved_total", &labels), Some(0.0), "{labels:?}");
        }
        for scope in ["team", "upstream"] {
            let labels = [("team", t), ("scope", scope)];
            assert_eq!(m.get("gateway_rate_limited_total", &labels), Some(0.0), "{labels:?}");
        }
        assert_eq!(m.get("gateway_quota_rejections_total", &[("team", t)]), Some(0.0));
        for budget in ["team", "app", "org"] {
            let labels = [("team", t), ("budget", budget)];
            assert_eq!(m.get("gateway_budget_refusals_total", &labels), Some(0.0), "{labels:?}");
        }
        assert_eq!(m.get("gateway_team_credits_used", &[("team", t)]), Some(0.0));
    }
    assert_eq!(m.get("gateway_team_credit_limit", &[("team", "alpha")]), Some(1000.0));
    assert_eq!(
        m.get("gateway_team_credit_limit", &[("team", "beta")]),
        None,
        "unlimited"
    );
    assert_eq!(
        (
            m.get("gateway_org_credits_used", &[]),
            m.get("gateway_org_credit_limit", &[])
        ),
        (Some(0.0), Some(5000.0)),
        "the company's spend and cap"
    );
    for route in Route::ALL.map(Route::as_str) {
        assert_eq!(
            m.get("gateway_coalesced_requests_total", &[("route", route)]),
            Some(0.0)
        );
        assert_eq!(m.get("gateway_upstream_retries_total", &[("route", route)]), Some(0.0));
        let count = "gateway_upstream_request_duration_seconds_count";
        assert_eq!(m.get(count, &[("route", route)]), Some(0.0), "{route}");
    }
    for (backend, op) in [
        ("ledger", "reserve"),
        ("ledger", "settle"),
        ("redis", "cache_get"),
        ("redis", "ping"),
    ] {
        let labels = [("backend", backend), ("op", op)];
        assert_eq!(m.get("gateway_backend_errors_total", &labels), Some(0.0), "{labels:?}");
    }
    for tier in ["memory", "redis"] {
        assert!(m.get("gateway_cache_entries", &[("tier", tier)]).is_some(), "{tier}");
    }
    // Bounded: no label value outside config and the contract's sets.
    let teams: BTreeSet<_> = m.samples.iter().filter_map(|s| s.labels.get("team")).collect();
    assert_eq!(teams, BTreeSet::from([&"alpha".to_string(), &"beta".to_string()]));

    // Every name a dashboard panel or a rule uses is there before any traffic.
    let exported = m.names();
    let mut referenced = BTreeSet::new();
    for entry in std::fs::read_dir(dashboards_dir()).expect("dashboards/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "json" || e == "yml") {
            let text = std::fs::read_to_string(&path).expect("read dashboard");
            let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
            referenced.extend(gateway_names(&text).into_iter().map(|n| (file.clone(), n)));
        }
    }
    assert!(referenced.len() >= 20, "names found: {referenced:?}");
    let unknown: Vec<_> = referenced.iter().filter(|(_, n)| !exported.contains(n)).collect();
    assert!(unknown.is_empty(), "not exported by a fresh gateway: {unknown:?}");
}

/// docs/metrics.md marks exactly the contract's names "(contract)".
#[test]
fn the_metrics_reference_marks_the_contract_names() {
    let path = dashboards_dir().join("../docs/metrics.md");
    let text = std::fs::read_to_string(path).expect("docs/metrics.md");
    let marked: BTreeSet<&str> = text
        .match_indices("` (contract)")
        .filter_map(|(i, _)| text[..i].rsplit('`').next())
        .collect();
    assert_eq!(marked, BTreeSet::from(CONTRACT));
}

#[tokio::test]
async fn a_reload_gives_a_new_team_its_metric_children() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[ALPHA]);
    let file = FromFile::start(&setup, &sim).await;
    let gw = &file.gw;
    let before = scrape(&gw.admin_url()).await;
    assert_eq!(before.get("gateway_rate_limited_total", &[("team", "beta")]), None);

    let setup = setup.credit_limit(BETA, 7);
    file.rewrite(&setup, &sim);
    let reload = file.reload().await;
    assert_eq!(reload.status, StatusCode::OK, "{}", reload.text());

    let after = scrape(&gw.admin_url()).await;
    let beta = [("team", "beta")];
    assert_eq!(after.get("gateway_team_credit_limit", &beta), Some(7.0));
    for family in [
        "gateway_rate_limited_total",
        "gateway_quota_rejections_total",
        "gateway_requests_total",
    ] {
        assert_eq!(after.get(family, &beta), Some(0.0), "{family} for the new team");
    }
    let per_team = after.matching("gateway_requests_total", &beta).count();
    assert_eq!(per_team, Route::ALL.len() * 4, "routes × cache states, once each");
}

/// Fails to compile when a variant is added, so `metrics::labels` follows.
fn every_cache_state(c: CacheState) -> &'static str {
    match c {
        CacheState::Hit | CacheState::Miss | CacheState::Stale | CacheState::Bypass => c.as_str(),
    }
}

fn every_tier(t: Tier) -> &'static str {
    match t {
        Tier::Memory | Tier::Redis | Tier::Disk => t.as_str(),
    }
}

#[test]
fn label_lists_match_the_enums() {
    let states = [CacheState::Hit, CacheState::Miss, CacheState::Stale, CacheState::Bypass];
    assert_eq!(states.map(every_cache_state), CACHE_STATES);
    assert_eq!([Tier::Memory, Tier::Redis, Tier::Disk].map(every_tier), TIERS);
}

/// Every Redis op has its error counter at 0 from the first scrape, the
/// two found only when the op names became an enum (`ledger_settle`,
/// `ledger_saved`: their calls span lines, which a text scan missed).
#[test]
fn every_redis_op_is_listed() {
    use permit_gateway::metrics::RedisOp;
    assert_eq!(RedisOp::ALL.map(RedisOp::as_str), REDIS_OPS);
    for op in ["ledger_settle", "ledger_saved", "cache_get", "ledger_check"] {
        assert!(REDIS_OPS.contains(&op), "{op} missing from {REDIS_OPS:?}");
    }
}

#[test]
fn preset_exports_every_family_at_zero_and_is_idempotent() {
    let m = Metrics::new();
    m.preset(["a", "b"], true);
    m.preset(["a", "b", "c"], true);
    let text = String::from_utf8(m.render()).expect("utf-8");
    for family in [
        "gateway_rate_limited_total",
        "gateway_backend_errors_total",
        "gateway_coalesced_requests_total",
    ] {
        assert!(text.contains(&format!("# TYPE {family} counter")), "{family}");
    }
    let samples: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("gateway_requests_total{"))
        .collect();
    let routes = Route::ALL.len();
    assert_eq!(
        samples.len(),
        3 * routes * 4,
        "teams × routes × cache states, once each"
    );
    assert!(samples.iter().all(|l| l.ends_with(" 0")));
    assert!(text.contains(r#"gateway_backend_errors_total{backend="redis",op="cache_get"} 0"#));
}
