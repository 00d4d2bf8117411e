//! CHANGELOG.md tells what each release changed (issue 59): its newest
//! release is the version the crate builds (`Cargo.toml`, which
//! `--version` and `gateway_build_info` carry) and the Helm chart's
//! `appVersion`; releases are listed newest first, each heading
//! `## X.Y.Z — YYYY-MM-DD`; and a section (a release, or `Unreleased`) that
//! names a metric, a config key, a column or a format has its
//! `### Upgrade and rollback` steps.

use super::root;
use permit_gateway::config::DEFAULTS_TOML;

/// A section of the changelog: its heading (after `## `) and its text.
struct Section {
    heading: String,
    text: String,
}

fn sections(changelog: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for line in changelog.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            out.push(Section {
                heading: heading.trim().to_string(),
                text: String::new(),
            });
        } else if let Some(section) = out.last_mut() {
            section.text.push_str(line);
            section.text.push('\n');
        }
    }
    out
}

/// `X.Y.Z` of a release heading `X.Y.Z — YYYY-MM-DD`; `None` for another
/// heading (`Unreleased`).
fn release(heading: &str) -> Option<((u64, u64, u64), String)> {
    let (version, date) = heading.split_once(" — ")?;
    let parts: Vec<u64> = version.split('.').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let [major, minor, patch] = parts[..] else { return None };
    chrono::NaiveDate::parse_from_str(date.trim(), "%Y-%m-%d").ok()?;
    Some(((major, minor, patch), version.to_string()))
}

/// What a section names that an upgrade or a rollback may need a step for:
/// a metric (`gateway_*`), a config key (`section.key`, `[[teams...]]`),
/// a column or a format.
fn names_a_contract(text: &str, config_sections: &[String]) -> Vec<String> {
    let mut found: Vec<String> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|code| {
            code.starts_with("gateway_")
                || code.starts_with("[[teams")
                || code.starts_with("[teams")
                || code
                    .split_once('.')
                    .is_some_and(|(section, _)| config_sections.iter().any(|s| s == section))
        })
        .map(str::to_string)
        .collect();
    found.extend(
        text.split(|c: char| !c.is_ascii_alphabetic())
            .map(str::to_ascii_lowercase)
            .filter(|w| matches!(w.as_str(), "column" | "columns" | "format" | "formats")),
    );
    found
}

#[test]
fn the_changelogs_newest_release_is_the_crates_version_and_every_change_says_how_to_upgrade_and_roll_back() {
    let changelog = std::fs::read_to_string(root().join("CHANGELOG.md")).expect("CHANGELOG.md");
    let cargo: toml::Table = std::fs::read_to_string(root().join("Cargo.toml"))
        .expect("Cargo.toml")
        .parse()
        .expect("Cargo.toml parses");
    let version = cargo["package"]["version"].as_str().expect("[package] version");
    let all = sections(&changelog);
    let releases: Vec<_> = all.iter().filter_map(|s| release(&s.heading)).collect();
    let others: Vec<_> = all
        .iter()
        .filter(|s| s.heading != "Unreleased" && release(&s.heading).is_none())
        .map(|s| s.heading.as_str())
        .collect();
    assert!(
        others.is_empty(),
        "CHANGELOG.md: a `## ` heading is `Unreleased` or `X.Y.Z — YYYY-MM-DD`: {others:?}"
    );
    let newest = releases.first().map(|(_, v)| v.as_str());
    assert_eq!(
        newest,
        Some(version),
        "CHANGELOG.md's newest release is Cargo.toml's version: a release renames `## Unreleased` \
         to `## X.Y.Z — date` and sets the version in the same change"
    );
    assert!(
        releases.windows(2).all(|w| w[0].0 > w[1].0),
        "CHANGELOG.md lists releases newest first, each once"
    );
    let chart = std::fs::read_to_string(root().join("helm/permit-gateway/Chart.yaml")).expect("Chart.yaml");
    assert!(
        chart.lines().any(|l| l.trim() == format!("appVersion: \"{version}\"")),
        "the chart's appVersion is {version}"
    );
    let defaults: toml::Table = DEFAULTS_TOML.parse().expect("defaults.toml parses");
    let config_sections: Vec<String> = defaults
        .iter()
        .filter(|(_, v)| v.is_table())
        .map(|(k, _)| k.clone())
        .collect();
    for section in &all {
        let named = names_a_contract(&section.text, &config_sections);
        let steps = section.text.contains("\n### Upgrade and rollback\n");
        assert!(
            named.is_empty() || steps,
            "CHANGELOG.md `## {}` names {named:?} but has no `### Upgrade and rollback` steps",
            section.heading
        );
    }
}

#[test]
fn the_changelog_readers_find_what_they_should() {
    let text = "# C\nintro\n## Unreleased\n## 0.10.0 — 2026-12-07\n- `gateway_x_total`\n## 0.9.1 — 2026-11-01\n";
    let all = sections(text);
    assert_eq!(all.len(), 3);
    assert_eq!(all[1].text, "- `gateway_x_total`\n");
    assert_eq!(release(&all[1].heading), Some(((0, 10, 0), "0.10.0".to_string())));
    assert_eq!(release("Unreleased"), None);
    assert_eq!(release("0.2 — 2026-12-07"), None);
    assert_eq!(release("0.2.0 — December"), None);
    let sections = ["quota".to_string()];
    assert_eq!(
        names_a_contract(
            "`quota.path`, `[[teams.tokens]]`, `x.y`, new columns; information",
            &sections
        ),
        ["quota.path", "[[teams.tokens]]", "columns"]
    );
    assert!(names_a_contract("`gateway_a_total` and a Format", &sections).len() == 2);
}
