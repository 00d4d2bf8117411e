//! Id lookups of many requests share one upstream call: the org's ~120
//! calls a minute go further when a call carries every id that waits for
//! one (the by-id operations take up to 50, and the upstream bills per
//! record, not per call).
//!
//! A request's buyer (`per_piece`) that leads some ids reserves for them in
//! its own team's budget (refused: a 402 for its ids alone, nothing about
//! the others changes), then joins its route's queue. The first to join an
//! idle queue drives it: it gathers for `upstream.batch_window_ms` when the
//! route had a call in the last second (a crowd is likely arriving; a lone
//! lookup on an idle gateway goes at once), takes one fair turn at the
//! upstream rate for the team whose ids have waited longest, then takes
//! up to 50 ids, round-robin over teams (a team flooding lookups cannot
//! push another's ids out of the next batch), and sends them in one call;
//! ids that did not fit wait for the next turn, which the driver takes at
//! once. While a turn is waited for, every id that arrives joins.
//!
//! **Money.** A buyer is a purchase's stake (`purchase`): its ids' credits
//! reserved in its own budgets before it joins. The batch's call settles
//! every stake by the purchase's one rule: each buyer pays the records of
//! its own ids, and what the bill stakes beyond the records (or a bill with
//! no records to count) is split by the ids each asked, up to each
//! reservation; so a lookup costs the same alone and in a batch, and only
//! what no reservation covers is left untracked.
//!
//! **Failure.** A refused turn or a failed call reaches every buyer of the
//! batch as the error a lone lookup would have got; an answer is read and
//! filed once, by the same rules as a lone one (`learn`), and each buyer
//! takes what it says of its own ids. A 422 (an id the upstream refuses)
//! is no buyer's but the one whose id it was: each buyer of a batch of
//! several then asks alone.

use super::kind::{Got, Kind, PieceOutcome};
use super::learn::learn;
use crate::app::App;
use crate::auth::Team;
use crate::cache::records::IdList;
use crate::error::GatewayError;
use crate::proxy::context::Job;
use crate::proxy::fetch;
use crate::proxy::purchase::{self, Opened, Stake};
use crate::route::Route;
use http::StatusCode;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The most ids one by-id call takes (the upstream's limit).
const MAX_IDS: usize = 50;

/// How long after a route's last call a new id still gathers company.
const RECENT: Duration = Duration::from_secs(1);

/// Now, on tokio's clock (converted at once to the one clock type): a
/// test's paused clock moves the window.
#[expect(clippy::disallowed_types, reason = "tokio's clock read, converted at once")]
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// The queues of ids waiting for a call, by route.
#[derive(Clone, Default)]
pub(crate) struct Batches(Arc<Mutex<HashMap<Route, Queue>>>);

#[derive(Default)]
struct Queue {
    /// Buyers waiting, per team, in the order they joined.
    waiting: HashMap<String, VecDeque<Buyer>>,
    /// Teams with buyers waiting, in round-robin order.
    turn: VecDeque<String>,
    /// Ids waiting.
    ids: usize,
    /// A driver is gathering or waiting for a turn.
    driven: bool,
    /// When the route's last call went.
    last_call: Option<Instant>,
}

/// One request's ids, waiting for a call.
struct Buyer {
    /// Its stake in the call: its ids' credits reserved in its own budgets
    /// (`purchase`).
    stake: Stake,
    list: IdList,
    wanted: Vec<usize>,
    done: oneshot::Sender<Share>,
}

/// What a buyer gets back: what the call said of each of its ids, and what
/// its team was charged.
pub(super) struct Share {
    pub(super) got: Vec<PieceOutcome>,
    pub(super) charged: u64,
}

impl Share {
    fn failed(n: usize, e: GatewayError) -> Share {
        Share {
            got: vec![Err(e); n],
            charged: 0,
        }
    }
}

impl Batches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Route, Queue>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a buyer; `true` when it is to drive the queue.
    fn join(&self, route: Route, buyer: Buyer) -> bool {
        let mut queues = self.lock();
        let q = queues.entry(route).or_default();
        let team = buyer.stake.job.team.name.clone();
        if !q.waiting.contains_key(&team) {
            q.turn.push_back(team.clone());
        }
        q.ids += buyer.wanted.len();
        q.waiting.entry(team).or_default().push_back(buyer);
        !std::mem::replace(&mut q.driven, true)
    }

    /// How long the next batch gathers: the window when the route had a
    /// call lately and the batch is not full yet, else nothing.
    fn gathering(&self, route: Route, window: Duration) -> Duration {
        let queues = self.lock();
        let Some(q) = queues.get(&route) else {
            return Duration::ZERO;
        };
        let recent = q.last_call.is_some_and(|t| now().saturating_duration_since(t) < RECENT);
        if recent && q.ids < MAX_IDS {
            window
        } else {
            Duration::ZERO
        }
    }

    /// The team whose ids have waited longest (the round's head), for the
    /// fair turn; `None` when nothing waits (the driver stops).
    fn head(&self, route: Route) -> Option<Arc<Team>> {
        let mut queues = self.lock();
        let q = queues.get_mut(&route)?;
        let team = q
            .turn
            .front()
            .and_then(|t| q.waiting.get(t))
            .and_then(|w| w.front())
            .map(|b| b.stake.job.team.clone());
        if team.is_none() {
            q.driven = false;
        }
        team
    }

    /// Up to [`MAX_IDS`] ids, buyer by buyer, round-robin over teams; a
    /// buyer is never split.
    fn take(&self, route: Route) -> Vec<Buyer> {
        let mut queues = self.lock();
        let Some(q) = queues.get_mut(&route) else {
            return Vec::new();
        };
        let mut taken: Vec<Buyer> = Vec::new();
        let mut ids = 0;
        let mut skipped = 0;
        while skipped < q.turn.len() {
            let Some(team) = q.turn.pop_front() else { break };
            let Some(list) = q.waiting.get_mut(&team) else { continue };
            let fits = list.front().is_some_and(|b| ids + b.wanted.len() <= MAX_IDS);
            if fits {
                if let Some(buyer) = list.pop_front() {
                    ids += buyer.wanted.len();
                    taken.push(buyer);
                }
                skipped = 0;
            } else {
                skipped += 1;
            }
            if q.waiting.get(&team).is_some_and(VecDeque::is_empty) {
                q.waiting.remove(&team);
            } else {
                q.turn.push_back(team);
            }
        }
        q.ids -= ids;
        q.last_call = Some(now());
        taken
    }
}

