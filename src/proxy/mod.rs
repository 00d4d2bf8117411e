//! The life of a team request (DESIGN §2), one phase per call, top to bottom.
//!
//! [`handle`] is the service function of the team listener: it runs
//! [`pipeline`], turns an error into a response at the single rescue point,
//! and then records metrics and one access-log line for every request.

mod answer;
mod by_id;
mod context;
mod fetch;
mod lookup;

pub use context::{CacheState, RequestLog};
pub use fetch::Outcome;

use crate::app::App;
use crate::auth::Team;
use crate::cache::control::Directives;
use crate::cache::{key, now_ms, Entry};
use crate::error::GatewayError;
use crate::http_util::{request_id, Body};
use crate::route::{self, Route, Target};
use fetch::{Job, Role};
use http::{HeaderValue, Method, Request, Response};
use lookup::Use;
use std::sync::Arc;
use std::time::Instant;

/// Answers one team request. Never fails: errors become responses here.
pub async fn handle<B>(app: Arc<App>, req: Request<B>) -> Response<Body> {
    let started = Instant::now();
    let request_id = request_id(req.headers());
    let mut log = RequestLog::new(request_id);
    let mut resp = match pipeline(&app, &req, &mut log).await {
        Ok(resp) => resp,
        Err(e) => {
            log.fault = Some(e.fault());
            e.into_response()
        }
    };
    // The team's budget, as the upstream shows the org's: on answers and on
    // 402s, omitted for unlimited teams.
    if let Some(team) = log.team.as_deref() {
        if resp.status().is_success() || resp.status().as_u16() == 304 || resp.status().as_u16() == 402 {
            answer::team_budget_headers(&app, team, resp.headers_mut()).await;
        }
    }
    if let Ok(v) = HeaderValue::from_str(&log.request_id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    log.finish(&app.metrics, req.method(), resp.status(), started.elapsed());
    resp
}

/// The phases in order; each returns early with the error that ends it.
async fn pipeline<B>(app: &Arc<App>, req: &Request<B>, log: &mut RequestLog) -> Result<Response<Body>, GatewayError> {
    // 1. Method, framing and size: only plain GET and HEAD are ours.
    admit(app, req)?;
    // 3. Route (before auth only so that 404 needs no token, like upstream).
    let target = route::classify(req.uri(), app.config.server.max_uri_bytes)?;
    log.route = Some(target.route);
    if target.route == Route::Other {
        // The one place an operator learns which path the vendor may have
        // added (alert GatewayUnknownVendorOperation); the query stays out.
        tracing::info!(request_id = %log.request_id, path = %target.path, "unknown /v2 path, routed as other");
    }

    // 2. Authenticate before anything costs money or reveals data.
    let team = app.teams.load().authenticate(req.headers())?;
    log.team = Some(team.name.clone());

    // 4. The team's own request rate.
    if let Err(retry_after_secs) = team.check_rate() {
        app.metrics
            .rate_limited_total
            .with_label_values(&[&team.name, "team"])
            .inc();
        return Err(GatewayError::TeamRateLimited { retry_after_secs });
    }

    // 4b. A `size` or `id` list the upstream would refuse: its free 422,
    //     answered here before anything is looked up, reserved or sent, so
    //     the estimate below is computed from a valid value.
    route::validate(&target)?;

    // 6. /v2/usage is the team's own usage: answered here, never forwarded,
    //    since the upstream's answer is the whole org's.
    if target.route == Route::Usage {
        log.cache = CacheState::Bypass;
        return answer::usage(app, &team).await;
    }

    // 5. The normalized key; `None` for routes that are never cached.
    let directives = Directives::from_headers(req.headers());
    let key = app.cache.ttl(target.route).map(|_| key::cache_key(&target));
    let request_id = log.request_id.clone();
    let job = || Job {
        team: team.clone(),
        target: target.clone(),
        key: key.clone(),
        no_store: directives.no_store,
        request_id: request_id.clone(),
        accept: req.headers().get(http::header::ACCEPT).cloned(),
    };

    // 7a. An id lookup: from the records already bought, buying the rest.
    if let Some(answer) = by_id::answer(app, &team, &target, &directives, req, log, &job).await {
        return answer;
    }
    // 7. Lookup, unless the client said no-cache.
    let mut cached = None;
    if let (Some(k), false) = (&key, directives.no_cache) {
        if let Some((entry, tier)) = app.cache.lookup(target.route, k).await {
            if let Some(state) = accept_cached(app, &entry, &directives, job) {
                let labels = [target.route.as_str(), tier.as_str()];
                app.metrics.cache_hits_total.with_label_values(&labels).inc();
                return Ok(from_cache(app, &team, &target, &entry, state, req, log));
            }
            cached = Some(entry);
        }
    }
    if directives.only_if_cached {
        return Err(GatewayError::NotCached);
    }

    // 8–13. Coalesce, fetch upstream, settle, store.
    let (outcome, role) = fetch::coalesced(app, job()).await;

    // 14. The upstream failed and a stale copy exists: serve it instead.
    let failed = match &outcome {
        Ok(f) => answer::is_failure(f.status),
        Err(e) => e.fault() == crate::error::Fault::Upstream,
    };
    if let (true, Some(k)) = (failed, key.as_deref()) {
        if cached.is_none() {
            cached = app.cache.lookup(target.route, k).await.map(|(e, _)| e);
        }
        if let Some(entry) = &cached {
            return Ok(from_cache(app, &team, &target, entry, CacheState::Stale, req, log));
        }
    }
    // 15. Respond with what the fetch brought.
    let no_cache = directives.no_cache || key.is_none();
    from_fetched(app, &team, &target, outcome?, role, no_cache, log)
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

/// Whether a found entry answers this request, and as what. An entry within
/// the stale-while-revalidate window answers at once and starts one
/// background refresh (coalesced by key), paid by this team like a miss.
fn accept_cached(app: &Arc<App>, entry: &Entry, d: &Directives, job: impl FnOnce() -> Job) -> Option<CacheState> {
    match lookup::usable(entry, d, app.config.cache.stale_while_revalidate_secs, now_ms()) {
        Use::Hit => Some(CacheState::Hit),
        Use::StaleAccepted => Some(CacheState::Stale),
        Use::Revalidate => {
            // only-if-cached never reaches the upstream, not even so.
            if !d.only_if_cached {
                let (app, job) = (app.clone(), job());
                tokio::spawn(async move { fetch::coalesced(&app, job).await });
            }
            Some(CacheState::Stale)
        }
        Use::FallbackOnly => None,
    }
}

/// The response for a fetch: the leader pays what the upstream charged;
/// followers and answers fetched by another replica are free (saved).
fn from_fetched(
    app: &App,
    team: &Team,
    target: &Target,
    fetched: Arc<fetch::Fetch>,
    role: Role,
    no_cache: bool,
    log: &mut RequestLog,
) -> Result<Response<Body>, GatewayError> {
    let (state, charged) = match role {
        Role::Leader if fetched.from_peer => (CacheState::Hit, 0),
        Role::Leader if no_cache => (CacheState::Bypass, fetched.credits),
        Role::Leader => (CacheState::Miss, fetched.credits),
        Role::Follower => (CacheState::Hit, 0),
    };
    if role == Role::Follower || fetched.from_peer {
        app.metrics
            .coalesced_requests_total
            .with_label_values(&[target.route.as_str()])
            .inc();
        saved(app, team, target, fetched.credits);
    }
    log.cache = state;
    log.credits = charged;
    let answer = answer::from_fetch(&fetched, charged, state, log);
    if let Err(GatewayError::UpstreamRateLimited { .. }) = answer {
        // The upstream itself said 429 (the scheduler counts its own refusals).
        app.metrics
            .rate_limited_total
            .with_label_values(&[&team.name, "upstream"])
            .inc();
    }
    answer
}

/// A response from a cached entry: the team pays nothing and saves what the
/// entry cost.
fn from_cache<B>(
    app: &App,
    team: &Team,
    target: &Target,
    entry: &Entry,
    state: CacheState,
    req: &Request<B>,
    log: &mut RequestLog,
) -> Response<Body> {
    log.cache = state;
    saved(app, team, target, entry.credits);
    lookup::respond(entry, state, req.headers())
}

fn saved(app: &App, team: &Team, target: &Target, credits: u64) {
    if credits > 0 {
        app.metrics
            .credits_saved_total
            .with_label_values(&[&team.name, target.route.as_str()])
            .inc_by(credits);
        app.ledger.record_saved(&team.name, target.route, credits);
    }
}

/// Size of the header section as sent (names, values, ": " and CRLF).
fn header_bytes(headers: &http::HeaderMap) -> usize {
    headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum()
}
