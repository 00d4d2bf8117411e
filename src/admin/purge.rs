//! `POST /admin/cache/purge`: what to purge, read from the query, and an
//! answer that says what went from each tier. Exactly one of `all=true`
//! (everything, only when asked so), `route=NAME`, `request=PATH?QUERY`
//! (one answer: the request URL-encoded as one value, keyed as the team
//! port keys it) or `record=ID` (one record); none, or two, is a 422 that
//! lists the choices. An unknown or repeated parameter never gets here
//! (`params`). The purge itself is `cache::purge`'s.
//!
//! 200 only for a purge that cannot come back: 503 when the disk tier
//! could not take it (its file neither written nor moved aside, or
//! unusable since the start), after every other tier was purged.

use crate::app::App;
use crate::cache::disk::DiskPurged;
use crate::cache::key;
use crate::cache::purge::{Purged, Scope};
use crate::error::{GatewayError, Violation};
use crate::http_util::{json_response, Body};
use crate::route::{self, Route};
use http::{Response, StatusCode, Uri};
use serde_json::{json, Value};

/// The choices, as a 422 lists them.
const CHOICES: &str = "Say what to purge, one of: all=true (everything), route=NAME (one route), \
request=PATH?QUERY (one answer, URL-encoded as one value), record=ID (one record)";

pub(super) async fn purge(app: &App, query: Option<&str>) -> Result<Response<Body>, GatewayError> {
    let scope = scope_of(app, query)?;
    let purged = app.cache.purge(&scope).await;
    let what = name_of(&scope);
    let disk = purged.disk.map(DiskPurged::as_str);
    if purged.disk.is_some_and(DiskPurged::may_come_back) {
        tracing::warn!(
            purged = what,
            memory = purged.memory,
            redis_keys = purged.redis,
            disk,
            "cache purged but for the disk tier: the purge answers 503"
        );
    } else {
        tracing::info!(
            purged = what,
            memory = purged.memory,
            redis_keys = purged.redis,
            disk,
            "cache purged"
        );
    }
    Ok(answer(&scope, purged))
}

/// The one thing the query asks to purge.
fn scope_of(app: &App, query: Option<&str>) -> Result<Scope, GatewayError> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect();
    let (name, value) = match &pairs[..] {
        [one] => one,
        [] => return Err(refused("missing", "all", CHOICES, Value::Null)),
        [_, second, ..] => {
            let (name, value) = second.clone();
            return Err(refused("value_error", name, CHOICES, Value::String(value)));
        }
    };
    let input = || Value::String(value.clone());
    match name.as_str() {
        "all" if value == "true" => Ok(Scope::All),
        "all" => Err(refused(
            "value_error",
            "all",
            "all=true purges everything; nothing else is read",
            input(),
        )),
        "route" => Route::from_name(value)
            .map(Scope::Route)
            .ok_or_else(|| refused("enum", "route", "not a route name", input())),
        "request" => request_of(app, value).map(Scope::Request),
        "record" if !value.is_empty() => Ok(Scope::Record(value.clone())),
        "record" => Err(refused("string_too_short", "record", "a record's id", input())),
        // `params` lets no other name through.
        _ => Err(GatewayError::NotFound),
    }
}

/// A team request's target, read as the team port reads it (its route, its
/// canonical path): the answer to purge is the one filed under its key.
fn request_of(app: &App, value: &str) -> Result<route::Target, GatewayError> {
    let not = |why: &str| refused("value_error", "request", why, Value::String(value.to_string()));
    let uri: Uri = value
        .parse()
        .map_err(|_| not("Not a request target: send the path and query of a /v2 request, URL-encoded as one value"))?;
    match route::classify(&uri, app.config.server.max_uri_bytes) {
        Ok(target) if target.route != Route::Other => Ok(target),
        _ => Err(not(
            "No vendor operation answers this path: send the path and query of a /v2 request",
        )),
    }
}

fn refused(kind: &'static str, param: impl Into<String>, msg: &str, input: Value) -> GatewayError {
    GatewayError::InvalidQuery(vec![Violation::new(kind, param.into(), msg, input, None)])
}

/// What the answer's `purged` says: `all`, the route's name, `request` or
/// `record`.
fn name_of(scope: &Scope) -> &'static str {
    match scope {
        Scope::All => "all",
        Scope::Route(route) => route.as_str(),
        Scope::Request(_) => "request",
        Scope::Record(_) => "record",
    }
}

/// `{"purged", "redis_keys", "dropped": {tier: n}, "disk"}`, and what was
/// named (`request` as keyed, `record`); 503 with a `detail` when a
/// restart could serve the purged answers again.
fn answer(scope: &Scope, purged: Purged) -> Response<Body> {
    let mut dropped = serde_json::Map::new();
    if let Some(n) = purged.memory {
        dropped.insert("memory".into(), json!(n));
    }
    if let Some(n) = purged.redis {
        dropped.insert("redis".into(), json!(n));
    }
    if let Some(disk) = purged.disk {
        let n = match disk {
            DiskPurged::Committed(n) => Some(n),
            _ => None,
        };
        dropped.insert("disk".into(), json!(n));
    }
    let mut body = json!({
        "purged": name_of(scope),
        "redis_keys": purged.redis.unwrap_or(0),
        "dropped": dropped,
    });
    match scope {
        Scope::Request(target) => body["request"] = json!(keyed(target)),
        Scope::Record(id) => body["record"] = json!(id),
        Scope::All | Scope::Route(_) => {}
    }
    let Some(disk) = purged.disk else {
        return json_response(StatusCode::OK, &body);
    };
    body["disk"] = json!(disk.as_str());
    let detail = match disk {
        DiskPurged::Failed => "the disk tier could not record the purge nor move its file aside: a restart would serve the purged answers again; free the volume and purge again",
        DiskPurged::Unusable => "the disk tier could not be opened at start, so the purge could not reach its file (memory and Redis were purged): a start that opens the file would serve the purged answers again; delete the file before that start, or purge again right after it",
        DiskPurged::Committed(_) | DiskPurged::MovedAside => return json_response(StatusCode::OK, &body),
    };
    body["detail"] = json!(detail);
    json_response(StatusCode::SERVICE_UNAVAILABLE, &body)
}

/// The request as its cache key reads it: canonical path, normalized
/// query (what every spelling of it shares).
fn keyed(target: &route::Target) -> String {
    match target.query.as_deref().map(|q| key::normalize_query(target.route, q)) {
        Some(query) if !query.is_empty() => format!("{}?{query}", target.path),
        _ => target.path.to_string(),
    }
}
