//! [`lookup_ids`]: id lookups answered from the record tier (docs/design.md
//! §2, `lookup_ids`, for `permits_by_id`, `contractors_by_id`,
//! `decisions_by_id`, `properties_by_id`; the tier is
//! [`crate::cache::records`]).
//!
//! Runs instead of the page [`lookup`](super::lookup) and
//! [`fetch`](fn@super::fetch) when `cache.record_reuse` is on and the client
//! did not say `no-cache`. The records already held answer at 0 credits;
//! only the missing ids go upstream, each bought once however lookups
//! overlap ([`buy`]: per-id flights and leases), in one call reserved and
//! settled for those alone (the `fetch` of any miss, uncoalesced); the
//! answer is assembled as the upstream assembles it (`docs/vendor-api.md`,
//! "Id lookups"): request order, each id once, unknown ids omitted, in
//! `{"items":[…],"size":n,"next_cursor":null,"total_count":null}`.
//!
//! `X-Cache` is `HIT` when every id was held, `MISS` when some were bought,
//! `STALE` when the upstream failed and expired records stood in;
//! `X-Credits-Request` is what this team paid (a failed call the upstream
//! still billed included).

mod buy;
mod ids;

use super::context::{Ask, CacheState, RequestContext};
use super::credits::X_CREDITS_REQUEST;
use super::fetch::{self, Role};
use super::flight::{Fetched, Flights};
use super::respond::{self, saved};
use super::State;
use crate::app::App;
use crate::auth::Team;
use crate::cache::control::Directives;
use crate::cache::records::{is_absent, Resource};
use crate::cache::Entry;
use crate::clock::now_ms;
use crate::error::GatewayError;
use crate::http_util::{number_header, Body};
use crate::metrics::RecordSource;
use crate::route::Target;
use bytes::{BufMut, Bytes, BytesMut};
use http::{Method, Request, Response, StatusCode};
use std::sync::Arc;
use std::time::Duration;

type Answer = Result<Response<Body>, GatewayError>;
/// A held record or absence, if any.
type Held = Option<Arc<Entry>>;

/// What a lookup learned about one id it bought or waited for.
#[derive(Debug, Clone)]
pub(super) enum IdGot {
    /// Its record, or its absence (an empty body).
    Held(Arc<Entry>),
    /// The answer that was to bring it cannot be trusted to say the
    /// upstream does not know it (`buy::learn`): omitted, not filed.
    Unknown,
    /// The upstream answered the call that was to buy it with an error
    /// status (402, 429, 5xx, 422): that answer stands for it.
    Refused(Arc<Fetched>),
}

/// An id's flight: what its buyer learned, or the error that ended the buy.
pub(super) type IdOutcome = Result<IdGot, GatewayError>;

/// Per-id flights: an id some lookup of this process is buying is waited
/// for, not bought again ([`State::id_flights`]).
pub(super) type IdFlights = Flights<IdOutcome>;

