//! The admin listener: `/metrics`, `/healthz`, `/readyz`, and `/admin/*`
//! behind a bearer token. A separate socket from team traffic, so it can be
//! kept off the team network entirely.

use crate::app::App;
use crate::http_util::{bytes_response, json_response, Body};
use crate::ledger;
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
            app.cache.observe().await;
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
    match app.ledger.check().await {
        Ok(note) => {
            checks.insert("ledger".into(), json!(note));
        }
        Err(e) => {
            // Fail closed: without a ledger no metered call can be budgeted.
            ready = app.config.quota.fail_open;
            checks.insert("ledger".into(), json!(e));
        }
    }
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
        (&Method::GET, "/admin/teams") => teams(app).await,
        (&Method::GET, "/admin/usage.csv") => usage_csv(app, query).await,
        (&Method::POST, "/admin/reload") => match app.reload() {
            Ok(n) => json_response(StatusCode::OK, &json!({"reloaded": true, "teams": n})),
            Err(e) => json_response(StatusCode::UNPROCESSABLE_ENTITY, &json!({"detail": e.0})),
        },
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
        .and_then(crate::auth::bearer_token);
    let Some(token) = token else {
        return false;
    };
    let digest = Sha256::digest(token.as_bytes());
    bool::from(digest.as_slice().ct_eq(&expected))
}

/// `POST /admin/cache/purge[?route=NAME]`: both tiers, all or one route.
async fn purge(app: &App, query: Option<&str>) -> Response<Body> {
    let route_name = query_param(query, "route");
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
        match app.ledger.usage(&team.name).await {
            Ok(usage) => {
                let used = i64::try_from(usage.used).unwrap_or(i64::MAX);
                app.metrics.team_credits_used.with_label_values(&[&team.name]).set(used);
            }
            Err(_) => app
                .metrics
                .backend_errors_total
                .with_label_values(&["ledger", "usage"])
                .inc(),
        }
    }
}

/// `GET /admin/teams`: each team's budget and use in its window.
async fn teams(app: &App) -> Response<Body> {
    let window = app.ledger.window();
    let mut out = Vec::new();
    for team in app.teams.load().iter() {
        let used = app.ledger.usage(&team.name).await.map(|u| u.used).ok();
        out.push(json!({
            "name": team.name,
            "credit_limit": team.credit_limit,
            "used": used,
            "remaining": team.credit_limit.zip(used).map(|(l, u)| l.saturating_sub(u)),
            "window": window.as_str(),
            "requests_per_minute": team.requests_per_minute,
            "requests": team.requests.load(std::sync::atomic::Ordering::Relaxed),
        }));
    }
    json_response(StatusCode::OK, &json!({ "teams": out }))
}

/// `GET /admin/usage.csv?from=YYYY-MM-DD&to=YYYY-MM-DD` (default: the last
/// 30 days): credits spent and saved per team, day and route, for chargeback.
async fn usage_csv(app: &App, query: Option<&str>) -> Response<Body> {
    let today = ledger::today();
    let day = |name: &str, default: u32| -> Result<u32, String> {
        match query_param(query, name) {
            None => Ok(default),
            Some(v) => chrono::NaiveDate::parse_from_str(&v, "%Y-%m-%d")
                .map(ledger::day_of)
                .map_err(|_| format!("{name}: expected YYYY-MM-DD")),
        }
    };
    let (from, to) = match (day("from", today.saturating_sub(29)), day("to", today)) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(e), _) | (_, Err(e)) => {
            return json_response(
                StatusCode::UNPROCESSABLE_ENTITY,
                &json!({"detail": [{"type": "date_parsing", "loc": ["query"], "msg": e}]}),
            )
        }
    };
    let names: Vec<String> = app.teams.load().iter().map(|t| t.name.clone()).collect();
    match app.ledger.rows(&names, from, to).await {
        Ok(rows) => {
            let mut csv = String::from("team,date,route,credits_spent,credits_saved\n");
            for r in rows {
                csv.push_str(&format!(
                    "{},{},{},{},{}\n",
                    r.team,
                    ledger::date_of(r.day),
                    r.route,
                    r.spent,
                    r.saved
                ));
            }
            bytes_response(StatusCode::OK, "text/csv; charset=utf-8", csv.into())
        }
        Err(e) => {
            tracing::error!(error = %e, "usage.csv: ledger read failed");
            json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"detail": "Credit ledger unavailable"}),
            )
        }
    }
}

/// The first value of a query parameter, decoded.
fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query
        .into_iter()
        .flat_map(|q| form_urlencoded::parse(q.as_bytes()))
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}
