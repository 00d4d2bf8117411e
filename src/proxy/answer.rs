//! Shaping what a team receives from what the upstream said: the team's view
//! of credits, the org's headers removed, upstream failures mapped.

use super::context::{CacheState, RequestLog};
use super::fetch::Fetch;
use crate::app::App;
use crate::auth::Team;
use crate::error::GatewayError;
use crate::http_util::{json_response, Body};
use crate::ledger::date_of;
use crate::upstream::{retry_after, UpstreamResponse};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, ETAG, SERVER, SET_COOKIE};
use http::{Response, StatusCode};
use http_body_util::Full;
use serde_json::json;

pub const X_CREDITS_REQUEST: HeaderName = HeaderName::from_static("x-credits-request");
pub const X_CREDITS_LIMIT: HeaderName = HeaderName::from_static("x-credits-limit");
pub const X_CREDITS_REMAINING: HeaderName = HeaderName::from_static("x-credits-remaining");
pub const X_CACHE: HeaderName = HeaderName::from_static("x-cache");

/// More than any one call can cost (100 records a page): a header above
/// this is a fault, and the records are counted instead.
const MAX_PLAUSIBLE_CREDITS: u64 = 10_000;

/// Credits the upstream charged for this answer: its `X-Credits-Request`,
/// else (missing, malformed or absurd, on a metered route) the number of
/// records in the page.
pub fn credits_charged(resp: &UpstreamResponse, metered: bool) -> u64 {
    if resp.status != StatusCode::OK {
        return 0;
    }
    let header = resp
        .headers
        .get(X_CREDITS_REQUEST)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|n| *n <= MAX_PLAUSIBLE_CREDITS);
    match header {
        Some(n) => n,
        None if metered => count_items(&resp.body),
        None => 0,
    }
}

/// Records in a page envelope; 0 when the body is not one.
pub fn count_items(body: &[u8]) -> u64 {
    #[derive(serde::Deserialize)]
    struct Page {
        items: Vec<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Page>(body).map_or(0, |p| p.items.len() as u64)
}

/// Whether an upstream answer is a failure that a stale entry may replace:
/// rate-limited, out of credits, or broken.
pub fn is_failure(status: StatusCode) -> bool {
    matches!(status.as_u16(), 402 | 429 | 500..=599)
}

/// The team's response for an upstream answer; `charged` is what this team
/// pays for it (0 for a coalesced follower).
pub fn from_fetch(
    fetch: &Fetch,
    charged: u64,
    state: CacheState,
    log: &RequestLog,
) -> Result<Response<Body>, GatewayError> {
    match fetch.status.as_u16() {
        // Our key was refused: the gateway's problem, not the team's token.
        401 | 403 => {
            tracing::error!(request_id = %log.request_id, status = fetch.status.as_u16(), "upstream refused the gateway's key");
            return Err(GatewayError::UpstreamUnavailable);
        }
        429 => {
            let secs = retry_after(&fetch.headers).map_or(1, |d| d.as_secs());
            return Err(GatewayError::UpstreamRateLimited { retry_after_secs: secs });
        }
        500..=599 => return Err(GatewayError::UpstreamUnavailable),
        _ => {}
    }
    let mut resp = Response::new(Full::new(fetch.body.clone()));
    *resp.status_mut() = fetch.status;
    let headers = resp.headers_mut();
    if fetch.from_peer {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    } else {
        *headers = fetch.headers.clone();
    }
    // The org's numbers are not the team's business; the team's own are set later.
    for name in [
        X_CREDITS_REQUEST,
        X_CREDITS_LIMIT,
        X_CREDITS_REMAINING,
        CONTENT_LENGTH,
        SERVER,
        SET_COOKIE,
    ] {
        headers.remove(name);
    }
    if fetch.status == StatusCode::OK {
        // Like the upstream: free endpoints carry no credit headers.
        if log.route.is_some_and(|r| r.is_metered()) {
            headers.insert(X_CREDITS_REQUEST, HeaderValue::from(charged));
        }
        if let Some(Ok(etag)) = fetch.etag.as_deref().map(HeaderValue::from_str) {
            headers.insert(ETAG, etag);
        }
    }
    headers.insert(X_CACHE, HeaderValue::from_static(state.header()));
    Ok(resp)
}

/// `GET /v2/usage` for one team, in the upstream's usage shape.
pub async fn usage(app: &App, team: &Team) -> Result<Response<Body>, GatewayError> {
    let usage = app.ledger.usage(&team.name).await.map_err(|e| {
        app.metrics
            .backend_errors_total
            .with_label_values(&["ledger", "usage"])
            .inc();
        tracing::error!(team = %team.name, error = %e, "ledger usage failed");
        GatewayError::Unavailable("Credit ledger unavailable")
    })?;
    let window = app.ledger.window();
    let over = team.credit_limit.is_some_and(|l| usage.used >= l);
    let daily: Vec<_> = usage
        .daily
        .iter()
        .map(|(day, credits)| {
            json!({
                "date": date_of(*day).to_string(),
                "credits": credits,
                "expires": date_of(window.expires(*day)).to_string(),
            })
        })
        .collect();
    // When over the limit: the day the oldest spend leaves the window.
    let available_at = over
        .then(|| {
            usage
                .daily
                .first()
                .map(|(d, _)| date_of(window.expires(*d)).to_string())
        })
        .flatten();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "credits_used": usage.used,
            "credit_limit": team.credit_limit,
            "is_over_limit": over,
            "available_at": available_at,
            "daily_usage": daily,
            "window": window.as_str(),
        }),
    ))
}