/// The answer of an id lookup from held records and the missing ids'
/// fetch; `None` when this request is not one (the page path answers it).
pub(super) async fn lookup_ids<B>(
    app: &Arc<App>,
    state: &State,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
) -> Option<Answer> {
    let (d, target) = (&ask.directives, &ask.parsed.target);
    let resource = Resource::of_lookup(target.route)?;
    if !app.cache.record_reuse() || d.no_cache {
        return None;
    }
    let ttl = app.cache.ttl(target.route)?;
    let ids = ids::lookup_ids(target.route, target.query.as_deref()?)?;
    let (found, from_disk) = app.cache.held_records_from(resource, &ids).await;
    let (held, stale) = split_fresh(found, d);
    let missing: Vec<String> = ids
        .iter()
        .zip(&held)
        .filter(|(_, h)| h.is_none())
        .map(|(id, _)| id.clone())
        .collect();
    let page = Page {
        ids: &ids,
        ttl,
        target,
        req: ask.req,
        from_disk: &from_disk,
    };
    if missing.is_empty() {
        tally(app, &ask.team, target, &held, 0, &from_disk);
        ctx.cache = CacheState::Hit;
        return Some(Ok(page.respond(&held, &[], 0, CacheState::Hit)));
    }
    // Like only-if-cached, a HEAD never buys anything.
    if d.only_if_cached || ask.req.method() == Method::HEAD {
        return Some(Err(GatewayError::NotCached));
    }
    // The fetch of the missing ids alone, each id bought once whoever else
    // asks for it (`buy`): the ids another lookup is buying are waited
    // for, the others bought in one call.
    let job = ask.job(&ctx.request_id);
    let got = buy::gather(app, &state.id_flights, &job, resource, &missing).await;
    ctx.credits = got.charged;
    // Stale on failure: stale records for every missing id stand in, and
    // the answer says what the failed calls still cost.
    let failed = got.outcomes.iter().any(|o| match o {
        // The one rule (`fetch::upstream_failed`) for an answer that
        // refuses the ids as for any other.
        Ok(IdGot::Refused(f)) => fetch::upstream_failed(&Ok(f.clone())),
        Ok(_) => false,
        Err(e) => e.upstream_failed(),
    });
    if failed && stale.iter().zip(&held).all(|(s, h)| h.is_some() || s.is_some()) {
        let merged: Vec<_> = held.iter().zip(stale).map(|(h, s)| h.clone().or(s)).collect();
        tally(app, &ask.team, target, &merged, 0, &from_disk);
        ctx.cache = CacheState::Stale;
        return Some(Ok(page.respond(&merged, &[], got.charged, CacheState::Stale)));
    }
    gathered(app, ask, ctx, &page, &held, &missing, got)
}

/// The answer from the held records and what was gathered for the missing
/// ids: the assembled page, or the refusal or error that stands for them.
fn gathered<B>(
    app: &App,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
    page: &Page<'_, B>,
    held: &[Held],
    missing: &[String],
    got: buy::Gathered,
) -> Option<Answer> {
    let (target, charged) = (page.target, got.charged);
    let mut bought: Vec<(String, Bytes)> = Vec::with_capacity(missing.len());
    for ((id, outcome), led) in missing.iter().zip(got.outcomes).zip(got.led) {
        match outcome {
            // The error says what the lookup's failed calls still cost.
            Err(e) => return Some(Err(e.billed_at(charged))),
            // An id the upstream refuses (a city's id in a property lookup)
            // refuses the whole lookup, with its position in the list: the
            // page path asks again with the request as sent (a 422 costs
            // nothing).
            Ok(IdGot::Refused(f)) if f.status == StatusCode::UNPROCESSABLE_ENTITY => return None,
            Ok(IdGot::Refused(f)) => {
                let role = if led { Role::Leader } else { Role::Follower };
                return Some(respond::from_fetched(app, &ask.team, target, f, role, false, ctx));
            }
            Ok(IdGot::Held(e)) if !is_absent(&e) => {
                // Another lookup's purchase: a credit this team did not spend.
                if !led {
                    saved(app, &ask.team, target, e.credits);
                }
                bought.push((id.clone(), e.body.clone()));
            }
            Ok(IdGot::Held(_) | IdGot::Unknown) => {}
        }
    }
    tally(app, &ask.team, target, held, bought.len(), page.from_disk);
    ctx.cache = CacheState::Miss;
    Some(Ok(page.respond(held, &bought, charged, CacheState::Miss)))
}

/// Fresh entries answer; the others (within the stale grace) only stand in
/// when the upstream fails. A client's `max-age` binds records as it binds
/// pages.
fn split_fresh(entries: Vec<Option<Arc<Entry>>>, d: &Directives) -> (Vec<Held>, Vec<Held>) {
    let now = now_ms();
    entries
        .into_iter()
        .map(|h| {
            let young = |e: &Arc<Entry>| d.max_age.is_none_or(|max| e.age(now).as_secs() <= max);
            match h {
                Some(e) if e.is_fresh(now) && young(&e) => (Some(e), None),
                other => (None, other),
            }
        })
        .unzip()
}

