//! Buying a lookup's missing ids once, however lookups overlap (issue 24):
//! per-id flights in this process, per-id leases across replicas.
//!
//! A lookup joins the flight of each id it misses. The ids it leads go to a
//! task of their own (a client that hangs up leaves no flight, lease or
//! reservation behind), which takes each id's Redis lease — one key at a
//! time: each id hashes to its own Cluster slot — waits for the peers that
//! hold theirs, and buys the rest in one upstream call, reserved for those
//! ids alone. The ids it follows it waits for. Every flight ends with what
//! the buy said of its id, after the records are filed (in both tiers, so a
//! peer polling L2 finds them before the lease goes).
//!
//! Lists are keyed by no list at all: reordered, repeated and overlapping
//! lookups meet on their shared ids.

use super::ids::query_of;
use super::{IdFlights, IdGot, IdOutcome};
use crate::app::App;
use crate::cache::lease::{Acquired, Lease, Peer};
use crate::cache::records::{records_of, Resource};
use crate::cache::{control, Entry};
use crate::error::GatewayError;
use crate::metrics::RecordSource;
use crate::proxy::flight::{follow, Fetched, Join, Leader};
use crate::proxy::{context::Job, credits, fetch};
use bytes::Bytes;
use http::StatusCode;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rounds of joining for ids whose leader failed for its own reasons (its
/// team's budget or rate): each round this lookup leads or follows anew.
const ROUNDS: usize = 4;

/// What a lookup gathered for its missing ids.
pub(super) struct Gathered {
    /// Each missing id's outcome, in order.
    pub(super) outcomes: Vec<IdOutcome>,
    /// Whether this lookup led (and its team paid for) each id's buy.
    pub(super) led: Vec<bool>,
    /// What this lookup's own buys cost its team.
    pub(super) charged: u64,
}

/// Each missing id's record, absence or failure: led ids bought by a task
/// of this lookup, the others waited for.
pub(super) async fn gather(
    app: &Arc<App>,
    flights: &IdFlights,
    job: &Job,
    resource: Resource,
    missing: &[String],
) -> Gathered {
    let n = missing.len();
    let mut outcomes: Vec<Option<IdOutcome>> = vec![None; n];
    let mut led = vec![false; n];
    let mut charged = 0;
    for _ in 0..ROUNDS {
        let mut leading = Vec::new();
        let mut waits = Vec::new();
        for i in (0..n).filter(|i| outcomes[*i].is_none()) {
            match flights.join(&resource.key(&missing[i])) {
                Join::Leader(leader) => {
                    led[i] = true;
                    waits.push((i, leader.subscribe()));
                    leading.push((missing[i].clone(), leader));
                }
                Join::Follower(rx) => {
                    led[i] = false;
                    waits.push((i, rx));
                }
            }
        }
        if waits.is_empty() {
            break;
        }
        let buyer = (!leading.is_empty()).then(|| app.detach(buy(app.clone(), job.clone(), resource, leading)));
        for (i, rx) in waits {
            match follow(rx).await {
                Some(Ok(got)) => outcomes[i] = Some(Ok(got)),
                Some(Err(e)) if led[i] || e.upstream_failed() => outcomes[i] = Some(Err(e)),
                // Its leader failed for its own reasons: the next round.
                _ => {}
            }
        }
        if let Some(buyer) = buyer {
            charged += buyer.await.unwrap_or(0);
        }
    }
    let outcomes = outcomes
        .into_iter()
        .map(|o| o.unwrap_or(Err(GatewayError::UpstreamUnavailable)))
        .collect();
    Gathered { outcomes, led, charged }
}

/// An id this lookup leads, and whether its lease is still to be taken
/// (not after a wait on a peer ran out: then it is bought without one).
struct Todo {
    id: String,
    leader: Leader<IdOutcome>,
    lease_first: bool,
}

/// Ours to buy: the id, its flight, its lease (none without Redis, or
/// after the wait for a peer ran out).
type Ours = (String, Leader<IdOutcome>, Option<Lease>);

/// The buyer of the ids a lookup leads: takes their leases, waits for the
/// peers that hold theirs, buys the rest in one call; again for ids whose
/// peer went without filing them. Returns what its calls cost the team.
async fn buy(app: Arc<App>, job: Job, resource: Resource, leading: Vec<(String, Leader<IdOutcome>)>) -> u64 {
    let deadline = Instant::now() + Duration::from_millis(app.config.cache.coalesce_wait_ms);
    let mut todo: Vec<Todo> = leading
        .into_iter()
        .map(|(id, leader)| Todo {
            id,
            leader,
            lease_first: true,
        })
        .collect();
    // A lookup with `max-age` (a `no_cache` job) takes no held record the
    // age of which it did not check, only what is bought from now on.
    let since_ms = if job.no_cache { crate::clock::now_ms() } else { 0 };
    let mut charged = 0;
    while !todo.is_empty() {
        let (ours, theirs) = take_leases(&app, resource, todo).await;
        let ours = if job.no_cache {
            ours
        } else {
            held_meanwhile(&app, resource, ours).await
        };
        let (paid, again) = tokio::join!(
            buy_now(&app, &job, resource, ours),
            wait_for_peers(&app, resource, theirs, deadline, since_ms)
        );
        charged += paid;
        todo = again;
    }
    charged
}

/// Each id's lease, all asked at once: owned (or no Redis to ask) is ours
/// to buy, held is a peer's.
async fn take_leases(app: &Arc<App>, resource: Resource, todo: Vec<Todo>) -> (Vec<Ours>, Vec<Todo>) {
    let keys = todo
        .iter()
        .filter(|t| t.lease_first)
        .map(|t| resource.key(&t.id))
        .collect();
    let mut acquired = all(keys, |key| {
        let app = app.clone();
        async move { app.leases.acquire(&key).await }
    })
    .await
    .into_iter();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for t in todo {
        if !t.lease_first {
            ours.push((t.id, t.leader, None));
            continue;
        }
        match acquired.next().flatten() {
            Some(Acquired::Owned(lease)) => ours.push((t.id, t.leader, Some(lease))),
            Some(Acquired::Held) => theirs.push(t),
            Some(Acquired::Unavailable) | None => ours.push((t.id, t.leader, None)),
        }
    }
    (ours, theirs)
}

/// One more look at both tiers before paying: a flight that ended between
/// the lookup's own look and its join, or a peer that filed and released
/// just before our lease, left the record there.
async fn held_meanwhile(app: &App, resource: Resource, ours: Vec<Ours>) -> Vec<Ours> {
    if ours.is_empty() {
        return ours;
    }
    let ids: Vec<String> = ours.iter().map(|(id, _, _)| id.clone()).collect();
    let now = crate::clock::now_ms();
    let held = app.cache.held_records(resource, &ids).await;
    let mut left = Vec::with_capacity(ours.len());
    for ((id, leader, lease), held) in ours.into_iter().zip(held) {
        match held.filter(|e| e.is_fresh(now)) {
            Some(entry) => {
                if let Some(lease) = lease {
                    lease.release().await;
                }
                leader.complete(Ok(IdGot::Held(entry)));
            }
            None => left.push((id, leader, lease)),
        }
    }
    left
}

/// Waits, all at once, for the peers holding these ids' leases. An id a
/// peer filed ends its flight; one whose peer went without filing it is
/// taken in turn (its lease first); one whose wait ran out is bought
/// without a lease.
async fn wait_for_peers(
    app: &Arc<App>,
    resource: Resource,
    theirs: Vec<Todo>,
    deadline: Instant,
    since_ms: u64,
) -> Vec<Todo> {
    let keys = theirs.iter().map(|t| resource.key(&t.id)).collect();
    let waited = all(keys, |key| {
        let app = app.clone();
        let left = deadline.saturating_duration_since(Instant::now());
        async move {
            let route = resource.lookup_route();
            app.leases.wait_for_peer(&app.cache, route, &key, left, since_ms).await
        }
    })
    .await;
    let mut again = Vec::new();
    for (mut t, peer) in theirs.into_iter().zip(waited) {
        match peer {
            Some(Peer::Stored(entry)) => {
                // L1 keeps no ETag for records (see `records::record_entry`).
                let entry = Entry {
                    etag: http::HeaderValue::from_static(""),
                    ..entry
                };
                t.leader.complete(Ok(IdGot::Held(Arc::new(entry))));
            }
            Some(Peer::Gone) => again.push(t),
            Some(Peer::GaveUp) | None => {
                t.lease_first = false;
                again.push(t);
            }
        }
    }
    again
}

/// One upstream call for these ids (reserved for them alone);
/// files what it says of them, then releases their leases and ends their
/// flights. Returns what it cost the team.
async fn buy_now(app: &Arc<App>, job: &Job, resource: Resource, ours: Vec<Ours>) -> u64 {
    if ours.is_empty() {
        return 0;
    }
    let ids: Vec<String> = ours.iter().map(|(id, _, _)| id.clone()).collect();
    let mut job = job.clone();
    job.target.query = Some(query_of(&ids).into());
    // Not a page key: the answer is filed as records, under their ids.
    job.key = None;
    let outcome = fetch::uncoalesced(app, job.clone()).await;
    let (charged, got) = learn(app, &job, resource, &ids, outcome).await;
    let mut leases: Vec<Lease> = Vec::new();
    for ((_, leader, lease), got) in ours.into_iter().zip(got) {
        leases.extend(lease);
        leader.complete(got);
    }
    all(leases, |lease| lease.release()).await;
    charged
}

/// What one call's answer says of each asked id, filed when trustworthy;
/// and what the call cost.
async fn learn(
    app: &App,
    job: &Job,
    resource: Resource,
    ids: &[String],
    outcome: Result<Arc<Fetched>, GatewayError>,
) -> (u64, Vec<IdOutcome>) {
    let fetched = match outcome {
        Ok(f) => f,
        // What a failed call still cost is this lookup's to pay; the ids'
        // flights (other lookups wait on them) carry the failure alone.
        Err(e) => return (e.billed(), vec![Err(e.unbilled()); ids.len()]),
    };
    let charged = fetched.credits;
    if fetched.status != StatusCode::OK {
        return (charged, vec![Ok(IdGot::Refused(fetched)); ids.len()]);
    }
    let Some(records) = records_of(&fetched.body, resource) else {
        let invalid = GatewayError::UpstreamInvalid("Upstream sent a malformed answer");
        return (charged, vec![Err(invalid); ids.len()]);
    };
    let trusted = !foreign(app, job, ids, &records) && complete(&fetched, records.len());
    let route = job.target.route;
    let ttl = app.cache.ttl(route).unwrap_or_default();
    let page = Entry::new(Bytes::new(), 0, ttl, route);
    let learned: Vec<(String, Option<Arc<Entry>>)> = ids
        .iter()
        .map(|id| {
            let body = records.iter().find(|(got, _)| got == id).map(|(_, b)| b);
            let entry = match body {
                Some(body) => Some(Bytes::copy_from_slice(body)),
                None if trusted => Some(Bytes::new()),
                None => None,
            };
            let entry = entry.map(|b| Arc::new(app.cache.record_entry(resource, &page, b)));
            (id.clone(), entry)
        })
        .collect();
    let storable = trusted && !job.no_store && !control::forbids_storing(&fetched.headers);
    if storable {
        let filed: Vec<(String, Arc<Entry>)> = learned
            .iter()
            .filter_map(|(id, e)| e.clone().map(|e| (id.clone(), e)))
            .collect();
        app.cache.file_lookup(resource, &filed).await;
    }
    let got = learned
        .into_iter()
        .map(|(_, e)| Ok(e.map_or(IdGot::Unknown, IdGot::Held)))
        .collect();
    (charged, got)
}

/// Whether the answer carries records for ids it was not asked: an
/// upstream anomaly, counted and logged (the caller files nothing of it).
fn foreign(app: &App, job: &Job, ids: &[String], records: &[(String, Bytes)]) -> bool {
    let foreign = records.iter().filter(|(id, _)| !ids.contains(id)).count();
    if foreign > 0 {
        app.metrics
            .cache_records(job.target.route, RecordSource::Foreign, foreign as u64);
        tracing::warn!(
            request_id = %job.request_id,
            route = job.target.route.as_str(),
            asked = ids.len(),
            foreign,
            "upstream anomaly: a lookup answered records it was not asked for; nothing filed"
        );
    }
    foreign > 0
}

/// A well-formed complete lookup page: one page (`size` its records, no
/// next cursor) billed one credit per record it carries. Only such an
/// answer says that an asked id it lacks is unknown to the upstream; a
/// partial one (billed for records it does not carry) says nothing.
fn complete(fetched: &Fetched, records: usize) -> bool {
    #[derive(serde::Deserialize)]
    struct Envelope {
        size: Option<u64>,
        next_cursor: Option<serde::de::IgnoredAny>,
    }
    let Ok(page) = serde_json::from_slice::<Envelope>(&fetched.body) else {
        return false;
    };
    let n = records as u64;
    page.size == Some(n) && page.next_cursor.is_none() && credits::billed(&fetched.headers) == Some(n)
}

/// Runs `f` on every item at once, each in its own task; answers in
/// order, `None` for a task that panicked.
async fn all<T, R, F, Fut>(items: Vec<T>, f: F) -> Vec<Option<R>>
where
    F: Fn(T) -> Fut,
    Fut: Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let n = items.len();
    for (i, item) in items.into_iter().enumerate() {
        let fut = f(item);
        set.spawn(async move { (i, fut.await) });
    }
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    while let Some(done) = set.join_next().await {
        if let Ok((i, r)) = done {
            out[i] = Some(r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn answer(body: &'static str, billed: Option<u64>) -> Fetched {
        let mut headers = HeaderMap::new();
        if let Some(n) = billed {
            headers.insert(credits::X_CREDITS_REQUEST, crate::http_util::number_header(n));
        }
        Fetched {
            status: StatusCode::OK,
            headers,
            body: Bytes::from_static(body.as_bytes()),
            credits: billed.unwrap_or(0),
            worth: 0,
            from_cache: false,
            etag: None,
        }
    }

    #[test]
    fn only_a_whole_page_billed_for_what_it_carries_is_complete() {
        let two = r#"{"items":[{"id":"a"},{"id":"b"}],"size":2,"next_cursor":null,"total_count":null}"#;
        assert!(complete(&answer(two, Some(2)), 2));
        assert!(!complete(&answer(two, Some(3)), 2), "billed for a record it lacks");
        assert!(!complete(&answer(two, None), 2), "no bill to check");
        let cut = r#"{"items":[{"id":"a"}],"size":2,"next_cursor":null}"#;
        assert!(!complete(&answer(cut, Some(1)), 1), "size says two");
        let paged = r#"{"items":[{"id":"a"}],"size":1,"next_cursor":"x"}"#;
        assert!(!complete(&answer(paged, Some(1)), 1), "a next page");
        let none = r#"{"items":[],"size":0,"next_cursor":null,"total_count":null}"#;
        assert!(complete(&answer(none, Some(0)), 0), "no record, no charge: all unknown");
    }
}
