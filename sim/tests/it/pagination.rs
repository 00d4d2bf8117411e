//! Cursor pagination: complete, stable, counted only on first pages, capped.

use super::{contractor_search, items, permit_search, sim, v2};
use std::collections::HashSet;

#[tokio::test]
async fn walking_all_pages_sees_every_permit_once_and_matches_the_count() {
    let sim = sim().await;
    let s = sim.samples();
    let first = v2(&sim, &permit_search(&s, &s.zip, "&size=7&include_count=true")).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let total = first.json()["total_count"].clone();
    assert_eq!(total["relation"], "eq");
    let total = total["value"].as_u64().expect("count value");
    assert!(total > 14, "needs several pages, got {total}");
    let mut seen = HashSet::new();
    let mut page = first;
    let mut pages = 0;
    loop {
        pages += 1;
        for p in items(&page) {
            assert!(
                seen.insert(p["id"].as_str().unwrap_or_default().to_string()),
                "duplicate {}",
                p["id"]
            );
        }
        let next = page.json()["next_cursor"].clone();
        let Some(cursor) = next.as_str() else { break };
        page = v2(
            &sim,
            &permit_search(&s, &s.zip, &format!("&size=7&include_count=true&cursor={cursor}")),
        )
        .await;
        assert_eq!(page.status, 200);
        assert!(page.json()["total_count"].is_null(), "count only on the first page");
    }
    assert_eq!(seen.len() as u64, total);
    assert_eq!(pages as u64, total.div_ceil(7));
}

#[tokio::test]
async fn contractor_pages_are_complete_without_duplicates() {
    let sim = sim().await;
    let s = sim.samples();
    let mut seen = HashSet::new();
    let mut cursor = String::new();
    let first = v2(&sim, &contractor_search(&s, &s.zip, "&size=3&include_count=true")).await;
    let total = first.json()["total_count"]["value"].as_u64().expect("count");
    let mut page = first;
    loop {
        for c in items(&page) {
            assert!(seen.insert(c["id"].to_string()));
        }
        let Some(next) = page.json()["next_cursor"].as_str().map(str::to_owned) else {
            break;
        };
        cursor = next;
        page = v2(
            &sim,
            &contractor_search(&s, &s.zip, &format!("&size=3&cursor={cursor}")),
        )
        .await;
    }
    assert!(!cursor.is_empty(), "more than one page");
    assert_eq!(seen.len() as u64, total);
}

#[tokio::test]
async fn big_state_count_is_capped_at_ten_thousand() {
    let sim = sim().await;
    let s = sim.samples();
    let r = v2(&sim, &permit_search(&s, &s.big_state, "&size=1&include_count=true")).await;
    assert_eq!(
        r.json()["total_count"],
        serde_json::json!({"value": 10000, "relation": "gte"})
    );
    let r = v2(&sim, &permit_search(&s, &s.big_state, "&size=1")).await;
    assert!(r.json()["total_count"].is_null(), "no count unless asked");
}

#[tokio::test]
async fn default_size_is_fifty_and_pages_are_stable() {
    let sim = sim().await;
    let s = sim.samples();
    let a = v2(&sim, &permit_search(&s, &s.state, "")).await.json();
    let b = v2(&sim, &permit_search(&s, &s.state, "")).await.json();
    assert_eq!(a["size"], 50);
    assert_eq!(a, b);
}

#[tokio::test]
async fn malformed_cursor_is_422() {
    let sim = sim().await;
    let s = sim.samples();
    let r = v2(&sim, &permit_search(&s, &s.state, "&cursor=%25%25garbage")).await;
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["detail"][0]["loc"], serde_json::json!(["query", "cursor"]));
}
