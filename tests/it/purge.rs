//! `POST /admin/cache/purge` means what it says (issue 59): an unknown
//! parameter of any admin endpoint is a 422 that names it and purges
//! nothing; everything goes only with `all=true`; one answer (by its
//! request, under any spelling) and one record (by its id) go alone, from
//! every tier; a purge the disk tier cannot take is a 503, never a 200
//! that a restart undoes. What reached the simulator says what was bought.

use crate::disk_tier::{config_file, durable};
use crate::records::ids_of;
use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA};
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, Samples, Sim};
use http::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

fn upstream_requests(sim: &Sim) -> u64 {
    sim.stats().requests_total
}

/// `request=<target>`, the target URL-encoded as one value.
fn request_param(q: &Query) -> String {
    let encoded: String = form_urlencoded::byte_serialize(q.to_string().as_bytes()).collect();
    format!("request={encoded}")
}

/// The small state's permits, `size=3`, as `Query::state_permits` spells it.
fn page(s: &Samples) -> Query {
    Query::state_permits(s).size(3)
}

#[tokio::test]
async fn an_unknown_admin_parameter_is_a_422_naming_it_and_nothing_is_purged() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let page = page(&sim.samples());
    assert_eq!(alpha.get(&page).await.x_cache(), Some("MISS"));
    let admin = Client::admin(gw.admin_url());

    let typo = admin.post("/admin/cache/purge?routes=permits_search").await;
    assert_eq!(typo.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", typo.text());
    assert_eq!(
        typo.json(),
        json!({"detail": [{"type": "extra_forbidden", "loc": ["query", "routes"],
            "msg": "Unknown parameter `routes` (did you mean `route`?)", "input": "permits_search"}]})
    );
    let refused = |r: &crate::support::http::Reply| {
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
        r.json()["detail"][0].clone()
    };
    // No parameter: "everything" is never implied; the choices are listed.
    let none = refused(&admin.post("/admin/cache/purge").await);
    assert_eq!(none["loc"], json!(["query", "all"]));
    assert!(none["msg"]
        .as_str()
        .is_some_and(|m| m.contains("all=true") && m.contains("request=")));
    assert_eq!(
        refused(&admin.post("/admin/cache/purge?all=1").await)["loc"],
        json!(["query", "all"])
    );
    let two = refused(&admin.post("/admin/cache/purge?all=true&route=permits_search").await);
    assert_eq!(two["loc"], json!(["query", "route"]));
    let twice = refused(
        &admin
            .post("/admin/cache/purge?route=meta_release&route=permits_search")
            .await,
    );
    assert_eq!(twice["type"], "value_error");
    // A request not URL-encoded: its own parameters are the endpoint's.
    let raw = refused(&admin.post(format!("/admin/cache/purge?request={page}")).await);
    assert_eq!(raw["type"], "extra_forbidden");
    assert_eq!(
        refused(&admin.post("/admin/cache/purge?route=nope").await)["type"],
        "enum"
    );
    assert_eq!(
        refused(&admin.post("/admin/cache/purge?request=%2Fnot%2Fv2").await)["loc"],
        json!(["query", "request"])
    );
    // The other endpoints too.
    let csv = refused(&admin.get("/admin/usage.csv?form=2025-01-01").await);
    assert_eq!(csv["msg"], "Unknown parameter `form` (did you mean `from`?)");
    assert_eq!(
        refused(&admin.get("/admin/teams?verbose=1").await)["loc"],
        json!(["query", "verbose"])
    );
    assert_eq!(
        refused(&admin.post("/admin/reload?force=1").await)["loc"],
        json!(["query", "force"])
    );

    let still = alpha.get(&page).await;
    assert_eq!((still.x_cache(), still.credits_request()), (Some("HIT"), Some(0)));
    assert_eq!(upstream_requests(&sim), 1, "nothing was purged, nothing bought again");
}

#[tokio::test]
async fn all_true_purges_everything() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let (page, release) = (page(&sim.samples()), Query::meta_release());
    alpha.get(&page).await.expect_status(StatusCode::OK);
    alpha.get(&release).await.expect_status(StatusCode::OK);
    let all = Client::admin(gw.admin_url()).post("/admin/cache/purge?all=true").await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.text());
    let body = all.json();
    assert_eq!(
        (body["purged"].clone(), body["disk"].clone()),
        (json!("all"), json!("purged"))
    );
    assert!(body["dropped"]["memory"].as_u64() >= Some(2), "{body}");
    assert!(body["dropped"]["disk"].as_u64() >= Some(2), "{body}");
    assert_eq!(alpha.get(&page).await.x_cache(), Some("MISS"));
    assert_eq!(alpha.get(&release).await.x_cache(), Some("MISS"));
    assert_eq!(upstream_requests(&sim), 4, "both bought again");
}

