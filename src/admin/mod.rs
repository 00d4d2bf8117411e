//! The admin listener: `/metrics`, `/healthz`, `/readyz`, and `/admin/*`
//! behind a bearer token (`/metrics` too with `admin.metrics_auth`). A
//! separate socket from team traffic, so it can be kept off the team network
//! entirely. Its errors are [`GatewayError`]s, turned into responses by the
//! same one mapping as the team port's. An `/admin/*` call with a query
//! parameter its endpoint does not take is refused before it acts
//! ([`params`]); the cache purge and what it answers are [`purge`]'s.

mod params;
mod purge;

use crate::app::App;
use crate::error::{GatewayError, Violation};
use crate::http_util::{bytes_response, json_response, Body};
use crate::ledger;
use crate::metrics::LedgerOp;
use crate::scheduler::Asker;
use http::header::AUTHORIZATION;
use http::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;

pub(crate) async fn handle<B>(app: Arc<App>, req: Request<B>) -> Response<Body> {
    let started = std::time::Instant::now();
    let response = route(&app, &req).await.unwrap_or_else(GatewayError::into_response);
    access_line(req.method(), req.uri().path(), response.status(), started.elapsed());
    response
}

/// The admin endpoints, by path: what an access line may name (any other
/// path is written `other`, so a caller cannot write into the log).
const ENDPOINTS: [&str; 8] = [
    "/admin/teams",
    "/admin/usage.csv",
    "/admin/ledger/backup",
    "/admin/cache/purge",
    "/admin/reload",
    "/metrics",
    "/healthz",
    "/readyz",
];

/// One access line (target `access`, message `admin`) for every call to
/// `/admin/*` and every refused credential: who (`admin`, the one admin
/// token, or `unauthenticated`), what (method and endpoint), the status and
/// the time taken. Never the token, the query or a body. Probes and
/// scrapes that pass are not written: they come every few seconds and
/// change nothing.
fn access_line(method: &Method, path: &str, status: StatusCode, took: std::time::Duration) {
    let refused = status == StatusCode::UNAUTHORIZED;
    if !refused && !path.starts_with("/admin/") {
        return;
    }
    let endpoint = ENDPOINTS.iter().find(|e| **e == path).copied().unwrap_or("other");
    let who = if refused { "unauthenticated" } else { "admin" };
    let duration_ms = took.as_micros() as f64 / 1000.0;
    let status = status.as_u16();
    if refused {
        tracing::warn!(target: "access", who, method = %method, path = endpoint, status, duration_ms, "admin");
    } else {
        tracing::info!(target: "access", who, method = %method, path = endpoint, status, duration_ms, "admin");
    }
}

async fn route<B>(app: &App, req: &Request<B>) -> Result<Response<Body>, GatewayError> {
    let path = req.uri().path();
    match (req.method(), path) {
        (&Method::GET, "/healthz") => Ok(json_response(StatusCode::OK, &json!({"status": "ok"}))),
        (&Method::GET, "/readyz") => Ok(readyz(app).await),
        (&Method::GET, "/metrics") => {
            // Team names and spend: optionally as guarded as /admin/*.
            if app.config.admin.metrics_auth {
                authorize(app, req)?;
            }
            app.cache.observe().await;
            observe_budgets(app).await;
            app.ledger
                .observe_org(&app.metrics, app.config.quota.org_credit_limit)
                .await;
            observe_gate(app);
            Ok(bytes_response(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                app.metrics.render().into(),
            ))
        }
        (_, p) if p.starts_with("/admin/") => {
            authorize(app, req)?;
            admin_route(app, req.method(), p, req.uri().query()).await
        }
        _ => Err(GatewayError::NotFound),
    }
}

