//! The admin listener: `/metrics`, `/healthz`, `/readyz`, and `/admin/*`
//! behind a bearer token. A separate socket from team traffic, so it can be
//! kept off the team network entirely.

use crate::app::App;
use crate::http_util::{bytes_response, json_response, Body};
use crate::route::Route;
use http::header::AUTHORIZATION;
use http::{Method, Request, Response, StatusCode};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use subtle::ConstantTimeEq;

pub async fn handle<B>(app: Arc<App>, req: Request<B>) -> Response<Body> {
    let path = req.uri().path();
    match (req.method(), path) {
        (&Method::GET, "/healthz") => json_response(StatusCode::OK, &json!({"status": "ok"})),
        (&Method::GET, "/readyz") => readyz(&app).await,
        (&Method::GET, "/metrics") => {
            app.cache.observe();
            observe_budgets(&app).await;
            bytes_response(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                app.metrics.render().into(),
            )
        }
        (_, p) if p.starts_with("/admin/") => {
            if !authorized(&app, &req) {
                let mut resp = json_response(StatusCode::UNAUTHORIZED, &json!({"detail": "Not authenticated"}));
                resp.headers_mut()
                    .insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
                return resp;
            }
            admin_route(&app, req.method(), p, req.uri().query()).await
        }
        _ => json_response(StatusCode::NOT_FOUND, &json!({"detail": "Not Found"})),
    }
}

/// Ready when every configured backend answers. A down cache Redis does not
/// stop traffic (the cache fails open) but is reported, so an operator sees it.
async fn readyz(app: &App) -> Response<Body> {
    let mut checks = serde_json::Map::new();
    let mut ready = true;
    if let Some(redis) = app.cache.redis() {
        let ok = redis.ping().await.is_ok();
        checks.insert(
            "cache_redis".into(),
            json!(if ok { "ok" } else { "unreachable (serving from memory)" }),
        );
    }
    checks.insert("config".into(), json!("ok"));
    let _ = &mut ready;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(
        status,
        &json!({"status": if ready { "ready" } else { "not ready" }, "checks": checks}),
    )
}

async fn admin_route(app: &App, method: &Method, path: &str, query: Option<&str>) -> Response<Body> {
    match (method, path) {
        (&Method::POST, "/admin/cache/purge") => purge(app, query).await,
        (&Method::GET, "/admin/teams") => {
            let teams: Vec<_> = app
                .teams
                .load()
                .iter()
                .map(|t| json!({"name": t.name, "credit_limit": t.credit_limit}))
                .collect();
            json_response(StatusCode::OK, &json!({ "teams": teams }))
        }
        _ => json_response(StatusCode::NOT_FOUND, &json!({"detail": "Not Found"})),
    }
}

/// `Authorization: Bearer <token>` whose SHA-256 equals `admin.token_sha256`,
/// compared in constant time. No admin token configured: always refused.
fn authorized<B>(app: &App, req: &Request<B>) -> bool {
    let Some(expected) = app.config.admin.token_sha256.as_deref() else {
        return false;
    };
    let Ok(expected) = hex::decode(expected) else {
        return false;
    };
    let token = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    let Some(token) = token else {
        return false;
    };
    let digest = Sha256::digest(token.as_bytes());
    bool::from(digest.as_slice().ct_eq(&expected))
}

/// `POST /admin/cache/purge[?route=NAME]`: both tiers, all or one route.
async fn purge(app: &App, query: Option<&str>) -> Response<Body> {
    let route_name = query
        .into_iter()
        .flat_map(|q| form_urlencoded::parse(q.as_bytes()))
        .find(|(k, _)| k == "route")
        .map(|(_, v)| v.into_owned());
    let route = match route_name.as_deref() {
        None => None,
        Some(name) => match Route::ALL.iter().find(|r| r.as_str() == name) {
            Some(r) => Some(*r),
            None => {
                return json_response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &json!({"detail": [{"type": "enum", "loc": ["query", "route"], "msg": "not a route name", "input": name}]}),
                )
            }
        },
    };
    let redis_keys = app.cache.purge(route).await;
    tracing::info!(route = route.map_or("all", Route::as_str), redis_keys, "cache purged");
    json_response(
        StatusCode::OK,
        &json!({"purged": route.map_or("all", Route::as_str), "redis_keys": redis_keys}),
    )
}

/// Every team's spend in its window, refreshed at scrape time so the gauge
/// is right for idle and unlimited teams too.
async fn observe_budgets(app: &App) {
    let teams = app.teams.load();
    app.metrics.team_credits_used.reset();
    for team in teams.iter() {
        if let Ok(usage) = app.ledger.usage(&team.name).await {
            let used = i64::try_from(usage.used).unwrap_or(i64::MAX);
            app.metrics.team_credits_used.with_label_values(&[&team.name]).set(used);
        }
    }
}
