//! [`Buying::PerPiece`](super::kind::Buying): a request's missing pieces bought
//! once however requests overlap: a flight per piece in this process, a
//! lease per piece across replicas.
//!
//! A request joins the flight of each piece it misses. The pieces it leads
//! go to a task of their own (a client that hangs up leaves no flight,
//! lease or reservation behind), which takes each piece's Redis lease (one
//! key at a time: each piece hashes to its own Cluster slot), waits for the
//! peers that hold theirs, and buys the rest in one upstream call, reserved
//! for those pieces alone. The pieces it follows it waits for. Every flight
//! ends with what the buy said of its piece, after the pieces are filed (in
//! every tier, so a peer polling L2 finds them before the lease goes).
//!
//! Lists are keyed by no list at all: reordered, repeated and overlapping
//! requests meet on their shared pieces.

use super::batch::{self, Batches};
use super::kind::{Bought, Got, Kind, PieceOutcome};
use super::learn::learn;
use crate::app::App;
use crate::cache::lease::{Acquired, Lease, Peer};
use crate::error::GatewayError;
use crate::proxy::context::Job;
use crate::proxy::fetch;
use crate::proxy::flight::{follow, Flights, Join, Leader};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Per-piece flights: a piece some request of this process is buying is
/// waited for, not bought again (`Buyers`).
pub(crate) type PieceFlights = Flights<PieceOutcome>;

/// Rounds of joining for pieces whose leader failed for its own reasons
/// (its team's budget or rate): each round this request leads or follows
/// anew.
const ROUNDS: usize = 4;

/// Each missing piece's entry, absence or failure: the led ones bought by
/// a task of this request, the others waited for; and what this request's
/// calls cost its team.
pub(super) async fn gather<K: Kind>(
    app: &Arc<App>,
    (flights, batches): (&PieceFlights, &Batches),
    job: &Job,
    kind: &K,
    missing: &[usize],
) -> (Bought, u64) {
    let n = missing.len();
    let mut outcomes: Vec<Option<PieceOutcome>> = vec![None; n];
    let mut led = vec![false; n];
    let mut charged = 0;
    for _ in 0..ROUNDS {
        let mut leading = Vec::new();
        let mut waits = Vec::new();
        for at in (0..n).filter(|at| outcomes[*at].is_none()) {
            let i = missing[at];
            match flights.join(&kind.keys()[i]) {
                Join::Leader(leader) => {
                    led[at] = true;
                    waits.push((at, leader.subscribe()));
                    leading.push(Todo {
                        i,
                        leader,
                        lease_first: true,
                    });
                }
                Join::Follower(rx) => {
                    led[at] = false;
                    waits.push((at, rx));
                }
            }
        }
        if waits.is_empty() {
            break;
        }
        let buyer = (!leading.is_empty()).then(|| {
            let task = buy(app.clone(), batches.clone(), job.clone(), kind.clone(), leading);
            app.detach(task)
        });
        for (at, rx) in waits {
            match follow(rx).await {
                Some(Ok(got)) => outcomes[at] = Some(Ok(got)),
                Some(Err(e)) if led[at] || e.upstream_failed() => outcomes[at] = Some(Err(e)),
                // Its leader failed for its own reasons: the next round.
                _ => {}
            }
        }
        if let Some(buyer) = buyer {
            charged += buyer.await.unwrap_or(0);
        }
    }
    let called = led.iter().any(|l| *l);
    let got = missing
        .iter()
        .zip(outcomes)
        .zip(led)
        .map(|((i, o), led)| (*i, o.unwrap_or(Err(GatewayError::UpstreamUnavailable)), led))
        .collect();
    (Bought { got, called }, charged)
}

/// A piece this request leads, and whether its lease is still to be taken
/// (not after a wait on a peer ran out: then it is bought without one).
struct Todo {
    i: usize,
    leader: Leader<PieceOutcome>,
    lease_first: bool,
}

/// Ours to buy: the piece, its flight, its lease (none without Redis, or
/// after the wait for a peer ran out).
type Ours = (usize, Leader<PieceOutcome>, Option<Lease>);

/// The buyer of the pieces a request leads: takes their leases, waits for
/// the peers that hold theirs, buys the rest in one call; again for pieces
/// whose peer went without filing them. Returns what its calls cost the
/// team.
async fn buy<K: Kind>(app: Arc<App>, batches: Batches, job: Job, kind: K, leading: Vec<Todo>) -> u64 {
    let deadline = Instant::now() + Duration::from_millis(app.config.cache.coalesce_wait_ms);
    // A request with `max-age` (a `no_cache` job) takes no held piece the
    // age of which it did not check, only what is bought from now on.
    let since_ms = if job.no_cache { crate::clock::now_ms() } else { 0 };
    let mut todo = leading;
    let mut charged = 0;
    while !todo.is_empty() {
        let (ours, theirs) = take_leases(&app, &kind, todo).await;
        let ours = if job.no_cache {
            ours
        } else {
            held_meanwhile(&app, &kind, ours).await
        };
        let (paid, again) = tokio::join!(
            buy_now(&app, &batches, &job, &kind, ours),
            wait_for_peers(&app, &kind, theirs, deadline, since_ms)
        );
        charged += paid;
        todo = again;
    }
    charged
}

