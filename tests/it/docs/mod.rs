//! The operator's documentation cannot drift from the code: every key of
//! `docs/operations.md`'s key table is a real config key with its real
//! default, and every real key is in the table. The real keys come from the
//! `Config` structs (serialized, `None` included), the defaults from the
//! compiled-in `config/defaults.toml`. Also: the example config and the Helm
//! chart's rendered configs pass validation (the chart when `helm` is on PATH).
//! And every repository path a doc or a comment cites exists
//! ([`cited_paths`]); imports between the modules of `src/` run one way, as
//! the crate doc says ([`imports`]); the phases design §2 names are the
//! proxy's functions, in the code's order ([`phases`]); docs/metrics.md's
//! size of a scrape and its families missing from the first scrape are
//! measured ([`series`]); no dashboard query uses a recording rule
//! ([`dashboards`]); CHANGELOG.md's newest release is the crate's version,
//! and a release that changes a contract says how to upgrade and roll back
//! ([`changelog`]). The key table is one Markdown table (no blank or other
//! line inside it), the README's workspace list names every workspace
//! member, and design §3.2 names every section of `config/defaults.toml`.

mod changelog;
mod cited_paths;
mod dashboards;
mod glossary;
mod imports;
mod phases;
mod series;
mod sizes;

use permit_gateway::config::{Config, Source, DEFAULTS_TOML};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The table row standing for every `cache.route_ttl_secs` entry.
const ROUTE_TTL_ROW: &str = "cache.route_ttl_secs.<route>";