/// Memory, Redis and the disk tier all on: the purged request's key goes
/// from each (as many entries from each), under whichever spelling it is
/// named or asked again; another answer of the same route stays.
#[tokio::test]
async fn one_answer_is_purged_alone_from_every_tier_under_any_spelling() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .cache_redis(&redis.url())
        .with(|c| c.cache.disk = permit_gateway::config::DiskMode::On)
        .start(&sim)
        .await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let s = sim.samples();
    let page = page(&s);
    // The same request, other orders, a default spelled out.
    let named = Query::permit_search(&s.state)
        .size(3)
        .window(&s.permit_from, &s.permit_to)
        .include_count(false);
    let asked = Query::new("/v2/permits/search")
        .param("permit_to", &s.permit_to)
        .param("size", 3)
        .param("include_count", 0)
        .param("permit_from", &s.permit_from)
        .param("geo_id", &s.state);
    assert_eq!(
        (named.cache_key(), asked.cache_key()),
        (page.cache_key(), page.cache_key())
    );
    let other = Query::distinct(&s, 1).size(3);
    alpha.get(&page).await.expect_status(StatusCode::OK);
    alpha.get(&other).await.expect_status(StatusCode::OK);
    assert_eq!(upstream_requests(&sim), 2);

    let purged = Client::admin(gw.admin_url())
        .post(format!("/admin/cache/purge?{}", request_param(&named)))
        .await;
    assert_eq!(purged.status, StatusCode::OK, "{}", purged.text());
    let body = purged.json();
    assert_eq!(body["purged"], "request");
    assert_eq!(
        body["request"].as_str(),
        page.cache_key().strip_prefix("k1 "),
        "as keyed"
    );
    let dropped = &body["dropped"];
    assert!(dropped["memory"].as_u64() >= Some(1), "{body}");
    assert_eq!(
        (&dropped["redis"], &dropped["disk"]),
        (&dropped["memory"], &dropped["memory"]),
        "{body}"
    );

    let again = alpha.get(&asked).await;
    assert_eq!((again.x_cache(), again.credits_request()), (Some("MISS"), Some(3)));
    assert_eq!(
        alpha.get(&page).await.x_cache(),
        Some("HIT"),
        "bought once, for every spelling"
    );
    let kept = alpha.get(&other).await;
    assert_eq!((kept.x_cache(), kept.credits_request()), (Some("HIT"), Some(0)));
    assert_eq!(
        upstream_requests(&sim),
        3,
        "the purged answer bought again, once; nothing else"
    );
}

#[tokio::test]
async fn one_record_is_purged_alone() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let page = page(&sim.samples());
    let ids = ids_of(&alpha.get(&page).await.expect_status(StatusCode::OK));
    let lookup = |id: &str| alpha.get(Query::permits_by_id(&[id]));
    assert_eq!(lookup(&ids[0]).await.x_cache(), Some("HIT"), "filed by the page");
    gw.app.cache.flush_disk().await;

    let purged = Client::admin(gw.admin_url())
        .post(format!("/admin/cache/purge?record={}", ids[0]))
        .await;
    assert_eq!(purged.status, StatusCode::OK, "{}", purged.text());
    assert_eq!(
        purged.json(),
        json!({"purged": "record", "record": ids[0], "redis_keys": 0, "disk": "purged",
            "dropped": {"memory": 1, "disk": 1}})
    );
    let bought = lookup(&ids[0]).await;
    assert_eq!((bought.x_cache(), bought.credits_request()), (Some("MISS"), Some(1)));
    assert_eq!(lookup(&ids[1]).await.x_cache(), Some("HIT"), "another record stays");
    assert_eq!(alpha.get(&page).await.x_cache(), Some("HIT"), "the page stays");
    assert_eq!(
        upstream_requests(&sim),
        2,
        "the purged record bought again; nothing else"
    );
}

/// The disk tier's folder made unusable between two starts (a file where
/// the folder was, which even root cannot write through): a purge cannot
/// reach the file, so it answers 503 saying so, after purging memory.
/// Once the file opens again it does hold the purged answer (what a 200
/// would have hidden); purged then, it answers 200 and the answer is gone.
#[tokio::test]
async fn a_purge_the_unusable_disk_tier_cannot_take_is_a_503_never_a_200() {
    let sim = start_sim(unlimited()).await;
    let dir = tempfile::tempdir().expect("tmp");
    let folder = dir.path().join("tier");
    let file = folder.join("cache.redb");
    let setup = Setup::new().with(move |c| c.cache.disk_path = Some(file.clone()));
    let config = config_file(dir.path(), &setup, &sim);
    let page = page(&sim.samples());
    let get = |gw: &ChildGateway| {
        let client = Client::new(gw.base_url(), ALPHA.1);
        let page = page.clone();
        async move { client.get(&page).await }
    };
    let purge = |gw: &ChildGateway| Client::admin(gw.admin_url()).post("/admin/cache/purge?route=permits_search");

    let mut gw = ChildGateway::spawn_file(&config, None);
    get(&gw).await.expect_status(StatusCode::OK);
    durable(&gw.admin_url(), 1.0).await;
    gw.signal("TERM");
    gw.wait_exit(Duration::from_secs(30));

    let away = dir.path().join("tier.away");
    std::fs::rename(&folder, &away).expect("move the folder");
    std::fs::write(&folder, b"not a folder").expect("block it");
    let mut gw = ChildGateway::spawn_file(&config, None);
    assert_eq!(get(&gw).await.x_cache(), Some("MISS"), "no disk tier");
    let refused = purge(&gw).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{}", refused.text());
    let body = refused.json();
    assert_eq!(body["disk"], "unusable");
    assert_eq!(body["dropped"]["disk"], Value::Null);
    assert!(body["dropped"]["memory"].as_u64() >= Some(1), "{body}");
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("could not be opened")),
        "{body}"
    );
    assert_eq!(get(&gw).await.x_cache(), Some("MISS"), "memory was purged");
    gw.signal("TERM");
    gw.wait_exit(Duration::from_secs(30));

    std::fs::remove_file(&folder).expect("unblock");
    std::fs::rename(&away, &folder).expect("the folder back");
    let gw = ChildGateway::spawn_file(&config, None);
    assert_eq!(
        get(&gw).await.x_cache(),
        Some("HIT"),
        "the file held what the 503 could not purge"
    );
    let purged = purge(&gw).await;
    assert_eq!(purged.status, StatusCode::OK, "{}", purged.text());
    assert_eq!(purged.json()["disk"], "purged");
    assert_eq!(get(&gw).await.x_cache(), Some("MISS"));
    assert_eq!(upstream_requests(&sim), 4, "bought at each MISS, never at a HIT");
}
