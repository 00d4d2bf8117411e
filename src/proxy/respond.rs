//! The one place a team's answer is made, whether it comes from the cache
//! ([`from_cache`]: HIT, STALE) or from a fetch ([`from_fetched`]: MISS,
//! BYPASS, or a follower's HIT; the pipeline's [`respond`](super::respond)):
//! what the team pays for it, what it saved ([`saved`]), and the answer's
//! shape. Pages, answers built from held pieces (`reuse`), covered answers (`covered`) and stale
//! copies all answer through here.
//!
//! Only an allow-list of the upstream's response headers reaches a team:
//! `Content-Type` and `Retry-After` (clamped) on passed-through errors; on a
//! 200 the gateway writes every header itself. So a HIT, a MISS and a STALE
//! answer of one key carry the same header names, and nothing the upstream
//! adds (`Set-Cookie`, `Location`, CORS, HSTS, its own credit headers, a
//! header that might echo a secret) reaches a team.

use super::answered::{Answered, CacheState};
use super::context::RequestContext;
use super::fetch::Role;
use super::flight::Fetched;
use crate::app::App;
use crate::auth::{Member, Team};
use crate::cache::Entry;
use crate::clock::coarse_now_ms;
use crate::error::GatewayError;
use crate::http_util::{number_header, Body};
use crate::metrics::SavedReason;
use crate::route::Target;
use crate::upstream::retry_after;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, AGE, CONTENT_TYPE, ETAG, IF_NONE_MATCH, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::sync::Arc;
use std::time::Duration;

const X_CACHE: HeaderName = HeaderName::from_static("x-cache");
/// The vendor's data release an answer came from (`cache::release`).
pub(super) const X_DATA_RELEASE: HeaderName = HeaderName::from_static("x-data-release");

/// `X-Data-Release` on a 200 or 304 of a cached route, once a release is
/// known: the held answer's release (`ctx.release`), else the current one
/// (bought now).
pub(super) fn data_release_header(app: &App, resp: &mut Response<Body>, ctx: &RequestContext) {
    let status = resp.status();
    if !(status == StatusCode::OK || status == StatusCode::NOT_MODIFIED) {
        return;
    }
    if ctx.route.is_none_or(|r| app.cache.ttl(r).is_none()) {
        return;
    }
    let day = match ctx.release {
        0 => app.cache.release.stamp(),
        day => day,
    };
    if day != 0 {
        if let Ok(v) = HeaderValue::from_str(&crate::cache::release::date_of(day)) {
            resp.headers_mut().insert(X_DATA_RELEASE, v);
        }
    }
}

/// Headers of a 200 answer: Content-Type, X-Cache, Age, ETag,
/// X-Credits-Request, X-Credits-Limit, X-Credits-Remaining, X-Request-Id.
const ANSWER_HEADERS: usize = 8;

/// A 200 answer: the same header names whatever its cache state (what
/// the team paid for it, `X-Credits-Request`, is written with its budget
/// where every answer ends: `proxy::finish`).
fn ok(body: Bytes, etag: Option<&HeaderValue>, age_secs: u64, state: CacheState) -> Response<Body> {
    let mut resp = Response::new(Full::new(body));
    // Room for every header of a 200 (these, the budget's, the request id):
    // one allocation instead of the map growing twice.
    *resp.headers_mut() = HeaderMap::with_capacity(ANSWER_HEADERS);
    let h = resp.headers_mut();
    // Every 200 the gateway passes on was checked to be JSON.
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    common(h, etag, age_secs, state);
    resp
}

fn common(h: &mut HeaderMap, etag: Option<&HeaderValue>, age_secs: u64, state: CacheState) {
    h.insert(X_CACHE, HeaderValue::from_static(state.header()));
    h.insert(AGE, number_header(age_secs));
    if let Some(etag) = etag {
        h.insert(ETAG, etag.clone());
    }
}

/// A response from a cached entry: the team pays nothing and saves what the
/// entry cost, for why `answered` says (one the disk tier held and memory
/// did not saves under `reason="disk"`, one held past its route TTL by
/// release-bound freshness under `reason="release"`).
pub(super) fn from_cache<B>(
    app: &App,
    team: &Team,
    target: &Target,
    entry: &Entry,
    answered: Answered,
    req: &Request<B>,
    ctx: &mut RequestContext,
) -> Response<Body> {
    ctx.answered = answered;
    ctx.release = app.cache.release.of(entry);
    let ttl = app.cache.ttl(target.route).unwrap_or_default();
    let reason = match answered {
        Answered::Held(_) if app.cache.release.kept_by_release(entry, ttl, coarse_now_ms()) => SavedReason::Release,
        _ => answered.saved_reason(),
    };
    saved_because(app, (team, ctx.member.as_deref()), target, entry.credits, reason);
    from_entry(entry, answered.cache(), ctx.conditional.then(|| req.headers()))
}

/// The response for a fetch: the leader pays what the upstream charged;
/// followers and answers found in the cache are free (saved).
pub(super) fn from_fetched(
    app: &App,
    team: &Team,
    target: &Target,
    fetched: Arc<Fetched>,
    role: Role,
    no_cache: bool,
    ctx: &mut RequestContext,
) -> Result<Response<Body>, GatewayError> {
    let answered = match role {
        // The only answer from no call that is not a 200: a kept refusal.
        _ if fetched.from_cache && fetched.status != StatusCode::OK => Answered::KeptRefusal,
        Role::Leader if fetched.from_cache => Answered::Follower,
        Role::Leader if no_cache => Answered::Refetched,
        Role::Leader => Answered::Bought,
        Role::Follower => Answered::Follower,
    };
    if role == Role::Follower || fetched.from_cache {
        app.metrics.coalesced(target.route);
        saved(app, (team, ctx.member.as_deref()), target, fetched.worth);
    }
    ctx.answered = answered;
    ctx.charge(super::fetch::charged(&Ok(fetched.clone()), role));
    let max_retry_after = Duration::from_secs(app.config.upstream.max_retry_after_secs);
    fetched_answer(&fetched, answered.cache(), max_retry_after)
}

