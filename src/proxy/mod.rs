//! The life of a team request. [`pipeline`] is a list of calls, each a
//! function named for what it does, run in this order (docs/design.md §2
//! describes each under the same name; the crate doc and the README list
//! them):
//!
//! [`admit`] → [`resolve`] → [`authenticate`] → [`limit_team`] →
//! [`validate`] → [`usage`](usage::usage) → [`cache_key`] →
//! [`lookup_pieces`](reuse::lookup_pieces) → [`lookup`] →
//! [`covered_answer`](covered::covered_answer) → [`may_buy`] → [`clamp`](clamp::clamp)
//! → [`fetch`](fn@fetch) → [`stale_on_failure`] → [`respond`](fn@respond).
//!
//! Each returns early with the error that ends the request, or with the
//! answer. [`handle`] is the service function of the team listener: it runs
//! [`pipeline`], turns an error into a response at the single rescue point
//! ([`rescue`]), and [`finish`]es every request, refused or not: the team's
//! budget headers, the request id, its metrics and one access-log line.
//!
//! # Layout
//! One concept per file; this file calls them, none of them calls it.
//! - [`context`]: what the phases share (the ask, the fetch job, the
//!   request context).
//! - [`state`]: what the request path keeps between requests ([`State`]):
//!   the memo of parsed targets ([`parsed`]), the flights ([`flight`]),
//!   the keys refreshed in the background ([`refresh`]).
//! - [`revalidate`]: `lookup`'s verdict on a found entry, and the
//!   background refresh of stale-while-revalidate.
//! - [`covered`](mod@covered): `covered_answer`, an answer another key's page covers;
//!   [`clamp`](mod@clamp): a page clamped to a team's remaining credits.
//! - [`reuse`]: `lookup_pieces`, an answer built from held pieces (an id
//!   lookup record by record, a monthly-metrics window month by month),
//!   buying only the missing ones.
//! - [`fetch`](mod@fetch): the miss path, `fetch` (coalesce, lease, the
//!   purchase, store).
//! - [`purchase`]: the money sequence every paid call runs, once (open:
//!   [`org_probe`] and [`credits`]' reserve; the fair turn; the call; settle
//!   or release), and the one rule of who pays which part of a bill; the
//!   miss and the batch (`reuse::batch`) are its callers.
//! - [`answered`]: how a request was answered, one value read for `X-Cache`,
//!   the `cache` label, the access line and the saved reason.
//! - [`respond`](mod@respond): answers from the cache or from a fetch.
//! - [`usage`](mod@usage): `/v2/usage`.

pub(crate) mod answered;
mod clamp;
mod context;
mod covered;
mod credits;
mod fetch;
pub mod flight;
mod heads;
mod org_probe;
mod parsed;
mod purchase;
mod refresh;
mod respond;
mod reuse;
mod revalidate;
mod state;
mod usage;

pub use answered::{Answered, CacheState};
pub use state::State;

use crate::app::App;
use crate::auth::{Caller, Member, Team, TeamInFlight};
use crate::cache::control::Directives;
use crate::cache::{key, Entry};
use crate::cache::{months::Window, records::IdList};
use crate::error::GatewayError;
use crate::http_util::{number_header, request_id_of, Body, X_REQUEST_ID};
use crate::metrics::Scope;
use crate::redis_backend::keys::Tag;
use crate::route::{self, Route, Target};
use crate::server::ConnectionMark;
use crate::telemetry::{trace::Trace, SPANS};
use context::{Ask, Parsed, Pieces, RequestContext};
use fetch::Role;
use flight::Outcome;
use heads::Heads;
use http::{HeaderValue, Method, Request, Response};
use std::sync::Arc;
use std::time::Instant;

type Answer = Result<Response<Body>, GatewayError>;

