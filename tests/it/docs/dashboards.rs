//! A dashboard query on a recording rule shows "No data" wherever the rules
//! of `dashboards/alerts.yml` are not loaded (Grafana alone, a Prometheus
//! without `rule_files:`). So no query of `dashboards/*.json` (a panel's
//! `expr`, a variable's `query` or `definition`) may name a recording rule
//! (a `record:` of `alerts.yml`) or any other name with a colon, which
//! Prometheus reserves for recording rules: panels inline the rule's
//! expression on the gateway's own metrics instead.

use super::root;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// The names `dashboards/alerts.yml` records.
fn recording_rules() -> Vec<String> {
    let rules = std::fs::read_to_string(root().join("dashboards/alerts.yml")).expect("dashboards/alerts.yml");
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record:"))
        .map(|name| name.trim().trim_matches(['"', '\'']).to_string())
        .collect()
}

fn dashboards() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("dashboards"))
        .expect("dashboards/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

/// Every query string of a dashboard, anywhere in it (panels, rows,
/// templating), with its JSON path.
fn queries(value: &Value, path: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let here = format!("{path}.{k}");
                match v {
                    Value::String(s) if ["expr", "query", "definition"].contains(&k.as_str()) => {
                        out.push((here, s.clone()));
                    }
                    _ => queries(v, &here, out),
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                queries(v, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Metric names with a colon in a PromQL expression: identifiers outside
/// string literals, not a Grafana variable (`$__range`) nor a subquery's
/// `[1h:5m]`.
fn colon_names(expr: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_string = false;
    let mut token = String::new();
    let mut after_dollar = false;
    let mut flush = |token: &mut String, after_dollar: bool| {
        let parts_ok = token
            .split(':')
            .all(|p| p.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_'));
        if !after_dollar && token.contains(':') && parts_ok {
            found.push(token.clone());
        }
        token.clear();
    };
    let mut prev = ' ';
    for c in expr.chars() {
        if in_string {
            if c == '"' && prev != '\\' {
                in_string = false;
            }
        } else if c == '"' {
            flush(&mut token, after_dollar);
            in_string = true;
        } else if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            if token.is_empty() {
                after_dollar = prev == '$';
            }
            token.push(c);
        } else {
            flush(&mut token, after_dollar);
        }
        prev = c;
    }
    flush(&mut token, after_dollar);
    found
}

#[test]
fn no_dashboard_query_uses_a_recording_rule() {
    let rules = recording_rules();
    assert!(rules.len() >= 5, "record: entries found in alerts.yml: {rules:?}");
    let files = dashboards();
    assert!(files.len() >= 3, "dashboards found: {files:?}");
    let mut found = Vec::new();
    let mut read = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("dashboard");
        let dash: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut all = Vec::new();
        queries(&dash, "", &mut all);
        read += all.len();
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (path, expr) in all {
            let mut named: BTreeSet<String> = rules.iter().filter(|r| expr.contains(r.as_str())).cloned().collect();
            named.extend(colon_names(&expr));
            if !named.is_empty() {
                found.push(format!("{name}{path}: {named:?} in {expr}"));
            }
        }
    }
    assert!(read >= 30, "only {read} queries read");
    assert!(
        found.is_empty(),
        "dashboard queries on recording rules (inline the rule's expression from dashboards/alerts.yml):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_query_reader_finds_what_it_should() {
    assert_eq!(
        colon_names("gateway:team_budget_exhaustion:days{team=~\"$team\"} < 7"),
        ["gateway:team_budget_exhaustion:days"]
    );
    assert_eq!(colon_names("sum(job:x:rate5m) / on() y"), ["job:x:rate5m"]);
    for plain in [
        "max_over_time(rate(gateway_requests_total[5m])[1h:5m])",
        "sum(increase(gateway_requests_total{team=~\"a:b\"}[$__range:1m]))",
        "rate(gateway_credits_spent_total{team=~\"$team\"}[${__rate_interval}])",
        "label_values(gateway_requests_total, team)",
    ] {
        assert_eq!(colon_names(plain), Vec::<String>::new(), "{plain}");
    }
    let dash: Value = serde_json::json!({
        "panels": [{"targets": [{"expr": "a"}], "panels": [{"targets": [{"expr": "b"}]}]}],
        "templating": {"list": [{"definition": "c", "query": {"query": "d"}}]}
    });
    let mut all = Vec::new();
    queries(&dash, "", &mut all);
    let mut exprs: Vec<&str> = all.iter().map(|(_, e)| e.as_str()).collect();
    exprs.sort();
    assert_eq!(exprs, ["a", "b", "c", "d"]);
}
