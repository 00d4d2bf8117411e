//! No input closes the simulator's connection without an answer: every
//! operation, with hostile values in its path and in every parameter any
//! operation reads, answers with a status below 500 (the handler did not
//! panic) and costs nothing unless it is a 200.

use super::{sim, v2};

/// Multibyte characters where byte slicing would cut one, separators,
/// overflows, NULs, broken percent-escapes, cursors that decode to garbage.
const VALUES: &[&str] = &[
    "1234%C3%A96789",
    "12345-67%C3%A9",
    "%C3%A9%C3%A9",
    "%F0%9F%92%A5",
    "2024-01-0%C3%A9",
    "-",
    "--",
    "a,b",
    "",
    "-1",
    "99999999999999999999999",
    "%00",
    "%",
    "%ZZ",
    "eyJhZnRlciI6IvCfkqUifQ",
    "%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9%C3%A9",
];

const PATHS: &[&str] = &[
    "/v2/permits/search",
    "/v2/permits",
    "/v2/contractors/search",
    "/v2/contractors",
    "/v2/contractors/{x}/permits",
    "/v2/contractors/{x}/employees",
    "/v2/contractors/{x}/metrics",
    "/v2/decisions/search",
    "/v2/decisions",
    "/v2/properties/search",
    "/v2/properties",
    "/v2/addresses/{x}/metrics/monthly",
    "/v2/addresses/{x}/metrics/current",
    "/v2/counties/{x}/metrics/current",
    "/v2/jurisdictions/{x}/metrics/monthly",
    "/v2/cities/{x}/metrics/current",
    "/v2/addresses/{x}/residents",
    "/v2/counties",
    "/v2/addresses/search",
    "/v2/cities/search",
    "/v2/zipcodes/search",
    "/v2/states/search",
    "/v2/list/tags",
    "/v2/meta/coverage",
];

const PARAMS: &[&str] = &[
    "id",
    "geo_id",
    "q",
    "size",
    "cursor",
    "permit_from",
    "decision_to",
    "metric_from",
    "tag",
    "property_type",
    "permit_tags",
    "legal_owner",
    "geo_type",
    "date_from",
    "permit_q",
    "min_project_value",
];

#[tokio::test]
async fn hostile_values_anywhere_get_an_answer_below_500() {
    let sim = sim().await;
    let s = sim.samples();
    for (i, path) in PATHS.iter().enumerate() {
        for (j, value) in VALUES.iter().enumerate() {
            let segment = if value.is_empty() { "x" } else { value };
            // Every parameter once with this value, the rest valid enough
            // to get past the required-field checks where they can.
            let mut query: Vec<String> = PARAMS.iter().map(|p| format!("{p}={value}")).collect();
            query.push(format!("permit_to={}", s.permit_to));
            query.rotate_left((i + j) % PARAMS.len());
            let url = format!("{}?{}", path.replace("{x}", segment), query.join("&"));
            let r = v2(&sim, &url).await;
            assert!(r.status.as_u16() < 500, "{url}: {} {}", r.status, r.text());
            assert!(r.status != 200 || r.json().is_object(), "{url}");
        }
    }
    let stats = sim.stats();
    assert_eq!(
        stats.requests_total,
        (PATHS.len() * VALUES.len()) as u64,
        "every request was answered"
    );
}
