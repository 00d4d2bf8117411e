//! The life of a team request, one phase per call, top to bottom, numbered
//! in the order the code runs them (the crate doc and the README list the
//! same order):
//!
//! 1. admit (method, framing, size) · 2. route · 3. authenticate ·
//! 4. team rate · 5. `/v2/usage` locally · 6. cache key · 7. lookup ·
//! 8. coalesce · 9. reserve · 10. fair queue · 11. forward · 12. settle ·
//! 13. store · 14. stale on upstream failure · 15. respond.
//!
//! [`handle`] is the service function of the team listener: it runs
//! [`pipeline`], turns an error into a response at the single rescue point,
//! and then records metrics and one access-log line for every request.
//!
//! # Layout
//! One concept per file; this file calls them, none of them calls it.
//! - [`context`]: what the phases share (the ask, the fetch job, the
//!   request context).
//! - [`revalidate`]: phase 7's verdict on a found entry, and the background
//!   refresh of stale-while-revalidate.
//! - [`spend`]: answers held by another key's page (7b), pages clamped to a
//!   team's remaining credits (8a).
//! - [`by_id`]: an id lookup, phases 7–15 record by record.
//! - [`fetch`]: phases 8–13; [`org_probe`] before 9 while the org is out of
//!   credits; [`credits`]: reserve, charge, settle.
//! - [`respond`]: phase 15, answering from the cache or from a fetch.
//! - [`usage`]: phase 5.

mod by_id;
mod context;
mod credits;
mod fetch;
mod monthly;
mod org_probe;
mod respond;
mod revalidate;
mod spend;
mod usage;

pub use context::CacheState;
use context::RequestContext;

use crate::app::App;
use crate::auth::Team;
use crate::cache::control::Directives;
use crate::cache::{key, parsed};
use crate::error::GatewayError;
use crate::http_util::{number_header, request_id, Body, X_REQUEST_ID};
use crate::metrics::Scope;
use crate::redis_backend::keys::Tag;
use crate::route::{self, Route, Target};
use crate::server::ConnectionMark;
use crate::telemetry::{trace::Trace, SPANS};
use context::Ask;
use http::{HeaderValue, Method, Request, Response};
use std::sync::Arc;
use std::time::Instant;

/// Answers one team request. Never fails: errors become responses here.
pub(crate) async fn handle<B>(app: Arc<App>, req: Request<B>, mark: Option<ConnectionMark>) -> Response<Body> {
    let started = Instant::now();
    // The request's span is built in `pipeline`, after authentication.
    let trace = Trace::from_headers(req.headers());
    let mut ctx = RequestContext::new(request_id(req.headers()), trace);
    let mut resp = match pipeline(&app, &req, mark.as_ref(), &mut ctx).await {
        Ok(resp) => resp,
        Err(e) => {
            ctx.fault = Some(e.fault());
            // A failure the upstream still billed: its cost, in the log.
            if e.billed() > 0 {
                ctx.credits = e.billed();
            }
            count_refusal(&app, ctx.team.as_deref().map(|t| t.name.as_str()), &e);
            e.into_response()
        }
    };
    // 15. The team's budget, as the upstream shows the org's: on metered
    //     answers and on 402s, omitted for unlimited teams. Credit-exempt
    //     routes carry none, for any team: the upstream sends none there
    //     (issue 39), and `/v2/usage` says it in its body.
    if let Some(team) = ctx.team.as_deref() {
        let status = resp.status().as_u16();
        let metered = ctx.route.is_some_and(Route::is_metered);
        if (metered && (resp.status().is_success() || status == 304)) || status == 402 {
            credits::team_budget_headers(&app, &team.name, resp.headers_mut()).await;
        }
    }
    if let Ok(mut v) = HeaderValue::from_str(&ctx.request_id) {
        // Never indexed by HPACK: a value unique to each answer would only
        // churn the HTTP/2 header table (inserting it evicted the entries
        // every answer shares: Content-Type, X-Cache, the budget).
        v.set_sensitive(true);
        resp.headers_mut().insert(X_REQUEST_ID, v);
    }
    if !ctx.span.is_disabled() {
        ctx.span
            .record("http.route", ctx.route.unwrap_or(Route::Other).as_str());
        ctx.span.record("http.response.status_code", resp.status().as_u16());
    }
    ctx.finish(&app.metrics, req.method(), resp.status(), started.elapsed());
    resp
}

/// 429s and 402s by a budget are counted here, where they become the
/// answer, and only here: a refusal deeper down that a stale copy rescued
/// (phase 14) was no refusal to the client.
fn count_refusal(app: &App, team: Option<&str>, e: &GatewayError) {
    let Some(team) = team else { return };
    match e {
        GatewayError::TeamRateLimited { .. } => app.metrics.rate_limited(team, Scope::Team),
        GatewayError::UpstreamRateLimited { .. } => app.metrics.rate_limited(team, Scope::Upstream),
        GatewayError::QuotaExceeded { .. } => app.metrics.quota_rejection(team),
        _ => {}
    }
}

