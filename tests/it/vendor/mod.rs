//! Vendor conformance: every GET operation of the vendor's published OpenAPI
//! (`sim/openapi/shovels-openapi.json`, read at test time) is
//! requested THROUGH THE GATEWAY (real gateway, real simulator upstream), and
//! its 200 body is validated against the operation's response schema with
//! the document's `$ref`s resolved by the validator. Metered operations must
//! settle to what the simulator charged; free ones must cost nothing.

use crate::support::client::Client;
use crate::support::gateway::{Setup, Team, ALPHA, BETA, SMALL};
use crate::support::http::Reply;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::traffic::{charged_to, ledger_used};
use jsonschema::{Draft, Registry, Validator};
use serde_json::{json, Value};
use std::collections::BTreeSet;

mod ops;
use ops::{fixtures, operations};

/// Where the vendor document lives: `PERMIT_VENDOR_OPENAPI`, else the copy
/// kept in the repository at `sim/openapi/` (the vendor's published file,
/// unchanged, so a fresh clone and CI test against the same document).
fn openapi() -> Value {
    let path = std::env::var("PERMIT_VENDOR_OPENAPI")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/sim/openapi/shovels-openapi.json").to_string());
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the vendor OpenAPI at {path} ({e}); set PERMIT_VENDOR_OPENAPI to its path"));
    serde_json::from_str(&text).expect("the vendor OpenAPI is JSON")
}

/// The document registered under one URI, so `#/components/...` refs resolve.
const DOC_URI: &str = "urn:vendor-openapi";

/// A validator for the 200 response schema of `GET {spec_path}`.
fn response_validator(doc: &Value, registry: &Registry, spec_path: &str) -> Validator {
    let schema = &doc["paths"][spec_path]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
    let pointer = schema["$ref"]
        .as_str()
        .unwrap_or_else(|| panic!("{spec_path}: the 200 schema is a $ref"));
    jsonschema::options()
        .with_draft(Draft::Draft202012)
        .with_registry(registry)
        .build(&json!({ "$ref": format!("{DOC_URI}{pointer}") }))
        .unwrap_or_else(|e| panic!("{spec_path}: schema compiles: {e}"))
}

fn registry(doc: &Value) -> Registry<'static> {
    Registry::new()
        .draft(Draft::Draft202012)
        .add(DOC_URI, Draft::Draft202012.create_resource(doc.clone()))
        .and_then(|b| b.prepare())
        .expect("the vendor document registers")
}

/// What the simulator charged for the request with this id.
fn upstream_credits(sim: &Sim, request_id: &str) -> Option<u64> {
    sim.log()
        .iter()
        .find(|e| e.request_id.as_deref() == Some(request_id))
        .map(|e| e.credits)
}

