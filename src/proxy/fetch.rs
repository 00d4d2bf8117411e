//! The miss path, [`fetch`](fn@super::fetch) of the pipeline, in the order
//! it runs: [`coalesce`] (one call per key in this process), [`take_lease`]
//! (one across replicas), then [`fetch_upstream`]: the purchase
//! (`purchase`: org probe, reserve, fair turn, call, settle or release)
//! and [`store`].
//!
//! **A reservation has one owner and one end.** Every upstream call runs in
//! a task of its own ([`owned`]) that stakes the coalescing flight, the
//! cross-replica lease and the reservation. No request owns them: a client
//! that hangs up drops only its wait, while the task settles what the
//! upstream charged (or releases what it did not), stores the answer and
//! hands it to every follower. A follower never starts a second paid call
//! for a key whose call is still running.

use super::context::Job;
use super::flight::{follow, Fetched, Flights, Join, Leader, Outcome};
use super::purchase::{self, Opened};
use crate::app::App;
use crate::cache::lease::{Acquired, Lease, Peer};
use crate::cache::{control, Entry};
use crate::clock::now_ms;
use crate::error::GatewayError;
use crate::scheduler::Asker;
use crate::telemetry::SPANS;
use http::{HeaderMap, HeaderValue, StatusCode};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// How this request took part in the fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// It fetched (and its team pays).
    Leader,
    /// Another request's fetch answered it.
    Follower,
}

/// What a request pays for a fetch's outcome, the one rule on every path
/// (a page, pieces bought in a turn, a background refresh): the leader of
/// a call that reached the upstream pays what the purchase charged it,
/// billed failures included; a follower, or an answer found in the cache
/// by the fetch, pays nothing.
pub(super) fn charged(outcome: &Outcome, role: Role) -> u64 {
    match (outcome, role) {
        (Ok(f), Role::Leader) if !f.from_cache => f.credits,
        (Err(e), Role::Leader) => e.billed(),
        _ => 0,
    }
}

/// The one rule for "the upstream failed" on every path (pages, id
/// lookups, refreshes, followers): an upstream error (its error statuses
/// became [`GatewayError`]s where the fetch returned), or the org's 402
/// (out of credits, passed on with the upstream's body). Then a stale copy
/// answers when one is held, and a follower takes the failure as its own.
pub(super) fn upstream_failed(outcome: &Outcome) -> bool {
    match outcome {
        Ok(f) => f.status == StatusCode::PAYMENT_REQUIRED && !f.from_cache,
        Err(e) => e.upstream_failed(),
    }
}

/// One upstream fetch per key at a time in this process; the others wait
/// for it. A follower whose leader failed for its own reasons (its budget,
/// its rate) tries itself; an upstream failure is everyone's.
pub(super) async fn coalesce(app: &Arc<App>, flights: &Flights<Outcome>, job: Job) -> (Outcome, Role) {
    let Some(key) = job.key.clone() else {
        return (uncoalesced(app, job).await, Role::Leader);
    };
    loop {
        match flights.join(&key) {
            Join::Leader(leader) => return (owned(app, job, Some(leader)).await, Role::Leader),
            Join::Follower(rx) => match follow(rx).await {
                Some(Ok(fetched)) => return (Ok(fetched), Role::Follower),
                // A follower paid nothing for its leader's failure.
                Some(failed) if upstream_failed(&failed) => {
                    return (failed.map_err(GatewayError::unbilled), Role::Follower)
                }
                _ => continue,
            },
        }
    }
}

/// A fetch no other request joins (no page key: a buy of pieces, which
/// have flights of their own: `reuse`), run like any other in a task of
/// its own.
pub(super) async fn uncoalesced(app: &Arc<App>, job: Job) -> Outcome {
    owned(app, job, None).await
}