/// Answers one team request. Never fails: errors become responses here.
pub(crate) async fn handle<B>(
    app: Arc<App>,
    state: Arc<State>,
    req: Request<B>,
    mark: Option<ConnectionMark>,
) -> Response<Body> {
    let started = Instant::now();
    let heads = Heads::of(req.headers());
    // The request's span is built in `pipeline`, after authentication.
    let trace = Trace::of(heads.traceparent, req.headers());
    let mut ctx = RequestContext::new(request_id_of(heads.request_id), trace, heads.if_none_match);
    let resp = match pipeline(&app, &state, &req, &heads, mark.as_ref(), &mut ctx).await {
        Ok(resp) => resp,
        Err(e) => rescue(&app, &mut ctx, e),
    };
    finish(&app, &req, resp, &ctx, started).await
}

/// The single rescue point: an error becomes its response. 429s and 402s
/// by a budget are counted here, where they become the answer, and only
/// here: a refusal deeper down that a stale copy rescued
/// ([`stale_on_failure`]) was no refusal to the client.
fn rescue(app: &App, ctx: &mut RequestContext, e: GatewayError) -> Response<Body> {
    ctx.fault = Some(e.fault());
    // A failure the upstream still billed: its cost, in the log.
    ctx.charge(e.billed());
    if let Some(team) = ctx.team.as_deref() {
        let team = team.name.as_str();
        match e {
            GatewayError::TeamRateLimited { .. } => app.metrics.rate_limited(team, Scope::Team),
            GatewayError::UpstreamRateLimited { why, .. } => {
                app.metrics.rate_limited(team, Scope::Upstream);
                app.metrics.gate_refused(team, why);
            }
            GatewayError::QuotaExceeded { ref budget, .. } => app.metrics.quota_rejection(team, budget),
            _ => {}
        }
    }
    // A budget's 402 tells that budget in its headers, as its body does
    // (`finish` writes them).
    if let GatewayError::QuotaExceeded {
        limit,
        remaining,
        budget,
        ..
    } = &e
    {
        ctx.answered = Answered::BudgetRefused;
        ctx.refused_by = Some(context::Refused {
            limit: *limit,
            remaining: *remaining,
            budget: budget.as_str(),
        });
    }
    e.into_response()
}

