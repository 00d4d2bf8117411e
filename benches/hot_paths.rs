//! Micro-benchmarks of the pure functions every request runs before the
//! cache answers: routing, key normalization and token lookup.
//!
//! `cargo bench --bench hot_paths` (results in BENCHMARKS.md). The inputs are
//! what real clients send on the hit path: a permit search with a few
//! filters, parameters in arbitrary order, explicit defaults.

use criterion::{criterion_group, criterion_main, Criterion};
use http::Uri;
use permit_gateway::auth::Teams;
use permit_gateway::cache::key::{cache_key, normalize_query};
use permit_gateway::config::{TeamConfig, TokenHash};
use permit_gateway::route::{classify, Route};
use std::hint::black_box;

/// A typical dashboard query: explicit defaults, a set filter, odd order.
const SEARCH: &str = "/v2/permits/search?size=50&permit_to=2024-12-31&geo_id=CA-06037\
    &permit_tags=solar&permit_tags=-roofing&include_count=False&permit_from=2024-01-01&permit_status=final";

/// A short query with nothing to normalize.
const SIMPLE: &str = "/v2/permits/search?geo_id=CA-06037&permit_from=2024-01-01&permit_to=2024-12-31";

fn routing(c: &mut Criterion) {
    let search: Uri = SEARCH.parse().expect("a valid uri");
    let contractor: Uri = "/v2/contractors/c-00042/permits?size=20".parse().expect("a valid uri");
    let mut g = c.benchmark_group("route::classify");
    g.bench_function("permits_search", |b| b.iter(|| classify(black_box(&search), 8192)));
    g.bench_function("contractor_permits", |b| {
        b.iter(|| classify(black_box(&contractor), 8192))
    });
    g.finish();
}

fn key_normalization(c: &mut Criterion) {
    let search = classify(&SEARCH.parse().expect("a valid uri"), 8192).expect("a /v2 target");
    let simple = classify(&SIMPLE.parse().expect("a valid uri"), 8192).expect("a /v2 target");
    let query = search.query.clone().unwrap_or_default();
    let mut g = c.benchmark_group("cache::key");
    g.bench_function("cache_key/permits_search_8_params", |b| {
        b.iter(|| cache_key(black_box(&search)))
    });
    g.bench_function("cache_key/permits_search_3_params", |b| {
        b.iter(|| cache_key(black_box(&simple)))
    });
    g.bench_function("normalize_query/permits_search_8_params", |b| {
        b.iter(|| normalize_query(Route::PermitsSearch, black_box(&query)))
    });
    g.finish();
}

fn token_lookup(c: &mut Criterion) {
    let configs: Vec<TeamConfig> = (0..50)
        .map(|i| TeamConfig {
            name: format!("team-{i:02}"),
            token_sha256: Some(TokenHash::of(&format!("pgw_token_of_team_{i:02}"))),
            not_after: None,
            tokens: Vec::new(),
            credit_limit: Some(100_000),
            requests_per_minute: None,
            clamp_to_budget: false,
            weight: 1,
        })
        .collect();
    let teams = Teams::from_config(&configs);
    let mut g = c.benchmark_group("auth::Teams::find_token/50_teams");
    g.bench_function("first", |b| {
        b.iter(|| teams.find_token(black_box("pgw_token_of_team_00")))
    });
    g.bench_function("last", |b| {
        b.iter(|| teams.find_token(black_box("pgw_token_of_team_49")))
    });
    g.bench_function("unknown", |b| b.iter(|| teams.find_token(black_box("pgw_not_a_token"))));
    g.finish();
}

criterion_group!(benches, routing, key_normalization, token_lookup);
criterion_main!(benches);
