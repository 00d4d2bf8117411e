//! The id lookups (`/v2/permits?id=` and its three siblings): which ids the
//! vendor's FastAPI parameter accepts, in which order records come back, and
//! that each record is the very object the searches return.

use super::{items, permit_search, sim, v2};
use crate::support::sim::Sim;
use serde_json::Value;

fn ids_of(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|r| r["id"].as_str().expect("record id").to_string())
        .collect()
}

/// Five permit records of the small state, as the search returns them.
async fn five_permits(sim: &Sim) -> Vec<Value> {
    let s = sim.samples();
    let r = v2(sim, &permit_search(&s, &s.state, "&size=5")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    items(&r)
}

fn query(ids: &[&str]) -> String {
    ids.iter().map(|i| format!("id={i}")).collect::<Vec<_>>().join("&")
}

#[tokio::test]
async fn permit_lookup_answers_in_request_order_with_the_search_records() {
    let sim = sim().await;
    let found = five_permits(&sim).await;
    let ids = ids_of(&found);
    let asked = [ids[3].as_str(), ids[0].as_str(), ids[4].as_str()];
    let r = v2(&sim, &format!("/v2/permits?{}", query(&asked))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = items(&r);
    assert_eq!(ids_of(&got), asked, "request order");
    assert_eq!(got[0], found[3], "the lookup record is the search record");
    assert_eq!(got[1], found[0]);
    assert_eq!(r.json()["size"], 3);
    assert_eq!(r.json()["next_cursor"], Value::Null);
    assert_eq!(r.header_u64("x-credits-request"), Some(3));
    assert_eq!(sim.stats().credits_total, 3 + 5);
}

#[tokio::test]
async fn unknown_ids_are_omitted_and_repeated_ids_answered_once() {
    let sim = sim().await;
    let ids = ids_of(&five_permits(&sim).await);
    let asked = [ids[1].as_str(), "ffffffffffffffff", ids[1].as_str(), ids[2].as_str()];
    let r = v2(&sim, &format!("/v2/permits?{}", query(&asked))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(ids_of(&items(&r)), [ids[1].clone(), ids[2].clone()]);
    assert_eq!(
        r.header_u64("x-credits-request"),
        Some(2),
        "one credit per record returned"
    );
}

#[tokio::test]
async fn a_comma_list_is_one_id_not_several() {
    let sim = sim().await;
    let ids = ids_of(&five_permits(&sim).await);
    let r = v2(&sim, &format!("/v2/permits?id={},{}", ids[0], ids[1])).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(items(&r).is_empty(), "FastAPI does not split list values on commas");
    assert_eq!(r.header_u64("x-credits-request"), Some(0));
}

#[tokio::test]
async fn more_than_50_ids_or_none_is_a_422_that_costs_nothing() {
    let sim = sim().await;
    let many: Vec<String> = (0..51).map(|i| format!("{i:016x}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for path in ["/v2/permits", "/v2/contractors", "/v2/decisions", "/v2/properties"] {
        let r = v2(&sim, &format!("{path}?{}", query(&many))).await;
        assert_eq!(r.status, 422, "{path}: {}", r.text());
        let e = &r.json()["detail"][0];
        assert_eq!(e["type"], "too_long", "{path}");
        assert_eq!(e["loc"], serde_json::json!(["query", "id"]));
        assert_eq!(e["ctx"]["max_length"], 50);
        let r = v2(&sim, path).await;
        assert_eq!(r.status, 422, "{path}");
        assert_eq!(r.json()["detail"][0]["type"], "missing");
        let r = v2(&sim, &format!("{path}?{}", query(&many[..50]))).await;
        assert_eq!(r.status, 200, "{path} takes exactly 50: {}", r.text());
    }
    assert_eq!(sim.stats().credits_total, 0);
}

#[tokio::test]
async fn contractor_decision_and_property_lookups_return_search_shaped_records() {
    let sim = sim().await;
    let s = sim.samples();
    let r = v2(&sim, &format!("/v2/contractors?id={}&id=NOSUCHID00", s.contractor_id)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let c = items(&r);
    assert_eq!(ids_of(&c), [s.contractor_id.as_str()]);
    let tallied: u64 = c[0]["status_tally"]
        .as_object()
        .expect("status tally")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(
        Some(tallied),
        c[0]["permit_count"].as_u64(),
        "lookup tallies are lifetime"
    );

    let search = v2(
        &sim,
        &format!(
            "/v2/decisions/search?geo_id={}&decision_from=2020-01-01&decision_to=2026-12-31&size=3",
            s.state
        ),
    )
    .await;
    let found = items(&search);
    assert_eq!(found.len(), 3, "{}", search.text());
    let r = v2(
        &sim,
        &format!(
            "/v2/decisions?id={}&id={}",
            found[2]["id"].as_str().unwrap_or(""),
            s.decision_id
        ),
    )
    .await;
    let got = items(&r);
    assert_eq!(got[0], found[2]);
    assert_eq!(got.len(), 2);

    let r = v2(&sim, &format!("/v2/properties?id={}&id=AAAAAAAAAAA", s.address_geo_id)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(ids_of(&items(&r)), [s.address_geo_id.as_str()]);
    let r = v2(&sim, &format!("/v2/properties?id={}", s.city_geo_id)).await;
    assert_eq!(r.status, 422, "a city id is not a property id: {}", r.text());
}
