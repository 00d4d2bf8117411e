//! The operator's documentation cannot drift from the code: every key of
//! `docs/operations.md`'s key table is a real config key with its real
//! default, and every real key is in the table. The real keys come from the
//! `Config` structs (serialized, `None` included), the defaults from the
//! compiled-in `config/defaults.toml`. Also: the example config and the Helm
//! chart's rendered configs pass validation (the chart when `helm` is on PATH).
//! And every repository path a doc or a comment cites exists
//! ([`cited_paths`]); imports between the modules of `src/` run one way, as
//! the crate doc says ([`imports`]); the phases design §2 names are the
//! proxy's functions, in the code's order ([`phases`]).

mod cited_paths;
mod imports;
mod phases;

use permit_gateway::config::{Config, Source, DEFAULTS_TOML};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The table row standing for every `cache.route_ttl_secs` entry.
const ROUTE_TTL_ROW: &str = "cache.route_ttl_secs.<route>";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every key the code knows, as dotted paths (`teams[].name` for the list).
fn real_keys() -> BTreeSet<String> {
    // One team, so the team keys show; the upstream key, so it validates.
    let text = r#"
        [upstream]
        api_key = "k"
        [[teams]]
        name = "t"
        token_sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
    "#;
    let config = Config::load(Source::Text(text)).expect("defaults plus a key and a team are valid");
    // JSON keeps `None` fields (as null), so optional keys that are unset by
    // default are still listed.
    let value = serde_json::to_value(&config).expect("config serializes");
    let mut keys = BTreeSet::new();
    flatten("", &value, &mut keys);
    keys
}

fn flatten(prefix: &str, value: &serde_json::Value, keys: &mut BTreeSet<String>) {
    match value {
        // A map from route name to seconds: one documented row.
        serde_json::Value::Object(_) if prefix == "cache.route_ttl_secs" => {
            keys.insert(ROUTE_TTL_ROW.to_string());
        }
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&path, v, keys);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                flatten(&format!("{prefix}[]"), item, keys);
            }
        }
        _ => {
            keys.insert(prefix.to_string());
        }
    }
}

/// The default of a key in the compiled-in defaults, as a TOML literal;
/// `None` when the key is only a comment there (unset by default).
fn default_of(defaults: &toml::Table, key: &str) -> Option<String> {
    let mut table = defaults;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        let value = table.get(part)?;
        if parts.peek().is_none() {
            return Some(value.to_string());
        }
        table = value.as_table()?;
    }
    None
}

/// One row of the doc's key table: key and default cell.
struct Row {
    key: String,
    default: String,
}

fn doc_rows() -> Vec<Row> {
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).expect("docs/operations.md");
    let start = doc
        .find("<!-- config-keys:begin -->")
        .expect("docs/operations.md has <!-- config-keys:begin -->");
    let end = doc
        .find("<!-- config-keys:end -->")
        .expect("docs/operations.md has <!-- config-keys:end -->");
    let mut rows = Vec::new();
    for line in doc[start..end].lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 3 || !cells[0].starts_with('`') {
            continue; // header, separator, markers
        }
        rows.push(Row {
            key: cells[0].trim_matches('`').to_string(),
            default: cells[1].to_string(),
        });
    }
    rows
}

#[test]
fn every_documented_config_key_is_real_and_every_real_key_is_documented() {
    let real = real_keys();
    let rows = doc_rows();
    let mut documented = BTreeSet::new();
    for row in &rows {
        assert!(
            documented.insert(row.key.clone()),
            "docs/operations.md documents {} twice",
            row.key
        );
    }
    let not_real: Vec<_> = documented.difference(&real).collect();
    let undocumented: Vec<_> = real.difference(&documented).collect();
    assert!(
        not_real.is_empty() && undocumented.is_empty(),
        "docs/operations.md's key table is out of date:\n  documented but not a config key: {not_real:?}\n  \
         config keys not documented: {undocumented:?}"
    );
}