/// Credits a team did not spend because an answer was held: its metrics
/// and its chargeback rows (its app's too, when the team names its apps).
pub(super) fn saved(app: &App, who: Who<'_>, target: &Target, credits: u64) {
    saved_because(app, who, target, credits, SavedReason::Cache);
}

/// The team, and the app when known, a saving is counted for.
pub(super) type Who<'a> = (&'a Team, Option<&'a Member>);

/// [`saved`], by why ([`SavedReason`]: a disk-tier copy, a monthly window).
pub(super) fn saved_because(app: &App, (team, member): Who<'_>, target: &Target, credits: u64, reason: SavedReason) {
    if credits > 0 {
        app.metrics
            .credits_saved_because(&team.name, target.route, credits, reason);
        app.ledger.record_saved(&team.name, target.route, credits);
        if let Some(account) = member.and_then(|m| m.account.as_deref()) {
            app.ledger.record_saved(account, target.route, credits);
        }
    }
}

/// The answer from a cached entry (HIT or STALE): 0 credits for the team,
/// and 304 when the client already has this body. `conditional`: the
/// request's headers when it sent `If-None-Match` (`None`: it did not).
pub(super) fn from_entry(entry: &Entry, state: CacheState, conditional: Option<&HeaderMap>) -> Response<Body> {
    // Whole seconds: the coarse clock is close enough.
    let age = entry.age(coarse_now_ms()).as_secs();
    if !conditional.is_some_and(|h| client_has(h, entry.etag.as_bytes())) {
        return ok(entry.body.clone(), Some(&entry.etag), age, state);
    }
    let mut resp = Response::new(Full::default());
    *resp.status_mut() = StatusCode::NOT_MODIFIED;
    common(resp.headers_mut(), Some(&entry.etag), age, state);
    resp
}

/// `If-None-Match` names this body (or `*`).
fn client_has(request_headers: &HeaderMap, etag: &[u8]) -> bool {
    request_headers
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|tag| {
            let tag = tag.trim();
            tag == "*" || tag.trim_start_matches("W/").as_bytes() == etag
        })
}

/// The shape of a fetch's answer. Upstream error statuses never get here: they became
/// [`GatewayError`]s where the fetch returned (`GatewayError::of_upstream_status`);
/// a free answer passed on keeps the upstream's `Retry-After`, clamped to
/// `max_retry_after`.
fn fetched_answer(
    fetched: &Fetched,
    state: CacheState,
    max_retry_after: Duration,
) -> Result<Response<Body>, GatewayError> {
    if fetched.status == StatusCode::OK {
        return Ok(ok(fetched.body.clone(), fetched.etag.as_ref(), 0, state));
    }
    // An answer the upstream gave for free (404, 422, 402, ...): its body
    // and the allow-listed headers only.
    let mut resp = Response::new(Full::new(fetched.body.clone()));
    *resp.status_mut() = fetched.status;
    let h = resp.headers_mut();
    if let Some(ct) = fetched.headers.get(CONTENT_TYPE) {
        h.insert(CONTENT_TYPE, ct.clone());
    }
    if let Some(wait) = retry_after(&fetched.headers, max_retry_after) {
        h.insert(RETRY_AFTER, HeaderValue::from(wait.as_secs()));
    }
    h.insert(X_CACHE, HeaderValue::from_static(state.header()));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Route;

    fn entry() -> Entry {
        Entry::new(
            Bytes::from_static(b"{}"),
            3,
            Duration::from_secs(60),
            Route::PermitsSearch,
        )
    }

    #[test]
    fn if_none_match_gets_304() {
        let e = entry();
        let mut h = HeaderMap::new();
        h.insert(IF_NONE_MATCH, e.etag.clone());
        assert_eq!(
            from_entry(&e, CacheState::Hit, Some(&h)).status(),
            StatusCode::NOT_MODIFIED
        );
        h.insert(IF_NONE_MATCH, HeaderValue::from_static("\"other\""));
        assert_eq!(from_entry(&e, CacheState::Hit, Some(&h)).status(), StatusCode::OK);
    }

    #[test]
    fn a_fetched_200_carries_the_gateway_headers_only() {
        let mut upstream = HeaderMap::new();
        for (k, v) in [
            ("location", "https://evil.example"),
            ("set-cookie", "a=b"),
            ("access-control-allow-origin", "*"),
            ("age", "99999"),
            ("x-credits-remaining", "123"),
            ("content-type", "application/json; charset=utf-8"),
        ] {
            upstream.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let fetched = Fetched {
            status: StatusCode::OK,
            headers: upstream,
            body: Bytes::from_static(b"{}"),
            credits: 3,
            bill: Some(3),
            worth: 3,
            from_cache: false,
            etag: Some(entry().etag),
        };
        let miss = fetched_answer(&fetched, CacheState::Miss, Duration::from_secs(120)).unwrap();
        let hit = from_entry(&entry(), CacheState::Hit, None);
        let names = |h: &HeaderMap| {
            let mut n: Vec<String> = h.keys().map(|k| k.to_string()).collect();
            n.sort();
            n
        };
        assert_eq!(names(miss.headers()), names(hit.headers()));
        assert_eq!(miss.headers()[AGE], "0");
    }
}