fn errors_of(v: &Validator, body: &Value) -> Vec<String> {
    v.iter_errors(body)
        .take(5)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

/// Every lookup goes upstream: these tests probe each operation's own
/// answer and charge, which record reuse (tests/it/records/mod.rs) would answer
/// from the records the searches before it bought.
fn pass_through() -> Setup {
    Setup::new().with(|c| c.cache.record_reuse = false)
}

#[tokio::test]
async fn every_vendor_operation_answers_through_the_gateway_with_a_body_valid_against_the_vendor_openapi() {
    let doc = openapi();
    let registry = registry(&doc);
    let sim = start_sim(unlimited()).await;
    let gw = pass_through().start(&sim).await;
    let (s, permit, ids) = fixtures(&sim).await;
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let ops = operations(&s, &permit, &ids);

    let declared: BTreeSet<&str> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .filter(|(_, item)| item.get("get").is_some())
        .map(|(p, _)| p.as_str())
        .collect();
    let covered: BTreeSet<&str> = ops.iter().map(|o| o.spec_path).collect();
    assert_eq!(
        covered, declared,
        "every GET operation of the vendor OpenAPI is exercised"
    );
    assert_eq!(declared.len(), 34);

    let alpha = Client::new(gw.base_url(), ALPHA.1);
    for (i, o) in ops.iter().enumerate() {
        let rid = format!("alpha-{i}");
        let r: Reply = alpha.get(&o.query).request_id(&rid).await;
        assert_eq!(r.status, 200, "{} ({}): {}", o.spec_path, o.query, r.text());
        let body = r.json();
        let errors = errors_of(&response_validator(&doc, &registry, o.spec_path), &body);
        assert!(
            errors.is_empty(),
            "{}: body invalid against the vendor schema: {errors:#?}",
            o.spec_path
        );
        if o.spec_path != "/usage" {
            assert!(
                upstream_credits(&sim, &rid).is_some(),
                "{} reached the upstream",
                o.spec_path
            );
        }
        if let Some(items) = body.get("items").and_then(Value::as_array) {
            assert!(!items.is_empty(), "{}: the probe should return records", o.spec_path);
        }
    }
}

#[tokio::test]
async fn metered_operations_settle_to_what_the_simulator_charged() {
    let sim = start_sim(unlimited()).await;
    let gw = pass_through().start(&sim).await;
    let (s, permit, ids) = fixtures(&sim).await;
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let beta = Client::new(gw.base_url(), BETA.1);
    for (i, o) in operations(&s, &permit, &ids)
        .iter()
        .enumerate()
        .filter(|(_, o)| o.metered)
    {
        let rid = format!("beta-{i}");
        let r = beta.get(&o.query).request_id(&rid).await;
        assert_eq!(r.status, 200, "{}: {}", o.spec_path, r.text());
        let charged = upstream_credits(&sim, &rid).unwrap_or_else(|| panic!("{} reached the upstream", o.spec_path));
        assert!(charged > 0, "{} is billed per record", o.spec_path);
        assert_eq!(r.credits_request(), Some(charged), "{}", o.spec_path);
    }
    let ledger = ledger_used(&gw.admin_url(), BETA.0).await;
    assert_eq!(
        ledger,
        charged_to(&sim, "beta-"),
        "the ledger equals the upstream's charge"
    );
}

/// Teams with tiny budgets: "small" has 3 credits, "tiny" 2.
const TINY: Team = ("tiny", "tok-tiny-9a8b7c6d5e4f3a2b");

#[tokio::test]
async fn free_operations_cost_nothing_and_an_id_lookup_of_3_reserves_3() {
    let sim = start_sim(unlimited()).await;
    let gw = pass_through()
        .teams(&[SMALL, TINY])
        .credit_limit(SMALL, 3)
        .credit_limit(TINY, 2)
        .start(&sim)
        .await;
    let (s, permit, ids) = fixtures(&sim).await;
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let lookup = Query::permits_by_id(&ids);
    let (small, tiny) = (Client::new(gw.base_url(), SMALL.1), Client::new(gw.base_url(), TINY.1));

    // A budget of 2 cannot cover the lookup's reservation of 3: refused
    // before the upstream is asked.
    let r = tiny.get(&lookup).request_id("tiny-0").await;
    assert_eq!(r.status, 402, "{}", r.text());
    assert_eq!(
        upstream_credits(&sim, "tiny-0"),
        None,
        "a refused lookup never reaches the upstream"
    );
    // A budget of exactly 3 covers it: the reservation is the 3 ids, not a page.
    let r = small.get(&lookup).request_id("small-lookup").expect_status(200).await;
    assert_eq!(r.credits_request(), Some(3));
    assert_eq!(r.header_u64("x-credits-remaining"), Some(0));

    // With 0 credits left, every free operation still answers, at no cost.
    for (i, o) in operations(&s, &permit, &ids)
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.metered)
    {
        let rid = format!("small-{i}");
        let r = small.get(&o.query).request_id(&rid).await;
        assert_eq!(r.status, 200, "{} with 0 credits left: {}", o.spec_path, r.text());
        assert_eq!(r.credits_request().unwrap_or(0), 0, "{} is free", o.spec_path);
    }
    assert_eq!(ledger_used(&gw.admin_url(), SMALL.0).await, 3);
    assert_eq!(charged_to(&sim, "small-"), 3);
    let r = small
        .get(Query::permits_by_id(&ids[..1]))
        .request_id("small-more")
        .await;
    assert_eq!(r.status, 402, "the budget is spent: {}", r.text());
}

/// The validator really checks what the simulator once got wrong: a float
/// lot size and a coverage field outside the vendor's enum are rejected, and
/// the simulator's current answers are accepted.
#[tokio::test]
async fn the_vendor_schemas_reject_the_simulators_old_mistakes() {
    let doc = openapi();
    let registry = registry(&doc);
    let sim = start_sim(unlimited()).await;
    let (s, permit, _) = fixtures(&sim).await;
    let permits = response_validator(&doc, &registry, "/permits/search");
    let page = |p: &Value| json!({"items": [p], "size": 1, "next_cursor": null});
    assert!(
        permits.is_valid(&page(&permit)),
        "{:#?}",
        errors_of(&permits, &page(&permit))
    );
    let mut float = permit.clone();
    float["property_lot_size"] = json!(1428.5);
    assert!(!permits.is_valid(&page(&float)), "a float lot size is not an integer");
    let coverage = response_validator(&doc, &registry, "/meta/coverage");
    let row =
        |field: &str| json!({"items": [{"field": field, "tier": "partial", "fill_pct": 0.5, "permits_total": 9}]});
    assert!(coverage.is_valid(&row("owner_name")));
    assert!(!coverage.is_valid(&row("description_derived")));
    let empty = Query::coverage("state", &s.state).dates("1990-01-01", "1990-01-02");
    let body = Client::upstream(&sim).get(empty).await.json();
    assert!(coverage.is_valid(&body), "{:#?}", errors_of(&coverage, &body));
}

/// The multibyte `geo_id` that once closed the simulator's connection gets a
/// 422 in the upstream's shape through the gateway, and costs the team nothing.
#[tokio::test]
async fn a_multibyte_geo_id_through_the_gateway_is_a_422_that_costs_nothing() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let s = sim.samples();
    for path in ["permits", "contractors"] {
        // The é written out percent-encoded: those bytes are the case.
        let search = Query::new(format!("/v2/{path}/search"))
            .param("geo_id", "1234%C3%A96789")
            .window(&s.permit_from, &s.permit_to);
        let r = alpha.get(search).request_id(&format!("alpha-{path}")).await;
        assert_eq!(r.status, 422, "{path}: {}", r.text());
        assert_eq!(r.json()["detail"][0]["loc"], json!(["query", "geo_id"]));
    }
    assert_eq!(ledger_used(&gw.admin_url(), ALPHA.0).await, 0);
    assert_eq!(charged_to(&sim, "alpha-"), 0);
}