/// Each piece's lease, all asked at once: owned (or no Redis to ask) is
/// ours to buy, taken is a peer's.
async fn take_leases<K: Kind>(app: &Arc<App>, kind: &K, todo: Vec<Todo>) -> (Vec<Ours>, Vec<Todo>) {
    let keys = todo
        .iter()
        .filter(|t| t.lease_first)
        .map(|t| kind.keys()[t.i].clone())
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
            ours.push((t.i, t.leader, None));
            continue;
        }
        match acquired.next().flatten() {
            Some(Acquired::Owned(lease)) => ours.push((t.i, t.leader, Some(lease))),
            Some(Acquired::Taken) => theirs.push(t),
            Some(Acquired::Unavailable) | None => ours.push((t.i, t.leader, None)),
        }
    }
    (ours, theirs)
}

/// One more look at every tier before paying: a flight that ended between
/// the request's own look and its join, or a peer that filed and released
/// just before our lease, left the piece there.
async fn held_meanwhile<K: Kind>(app: &App, kind: &K, ours: Vec<Ours>) -> Vec<Ours> {
    if ours.is_empty() {
        return ours;
    }
    let keys: Vec<String> = ours.iter().map(|(i, _, _)| kind.keys()[*i].clone()).collect();
    let now = crate::clock::now_ms();
    let held = app.cache.get_many(kind.route(), &keys).await;
    let mut left = Vec::with_capacity(ours.len());
    for ((i, leader, lease), held) in ours.into_iter().zip(held) {
        match held.filter(|(e, _)| e.is_fresh(now)) {
            Some((entry, _)) => {
                if let Some(lease) = lease {
                    lease.release().await;
                }
                leader.complete(Ok(Got::Held(entry)));
            }
            None => left.push((i, leader, lease)),
        }
    }
    left
}

/// Waits, all at once, for the peers holding these pieces' leases. A piece
/// a peer filed ends its flight; one whose peer went without filing it is
/// taken in turn (its lease first); one whose wait ran out is bought
/// without a lease.
async fn wait_for_peers<K: Kind>(
    app: &Arc<App>,
    kind: &K,
    theirs: Vec<Todo>,
    deadline: Instant,
    since_ms: u64,
) -> Vec<Todo> {
    let keys = theirs.iter().map(|t| kind.keys()[t.i].clone()).collect();
    let route = kind.route();
    let waited = all(keys, |key| {
        let app = app.clone();
        let left = deadline.saturating_duration_since(Instant::now());
        async move { app.leases.wait_for_peer(&app.cache, route, &key, left, since_ms).await }
    })
    .await;
    let mut again = Vec::new();
    for (mut t, peer) in theirs.into_iter().zip(waited) {
        match peer {
            Some(Peer::Stored(entry)) => t.leader.complete(Ok(Got::Held(Arc::new(entry)))),
            Some(Peer::Gone) => again.push(t),
            Some(Peer::GaveUp) | None => {
                t.lease_first = false;
                again.push(t);
            }
        }
    }
    again
}

/// These pieces bought in one upstream call, reserved for them alone (ids
/// in their route's next batch, which may carry other requests' too); files
/// what it says of them, then releases their leases and ends their flights.
/// Returns what it cost the team.
async fn buy_now<K: Kind>(app: &Arc<App>, batches: &Batches, job: &Job, kind: &K, ours: Vec<Ours>) -> u64 {
    if ours.is_empty() {
        return 0;
    }
    let wanted: Vec<usize> = ours.iter().map(|(i, _, _)| *i).collect();
    let (charged, got) = match (kind.ids(), kind.call(&wanted, 0)) {
        (Some(list), _) => {
            // While a request waits for one of these ids (its own, or a
            // follower): nobody waiting, they leave the batch uncalled.
            let watches: Vec<_> = ours.iter().map(|(_, leader, _)| leader.watch()).collect();
            let waited: batch::Waited = Box::new(move || watches.iter().any(|w| w.waited()));
            let share = batch::buy(app, batches, job, (list, &wanted), waited).await;
            (share.charged, share.got)
        }
        (None, Some(target)) => {
            let mut job = job.clone();
            job.target = target;
            // Not a page key: the answer is filed piece by piece.
            job.key = None;
            let outcome = fetch::uncoalesced(app, job.clone()).await;
            (
                fetch::charged(&outcome, fetch::Role::Leader),
                learn(app, kind, &wanted, &job, outcome).await,
            )
        }
        (None, None) => (0, vec![Err(GatewayError::Internal); wanted.len()]),
    };
    let mut leases: Vec<Lease> = Vec::new();
    for ((_, leader, lease), got) in ours.into_iter().zip(got) {
        leases.extend(lease);
        leader.complete(got);
    }
    all(leases, |lease| lease.release()).await;
    charged
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
