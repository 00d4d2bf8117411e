//! What one call's answer says of each piece it was to buy, filed when the
//! answer can be trusted: the `file` step of the engine, for every way of
//! buying.
//!
//! The answer is read as a page of these pieces ([`Kind::read`]). It is
//! trusted when it is billed one credit per item (its bill, from the
//! upstream or from the cache entry that answered: `Fetched::bill`) and
//! every item is one of the pieces asked: then its pieces are filed, and,
//! when it is one whole page (nothing follows it), so is the absence of
//! each piece it lacks. An answer that is not trusted files nothing: its
//! pieces answer this request alone, and the ones it lacks are unknown.

use super::kind::{Got, Kind, PieceOutcome};
use crate::app::App;
use crate::cache::{control, Entry};
use crate::error::GatewayError;
use crate::metrics::RecordSource;
use crate::page::Page;
use crate::proxy::context::Job;
use crate::proxy::flight::Outcome;
use bytes::Bytes;
use http::StatusCode;
use std::sync::Arc;

/// Each wanted piece's outcome from one call's outcome.
pub(super) async fn learn<K: Kind>(
    app: &App,
    kind: &K,
    wanted: &[usize],
    job: &Job,
    outcome: Outcome,
) -> Vec<PieceOutcome> {
    let n = wanted.len();
    let fetched = match outcome {
        Ok(f) => f,
        // What a failed call still cost is its buyer's to pay (charged
        // where the call returned); the pieces carry the failure alone.
        Err(e) => return vec![Err(e.unbilled()); n],
    };
    // An answer found in the cache was filed when it was bought: filed
    // again now, its pieces would claim to be younger than they are.
    let storable = !job.no_store && !fetched.from_cache && !control::forbids_storing(&fetched.headers);
    if fetched.status != StatusCode::OK {
        if !kind.none_found(fetched.status) {
            return vec![Ok(Got::Refused(fetched)); n];
        }
        let absent: Vec<Option<Bytes>> = vec![None; n];
        return file(app, kind, wanted, absent, true, storable).await;
    }
    let invalid = || vec![Err(GatewayError::UpstreamInvalid("Upstream sent a malformed answer")); n];
    let Some(page) = Page::parse(&fetched.body) else {
        return invalid();
    };
    let Some(read) = kind.read(wanted, &fetched.body, &page) else {
        anomaly(job, "an answer that is not a page of the pieces asked; nothing filed");
        return invalid();
    };
    if read.foreign > 0 {
        app.metrics
            .cache_records(job.target.route, RecordSource::Foreign, read.foreign as u64);
        anomaly(job, "an answer with items it was not asked for; nothing filed");
    }
    let trusted = read.foreign == 0 && fetched.bill == Some(page.len());
    let whole = trusted && page.whole();
    file(app, kind, wanted, read.pieces, whole, trusted && storable).await
}

/// The outcome of each wanted piece: its entry, its absence when `whole`
/// says the upstream does not have it, or unknown; filed when `storable`,
/// for the pieces a held entry may stand for.
async fn file<K: Kind>(
    app: &App,
    kind: &K,
    wanted: &[usize],
    pieces: Vec<Option<Bytes>>,
    whole: bool,
    storable: bool,
) -> Vec<PieceOutcome> {
    let mut filed = Vec::new();
    let mut got = Vec::with_capacity(wanted.len());
    for (&i, piece) in wanted.iter().zip(pieces) {
        let entry = match piece {
            Some(body) => Arc::new(kind.entry(&app.cache, i, body)),
            None if whole => Arc::new(kind.entry(&app.cache, i, Bytes::new())),
            None => {
                got.push(Ok(Got::Unknown));
                continue;
            }
        };
        if storable && kind.holds(i) {
            filed.push((kind.keys()[i].clone(), Entry::clone(&entry)));
        }
        got.push(Ok(Got::Held(entry)));
    }
    app.cache.put_many(kind.route(), filed).await;
    got
}

fn anomaly(job: &Job, what: &'static str) {
    tracing::warn!(
        request_id = %job.request_id,
        route = job.target.route.as_str(),
        "upstream anomaly: {what}"
    );
}