/// Buys `wanted` of `list` in its route's next call; what the call said of
/// each and what it cost this request's team.
pub(super) async fn buy(app: &Arc<App>, batches: &Batches, job: &Job, list: &IdList, wanted: &[usize]) -> Share {
    let n = wanted.len();
    let Some(target) = list.call(wanted, 0) else {
        return Share::failed(n, GatewayError::Internal);
    };
    let mut job = job.clone();
    job.target = target;
    // Not a page key: the answer is filed piece by piece.
    job.key = None;
    // Its own ids, in its own budget, before it joins anyone.
    let stake = match purchase::open(app, &job, n as u64).await {
        Ok(Opened::Staked(stake)) => *stake,
        Ok(Opened::OrgExhausted(refusal)) => {
            return Share {
                got: vec![Ok(Got::Refused(refusal)); n],
                charged: 0,
            }
        }
        Err(e) => return Share::failed(n, e),
    };
    let route = job.target.route;
    let (done, share) = oneshot::channel();
    let buyer = Buyer {
        stake,
        list: list.clone(),
        wanted: wanted.to_vec(),
        done,
    };
    if batches.join(route, buyer) {
        app.detach(drive(app.clone(), batches.clone(), route));
    }
    // The driver runs detached: it only goes away without answering if it
    // panicked.
    share.await.unwrap_or_else(|_| Share::failed(n, GatewayError::Internal))
}

/// Sends the route's batches while buyers wait: gather, a fair turn, take,
/// send (each send in a task of its own, so the next batch's turn is
/// waited for meanwhile).
async fn drive(app: Arc<App>, batches: Batches, route: Route) {
    let window = Duration::from_millis(app.config.upstream.batch_window_ms);
    loop {
        let gather = batches.gathering(route, window);
        if !gather.is_zero() {
            tokio::time::sleep(gather).await;
        }
        let Some(team) = batches.head(route) else { return };
        let turn = purchase::turn(&app, &team.name).await;
        let taken = batches.take(route);
        if taken.is_empty() {
            continue;
        }
        match turn {
            Ok(()) => {
                app.detach(send(app.clone(), taken));
            }
            Err(e) => {
                for buyer in taken {
                    buyer.stake.release(&app).await;
                    let _ = buyer.done.send(Share::failed(buyer.wanted.len(), e.clone()));
                }
            }
        }
    }
}

/// One call for the buyers' ids (their stakes' purchase); each buyer's
/// share of what it said and of its bill (`purchase::shares`: its records,
/// then the rest by the ids it asked).
async fn send(app: Arc<App>, buyers: Vec<Buyer>) {
    let (list, at) = union(&buyers);
    app.metrics
        .upstream_batch(buyers[0].stake.job.target.route, list.ids.len(), buyers.len());
    let all: Vec<usize> = (0..list.ids.len()).collect();
    let mut job = buyers[0].stake.job.clone();
    let Some(target) = list.call(&all, 0) else { return };
    job.target = target;
    let mut stakes = Vec::with_capacity(buyers.len());
    let mut waiting = Vec::with_capacity(buyers.len());
    for b in buyers {
        waiting.push((b.stake.job.clone(), b.list, b.wanted, b.done));
        stakes.push(b.stake);
    }
    let called = purchase::call(&app, &job, stakes).await;
    if waiting.len() > 1 && refused_id(&called.outcome) {
        // One buyer's id refused the whole list (billed nothing): each asks
        // alone.
        called.settle(&app, None).await;
        for (job, list, wanted, done) in waiting {
            app.detach(alone(app.clone(), job, list, wanted, done));
        }
        return;
    }
    let got = learn(&app, &list, &all, &job, called.outcome.clone()).await;
    let records: Vec<u64> = at
        .iter()
        .map(|idx| idx.iter().filter(|i| is_record(&got[**i])).count() as u64)
        .collect();
    let counted = records.iter().any(|r| *r > 0);
    let charges = called.settle(&app, counted.then_some(records.as_slice())).await;
    for (((_, _, _, done), idx), charged) in waiting.into_iter().zip(at).zip(charges) {
        let got = idx.iter().map(|i| got[*i].clone()).collect();
        let _ = done.send(Share { got, charged });
    }
}

