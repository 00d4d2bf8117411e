//! The route table checked against the vendor's OpenAPI document, read at
//! test time from the unchanged copy in `sim/openapi/` (the same file the
//! vendor-conformance integration tests validate answers against).

use super::table::{Cost, Kind, TABLE};
use super::{classify, Route};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn openapi() -> Value {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sim/openapi/shovels-openapi.json");
    let text = std::fs::read_to_string(&file).expect("openapi readable");
    serde_json::from_str(&text).expect("openapi is JSON")
}

/// `(path, query parameters)` of every GET operation of the document.
fn operations() -> Vec<(String, Vec<Value>)> {
    let doc = openapi();
    let paths = doc["paths"].as_object().expect("paths");
    let mut ops = Vec::new();
    for (path, item) in paths {
        let get = &item["get"];
        assert!(get.is_object(), "{path}: every vendor operation is a GET");
        let params = get["parameters"].as_array().cloned().unwrap_or_default();
        let query = params.into_iter().filter(|p| p["in"] == "query").collect();
        ops.push((path.clone(), query));
    }
    ops
}

/// The path with each `{param}` filled in, as a client would send it.
fn concrete(path: &str) -> String {
    let filled: Vec<&str> = path
        .split('/')
        .map(|s| if s.starts_with('{') { "Zm9vYmFy" } else { s })
        .collect();
    format!("/v2{}", filled.join("/"))
}

/// The schema's type, looking through `anyOf: [T, null]`.
fn schema_type(param: &Value) -> (String, Option<u64>) {
    let schema = &param["schema"];
    let inner = schema["anyOf"]
        .as_array()
        .and_then(|alts| alts.iter().find(|a| a["type"] != "null"))
        .unwrap_or(schema);
    let max_items = schema["maxItems"].as_u64().or(inner["maxItems"].as_u64());
    (inner["type"].as_str().unwrap_or("").to_string(), max_items)
}

#[test]
fn every_openapi_operation_classifies_to_its_own_route() {
    let ops = operations();
    assert_eq!(ops.len(), 34, "the vendor OpenAPI has 34 operations");
    let mut seen = BTreeSet::new();
    for (path, _) in &ops {
        let uri = concrete(path).parse().expect("uri");
        let target = classify(&uri, 8192).expect("classifies");
        assert_ne!(target.route, Route::Other, "{path} has no route of its own");
        assert_eq!(target.route.row().pattern, Some(&path[1..]), "{path}");
        assert!(seen.insert(target.route), "{path}: two operations share a route");
    }
    // And the table has nothing the vendor does not: 34 operations + other.
    let rows: BTreeSet<Route> = TABLE.iter().map(|r| r.route).filter(|r| *r != Route::Other).collect();
    assert_eq!(rows, seen);
}

#[test]
fn every_declared_parameter_is_in_the_table_with_its_kind() {
    for (path, params) in operations() {
        let uri = concrete(&path).parse().expect("uri");
        let route = classify(&uri, 8192).expect("classifies").route;
        let row = route.row();
        let mut declared = BTreeSet::new();
        for param in &params {
            let name = param["name"].as_str().expect("name");
            declared.insert(name.to_string());
            let kind = row
                .param(name)
                .unwrap_or_else(|| panic!("{path}: {name} is not in the table"));
            let (ty, max_items) = schema_type(param);
            let default = &param["schema"]["default"];
            let ok = match kind {
                Kind::Set { max_items: m } | Kind::List { max_items: m } => {
                    ty == "array" && m.map(|m| m as u64) == max_items
                }
                Kind::Ids => ty == "array" && max_items == Some(50) && param["required"] == true,
                Kind::Size => {
                    ty == "integer"
                        && default == 50
                        && param["schema"]["minimum"] == 1
                        && param["schema"]["maximum"] == 100
                }
                Kind::Count => ty == "boolean" && default == false,
                Kind::Flag { default: d } => ty == "boolean" && d.map_or(default.is_null(), |d| *default == d),
                Kind::Scalar => ty == "string" || ty == "integer",
            };
            assert!(
                ok,
                "{path}: {name} is {kind:?} in the table, {ty} {max_items:?} {default} in the OpenAPI"
            );
        }
        let listed: BTreeSet<String> = row
            .params
            .iter()
            .flat_map(|g| g.iter())
            .map(|p| p.name.to_string())
            .collect();
        assert_eq!(listed, declared, "{path}: the table's parameters are the OpenAPI's");
        let required: Vec<&str> = params
            .iter()
            .filter(|p| p["required"] == true)
            .filter_map(|p| p["name"].as_str())
            .collect();
        assert_eq!(
            row.required().collect::<Vec<_>>(),
            required,
            "{path}: the table's required parameters, in the OpenAPI's order"
        );
    }
}

#[test]
fn paged_operations_cost_their_page_and_lookups_their_ids() {
    for (path, params) in operations() {
        let uri = concrete(&path).parse().expect("uri");
        let row = classify(&uri, 8192).expect("classifies").route.row();
        let has = |n: &str| params.iter().any(|p| p["name"] == n);
        match row.cost {
            Cost::Page => assert!(has("size"), "{path}: metered by page but has no size"),
            Cost::Ids => assert!(has("id") && !has("size"), "{path}: a lookup is bounded by its ids"),
            Cost::Free => {}
            Cost::Unknown => panic!("{path}: a vendor operation of unknown cost"),
        }
    }
}

#[test]
fn credit_classes_follow_the_upstream_research() {
    // Free: geo searches and details, list/*, meta/*, contractor metrics, usage.
    let free: BTreeSet<&str> = TABLE.iter().filter(|r| r.cost == Cost::Free).map(|r| r.name).collect();
    let expected: BTreeSet<&str> = [
        "addresses_search",
        "cities",
        "cities_search",
        "contractor_metrics",
        "counties",
        "counties_search",
        "jurisdictions",
        "jurisdictions_search",
        "list_tags",
        "list_zip",
        "meta_coverage",
        "meta_release",
        "states_search",
        "usage",
        "zipcodes_search",
    ]
    .into();
    assert_eq!(free, expected);
}