/// Ready when every configured backend answers. A down cache Redis does not
/// stop traffic (the cache fails open) but is reported, so an operator sees it.
async fn readyz(app: &App) -> Response<Body> {
    let mut checks = serde_json::Map::new();
    let mut ready = true;
    if let Some(redis) = app.cache.redis() {
        let state = match redis.ping().await {
            Ok(()) => "ok".to_string(),
            Err(_) => format!("{} (serving from memory)", redis.unready_reason()),
        };
        checks.insert("cache_redis".into(), json!(state));
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

async fn admin_route(
    app: &App,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Result<Response<Body>, GatewayError> {
    let Some(takes) = params::taken_by(path) else {
        return Err(GatewayError::NotFound);
    };
    params::check(query, takes)?;
    match (method, path) {
        (&Method::POST, "/admin/cache/purge") => purge::purge(app, query).await,
        (&Method::GET, "/admin/teams") => Ok(teams(app).await),
        (&Method::GET, "/admin/usage.csv") => usage_csv(app, query).await,
        (&Method::GET, "/admin/ledger/backup") => ledger_backup(app).await,
        (&Method::POST, "/admin/reload") => match app.reload() {
            Ok(done) => Ok(json_response(
                StatusCode::OK,
                &json!({
                    "reloaded": true,
                    "teams": done.teams,
                    "applied": done.applied,
                    "restart_required": done.restart_required,
                }),
            )),
            Err(e) => {
                tracing::warn!(problems = %e.0.join("; "), "reload refused, the old teams stay");
                Err(GatewayError::ReloadRefused(e.0))
            }
        },
        _ => Err(GatewayError::NotFound),
    }
}

/// `Authorization: Bearer <token>` whose SHA-256 equals `admin.token_sha256`,
/// compared in constant time. Refused: no admin token configured, no
/// header, or more than one (like the team port: a proxy in front may have
/// added one, and which one wins must not be a guess).
fn authorize<B>(app: &App, req: &Request<B>) -> Result<(), GatewayError> {
    let expected = app
        .config
        .admin
        .token_sha256
        .as_ref()
        .ok_or(GatewayError::InvalidCredential)?;
    let mut values = req.headers().get_all(AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(GatewayError::InvalidCredential);
    };
    let token = value
        .to_str()
        .ok()
        .and_then(crate::auth::bearer_token)
        .ok_or(GatewayError::InvalidCredential)?;
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    if bool::from(expected.matches(&digest)) {
        Ok(())
    } else {
        Err(GatewayError::InvalidCredential)
    }
}

/// Every team's spend in its window, refreshed at scrape time so the gauge
/// is right for idle and unlimited teams too.
async fn observe_budgets(app: &App) {
    let teams = app.teams.load();
    app.metrics.reset_team_credits_used();
    for team in teams.iter() {
        match app.ledger.usage(&team.name).await {
            Ok(usage) => app.metrics.team_credits_used(&team.name, usage.used),
            Err(_) => app.metrics.ledger_error(LedgerOp::Usage),
        }
    }
}

/// Every team's pressure at the upstream's rate gate, at scrape time: its
/// calls waiting, the oldest wait and the wait a new call would meet (0
/// and the idle prediction for a team with none waiting).
fn observe_gate(app: &App) {
    let teams = app.teams.load();
    let weight_of = |name: &str| teams.by_name(name).map_or(1, |t| t.weight);
    let pressure = app.scheduler.pressure(weight_of);
    for team in teams.iter() {
        match pressure.iter().find(|(name, ..)| *name == team.name) {
            Some((_, waiting, oldest, predicted)) => {
                app.metrics.gate_pressure(&team.name, *waiting, *oldest, *predicted);
            }
            None => {
                let predicted = app.scheduler.predicted_wait(Asker::of(team, false));
                app.metrics
                    .gate_pressure(&team.name, 0, std::time::Duration::ZERO, predicted);
            }
        }
    }
}

/// `GET /admin/teams`: each team's budget and use in its window.
async fn teams(app: &App) -> Response<Body> {
    let window = app.ledger.window();
    let mut out = Vec::new();
    for team in app.teams.load().iter() {
        let used = app.ledger.usage(&team.name).await.map(|u| u.used).ok();
        let mut tokens = Vec::new();
        let mut apps_used = Some(0u64);
        for member in &team.members {
            let mut token = json!({
                "name": member.name,
                "not_after": member.not_after().and_then(crate::clock::rfc3339),
                "last_used": member.last_used().and_then(crate::clock::rfc3339),
                "credit_limit": member.credit_limit,
            });
            if let Some(account) = &member.account {
                let app_used = app.ledger.usage(account).await.map(|u| u.used).ok();
                apps_used = apps_used.zip(app_used).map(|(sum, u)| sum + u);
                token["used"] = json!(app_used);
            }
            tokens.push(token);
        }
        attribute_the_rest(&mut tokens, used, apps_used);
        out.push(json!({
            "name": team.name,
            "credit_limit": team.credit_limit,
            "used": used,
            "remaining": team.credit_limit.zip(used).map(|(l, u)| l.saturating_sub(u)),
            "window": window.as_str(),
            "requests_per_minute": team.requests_per_minute,
            "requests": team.requests.load(std::sync::atomic::Ordering::Relaxed),
            "tokens": tokens,
        }));
    }
    let org_limit = app.config.quota.org_credit_limit;
    let org_used = app.ledger.usage(ledger::ORG_ACCOUNT).await.map(|u| u.used).ok();
    let org = json!({
        "credit_limit": org_limit,
        "used": org_used,
        "remaining": org_limit.zip(org_used).map(|(l, u)| l.saturating_sub(u)),
    });
    json_response(StatusCode::OK, &json!({ "teams": out, "org": org }))
}

/// The apps' `used` made to add up to their team's, as usage.csv's rows
/// do (`ledger::export`): what the team's account holds beyond its apps'
/// (spend from before the team named its apps, on its one token of old,
/// and a removed app's) is the app `default`'s, added to that token's own
/// when the team has one, else listed as an app `default` with no token
/// (`not_after`, `last_used` and `credit_limit` null). Only for a team that
/// names its apps (their tokens have `used`), and only when every figure
/// was read.
fn attribute_the_rest(tokens: &mut Vec<Value>, team_used: Option<u64>, apps_used: Option<u64>) {
    let Some(rest) = team_used.zip(apps_used).map(|(t, a)| t.saturating_sub(a)) else {
        return;
    };
    if rest == 0 || !tokens.iter().any(|t| t.get("used").is_some()) {
        return;
    }
    let default = crate::config::DEFAULT_APP;
    match tokens.iter_mut().find(|t| t["name"] == default) {
        Some(token) => token["used"] = json!(token["used"].as_u64().unwrap_or(0) + rest),
        None => tokens.push(json!({
            "name": default,
            "not_after": null,
            "last_used": null,
            "credit_limit": null,
            "used": rest,
        })),
    }
}

/// `GET /admin/usage.csv?from=YYYY-MM-DD&to=YYYY-MM-DD` (default: the last
/// 30 days): credits spent and saved per team, day, route and app, for
/// chargeback (its columns: `ledger::export`).
async fn usage_csv(app: &App, query: Option<&str>) -> Result<Response<Body>, GatewayError> {
    let today = app.ledger.today();
    let day = |name: &'static str, default: u32| -> Result<u32, GatewayError> {
        match query_param(query, name) {
            None => Ok(default),
            Some(v) => chrono::NaiveDate::parse_from_str(&v, "%Y-%m-%d")
                .map(ledger::day_of)
                .map_err(|_| {
                    let why = "Input should be a valid date in the format YYYY-MM-DD";
                    GatewayError::InvalidQuery(vec![Violation::new("date_parsing", name, why, Value::String(v), None)])
                }),
        }
    };
    let (from, to) = (day("from", today.saturating_sub(29))?, day("to", today)?);
    // The teams' accounts, and their apps' where a team names its apps.
    let accounts: Vec<String> = app
        .teams
        .load()
        .iter()
        .flat_map(|t| std::iter::once(t.name.clone()).chain(t.members.iter().filter_map(|a| a.account.clone())))
        .collect();
    let rows = app.ledger.rows(&accounts, from, to).await.map_err(|e| {
        tracing::error!(error = %e, "usage.csv: ledger read failed");
        GatewayError::Unavailable("Credit ledger unavailable")
    })?;
    let csv = ledger::export::usage_csv(rows, crate::config::DEFAULT_APP);
    Ok(bytes_response(StatusCode::OK, "text/csv; charset=utf-8", csv.into()))
}

/// `GET /admin/ledger/backup`: the file ledger as of its last commit,
/// copied while it runs (`ledger::file::backup`): a redb file to restore
/// as `ledger.redb`. One access line says who took it.
async fn ledger_backup(app: &App) -> Result<Response<Body>, GatewayError> {
    let Some(copy) = app.ledger.backup().await else {
        return Err(GatewayError::BadRequest(
            "The credit ledger is in Redis (quota.store = \"redis\"): back it up with Redis's persistence (docs/operations.md)",
        ));
    };
    let bytes = copy.map_err(|e| {
        tracing::error!(error = %e, "ledger backup failed");
        GatewayError::Unavailable("Credit ledger backup failed")
    })?;
    tracing::info!(bytes = bytes.len(), "ledger backup taken");
    let mut response = bytes_response(StatusCode::OK, "application/octet-stream", bytes.into());
    response.headers_mut().insert(
        hyper::header::CONTENT_DISPOSITION,
        hyper::header::HeaderValue::from_static("attachment; filename=\"ledger.redb\""),
    );
    Ok(response)
}

/// The first value of a query parameter, decoded.
fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query
        .into_iter()
        .flat_map(|q| form_urlencoded::parse(q.as_bytes()))
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}