/// A buyer's ids asked alone, after a batch they shared was refused for
/// someone's id: a purchase of its own, in its own call.
async fn alone(app: Arc<App>, mut job: Job, list: IdList, wanted: Vec<usize>, done: oneshot::Sender<Share>) {
    let all: Vec<usize> = (0..wanted.len()).collect();
    let Some(target) = list.call(&wanted, 0) else {
        return;
    };
    job.target = target;
    let outcome = fetch::uncoalesced(&app, job.clone()).await;
    let charged = fetch::charged(&outcome, fetch::Role::Leader);
    let list = IdList {
        ids: wanted.iter().map(|i| list.ids[*i].clone()).collect(),
        keys: wanted.iter().map(|i| list.keys[*i].clone()).collect(),
        ..list
    };
    let got = learn(&app, &list, &all, &job, outcome).await;
    let _ = done.send(Share { got, charged });
}

/// The buyers' ids as one list, and where each buyer's ids are in it.
fn union(buyers: &[Buyer]) -> (IdList, Vec<Vec<usize>>) {
    let first = &buyers[0].list;
    let mut list = IdList {
        resource: first.resource,
        path: first.path.clone(),
        ids: Vec::new(),
        keys: Vec::new(),
    };
    let at = buyers
        .iter()
        .map(|b| {
            b.wanted
                .iter()
                .map(|i| {
                    list.ids.push(b.list.ids[*i].clone());
                    list.keys.push(b.list.keys[*i].clone());
                    list.ids.len() - 1
                })
                .collect()
        })
        .collect();
    (list, at)
}

/// Whether a piece came back as a record (one credit).
fn is_record(got: &PieceOutcome) -> bool {
    matches!(got, Ok(Got::Held(e)) if !e.body.is_empty())
}

/// Whether the call's answer is the upstream's 422 for an id of the list.
fn refused_id(outcome: &crate::proxy::flight::Outcome) -> bool {
    matches!(outcome, Ok(f) if f.status == StatusCode::UNPROCESSABLE_ENTITY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::flight::Fetched;

    const WINDOW: Duration = Duration::from_millis(20);

    /// The window on tokio's paused clock: an idle route's lookup goes at
    /// once; within a second of the route's last call the next gathers for
    /// the window; a second later it goes at once again.
    #[tokio::test(start_paused = true)]
    async fn a_route_called_within_the_last_second_gathers_for_the_window() {
        let batches = Batches::default();
        let route = Route::PermitsById;
        assert_eq!(batches.gathering(route, WINDOW), Duration::ZERO, "never called");
        // A call goes (an empty take marks it as the route's last).
        batches.lock().entry(route).or_default();
        assert!(batches.take(route).is_empty());
        assert_eq!(batches.gathering(route, WINDOW), WINDOW, "just called");
        tokio::time::advance(RECENT - Duration::from_millis(1)).await;
        assert_eq!(batches.gathering(route, WINDOW), WINDOW, "still within the second");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            batches.gathering(route, WINDOW),
            Duration::ZERO,
            "a second on: idle again"
        );
    }

    /// A full batch never waits for company, however recent the last call.
    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once() {
        let batches = Batches::default();
        let route = Route::PermitsById;
        batches.lock().entry(route).or_default();
        batches.take(route);
        batches.lock().get_mut(&route).expect("queued").ids = MAX_IDS;
        assert_eq!(batches.gathering(route, WINDOW), Duration::ZERO);
    }

    fn fetched_ok(body: &'static str) -> Fetched {
        Fetched {
            status: StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::from_static(body.as_bytes()),
            credits: 0,
            bill: None,
            worth: 0,
            from_cache: false,
            etag: None,
        }
    }

    #[test]
    fn a_422_refuses_an_id_and_nothing_else_does() {
        let mut refused = fetched_ok("{}");
        refused.status = StatusCode::UNPROCESSABLE_ENTITY;
        assert!(refused_id(&Ok(Arc::new(refused))));
        assert!(!refused_id(&Ok(Arc::new(fetched_ok("{}")))));
        assert!(!refused_id(&Err(GatewayError::UpstreamTimeout)));
    }
}