/// `X-Credits-Limit` and `X-Credits-Remaining` from the team's budget, and
/// the used-credits gauge. A ledger that cannot answer just leaves them out.
pub async fn team_budget_headers(app: &App, team: &str, headers: &mut http::HeaderMap) {
    let Some(limit) = app.teams.load().by_name(team).and_then(|t| t.credit_limit) else {
        return;
    };
    let Ok(used) = app.ledger.used(team).await else {
        app.metrics
            .backend_errors_total
            .with_label_values(&["ledger", "usage"])
            .inc();
        return;
    };
    app.metrics
        .team_credits_used
        .with_label_values(&[team])
        .set(i64::try_from(used).unwrap_or(i64::MAX));
    headers.insert(X_CREDITS_LIMIT, HeaderValue::from(limit));
    headers.insert(X_CREDITS_REMAINING, HeaderValue::from(limit.saturating_sub(used)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::HeaderMap;

    fn resp(status: u16, headers: &[(&'static str, &'static str)], body: &'static str) -> UpstreamResponse {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, HeaderValue::from_static(v));
        }
        UpstreamResponse {
            status: StatusCode::from_u16(status).unwrap(),
            headers: h,
            body: Bytes::from_static(body.as_bytes()),
        }
    }

    #[test]
    fn credits_come_from_the_header_else_from_the_records() {
        let page = r#"{"items":[{},{},{}],"size":3}"#;
        assert_eq!(
            credits_charged(&resp(200, &[("x-credits-request", "7")], page), true),
            7
        );
        for absurd in ["abc", "-5", "99999999999999999999", "5000000"] {
            let r = resp(200, &[("x-credits-request", absurd)], page);
            assert_eq!(credits_charged(&r, true), 3, "{absurd}");
        }
        assert_eq!(
            credits_charged(&resp(200, &[], page), true),
            3,
            "missing header: count records"
        );
        assert_eq!(
            credits_charged(&resp(200, &[], page), false),
            0,
            "free endpoints send no credit headers"
        );
        assert_eq!(
            credits_charged(&resp(422, &[("x-credits-request", "7")], page), true),
            0
        );
    }
}