/// Runs the fetch in a task that owns the flight: the caller only waits
/// for it. The flight completes with the task's outcome whatever happens to
/// the request that started it.
async fn owned(app: &Arc<App>, job: Job, leader: Option<Leader<Outcome>>) -> Outcome {
    let (done, result) = tokio::sync::oneshot::channel();
    let task_app = app.clone();
    app.detach(
        async move {
            // Someone still waits for this call: the request that started
            // it, or a follower of its flight.
            let waited = || !done.is_closed() || leader.as_ref().is_some_and(|l| l.waiting() > 0);
            let outcome = run(&task_app, job, &waited).await;
            if let Some(leader) = leader {
                leader.complete(outcome.clone());
            }
            let _ = done.send(outcome);
        }
        // Its spans are the request's children (a no-op without export).
        .in_current_span(),
    );
    // The task only goes away without sending if it panicked.
    result.await.unwrap_or(Err(GatewayError::Internal))
}

/// The owner's work: the cache again, the cross-replica lease, the call.
async fn run(app: &Arc<App>, job: Job, waited: &(dyn Fn() -> bool + Sync)) -> Outcome {
    // A flight that ended between our lookup and our join stored its answer:
    // take it instead of buying the key a second time.
    if let (Some(key), false) = (&job.key, job.no_cache) {
        if let Some((entry, _)) = app.cache.lookup(job.target.route, key).await {
            if entry.is_fresh(now_ms()) {
                return Ok(Arc::new(cached(&entry)));
            }
        }
        // The upstream refused this very query a moment ago: its 422 again,
        // without spending one of the org's calls on it.
        if let Some(refusal) = app.cache.refusals.get(key) {
            return Ok(Arc::new(refused(&refusal)));
        }
    }
    let Some(key) = &job.key else {
        return fetch_upstream(app, &job, waited).await;
    };
    let turn = take_lease(app, &job, key).instrument(tracing::info_span!(target: SPANS, "lease_wait"));
    let lease = match turn.await {
        Leased::Stored(entry) => return Ok(Arc::new(cached(&entry))),
        Leased::Buy(lease) => lease,
    };
    let outcome = fetch_upstream(app, &job, waited).await;
    if let Some(lease) = lease {
        lease.release().await;
    }
    outcome
}

/// Where the cross-replica lease leaves the owner.
enum Leased {
    /// A peer bought the key meanwhile: its entry answers.
    Stored(Entry),
    /// Ours to buy: under the lease, or without one when Redis cannot give
    /// one or the peer took longer than `cache.coalesce_wait_ms`.
    Buy(Option<Lease>),
}

/// Takes the key's lease, or waits for the peer that stakes it, until one of
/// the two has the entry or ours is the turn to buy. A lease that went
/// without an entry is taken in turn, never bypassed: two replicas that
/// both saw it go would otherwise both buy.
async fn take_lease(app: &App, job: &Job, key: &str) -> Leased {
    let deadline = Instant::now() + Duration::from_millis(app.config.cache.coalesce_wait_ms);
    // `no-cache`: only an answer the peer is buying now, not its old entry.
    let since_ms = if job.no_cache { now_ms() } else { 0 };
    loop {
        match app.leases.acquire(key).await {
            Acquired::Owned(lease) => {
                // The lease may be free because a peer has just stored the
                // key and released it, after our last look at the cache:
                // one more look at L2 before paying.
                if !job.no_cache {
                    if let Some(entry) = app.cache.fresh_in_redis(job.target.route, key).await {
                        lease.release().await;
                        return Leased::Stored(entry);
                    }
                }
                return Leased::Buy(Some(lease));
            }
            Acquired::Taken => {
                let left = deadline.saturating_duration_since(Instant::now());
                match app
                    .leases
                    .wait_for_peer(&app.cache, job.target.route, key, left, since_ms)
                    .await
                {
                    Peer::Stored(entry) => return Leased::Stored(entry),
                    Peer::Gone => continue,
                    Peer::GaveUp => return Leased::Buy(None),
                }
            }
            Acquired::Unavailable => return Leased::Buy(None),
        }
    }
}

