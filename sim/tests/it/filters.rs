//! Search filters change results the way the spec says (AND across filters).

use super::{contractor_search, items, permit_search, sim, v2};
use serde_json::Value;

async fn all_items(sim: &crate::support::sim::Sim, url: &str) -> Vec<Value> {
    let r = v2(sim, &format!("{url}&size=100")).await;
    assert_eq!(r.status, 200, "{url}: {}", r.text());
    items(&r)
}

fn tags(p: &Value) -> Vec<&str> {
    p["tags"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

#[tokio::test]
async fn tags_are_all_required_and_minus_excludes() {
    let sim = sim().await;
    let s = sim.samples();
    let count = |r: &crate::support::http::Reply| r.json()["total_count"]["value"].as_u64().unwrap_or(0);
    let base = count(&v2(&sim, &permit_search(&s, &s.state, "&include_count=true")).await);
    let solar_count = count(
        &v2(
            &sim,
            &permit_search(&s, &s.state, "&permit_tags=solar&include_count=true"),
        )
        .await,
    );
    assert!(solar_count > 0 && solar_count < base, "{solar_count} of {base}");
    let solar = all_items(&sim, &permit_search(&s, &s.state, "&permit_tags=solar")).await;
    assert!(solar.iter().all(|p| tags(p).contains(&"solar")));
    let both = all_items(
        &sim,
        &permit_search(&s, &s.state, "&permit_tags=solar&permit_tags=hvac"),
    )
    .await;
    assert!(both
        .iter()
        .all(|p| tags(p).contains(&"solar") && tags(p).contains(&"hvac")));
    let without = all_items(
        &sim,
        &permit_search(&s, &s.state, "&permit_tags=solar&permit_tags=-hvac"),
    )
    .await;
    assert!(
        !without.is_empty()
            && without
                .iter()
                .all(|p| tags(p).contains(&"solar") && !tags(p).contains(&"hvac"))
    );
    let bogus = all_items(&sim, &permit_search(&s, &s.state, "&permit_tags=no_such_tag")).await;
    assert!(bogus.is_empty());
}

#[tokio::test]
async fn status_property_type_text_and_contractor_presence_filter() {
    let sim = sim().await;
    let s = sim.samples();
    let st = all_items(
        &sim,
        &permit_search(&s, &s.state, "&permit_status=active&permit_status=in_review"),
    )
    .await;
    assert!(!st.is_empty() && st.iter().all(|p| p["status"] == "active" || p["status"] == "in_review"));
    let vacant = all_items(&sim, &permit_search(&s, &s.state, "&property_type=vacant%20land")).await;
    assert!(!vacant.is_empty() && vacant.iter().all(|p| p["property_type"] == "vacant land"));
    let text = all_items(&sim, &permit_search(&s, &s.state, "&permit_q=SOLAR%20PAN")).await;
    assert!(!text.is_empty());
    assert!(text.iter().all(|p| p["description"]
        .as_str()
        .unwrap_or("")
        .to_lowercase()
        .contains("solar pan")));
    let with = all_items(&sim, &permit_search(&s, &s.state, "&permit_has_contractor=yes")).await;
    assert!(with.iter().all(|p| p["contractor_id"].is_string()));
    let without = all_items(&sim, &permit_search(&s, &s.state, "&permit_has_contractor=0")).await;
    assert!(!without.is_empty() && without.iter().all(|p| p["contractor_id"].is_null()));
}

#[tokio::test]
async fn minimum_filters_and_dates_bound_results() {
    let sim = sim().await;
    let s = sim.samples();
    let rich = all_items(&sim, &permit_search(&s, &s.state, "&permit_min_job_value=150000000")).await;
    assert!(
        !rich.is_empty()
            && rich
                .iter()
                .all(|p| p["job_value"].as_i64().is_some_and(|v| v >= 150_000_000))
    );
    let url = format!(
        "/v2/permits/search?geo_id={}&permit_from=2023-01-01&permit_to=2023-06-30&size=100",
        s.state
    );
    let dated = items(&v2(&sim, &url).await);
    assert!(!dated.is_empty());
    // permit_from bounds the earliest of file/issue/start; permit_to the latest of file/issue/end.
    let dates = |p: &Value, fields: &[&str]| -> Vec<String> {
        fields
            .iter()
            .filter_map(|f| p[*f].as_str().map(str::to_owned))
            .collect()
    };
    for p in &dated {
        let early = dates(p, &["file_date", "issue_date", "start_date"]);
        assert!(
            early.iter().min().is_some_and(|d| d.as_str() >= "2023-01-01"),
            "{early:?}"
        );
        let late = dates(p, &["file_date", "issue_date", "end_date"]);
        assert!(
            late.iter().max().is_some_and(|d| d.as_str() <= "2023-06-30"),
            "{late:?}"
        );
    }
}

#[tokio::test]
async fn contractor_name_filter_matches_name_or_business_name() {
    let sim = sim().await;
    let s = sim.samples();
    let first = items(&v2(&sim, &contractor_search(&s, &s.state, "&size=1")).await);
    let business = first[0]["business_name"].as_str().unwrap_or_default().to_string();
    let word: String = business.split(' ').next().unwrap_or_default().to_lowercase();
    let found = all_items(
        &sim,
        &contractor_search(&s, &s.state, &format!("&contractor_name={word}")),
    )
    .await;
    assert!(!found.is_empty());
    assert!(found.iter().all(|c| {
        let n = format!("{} {}", c["name"], c["business_name"]).to_lowercase();
        n.contains(&word)
    }));
    let permits = all_items(&sim, &permit_search(&s, &s.state, &format!("&contractor_name={word}"))).await;
    assert!(!permits.is_empty() && permits.iter().all(|p| p["contractor_id"].is_string()));
}

#[tokio::test]
async fn contractor_tallies_follow_the_filters_and_can_be_switched_off() {
    let sim = sim().await;
    let s = sim.samples();
    let c = &items(&v2(&sim, &contractor_search(&s, &s.state, "&permit_status=final&size=5")).await)[0];
    let statuses = c["status_tally"].as_object().expect("tally");
    assert!(statuses.keys().all(|k| k == "final"), "{statuses:?}");
    assert!(c["permit_count"].as_u64() >= statuses.get("final").and_then(Value::as_u64));
    let off = &items(&v2(&sim, &contractor_search(&s, &s.state, "&include_tallies=false&size=1")).await)[0];
    assert_eq!(off["status_tally"], serde_json::json!({}));
    assert_eq!(off["tag_tally"], serde_json::json!({}));
}