/// What every answer gets, refused or not: the team's budget headers, the
/// request id, the span's last fields, the request's metrics and its one
/// access-log line.
async fn finish<B>(
    app: &App,
    req: &Request<B>,
    mut resp: Response<Body>,
    ctx: &RequestContext,
    started: Instant,
) -> Response<Body> {
    // What the team paid for this answer, the sum of every call it paid
    // for (written here alone): on every metered answer, and on any other
    // answer that still cost something (a failure the upstream billed).
    let status = resp.status().as_u16();
    let metered = ctx.route.is_some_and(Route::is_metered);
    let answered = metered && (resp.status().is_success() || status == 304);
    if answered || ctx.credits > 0 {
        resp.headers_mut()
            .insert(credits::X_CREDITS_REQUEST, number_header(ctx.credits));
    }
    // The team's budget, as the upstream shows the org's: on metered
    // answers and on 402s, omitted for unlimited teams. Credit-exempt
    // routes carry none, for any team: the upstream sends none there, and
    // `/v2/usage` says it in its body.
    if let Some(team) = ctx.team.as_deref() {
        if let Some(refused) = ctx.refused_by {
            credits::set_budget_headers(resp.headers_mut(), refused.limit, refused.remaining);
        } else if answered || status == 402 {
            credits::budget_headers(app, team, ctx.member.as_deref(), resp.headers_mut()).await;
        }
    }
    respond::data_release_header(app, &mut resp, ctx);
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

/// The phases before the team is known; the rest run in the request's span
/// ([`as_team`]).
async fn pipeline<B>(
    app: &Arc<App>,
    state: &Arc<State>,
    req: &Request<B>,
    heads: &Heads<'_>,
    mark: Option<&ConnectionMark>,
    ctx: &mut RequestContext,
) -> Answer {
    admit(app, req, heads)?;
    let resolved = resolve(app, state, req, heads, ctx)?;
    let caller = authenticate(app, heads, mark, ctx)?;
    let span = request_span(req, ctx);
    crate::telemetry::in_span!(span, as_team(app, state, req, heads.directives, caller, resolved, ctx))
}

/// What a known team asks, inside the request's span.
async fn as_team<B>(
    app: &Arc<App>,
    state: &Arc<State>,
    req: &Request<B>,
    directives: bool,
    caller: Caller,
    resolved: Resolved,
    ctx: &mut RequestContext,
) -> Answer {
    let _in_flight = limit_team(app, &caller.0)?;
    validate(&resolved)?;
    if resolved.target().route == Route::Usage {
        return Box::pin(usage::usage(app, &caller.0, &caller.1)).await;
    }
    let ask = cache_key(app, state, req, directives, caller, resolved, ctx);
    answer(app, state, &ask, ctx).await
}

/// The phases of a request that may be answered from the cache, bought, or
/// both; run again for the narrower request of a [`clamp`](clamp::clamp).
async fn answer<B>(app: &Arc<App>, state: &Arc<State>, ask: &Ask<'_, B>, ctx: &mut RequestContext) -> Answer {
    if ask.parsed.pieces.is_some() {
        // Every phase but the page's cache lookup is boxed: the request's
        // future then holds a pointer for it, not its state, so a hit's
        // future (moved whole into its box when the connection calls the
        // handler) stays small.
        if let Some(answer) = Box::pin(reuse::lookup_pieces(app, &state.buyers, &state.flights, ask, ctx)).await {
            return answer;
        }
    }
    let cached = match lookup(app, state, ask, ctx).await {
        Found::Answer(resp) => return Ok(resp),
        Found::Kept(cached) => cached,
    };
    if let Some(resp) = Box::pin(covered::covered_answer(app, ask, ctx)).await {
        return Ok(resp);
    }
    may_buy(ask)?;
    if let Some(clamped) = Box::pin(clamp::clamp(app, ask)).await {
        let narrowed = Ask {
            req: ask.req,
            trace: ask.trace.clone(),
            directives: ask.directives,
            team: ask.team.clone(),
            member: ask.member.clone(),
            parsed: Arc::new(Parsed {
                target: clamped.target,
                key: clamped.key,
                tag: None,
                pieces: None,
            }),
        };
        let mut resp = Box::pin(answer(app, state, &narrowed, ctx)).await?;
        if ctx.answered == Answered::Bought {
            ctx.answered = Answered::Clamped;
        }
        clamp::mark(&mut resp, clamped.asked);
        return Ok(resp);
    }
    let (outcome, role) = Box::pin(fetch(app, state, ask, ctx)).await;
    if let Some(resp) = Box::pin(stale_on_failure(app, ask, &outcome, cached, ctx)).await {
        return Ok(resp);
    }
    respond(app, ask, outcome, role, ctx)
}

/// Refuses what is not a plain GET or HEAD of a bounded size: free, and
/// needs nothing.
fn admit<B>(app: &App, req: &Request<B>, heads: &Heads<'_>) -> Result<(), GatewayError> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Err(GatewayError::MethodNotAllowed);
    }
    // A GET has no body: chunked framing here is a smuggling attempt (a
    // proxy in front may have framed it differently), so it is refused.
    if heads.transfer_encoding {
        return Err(GatewayError::BadRequest(
            "Transfer-Encoding is not accepted on GET or HEAD",
        ));
    }
    if heads.bytes > app.config.server.max_header_bytes {
        return Err(GatewayError::HeadersTooLarge);
    }
    Ok(())
}

/// The request target as sent: what the memo of parsed targets is keyed by.
fn raw_target<B>(req: &Request<B>) -> &str {
    req.uri().path_and_query().map_or("", |pq| pq.as_str())
}