/// A refusal kept (`cache::refusals`) as a fetch result: free, from no call.
fn refused(refusal: &crate::cache::refusals::Refusal) -> Fetched {
    let mut headers = HeaderMap::new();
    if let Some(ct) = &refusal.content_type {
        headers.insert(http::header::CONTENT_TYPE, ct.clone());
    }
    Fetched {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        headers,
        body: refusal.body.clone(),
        credits: 0,
        bill: Some(0),
        worth: 0,
        from_cache: true,
        etag: None,
    }
}

/// A cache entry as a fetch result: free for whoever it answers.
fn cached(entry: &Entry) -> Fetched {
    Fetched {
        status: StatusCode::OK,
        headers: HeaderMap::new(),
        body: entry.body.clone(),
        credits: 0,
        bill: Some(entry.credits),
        worth: entry.credits,
        from_cache: true,
        etag: Some(entry.etag.clone()),
    }
}

/// How often a miss waiting for its turn looks whether anyone still waits
/// for it.
const LOOK_FOR_CLIENT: Duration = Duration::from_millis(100);

/// The miss's purchase (`purchase`): one stake, one call; the answer
/// stored, a refusal kept. No call starts for nobody: when no client waits
/// any more (the request hung up while it waited for its lease or its
/// turn, and no other request follows it), the stake is released and the
/// call never made (a follower arriving just then asks again itself).
async fn fetch_upstream(app: &Arc<App>, job: &Job, waited: &(dyn Fn() -> bool + Sync)) -> Outcome {
    if !waited() {
        return Err(abandoned(app, job));
    }
    let stake = match purchase::open(app, job, 1).await? {
        Opened::Staked(stake) => *stake,
        Opened::OrgExhausted(refusal) => return Ok(refusal),
    };
    let turn = purchase::turn(app, Asker::of(&job.team, job.member.bulk), job.wait);
    // Nobody waits any more: leave the line before the turn comes, so the
    // window's place goes to a call someone waits for.
    let left = async {
        while waited() {
            tokio::time::sleep(LOOK_FOR_CLIENT).await;
        }
    };
    let turn = tokio::select! {
        turn = turn => turn,
        () = left => {
            stake.release(app).await;
            return Err(abandoned(app, job));
        }
    };
    if let Err(e) = turn {
        stake.release(app).await;
        return Err(e);
    }
    if !waited() {
        stake.release(app).await;
        return Err(abandoned(app, job));
    }
    let called = purchase::call(app, job, vec![stake]).await;
    let outcome = called.outcome.clone();
    called.settle(app, None).await;
    let fetched = outcome?;
    if let (Some(key), Some(etag)) = (&job.key, &fetched.etag) {
        store(app, job, key, &fetched, etag).await;
    }
    if let (Some(key), StatusCode::UNPROCESSABLE_ENTITY) = (&job.key, fetched.status) {
        let content_type = fetched.headers.get(http::header::CONTENT_TYPE).cloned();
        app.cache.refusals.keep(key, fetched.body.clone(), content_type);
    }
    Ok(fetched)
}

/// A call withdrawn for want of anyone waiting: counted; its error is
/// nobody's (not the upstream's, so a follower that joined meanwhile asks
/// again rather than take it).
fn abandoned(app: &App, job: &Job) -> GatewayError {
    app.metrics.upstream_withdrawn(job.target.route, "abandoned");
    GatewayError::Unavailable("No client waits for this call")
}

/// Stores 200 answers (already checked to be JSON) under the size cap,
/// unless the client said `no-store` or the upstream `no-store`/`private`.
/// The entry is worth what was charged (never above the reservation).
async fn store(app: &App, job: &Job, key: &str, resp: &Fetched, etag: &HeaderValue) {
    let Some(ttl) = app.cache.ttl(job.target.route) else {
        return;
    };
    let storable = resp.status == StatusCode::OK
        && !job.no_store
        && !control::forbids_storing(&resp.headers)
        && resp.body.len() <= app.cache.max_entry_bytes;
    if storable {
        let entry = Entry::with_etag(resp.body.clone(), etag.clone(), resp.worth, ttl, job.target.route);
        app.cache.store(key, Arc::new(entry)).await;
    }
}