/// Counts each id by where its answer came from; the held records are
/// credits this team did not spend (those the disk tier had and memory did
/// not under `reason="disk"`, issue 37).
fn tally(app: &App, team: &Team, target: &Target, held: &[Option<Arc<Entry>>], fetched: usize, disk: &[bool]) {
    let reused = held.iter().flatten().filter(|e| !is_absent(e)).count() as u64;
    let from_disk = held
        .iter()
        .zip(disk)
        .filter(|(h, d)| **d && h.as_ref().is_some_and(|e| !is_absent(e)))
        .count() as u64;
    respond::saved_because(app, team, target, from_disk, crate::metrics::SavedReason::Disk);
    let absent = held.iter().flatten().filter(|e| is_absent(e)).count() as u64;
    let sources = [
        (RecordSource::Cache, reused),
        (RecordSource::Absent, absent),
        (RecordSource::Upstream, fetched as u64),
    ];
    for (source, ids) in sources {
        app.metrics.cache_records(target.route, source, ids);
    }
    saved(app, team, target, reused - from_disk);
}

/// The upstream's lookup page: each id's record in request order, from the
/// held entry or else the fetched records; absent and unknown ids omitted.
fn assemble(ids: &[String], held: &[Option<Arc<Entry>>], fetched: &[(String, Bytes)]) -> Bytes {
    let records: Vec<&[u8]> = ids
        .iter()
        .zip(held)
        .filter_map(|(id, h)| match h {
            Some(e) if is_absent(e) => None,
            Some(e) => Some(&e.body[..]),
            None => fetched.iter().find(|(got, _)| got == id).map(|(_, b)| &b[..]),
        })
        .collect();
    let mut out = BytesMut::with_capacity(records.iter().map(|r| r.len() + 1).sum::<usize>() + 64);
    out.put_slice(b"{\"items\":[");
    for (i, record) in records.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(record);
    }
    out.put_slice(
        format!(
            "],\"size\":{},\"next_cursor\":null,\"total_count\":null}}",
            records.len()
        )
        .as_bytes(),
    );
    out.freeze()
}

/// What an assembled answer is made for.
struct Page<'a, B> {
    ids: &'a [String],
    ttl: Duration,
    target: &'a Target,
    req: &'a Request<B>,
    /// Which held entries the disk tier had (memory did not).
    from_disk: &'a [bool],
}

impl<B> Page<'_, B> {
    /// The response for the assembled page: as for a cached entry (ETag,
    /// 304, `Age` of the oldest record used), with what this team paid.
    fn respond(&self, held: &[Held], fetched: &[(String, Bytes)], charged: u64, state: CacheState) -> Response<Body> {
        let body = assemble(self.ids, held, fetched);
        let mut page = Entry::new(body, charged, self.ttl, self.target.route);
        let oldest = held.iter().flatten().map(|e| e.stored_at_ms).min();
        page.stored_at_ms = oldest.map_or(page.stored_at_ms, |t| t.min(page.stored_at_ms));
        let mut resp = respond::from_entry(&page, state, self.req.headers());
        resp.headers_mut().insert(X_CREDITS_REQUEST, number_header(charged));
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Route;

    fn record(id: &str) -> Option<Arc<Entry>> {
        let body = Bytes::from(format!("{{\"id\":\"{id}\"}}"));
        Some(Arc::new(Entry::new(
            body,
            1,
            Duration::from_secs(60),
            Route::PermitsById,
        )))
    }

    #[test]
    fn assembly_follows_request_order_and_omits_absent_ids() {
        let absent = Some(Arc::new(Entry::new(
            Bytes::new(),
            0,
            Duration::from_secs(60),
            Route::PermitsById,
        )));
        let ids: Vec<String> = ["c", "x", "a", "n"].map(String::from).to_vec();
        let held = [record("c"), absent, None, None];
        let fetched = [("a".to_string(), Bytes::from_static(br#"{"id":"a"}"#))];
        let body = assemble(&ids, &held, &fetched);
        assert_eq!(
            &body[..],
            br#"{"items":[{"id":"c"},{"id":"a"}],"size":2,"next_cursor":null,"total_count":null}"#
        );
    }
}
