//! The admin listener's guard and answers: one bearer token (never two),
//! `/metrics` optionally behind it, errors in the upstream's body shapes,
//! and counters that survive a reload.

use crate::support::client::Client;
use crate::support::gateway::{FromFile, Setup, ADMIN_TOKEN, ALPHA, BETA};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited};
use http::StatusCode;
use serde_json::json;

#[tokio::test]
async fn a_duplicated_authorization_header_is_refused_with_401() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let anonymous = Client::anonymous(gw.admin_url());
    let teams = || anonymous.get("/admin/teams");
    let good = format!("Bearer {ADMIN_TOKEN}");
    assert_eq!(teams().header("authorization", &good).await.status, StatusCode::OK);
    // The right token first or second: neither is guessed at.
    for pair in [
        [good.as_str(), "Bearer nope"],
        ["Bearer nope", good.as_str()],
        [good.as_str(), good.as_str()],
    ] {
        let r = teams()
            .header("authorization", pair[0])
            .header("authorization", pair[1])
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{pair:?}");
        assert_eq!(r.json(), json!({"detail": "Not authenticated"}));
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
}

#[tokio::test]
async fn metrics_need_the_admin_token_when_metrics_auth_is_on() {
    let sim = start_sim(unlimited()).await;
    let open = Setup::new().start(&sim).await;
    assert_eq!(
        Client::anonymous(open.admin_url()).get("/metrics").await.status,
        StatusCode::OK
    );
    let guarded = Setup::new().with(|c| c.admin.metrics_auth = true).start(&sim).await;
    let anonymous = Client::anonymous(guarded.admin_url());
    let refused = anonymous.get("/metrics").await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.json(), json!({"detail": "Not authenticated"}));
    assert!(!refused.text().contains("gateway_"), "metrics leaked in a 401");
    let wrong = anonymous.get("/metrics").header("authorization", "Bearer nope").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let ok = Client::admin(guarded.admin_url()).get("/metrics").await;
    assert_eq!(ok.status, StatusCode::OK);
    assert!(ok.text().contains("gateway_build_info"));
    // Probes stay open.
    for probe in ["/healthz", "/readyz"] {
        let r = anonymous.get(probe).await;
        assert_eq!(r.status, StatusCode::OK, "{probe}");
    }
}

#[tokio::test]
async fn admin_errors_keep_their_status_and_body_shapes() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let admin = Client::admin(gw.admin_url());
    let missing = Client::anonymous(gw.admin_url()).get("/admin/teams").await;
    assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
    assert_eq!(missing.json(), json!({"detail": "Not authenticated"}));
    assert_eq!(missing.header("www-authenticate"), Some("Bearer"));
    for path in ["/nope", "/admin/nope"] {
        let r = admin.get(path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(r.json(), json!({"detail": "Not Found"}), "{path}");
    }
    let purge = admin.post("/admin/cache/purge?route=nope").await;
    assert_eq!(purge.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        purge.json(),
        json!({"detail": [{"type": "enum", "loc": ["query", "route"], "msg": "not a route name", "input": "nope"}]})
    );
    let csv = admin.get("/admin/usage.csv?to=tomorrow").await;
    assert_eq!(csv.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        csv.json(),
        json!({"detail": [{"type": "date_parsing", "loc": ["query", "to"], "msg": "Input should be a valid date in the format YYYY-MM-DD", "input": "tomorrow"}]})
    );
    assert_eq!(csv.header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn team_request_counters_survive_a_reload() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[ALPHA]);
    let file = FromFile::start(&setup, &sim).await;
    let gw = &file.gw;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    for _ in 0..3 {
        assert_eq!(alpha.get(Query::meta_release()).await.status, StatusCode::OK);
    }
    let requests = |teams: serde_json::Value, name: &str| {
        teams["teams"]
            .as_array()
            .expect("teams")
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["requests"].clone())
    };
    let teams = || Client::admin(gw.admin_url()).get("/admin/teams");
    assert_eq!(requests(teams().await.json(), "alpha"), Some(json!(3)));
    let setup = setup.teams(&[ALPHA, BETA]).credit_limit(ALPHA, 50);
    file.rewrite(&setup, &sim);
    let reload = file.reload().await;
    assert_eq!(reload.status, StatusCode::OK, "{}", reload.text());
    assert_eq!(alpha.get(Query::meta_release()).await.status, StatusCode::OK);
    let after = teams().await.json();
    assert_eq!(requests(after.clone(), "alpha"), Some(json!(4)), "reset by the reload");
    assert_eq!(requests(after, "beta"), Some(json!(0)));
    // A config that does not load: every problem, in a 422.
    std::fs::write(&file.path, "[server]\nlisten = 1\n").expect("break");
    let refused = file.reload().await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    let problems = refused.json()["detail"].as_array().expect("a list of problems").clone();
    assert!(
        !problems.is_empty() && problems.iter().all(|p| p.is_string()),
        "{problems:?}"
    );
}
