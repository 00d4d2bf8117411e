//! The life of a team request (DESIGN §2), one phase per call, top to bottom.
//!
//! [`handle`] is the service function of the team listener: it runs
//! [`pipeline`], turns an error into a response at the single rescue point,
//! and then records metrics and one access-log line for every request.

mod answer;
mod context;

pub use context::{CacheState, RequestLog};

use crate::app::App;
use crate::error::GatewayError;
use crate::http_util::{request_id, Body};
use crate::route::{self, Route};
use http::{HeaderValue, Method, Request, Response};
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
    if let Ok(v) = HeaderValue::from_str(&log.request_id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    log.finish(&app.metrics, req.method(), resp.status(), started.elapsed());
    resp
}

/// The phases in order; each returns early with the error that ends it.
async fn pipeline<B>(
    app: &App,
    req: &Request<B>,
    log: &mut RequestLog,
) -> Result<Response<Body>, GatewayError> {
    // 1. Method, then path: only GET and HEAD under /v2/ are ours.
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Err(GatewayError::MethodNotAllowed);
    }
    let target = route::classify(req.uri(), app.config.server.max_uri_bytes)?;
    log.route = Some(target.route);

    // 2. Authenticate before anything costs money or reveals data.
    let team = app.teams.load().authenticate(req.headers())?;
    log.team = Some(team.name.clone());

    // 6. /v2/usage is the team's own usage: answered here, never forwarded,
    //    since the upstream's answer is the whole org's.
    if target.route == Route::Usage {
        log.cache = CacheState::Bypass;
        return Ok(answer::usage(&team));
    }

    // 11. Forward with the upstream key.
    log.cache = CacheState::Miss;
    let upstream = app
        .upstream
        .fetch(
            &target,
            &log.request_id,
            req.headers().get(http::header::ACCEPT),
            &app.metrics,
        )
        .await?;
    let charged = answer::credits_charged(&upstream, target.route.is_metered());
    log.credits = charged;
    if charged > 0 {
        app.metrics
            .credits_spent_total
            .with_label_values(&[&team.name, target.route.as_str()])
            .inc_by(charged);
    }
    answer::from_upstream(upstream, charged, log)
}