#[test]
fn documented_defaults_are_the_compiled_in_defaults() {
    let defaults: toml::Table = DEFAULTS_TOML.parse().expect("defaults.toml parses");
    let mut wrong = Vec::new();
    for row in doc_rows() {
        if row.key.starts_with("teams[]") || row.key == ROUTE_TTL_ROW {
            continue; // teams have no defaults; route TTLs are listed in defaults.toml
        }
        let documented = match row.default.as_str() {
            "unset" => None,
            cell if cell.starts_with('`') && cell.ends_with('`') && cell.len() > 1 => {
                Some(cell.trim_matches('`').to_string())
            }
            other => {
                wrong.push(format!(
                    "{}: default cell {other:?} is neither `literal` nor unset",
                    row.key
                ));
                continue;
            }
        };
        let real = default_of(&defaults, &row.key);
        if documented != real {
            wrong.push(format!(
                "{}: documented {}, config/defaults.toml has {}",
                row.key,
                documented.as_deref().unwrap_or("unset"),
                real.as_deref().unwrap_or("unset")
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/operations.md defaults differ:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn every_real_key_is_explained_in_the_compiled_in_defaults() {
    // defaults.toml is the long reference: each key appears there, set or as
    // a commented example.
    let mut missing = Vec::new();
    for key in real_keys() {
        let leaf = if key == ROUTE_TTL_ROW {
            "[cache.route_ttl_secs]".to_string()
        } else {
            format!("{} =", key.rsplit('.').next().unwrap_or(&key))
        };
        if !DEFAULTS_TOML.contains(&leaf) {
            missing.push(key);
        }
    }
    assert!(missing.is_empty(), "config/defaults.toml does not mention {missing:?}");
}

/// A config as deployed reads its key from a file that does not exist here:
/// give the key inline instead, then validate.
fn validate_deployed(what: &str, text: &str) {
    let text: String = text
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("api_key_file =") {
                "api_key = \"k\"".to_string()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    if let Err(errors) = Config::load(Source::Text(&text)) {
        panic!("{what} does not validate:\n{errors}\n--- config ---\n{text}");
    }
}

#[test]
fn the_example_config_validates() {
    let text = std::fs::read_to_string(root().join("config/gateway.toml")).expect("config/gateway.toml");
    validate_deployed("config/gateway.toml", &text);
}

fn helm() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("HELM") {
        return Some(PathBuf::from(path));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("helm"))
        .find(|p| p.is_file())
}

/// The `gateway.toml` of the chart's ConfigMap, rendered with `args`.
fn rendered_chart_config(helm: &Path, args: &[&str]) -> String {
    let chart = root().join("helm/permit-gateway");
    let out = Command::new(helm)
        .arg("template")
        .arg("pg")
        .arg(&chart)
        .args(["--show-only", "templates/configmap.yaml"])
        .args(args)
        .current_dir(&chart)
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm template {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = yaml.lines().skip_while(|l| l.trim() != "gateway.toml: |").skip(1);
    let mut toml = String::new();
    for line in lines.by_ref() {
        if !(line.is_empty() || line.starts_with("    ")) {
            break;
        }
        toml.push_str(line.strip_prefix("    ").unwrap_or(line));
        toml.push('\n');
    }
    assert!(toml.contains("[server]"), "no gateway.toml in:\n{yaml}");
    toml
}

#[test]
fn the_helm_charts_rendered_configs_validate() {
    let Some(helm) = helm() else {
        eprintln!("skipped: no helm on PATH (.ci/run installs it)");
        return;
    };
    let default = rendered_chart_config(&helm, &["--set", "upstream.apiKey=x"]);
    assert!(default.contains("admin_listen = \"0.0.0.0:9090\""), "{default}");
    validate_deployed("the chart's config (default values)", &default);
    let multi = rendered_chart_config(&helm, &["-f", "ci/multi-replica-redis-values.yaml"]);
    assert!(multi.contains("store = \"redis\""), "{multi}");
    validate_deployed("the chart's config (ci/multi-replica-redis-values.yaml)", &multi);
}

#[test]
fn the_chart_reads_alerts_and_dashboards_from_dashboards_through_symlinks() {
    let files = root().join("helm/permit-gateway/files");
    let mut links = vec![("alerts.yml".to_string(), "../../../dashboards/alerts.yml".to_string())];
    for name in ["credit-spend", "cache-efficiency", "upstream-health"] {
        links.push((
            format!("dashboards/{name}.json"),
            format!("../../../../dashboards/{name}.json"),
        ));
    }
    for (link, target) in links {
        let found = std::fs::read_link(files.join(&link)).unwrap_or_else(|e| panic!("files/{link}: {e}"));
        assert_eq!(found, PathBuf::from(&target), "files/{link} must point at {target}");
    }
}

/// The rows of docs/operations.md's operations table: (route, operation, credits, TTL).
fn operation_rows() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).expect("docs/operations.md");
    let start = doc
        .find("<!-- routes:begin -->")
        .expect("docs/operations.md has <!-- routes:begin -->");
    let end = doc
        .find("<!-- routes:end -->")
        .expect("docs/operations.md has <!-- routes:end -->");
    doc[start..end]
        .lines()
        .map(|line| {
            line.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|cells| cells.len() == 4 && cells[0].starts_with('`'))
        .collect()
}

#[test]
fn the_operations_table_is_the_route_table() {
    use permit_gateway::route::table::{Cost, TtlClass};
    use permit_gateway::route::Route;
    let rows = operation_rows();
    let mut documented = BTreeSet::new();
    for cells in &rows {
        let name = cells[0].trim_matches('`');
        let route = Route::from_name(name).unwrap_or_else(|| panic!("{name} is not a route"));
        assert!(documented.insert(route), "{name} documented twice");
        let row = route.row();
        let operation = row
            .pattern
            .map_or("any other `/v2/...` path".to_string(), |p| format!("`GET /v2/{p}`"));
        assert_eq!(cells[1], operation, "{name}: operation");
        let class = match row.cost {
            Cost::Free => "free",
            Cost::Page => "page",
            Cost::Ids => "ids",
            Cost::Unknown => "unknown",
        };
        assert_eq!(cells[2].split(':').next(), Some(class), "{name}: credit class");
        let ttl = match row.ttl {
            TtlClass::Never => "never cached".to_string(),
            TtlClass::Default => "`cache.default_ttl_secs`".to_string(),
            class => format!("`{}`", class.secs().expect("a fixed TTL")),
        };
        assert_eq!(cells[3], ttl, "{name}: TTL");
    }
    assert_eq!(documented.len(), Route::ALL.len(), "every route is documented");
}

#[test]
fn the_metrics_reference_lists_every_route_name() {
    let doc = std::fs::read_to_string(root().join("docs/metrics.md")).expect("docs/metrics.md");
    let row = doc
        .lines()
        .find(|l| l.starts_with("| `route` |"))
        .expect("docs/metrics.md has the route label row");
    for route in permit_gateway::route::Route::ALL {
        assert!(
            row.contains(&format!("`{}`", route.as_str())),
            "docs/metrics.md lacks {}",
            route.as_str()
        );
    }
}
