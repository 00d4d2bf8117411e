//! The org probe, just before the reservation: while the company's upstream credits
//! are exhausted (`crate::org`, set by an upstream 402), a metered call is
//! answered with the upstream's last 402 instead of being forwarded (every
//! one would be refused anyway), and now and then one free `/v2/usage` call
//! asks the upstream whether credits are back. Called by `fetch` for every
//! metered call it would make; `fetch::upstream_failed` counts the 402 as
//! an upstream failure, so a stale copy answers when one is held.

use super::context::Job;
use super::flight::Fetched;
use crate::app::App;
use crate::route::{Route, Target};
use http::StatusCode;
use std::sync::Arc;

/// While the org is out of credits, the upstream's last 402 instead of a
/// call that would be refused anyway.
pub(super) fn exhausted(app: &Arc<App>, job: &Job) -> Option<Arc<Fetched>> {
    let (headers, body) = app.org.exhausted()?;
    app.metrics.upstream_exhausted(&job.team.name);
    probe(app, job);
    Some(Arc::new(Fetched {
        status: StatusCode::PAYMENT_REQUIRED,
        headers,
        body,
        credits: 0,
        bill: None,
        worth: 0,
        from_cache: false,
        etag: None,
    }))
}

/// While the org is out of credits, ask the upstream's own /v2/usage now and
/// then whether credits came back (free: usage costs nothing).
fn probe(app: &Arc<App>, job: &Job) {
    if !app.org.probe_due() {
        return;
    }
    let app = app.clone();
    let (request_id, trace) = (job.request_id.clone(), job.trace.clone());
    tokio::spawn(async move {
        let target = Target {
            route: Route::Usage,
            path: "/v2/usage".into(),
            query: None,
        };
        let Ok(resp) = app
            .upstream
            .fetch(&target, &request_id, &trace, None, &app.metrics)
            .await
        else {
            return;
        };
        let over = serde_json::from_slice::<serde_json::Value>(&resp.body)
            .ok()
            .and_then(|v| v.get("is_over_limit").and_then(serde_json::Value::as_bool));
        if resp.status == StatusCode::OK && over == Some(false) {
            app.org.recovered();
        }
    });
}