/// A request target as [`resolve`] found it.
enum Resolved {
    /// Seen before: its memo (routed, validated and keyed then), shared.
    Memo(Arc<Parsed>),
    /// Seen for the first time: routed only.
    Fresh(Target),
}

impl Resolved {
    fn target(&self) -> &Target {
        match self {
            Resolved::Memo(parsed) => &parsed.target,
            Resolved::Fresh(target) => target,
        }
    }
}

/// The target's route, from its memo when it was seen before. Before
/// authentication only so that a wrong path is a 404 without a token, like
/// upstream.
fn resolve<B>(
    app: &App,
    state: &State,
    req: &Request<B>,
    heads: &Heads<'_>,
    ctx: &mut RequestContext,
) -> Result<Resolved, GatewayError> {
    let resolved = match state.parsed.get(raw_target(req)) {
        Some(parsed) => Resolved::Memo(parsed),
        None => Resolved::Fresh(route::classify(req.uri(), app.config.server.max_uri_bytes)?),
    };
    let target = resolved.target();
    ctx.route = Some(target.route);
    if target.route == Route::Other {
        // A path no vendor operation has: the vendor's server answers it
        // with a free 404 before it looks at the key, and so do we, before
        // anything is reserved or sent (a guessed reservation
        // refused teams near their limit what the upstream gives for free).
        // The path is logged (the lead behind alert
        // GatewayUnknownVendorOperation; the query stays out) only for a
        // valid token: a token-less peer's paths are no news of the
        // vendor's, and its lines must not crowd the log queue (telemetry).
        if let Ok((team, member)) = app.teams.load().authenticate_with(heads.credentials) {
            tracing::info!(request_id = %ctx.request_id, team = %team.name, path = %target.path, "unknown /v2 path (route other): 404");
            ctx.team = Some(team);
            ctx.member = Some(member);
        }
        return Err(GatewayError::NotFound);
    }
    Ok(resolved)
}

/// The team behind the token, before anything costs money or reveals data.
/// The team becomes its connection's tenant for the overload manager
/// (`server::overload`): an HTTP/2 stream past its team's share of the
/// answer bytes held for slow readers is refused here, before anything is
/// looked up, reserved or bought.
fn authenticate(
    app: &App,
    heads: &Heads<'_>,
    mark: Option<&ConnectionMark>,
    ctx: &mut RequestContext,
) -> Result<Caller, GatewayError> {
    let (team, member) = match app.teams.load().authenticate_with(heads.credentials) {
        Ok(caller) => caller,
        Err(refused) => {
            // An ended token matched: its 401 is its team's and app's in the
            // access line and the metrics (the team label is a config name,
            // bounded as ever), so a rotation's stragglers can be found; its
            // line is queued as the team's, not as an anonymous peer's.
            // Nothing else runs for it: no span, no budget headers (a 401).
            if let Some((team, member)) = refused.ended {
                ctx.team = Some(team);
                ctx.member = Some(member);
            }
            return Err(refused.error);
        }
    };
    ctx.team = Some(team.clone());
    ctx.member = Some(member.clone());
    if let Some(mark) = mark {
        if !mark.team_seen(team.tenant) {
            return Err(GatewayError::AnswersBusy);
        }
    }
    notice_expiring(app, &team, &member);
    Ok((team, member))
}

/// A token within `auth::EXPIRY_NOTICE_MS` of its `not_after` that is
/// still used: counted each time, logged once a day (its app has not
/// moved to the new token yet).
fn notice_expiring(app: &App, team: &Team, member: &Member) {
    // Most tokens have no end: no clock read for them.
    if member.not_after().is_none() {
        return;
    }
    let Some(first_today) = member.ending_soon(crate::clock::now_ms()) else {
        return;
    };
    app.metrics.token_expiring(&team.name, &member.name);
    if first_today {
        let not_after = member.not_after().and_then(crate::clock::rfc3339);
        tracing::warn!(team = %team.name, app = %member.name, not_after, "a token that ends within 7 days is still used: move the app to its new token");
    }
}

