//! Records weigh what they keep alive (issue 24, point 2): a hot record of
//! a page that left L1 keeps its own bytes, not the page's.

use super::{alpha, ids_of, lookup};
use crate::support::alloc::live_here;
use crate::support::client::Client;
use crate::support::gateway::Setup;
use crate::support::probe::scrape;
use crate::support::prometheus::encode;
use crate::support::sim::{start_sim, unlimited};
use crate::support::traffic::distinct_search;
use http::StatusCode;

/// `cache.memory_max_bytes` of the test.
const BOUND: i64 = 1 << 20;

#[tokio::test]
async fn hot_records_of_evicted_pages_keep_the_memory_bound() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .with(|c| c.cache.memory_max_bytes = BOUND as u64)
        .start(&sim)
        .await;
    // Warm what lives for the process (pools, metric children) first.
    let warm = ids_of(&alpha(&gw, &distinct_search(&sim, 400, 1)).await);
    alpha(&gw, &lookup("permits", &[&warm[0]])).await;
    let before = live_here();
    let mut hot: Vec<String> = Vec::new();
    let first = distinct_search(&sim, 0, 100);
    let mut query = first.clone();
    for _ in 0..40 {
        // 40 pages of one search, 100 records (~130 KB) each: ~5 MB, 5x the
        // bound, no record in two pages.
        let page = alpha(&gw, &query).await;
        let ids = ids_of(&page);
        assert_eq!(ids.len(), 100, "{}", page.text());
        let cursor = page.json()["next_cursor"].as_str().expect("a next page").to_string();
        query = first.clone().param("cursor", encode(&cursor));
        hot.push(ids[0].clone());
        // Every kept record asked again: each stays hot in L1.
        let asked: Vec<&str> = hot.iter().map(String::as_str).collect();
        let r = alpha(&gw, &lookup("permits", &asked)).await;
        assert_eq!(ids_of(&r).len(), hot.len());
    }
    let m = scrape(&gw.admin_url()).await;
    let entries = m.sum("gateway_cache_entries", &[("tier", "memory")]);
    let weighed = m.sum("gateway_cache_size_bytes", &[("tier", "memory")]);
    drop(m);
    let with_cache = live_here();
    // What the cache kept alive is what emptying it frees.
    let purge = Client::admin(gw.admin_url()).post("/admin/cache/purge?all=true").await;
    assert_eq!(purge.status, StatusCode::OK, "{}", purge.text());
    drop(purge);
    let kept = with_cache - live_here();
    println!(
        "kept alive by the cache: {kept} bytes for a {BOUND}-byte bound ({} bytes since the start); \
         {entries} entries weighing {weighed}",
        with_cache - before
    );
    // The bound, and 1/16 for what moka keeps whatever its entries (its
    // frequency sketch, its timer wheel).
    assert!(
        kept <= BOUND + BOUND / 16,
        "{kept} bytes kept alive by 40 hot records and an L1 of {BOUND}"
    );
}