/// Every `.rs` file below `dir`, with its text.
pub(super) fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("readable").filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("UTF-8");
            out.push((path.display().to_string(), text));
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every key the code knows, as dotted paths (`teams[].name` for the list).
fn real_keys() -> BTreeSet<String> {
    // One team with an app token, so the team and token keys show; the
    // upstream key, so it validates.
    let text = r#"
        [upstream]
        api_key = "k"
        [[teams]]
        name = "t"
        token_sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
        [[teams.tokens]]
        name = "app"
        token_sha256 = "1111111111111111111111111111111111111111111111111111111111111111"
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

/// The lines strictly between the key table's markers.
fn key_table_lines(doc: &str) -> Vec<&str> {
    let begin = "<!-- config-keys:begin -->";
    let start = doc
        .find(begin)
        .expect("docs/operations.md has <!-- config-keys:begin -->")
        + begin.len();
    let end = doc
        .find("<!-- config-keys:end -->")
        .expect("docs/operations.md has <!-- config-keys:end -->");
    assert!(
        start <= end,
        "<!-- config-keys:begin --> comes before <!-- config-keys:end -->"
    );
    // The rest of the begin marker's line, and the end marker's line up to it.
    let inner = &doc[start..end];
    let inner = inner.strip_prefix('\n').unwrap_or(inner);
    let inner = inner.strip_suffix('\n').unwrap_or(inner);
    inner.lines().collect()
}

/// The lines between the markers that are not rows of one Markdown table:
/// a blank line ends a table, and the rows after it render as text.
fn table_breaks(lines: &[&str]) -> Vec<String> {
    lines
        .iter()
        .enumerate()
        .filter(|(_, line)| {
            let line = line.trim_end();
            !(line.starts_with('|') && line.ends_with('|') && line.len() > 1)
        })
        .map(|(i, line)| format!("line {} of the table: {line:?}", i + 1))
        .collect()
}

fn doc_rows() -> Vec<Row> {
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).expect("docs/operations.md");
    let mut rows = Vec::new();
    for line in key_table_lines(&doc) {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 3 || !cells[0].starts_with('`') {
            continue; // header, separator
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
fn the_key_table_is_one_markdown_table() {
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).expect("docs/operations.md");
    let lines = key_table_lines(&doc);
    assert!(lines.len() > 50, "the key table has {} lines", lines.len());
    assert!(
        lines[1].trim().starts_with("|---") || lines[1].trim().starts_with("| ---"),
        "the key table opens with a header and its separator: {:?}",
        &lines[..2]
    );
    let breaks = table_breaks(&lines);
    assert!(
        breaks.is_empty(),
        "docs/operations.md's key table has lines that are not table rows (a blank line ends the table: the \
         rows after it render as text):\n  {}",
        breaks.join("\n  ")
    );
}

#[test]
fn the_table_reader_finds_what_it_should() {
    let doc = "x\n<!-- config-keys:begin -->\n| key | default |\n|---|---|\n| `a` | `1` |\n\n| `b` | `2` |\n\
               <!-- config-keys:end -->\n";
    let lines = key_table_lines(doc);
    assert_eq!(
        lines,
        ["| key | default |", "|---|---|", "| `a` | `1` |", "", "| `b` | `2` |"]
    );
    assert_eq!(table_breaks(&lines), ["line 4 of the table: \"\""]);
    assert_eq!(
        table_breaks(&["| `a` | `1` |", "some text", "  "]),
        ["line 2 of the table: \"some text\"", "line 3 of the table: \"  \""]
    );
    assert!(table_breaks(&["| `a` | `1` |", "|---|---|"]).is_empty());
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
    let apps = rendered_chart_config(&helm, &["-f", "ci/team-apps-values.yaml"]);
    assert!(apps.contains("[[teams.tokens]]"), "{apps}");
    validate_deployed("the chart's config (ci/team-apps-values.yaml)", &apps);
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

/// The README's workspace list: the Layout line `Cargo.toml  workspace: ...`.
fn readme_workspace_line(readme: &str) -> Option<&str> {
    readme
        .lines()
        .find(|l| l.starts_with("Cargo.toml") && l.contains("workspace:"))
}

/// Whether the workspace list names `member`: as a word `path/` (or
/// `path`), the root package as `name (root package)`.
fn workspace_lists(line: &str, member: &str, root_package: &str) -> bool {
    let list = line.split_once("workspace:").map_or(line, |(_, list)| list);
    match member.trim_end_matches('/') {
        "." | "" => list.contains(&format!("{root_package} (root package)")),
        path => list
            .split(|c: char| c.is_whitespace() || c == '+' || c == ',')
            .any(|word| word.trim_end_matches('/') == path),
    }
}

#[test]
fn the_readmes_workspace_list_names_every_workspace_member() {
    let cargo: toml::Table = std::fs::read_to_string(root().join("Cargo.toml"))
        .expect("Cargo.toml")
        .parse()
        .expect("Cargo.toml parses");
    let members: Vec<&str> = cargo["workspace"]["members"]
        .as_array()
        .expect("[workspace] members")
        .iter()
        .map(|m| m.as_str().expect("a member is a path"))
        .collect();
    assert!(members.len() >= 3, "workspace members: {members:?}");
    let root_package = cargo["package"]["name"].as_str().expect("[package] name");
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let line = readme_workspace_line(&readme).expect("README's Layout has a `Cargo.toml  workspace: ...` line");
    let missing: Vec<&str> = members
        .iter()
        .copied()
        .filter(|m| !workspace_lists(line, m, root_package))
        .collect();
    assert!(
        missing.is_empty(),
        "README's workspace list ({line:?}) lacks workspace members of Cargo.toml: {missing:?}"
    );
}

/// The sections docs/design.md §3.2 lists: the `[name]`s after "Sections".
fn design_sections(design: &str) -> BTreeSet<String> {
    let start = design.find("\n### 3.2 ").expect("docs/design.md has §3.2");
    let end = start + 1 + design[start + 1..].find("\n#").expect("a heading after §3.2");
    let text = &design[start..end];
    let list = &text[text.find("Sections").expect("§3.2 lists the sections")..];
    list.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| code.strip_prefix('[')?.strip_suffix(']'))
        .filter(|name| !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .map(str::to_string)
        .collect()
}

#[test]
fn design_lists_every_section_of_the_compiled_in_defaults() {
    let defaults: toml::Table = DEFAULTS_TOML.parse().expect("defaults.toml parses");
    let sections: BTreeSet<String> = defaults
        .iter()
        .filter(|(_, v)| v.is_table())
        .map(|(k, _)| k.clone())
        .collect();
    assert!(sections.len() >= 8, "sections of defaults.toml: {sections:?}");
    let design = std::fs::read_to_string(root().join("docs/design.md")).expect("docs/design.md");
    let listed = design_sections(&design);
    let missing: Vec<_> = sections.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&sections).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/design.md §3.2's list of sections differs from config/defaults.toml's top-level tables:\n  \
         not listed: {missing:?}\n  listed but not a section: {unknown:?}"
    );
}

#[test]
fn the_workspace_and_section_readers_find_what_they_should() {
    let readme = "```\nCargo.toml          workspace: gw (root package) + sim/ + bench/ceiling/\nsrc/ x\n```\n";
    let line = readme_workspace_line(readme).expect("the line");
    for member in [".", "sim", "bench/ceiling", "bench/ceiling/"] {
        assert!(workspace_lists(line, member, "gw"), "{member}");
    }
    assert!(!workspace_lists(line, "bench", "gw"));
    assert!(!workspace_lists(line, ".", "other"));
    assert!(!workspace_lists(
        "Cargo.toml  workspace: gw (root package) + sim/",
        "bench/ceiling",
        "gw"
    ));
    let design = "## 3\n### 3.2 Configuration\nLayers: `[x]`. Sections: `[server]` (a `[a-z0-9_-]` label),\n\
                  `[log]`, and `[[teams]]`.\n### 3.3 Next\n`[cache]`\n";
    let names: BTreeSet<String> = ["server", "log"].map(String::from).into();
    assert_eq!(design_sections(design), names);
}