/// The request's span, only now that its team is known: an anonymous
/// peer's `traceparent`, sampled or not, makes no span and exports
/// nothing. Built only when spans are exported (see telemetry).
fn request_span<B>(req: &Request<B>, ctx: &mut RequestContext) -> tracing::Span {
    let span = tracing::info_span!(
        target: SPANS,
        "request",
        otel.kind = "server",
        http.request.method = %req.method(),
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        team = ctx.team_name(),
        app = tracing::field::Empty,
    );
    if let Some(app) = ctx.app_name() {
        span.record("app", app);
    }
    ctx.trace.attach(&span);
    ctx.span = span.clone();
    span
}

/// The team's own limits, before the cache on purpose (they protect the
/// gateway itself, hits included). First its requests in flight (followers
/// too), held until answered, so one team cannot keep every connection and
/// queue place busy; then its request rate, so a request refused for the
/// first takes no token of the second.
fn limit_team(app: &App, team: &Team) -> Result<TeamInFlight, GatewayError> {
    let Some(in_flight) = team.enter(app.config.server.team_in_flight_limit()) else {
        return Err(GatewayError::TeamRateLimited { retry_after_secs: 1 });
    };
    if let Err(retry_after_secs) = team.check_rate() {
        return Err(GatewayError::TeamRateLimited { retry_after_secs });
    }
    Ok(in_flight)
}

/// A `size` or `id` list the upstream would refuse: its free 422, answered
/// here before anything is looked up, reserved or sent, so the estimate is
/// computed from a valid value. A memoized target was validated when it
/// was first seen.
fn validate(resolved: &Resolved) -> Result<(), GatewayError> {
    match resolved {
        Resolved::Memo(_) => Ok(()),
        Resolved::Fresh(target) => route::validate(target),
    }
}

/// What the request asks, with its normalized cache key (`None` for routes
/// that are never cached) and the client's `Cache-Control`; a target seen
/// for the first time is memoized here, routed, validated and keyed.
fn cache_key<'r, B>(
    app: &App,
    state: &State,
    req: &'r Request<B>,
    directives: bool,
    (team, member): Caller,
    resolved: Resolved,
    ctx: &RequestContext,
) -> Ask<'r, B> {
    let parsed = match resolved {
        Resolved::Memo(parsed) => parsed,
        Resolved::Fresh(target) => {
            let key = app.cache.ttl(target.route).map(|_| key::cache_key(&target));
            // Worked out once for the memo: hashed on every Redis-tier hit
            // it was ~7k instructions (callgrind's SHA-256 without SHA-NI).
            let tag = key.as_deref().filter(|_| app.cache.redis().is_some()).map(Tag::of);
            let pieces = key.as_ref().and_then(|_| pieces_of(app, &target));
            let parsed = Arc::new(Parsed {
                target,
                key,
                tag,
                pieces,
            });
            state.parsed.insert(raw_target(req), parsed.clone());
            parsed
        }
    };
    Ask {
        req,
        trace: ctx.trace.clone(),
        // Most requests send no directive: nothing to parse.
        directives: if directives {
            Directives::from_headers(req.headers())
        } else {
            Directives::default()
        },
        team,
        member,
        parsed,
    }
}

/// Whether the target is answered from held pieces (`reuse`), and which.
fn pieces_of(app: &App, target: &route::Target) -> Option<Pieces> {
    if app.cache.record_reuse() {
        if let Some(ids) = IdList::of(target) {
            return Some(Pieces::Ids(ids));
        }
    }
    if app.cache.month_reuse() {
        return Window::of(target).map(Pieces::Window);
    }
    None
}

