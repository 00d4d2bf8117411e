//! docs/metrics.md's size of a scrape and its list of families missing
//! from the first scrape are measured, not estimated: a real gateway (no
//! Redis, the disk tier on as by default, teams without a `credit_limit`)
//! is started with 1, 2 and 3 teams and its first `/metrics` counted, one
//! series per sample line (comments excluded). The doc's "about P series
//! per team plus about F" must be within 5 of what the count gives (the doc
//! rounds to the nearest 10), and its "Not in the first scrape" paragraph
//! must name exactly the families of its tables that have no sample then.

use super::root;
use crate::support::gateway::{Setup, Team};
use crate::support::probe::metrics_text;
use crate::support::prometheus::Exposition;
use crate::support::sim::{start_sim, unlimited, Sim};
use std::collections::BTreeSet;

/// Teams of this test only (their tokens are never used).
const TEAMS: [Team; 3] = [
    ("series-one", "tok-series-one-3b1f0c2a9e8d7a61"),
    ("series-two", "tok-series-two-6d2e1f3a4b5c6d72"),
    ("series-three", "tok-series-three-9a8b7c6d5e4f3a83"),
];

/// How far the doc's figures may be from the measured ones: rounded to
/// the nearest 10.
const ROUNDING: u64 = 5;

fn metrics_doc() -> String {
    std::fs::read_to_string(root().join("docs/metrics.md")).expect("docs/metrics.md")
}

/// The first scrape of a fresh gateway of `setup`.
async fn first_scrape(setup: Setup, sim: &Sim) -> String {
    let gw = setup.start(sim).await;
    metrics_text(&gw.admin_url()).await
}

/// Series in a scrape: its sample lines.
fn series(text: &str) -> u64 {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .count() as u64
}

/// "about P series per team plus about F" in `doc` (whitespace and line
/// breaks collapsed, thousands separated by commas or not).
fn stated_figures(doc: &str) -> Option<(u64, u64)> {
    let words: Vec<&str> = doc.split_whitespace().collect();
    let number = |w: &str| w.replace(',', "").parse::<u64>().ok();
    words.windows(8).find_map(|w| {
        let shape =
            w[0] == "about" && w[2] == "series" && w[3] == "per" && w[4] == "team" && w[5] == "plus" && w[6] == "about";
        if !shape {
            return None;
        }
        Some((number(w[1])?, number(w[7].trim_end_matches([',', '.', ';', ':']))?))
    })
}

/// The families the doc's tables list: `gateway_*` names in a row's first
/// cell.
fn documented_families(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .filter_map(|l| l.strip_prefix('|'))
        .filter_map(|l| l.split('|').next())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2))
        .filter(|name| name.starts_with("gateway_"))
        .map(str::to_string)
        .collect()
}

/// The `gateway_*` names of the doc's "**Not in the first scrape**"
/// paragraph (up to the next blank line).
fn stated_absent(doc: &str) -> Option<BTreeSet<String>> {
    let start = doc.find("**Not in the first scrape")?;
    let paragraph = doc[start..].split("\n\n").next()?;
    Some(
        paragraph
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|name| name.starts_with("gateway_") && !name.contains(['{', ' ']))
            .map(str::to_string)
            .collect(),
    )
}

/// Whether a scrape has a sample of `family` (histograms: its `_bucket`,
/// `_sum`, `_count`).
fn has_samples(m: &Exposition, family: &str) -> bool {
    m.samples.iter().any(|s| {
        s.name == family
            || s.name
                .strip_prefix(family)
                .is_some_and(|t| ["_bucket", "_sum", "_count"].contains(&t))
    })
}

#[tokio::test]
async fn the_metrics_reference_states_the_measured_size_of_a_scrape() {
    let sim = start_sim(unlimited()).await;
    let mut counts = Vec::new();
    for n in 1..=TEAMS.len() {
        let text = first_scrape(Setup::new().teams(&TEAMS[..n]), &sim).await;
        counts.push(series(&text));
    }
    let per_team = counts[1] - counts[0];
    assert_eq!(
        counts[2] - counts[1],
        per_team,
        "series grow by the same number per team: {counts:?}"
    );
    let fixed = counts[0] - per_team;
    let limited = first_scrape(Setup::new().teams(&TEAMS[..1]).credit_limit(TEAMS[0], 10), &sim).await;
    assert_eq!(
        series(&limited),
        counts[0] + 1,
        "a credit_limit adds one series (gateway_team_credit_limit)"
    );

    let doc = metrics_doc();
    let (p, f) = stated_figures(&doc).expect("docs/metrics.md says \"about P series per team plus about F\"");
    assert!(
        p.abs_diff(per_team) <= ROUNDING && f.abs_diff(fixed) <= ROUNDING,
        "docs/metrics.md says about {p} series per team plus about {f}; measured {per_team} per team plus \
         {fixed} (1, 2, 3 teams: {counts:?} sample lines)"
    );
    assert!(
        doc.contains("tests/it/docs/series.rs"),
        "docs/metrics.md says how its figures are measured"
    );

    // Families missing from the first scrape (a limited team, so
    // gateway_team_credit_limit has its series).
    let m = Exposition::parse(&limited);
    let documented = documented_families(&doc);
    assert!(documented.len() >= 30, "families found in the doc: {documented:?}");
    let absent: BTreeSet<String> = documented.into_iter().filter(|f| !has_samples(&m, f)).collect();
    let stated = stated_absent(&doc).expect("docs/metrics.md has a **Not in the first scrape** paragraph");
    assert_eq!(
        stated, absent,
        "docs/metrics.md's **Not in the first scrape** list differs from the families its tables name that a \
         fresh gateway does not export"
    );
}

#[test]
fn the_readers_find_the_figures_and_the_families() {
    let text = "bounded: about 220 series\nper team plus about 3,810 whatever the teams";
    assert_eq!(stated_figures(text), Some((220, 3810)));
    assert_eq!(stated_figures("about 220 series per team plus 3810"), None);
    assert_eq!(series("# HELP a\n# TYPE a counter\na 0\na{b=\"c\"} 1\n\n"), 2);
    let doc = "| `gateway_a` (contract) | counter | x | `gateway_not_a_family` |\n\
               | `process_x`, `gateway_b` | gauge | | |\n\n\
               **Not in the first scrape:** `gateway_a` (why)\nand `gateway_b`.\n\nLater: `gateway_c`.\n";
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(documented_families(doc), names(&["gateway_a", "gateway_b"]));
    assert_eq!(stated_absent(doc), Some(names(&["gateway_a", "gateway_b"])));
    let m = Exposition::parse("h_bucket{le=\"1\"} 0\nh_sum 0\nh_count 0\nc_total 0\n");
    assert!(has_samples(&m, "h") && has_samples(&m, "c_total") && !has_samples(&m, "c"));
}