/// The phases in order; each returns early with the error that ends it.
async fn pipeline<B>(
    app: &Arc<App>,
    req: &Request<B>,
    mark: Option<&ConnectionMark>,
    ctx: &mut RequestContext,
) -> Result<Response<Body>, GatewayError> {
    // 1. Method, framing and size: only plain GET and HEAD are ours.
    admit(app, req)?;
    // 2. Route (before auth only so that 404 needs no token, like upstream);
    //    a target seen before was routed, validated and keyed then.
    let raw = req.uri().path_and_query().map_or("", |pq| pq.as_str());
    let memo = app.parsed.get(raw);
    let target = match &memo {
        Some(parsed) => parsed.target.clone(),
        None => route::classify(req.uri(), app.config.server.max_uri_bytes)?,
    };
    ctx.route = Some(target.route);
    if target.route == Route::Other {
        // A path no vendor operation has: the vendor's server answers it
        // with a free 404 before it looks at the key, and so do we, before
        // anything is reserved or sent (issue 39: a guessed reservation
        // refused teams near their limit what the upstream gives for free).
        // The path is logged (the lead behind alert
        // GatewayUnknownVendorOperation; the query stays out) only for a
        // valid token: a token-less peer's paths are no news of the
        // vendor's, and its lines must not crowd the log queue (telemetry).
        if let Ok(team) = app.teams.load().authenticate(req.headers()) {
            tracing::info!(request_id = %ctx.request_id, team = %team.name, path = %target.path, "unknown /v2 path (route other): 404");
            ctx.team = Some(team);
        }
        return Err(GatewayError::NotFound);
    }
    // 3. Authenticate before anything costs money or reveals data.
    let team = app.teams.load().authenticate(req.headers())?;
    ctx.team = Some(team.clone());
    // 3. (cont.) An HTTP/2 stream past its team's share of the answer
    //    bytes held for slow readers is refused here, before anything is
    //    looked up, reserved or bought (server::overload).
    if let Some(mark) = mark {
        if !mark.team_seen(&team.name) {
            return Err(GatewayError::AnswersBusy);
        }
    }
    // The request's span, only now that its team is known: an anonymous
    // peer's `traceparent`, sampled or not, makes no span and exports
    // nothing. Built only when spans are exported (see telemetry).
    let span = tracing::info_span!(
        target: SPANS,
        "request",
        otel.kind = "server",
        http.request.method = %req.method(),
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    ctx.trace.attach(&span);
    ctx.span = span.clone();
    crate::telemetry::in_span!(span, authenticated(app, req, team, target, memo, ctx))
}

/// Phases 4–15, inside the request's span: what a known team asks.
async fn authenticated<B>(
    app: &Arc<App>,
    req: &Request<B>,
    team: Arc<Team>,
    target: Target,
    memo: Option<Arc<parsed::Parsed>>,
    ctx: &mut RequestContext,
) -> Result<Response<Body>, GatewayError> {
    // 4. The team's requests in flight (followers too), so one team cannot
    //    keep every connection and queue place busy; held until answered.
    let Some(_in_flight) = team.enter(app.config.server.team_in_flight_limit()) else {
        return Err(GatewayError::TeamRateLimited { retry_after_secs: 1 });
    };
    // 4. The team's own request rate.
    if let Err(retry_after_secs) = team.check_rate() {
        return Err(GatewayError::TeamRateLimited { retry_after_secs });
    }
    // 4. (cont.) A `size` or `id` list the upstream would refuse: its free
    //    422, answered here before anything is looked up, reserved or sent,
    //    so the estimate below is computed from a valid value.
    if memo.is_none() {
        route::validate(&target)?;
    }
    // 5. /v2/usage is the team's own usage: answered here, never forwarded.
    if target.route == Route::Usage {
        ctx.cache = CacheState::Bypass;
        return usage::usage(app, &team).await;
    }
    // 6. The normalized key; `None` for routes that are never cached.
    let raw = req.uri().path_and_query().map_or("", |pq| pq.as_str());
    let (key, tag) = match memo {
        Some(parsed) => (parsed.key.clone(), parsed.tag),
        None => {
            let key = app.cache.ttl(target.route).map(|_| key::cache_key(&target));
            // Worked out once for the memo: hashed on every Redis-tier hit
            // it was ~7k instructions (callgrind's SHA-256 without SHA-NI).
            let tag = key.as_deref().filter(|_| app.cache.redis().is_some()).map(Tag::of);
            let parsed = parsed::Parsed {
                target: target.clone(),
                key: key.clone(),
                tag,
            };
            app.parsed.insert(raw, parsed);
            (key, tag)
        }
    };
    let ask = Ask {
        req,
        trace: ctx.trace.clone(),
        directives: Directives::from_headers(req.headers()),
        team,
        target,
        key,
        tag,
    };
    cached_or_fetched(app, &ask, ctx).await
}

/// Phases 7–15 of a request that may be answered from the cache.
async fn cached_or_fetched<B>(
    app: &Arc<App>,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
) -> Result<Response<Body>, GatewayError> {
    // 7a. An id lookup: from the records already bought, buying the rest.
    if let Some(answer) = by_id::answer(app, ask, ctx).await {
        return answer;
    }
    // 7a. Monthly metrics: from the months already held, buying the rest.
    if let Some(answer) = monthly::answer(app, ask, ctx).await {
        return answer;
    }
    let (d, target) = (&ask.directives, &ask.target);
    // 7. Lookup, unless the client said no-cache.
    let mut cached = None;
    if let (Some(k), false) = (&ask.key, d.no_cache) {
        let span = tracing::info_span!(target: SPANS, "cache_lookup");
        if let Some((entry, tier)) =
            crate::telemetry::in_span!(span, app.cache.lookup_tagged(target.route, k, ask.tag.as_ref()))
        {
            // A HEAD never buys, not even a background refresh (built only
            // when one starts: the hit path allocates no job).
            let buys = ask.req.method() != Method::HEAD;
            let job = || buys.then(|| ask.job(&ctx.request_id));
            if let Some(state) = revalidate::accept(app, &entry, d, k, job).await {
                app.metrics.cache_hit(target.route, tier);
                let held = (&*entry, tier);
                return Ok(respond::from_held(app, &ask.team, target, held, state, ask.req, ctx));
            }
            cached = Some(entry);
        }
    }
    // 7b. The answer held by another key's page (issue 28).
    if let Some(answer) = spend::derived(app, ask, ctx).await {
        return Ok(answer);
    }
    // A HEAD never buys anything: it is answered from the cache or not at
    // all, like only-if-cached (the upstream has no HEAD to forward to).
    let head_of_metered = ask.req.method() == Method::HEAD && route::credit_estimate(target) > 0;
    if d.only_if_cached || head_of_metered {
        return Err(GatewayError::NotCached);
    }
    // 8a. A team that opted in gets the page its remaining credits cover
    //     (looked up, then bought, as a request of its own).
    if let Some(clamped) = spend::clamp(app, ask).await {
        let narrowed = Ask {
            req: ask.req,
            trace: ask.trace.clone(),
            directives: ask.directives,
            team: ask.team.clone(),
            target: clamped.target,
            key: clamped.key,
            tag: None,
        };
        let mut resp = Box::pin(cached_or_fetched(app, &narrowed, ctx)).await?;
        spend::mark(&mut resp, clamped.asked);
        return Ok(resp);
    }
    // 8–13. Coalesce, reserve, queue, forward, settle, store.
    let (outcome, role) = fetch::coalesced(app, ask.job(&ctx.request_id)).await;
    // 14. The upstream failed and a stale copy exists: serve it instead.
    if let (true, Some(k)) = (fetch::upstream_failed(&outcome), ask.key.as_deref()) {
        if cached.is_none() {
            cached = app.cache.lookup(target.route, k).await.map(|(e, _)| e);
        }
        if let Some(entry) = &cached {
            let mut resp = respond::from_cache(app, &ask.team, target, entry, CacheState::Stale, ask.req, ctx);
            // The leader's failed call may still have been billed (a
            // follower's failure is unbilled): the answer says so.
            let billed = outcome.as_ref().err().map_or(0, GatewayError::billed);
            if billed > 0 {
                ctx.credits = billed;
                resp.headers_mut()
                    .insert(credits::X_CREDITS_REQUEST, number_header(billed));
            }
            return Ok(resp);
        }
    }
    // 15. Respond with what the fetch brought.
    let no_cache = d.no_cache || ask.key.is_none();
    respond::from_fetched(app, &ask.team, target, outcome?, role, no_cache, ctx)
}

/// Phase 1: refuses what is not a plain GET or HEAD of a bounded size.
fn admit<B>(app: &App, req: &Request<B>) -> Result<(), GatewayError> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Err(GatewayError::MethodNotAllowed);
    }
    // A GET has no body: chunked framing here is a smuggling attempt (a
    // proxy in front may have framed it differently), so it is refused.
    if req.headers().contains_key(http::header::TRANSFER_ENCODING) {
        return Err(GatewayError::BadRequest(
            "Transfer-Encoding is not accepted on GET or HEAD",
        ));
    }
    if header_bytes(req.headers()) > app.config.server.max_header_bytes {
        return Err(GatewayError::HeadersTooLarge);
    }
    Ok(())
}

/// Size of the header section as sent (names, values, ": " and CRLF).
fn header_bytes(headers: &http::HeaderMap) -> usize {
    headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum()
}