/// What [`lookup`] found.
enum Found {
    /// An entry that answers this request (HIT or STALE).
    Answer(Response<Body>),
    /// None that answers it; an expired one, if any, is kept for
    /// [`stale_on_failure`].
    Kept(Option<Arc<Entry>>),
}

/// The request's own key in the cache, unless the client said `no-cache`,
/// and the verdict on what it finds ([`revalidate`]).
async fn lookup<B>(app: &Arc<App>, state: &Arc<State>, ask: &Ask<'_, B>, ctx: &mut RequestContext) -> Found {
    let (Some(k), false) = (&ask.parsed.key, ask.directives.no_cache) else {
        return Found::Kept(None);
    };
    let target = &ask.parsed.target;
    let span = tracing::info_span!(target: SPANS, "cache_lookup");
    let Some((entry, tier)) =
        crate::telemetry::in_span!(span, app.cache.lookup_tagged(target.route, k, ask.parsed.tag.as_ref()))
    else {
        return Found::Kept(None);
    };
    // A HEAD never buys, not even a background refresh (built only when
    // one starts: the hit path allocates no job).
    let buys = ask.req.method() != Method::HEAD;
    let job = || buys.then(|| ask.job(&ctx.request_id));
    match revalidate::accept(app, state, &entry, &ask.directives, (k, tier), job).await {
        Some(answered) => {
            app.metrics.cache_hit(target.route, tier);
            Found::Answer(respond::from_cache(
                app, &ask.team, target, &entry, answered, ask.req, ctx,
            ))
        }
        None => Found::Kept(Some(entry)),
    }
}

/// Whether this request may buy: a HEAD never does, not even on a miss (it
/// is answered from the cache or not at all, like `only-if-cached`: the
/// upstream has no HEAD to forward to).
fn may_buy<B>(ask: &Ask<'_, B>) -> Result<(), GatewayError> {
    let head_of_metered = ask.req.method() == Method::HEAD && route::credit_estimate(&ask.parsed.target) > 0;
    if ask.directives.only_if_cached || head_of_metered {
        return Err(GatewayError::NotCached);
    }
    Ok(())
}

/// Coalesce, reserve, queue, forward, settle, store ([`fetch`](mod@fetch)),
/// in a task of its own that no client can cancel.
async fn fetch<B>(app: &Arc<App>, state: &State, ask: &Ask<'_, B>, ctx: &RequestContext) -> (Outcome, Role) {
    fetch::coalesce(app, &state.flights, ask.job(&ctx.request_id)).await
}

/// The upstream failed ([`fetch::upstream_failed`]) and an expired copy is
/// still within its grace period: it answers instead of the error, with
/// what the failed call still cost. The entry [`lookup`] kept is reused.
async fn stale_on_failure<B>(
    app: &App,
    ask: &Ask<'_, B>,
    outcome: &Outcome,
    cached: Option<Arc<Entry>>,
    ctx: &mut RequestContext,
) -> Option<Response<Body>> {
    let key = ask.parsed.key.as_deref()?;
    if !fetch::upstream_failed(outcome) {
        return None;
    }
    let entry = match cached {
        Some(entry) => entry,
        None => app.cache.lookup(ask.parsed.target.route, key).await?.0,
    };
    let resp = respond::from_cache(
        app,
        &ask.team,
        &ask.parsed.target,
        &entry,
        Answered::Stale,
        ask.req,
        ctx,
    );
    // The leader's failed call may still have been billed (a follower's
    // failure is unbilled): the answer says so.
    ctx.charge(outcome.as_ref().err().map_or(0, GatewayError::billed));
    Some(resp)
}

/// The answer the fetch brought, or its error.
fn respond<B>(app: &App, ask: &Ask<'_, B>, outcome: Outcome, role: Role, ctx: &mut RequestContext) -> Answer {
    let no_cache = ask.directives.no_cache || ask.parsed.key.is_none();
    respond::from_fetched(app, &ask.team, &ask.parsed.target, outcome?, role, no_cache, ctx)
}
