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
use crate::proxy::flight::{Fetched, Outcome};
use crate::proxy::purchase::{self, Opened, Stake};
use crate::route::Route;
use http::StatusCode;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};
use tokio::task::{AbortHandle, JoinSet};

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
    /// Told when a buyer joins, so the driver asks a turn for its team
    /// at once rather than after the turns it waits for.
    joined: Arc<Notify>,
}

/// Whether anyone still waits for a buyer's ids: its request, or another
/// request that needs the same ids (their flights' [`Watch`]es).
pub(super) type Waited = Box<dyn Fn() -> bool + Send + Sync>;

/// One request's ids, waiting for a call.
struct Buyer {
    /// Its stake in the call: its ids' credits reserved in its own budgets
    /// (`purchase`).
    stake: Stake,
    order: Order,
}

/// What a buyer asked and how it is answered, apart from its stake (which
/// a call takes).
struct Order {
    list: IdList,
    wanted: Vec<usize>,
    /// The request's own cache key: where the upstream's refusal of its ids
    /// is kept, for the page path to answer it without a call.
    request_key: Option<String>,
    waited: Waited,
    /// When its wait at the gate ends (`upstream.max_queue_wait_secs` after
    /// it joined): no call has taken it by then, it leaves with a 429.
    deadline: Instant,
    done: oneshot::Sender<Share>,
}

/// Why a buyer left its queue before a call took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Left {
    /// Nobody waits for its ids any more.
    Abandoned,
    /// Its deadline came.
    Deadline,
}

impl Left {
    fn as_str(self) -> &'static str {
        match self {
            Left::Abandoned => "abandoned",
            Left::Deadline => "deadline",
        }
    }
}

impl Order {
    /// Why it is to leave at `now`, if it is.
    fn leaves(&self, now: Instant) -> Option<Left> {
        if self.done.is_closed() || !(self.waited)() {
            Some(Left::Abandoned)
        } else if now >= self.deadline {
            Some(Left::Deadline)
        } else {
            None
        }
    }
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
        q.ids += buyer.order.wanted.len();
        q.waiting.entry(team).or_default().push_back(buyer);
        q.joined.notify_one();
        !std::mem::replace(&mut q.driven, true)
    }

    /// What tells the route's driver that a buyer joined.
    fn joined(&self, route: Route) -> Arc<Notify> {
        self.lock().entry(route).or_default().joined.clone()
    }

    /// Puts buyers back at the head of their teams' lines (their call was
    /// refused for another's id): they go in the next call. `true` when
    /// one is to drive the queue.
    fn requeue(&self, route: Route, buyers: Vec<Buyer>) -> bool {
        let mut queues = self.lock();
        let q = queues.entry(route).or_default();
        for buyer in buyers.into_iter().rev() {
            let team = buyer.stake.job.team.name.clone();
            q.turn.retain(|t| *t != team);
            q.turn.push_front(team.clone());
            q.ids += buyer.order.wanted.len();
            q.waiting.entry(team).or_default().push_front(buyer);
        }
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

    /// The buyers that are to leave at `now` (nobody waits for them, or
    /// their deadline came), out of the queue, with why.
    fn leaving(&self, route: Route, now: Instant) -> Vec<(Buyer, Left)> {
        let mut queues = self.lock();
        let Some(q) = queues.get_mut(&route) else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        for line in q.waiting.values_mut() {
            let mut kept = VecDeque::with_capacity(line.len());
            for buyer in line.drain(..) {
                match buyer.order.leaves(now) {
                    Some(why) => gone.push((buyer, why)),
                    None => kept.push_back(buyer),
                }
            }
            *line = kept;
        }
        q.waiting.retain(|_, line| !line.is_empty());
        let waiting = &q.waiting;
        q.turn.retain(|t| waiting.contains_key(t));
        q.ids -= gone.iter().map(|(b, _)| b.order.wanted.len()).sum::<usize>();
        gone
    }

    /// The teams with ids waiting, each to take its own fair turn, and
    /// the earliest deadline of any buyer; `None` when nothing waits (the
    /// driver stops).
    fn teams(&self, route: Route) -> Option<(Vec<Arc<Team>>, Instant)> {
        let mut queues = self.lock();
        let q = queues.get_mut(&route)?;
        let teams: Vec<Arc<Team>> = q
            .turn
            .iter()
            .filter_map(|t| q.waiting.get(t)?.front().map(|b| b.stake.job.team.clone()))
            .collect();
        let earliest = q.waiting.values().flatten().map(|b| b.order.deadline).min();
        match earliest {
            Some(earliest) if !teams.is_empty() => Some((teams, earliest)),
            _ => {
                q.driven = false;
                None
            }
        }
    }

    /// Every buyer of `team` waiting, out of the queue (its turn was
    /// refused).
    fn take_team(&self, route: Route, team: &str) -> Vec<Buyer> {
        let mut queues = self.lock();
        let Some(q) = queues.get_mut(&route) else {
            return Vec::new();
        };
        let taken: Vec<Buyer> = q.waiting.remove(team).map(Vec::from).unwrap_or_default();
        q.turn.retain(|t| t != team);
        q.ids -= taken.iter().map(|b| b.order.wanted.len()).sum::<usize>();
        taken
    }

    /// Up to [`MAX_IDS`] ids, buyer by buyer, round-robin over teams from
    /// `first` (whose turn it is); a buyer is never split.
    fn take(&self, route: Route, first: &str) -> Vec<Buyer> {
        let mut queues = self.lock();
        let Some(q) = queues.get_mut(&route) else {
            return Vec::new();
        };
        if let Some(at) = q.turn.iter().position(|t| t == first) {
            q.turn.rotate_left(at);
        }
        let mut taken: Vec<Buyer> = Vec::new();
        let mut ids = 0;
        let mut skipped = 0;
        while skipped < q.turn.len() {
            let Some(team) = q.turn.pop_front() else { break };
            let Some(list) = q.waiting.get_mut(&team) else { continue };
            let fits = list.front().is_some_and(|b| ids + b.order.wanted.len() <= MAX_IDS);
            if fits {
                if let Some(buyer) = list.pop_front() {
                    ids += buyer.order.wanted.len();
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

/// Buys `wanted` of `list` in its route's next call, while `waited` says
/// someone waits for them; what the call said of each and what it cost
/// this request's team.
pub(super) async fn buy(
    app: &Arc<App>,
    batches: &Batches,
    job: &Job,
    (list, wanted): (&IdList, &[usize]),
    waited: Waited,
) -> Share {
    let n = wanted.len();
    let Some(target) = list.call(wanted, 0) else {
        return Share::failed(n, GatewayError::Internal);
    };
    let mut job = job.clone();
    job.target = target;
    // Not a page key: the answer is filed piece by piece.
    let request_key = job.key.take();
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
    // The gate's bound, or the client's shorter `Prefer: wait`.
    let max_wait = Duration::from_secs(app.config.upstream.max_queue_wait_secs);
    let max_wait = job.wait.map_or(max_wait, |w| w.min(max_wait));
    let buyer = Buyer {
        stake,
        order: Order {
            list: list.clone(),
            wanted: wanted.to_vec(),
            request_key,
            waited,
            deadline: now() + max_wait,
            done,
        },
    };
    if batches.join(route, buyer) {
        app.detach(driver(app.clone(), batches.clone(), route));
    }
    // The driver runs detached: it only goes away without answering if it
    // panicked.
    share.await.unwrap_or_else(|_| Share::failed(n, GatewayError::Internal))
}

/// [`drive`], as a future of a type that can be named: a driver's call may
/// start the next driver (a refused batch's buyers, queued again).
fn driver(app: Arc<App>, batches: Batches, route: Route) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(drive(app, batches, route))
}

/// Sends the route's batches while buyers wait. Each team with ids
/// waiting takes its own fair turn at the upstream rate (a light team's
/// lookups wait what its own share implies, not the heaviest team's
/// line); the first turn to come sends a call that carries that team's
/// ids first, then the others' round-robin (each send in a task of its
/// own). A team whose ids all left gives its place back. Before a call,
/// buyers nobody waits for leave without one, and those whose deadline
/// came leave with a 429; turns are waited for only until the earliest
/// deadline. A fresh start gathers for the window first.
async fn drive(app: Arc<App>, batches: Batches, route: Route) {
    let window = Duration::from_millis(app.config.upstream.batch_window_ms);
    let mut turns: JoinSet<(String, Result<(), GatewayError>)> = JoinSet::new();
    let mut pending: HashMap<String, AbortHandle> = HashMap::new();
    let joined = batches.joined(route);
    loop {
        if pending.is_empty() {
            let gather = batches.gathering(route, window);
            if !gather.is_zero() {
                tokio::time::sleep(gather).await;
            }
        }
        withdraw(&app, route, batches.leaving(route, now())).await;
        let Some((teams, earliest)) = batches.teams(route) else {
            return;
        };
        // A place in the gate for each team waiting, none for a team gone.
        pending.retain(|name, turn| {
            let waits = teams.iter().any(|t| t.name == *name);
            if !waits {
                turn.abort();
            }
            waits
        });
        for team in teams {
            if !pending.contains_key(&team.name) {
                let app = app.clone();
                let name = team.name.clone();
                let turn = turns.spawn(async move {
                    let turn = purchase::turn(&app, &name, None).await;
                    (name, turn)
                });
                pending.insert(team.name.clone(), turn);
            }
        }
        let done = tokio::select! {
            done = turns.join_next() => done,
            // A buyer joined: its team takes a turn of its own now.
            () = joined.notified() => continue,
            // A deadline comes first: its buyer leaves, and the turns
            // still waited for keep their places.
            () = tokio::time::sleep_until(earliest.into()) => continue,
        };
        // A turn given back (its team gone) ends as cancelled: look again.
        let Some(Ok((team, turn))) = done else { continue };
        pending.remove(&team);
        match turn {
            Ok(()) => {
                // Who left while the turn was waited for goes without a call.
                withdraw(&app, route, batches.leaving(route, now())).await;
                let taken = batches.take(route, &team);
                if !taken.is_empty() {
                    app.detach(send(app.clone(), batches.clone(), taken));
                }
            }
            Err(e) => {
                for buyer in batches.take_team(route, &team) {
                    buyer.stake.release(&app).await;
                    let _ = buyer
                        .order
                        .done
                        .send(Share::failed(buyer.order.wanted.len(), e.clone()));
                }
            }
        }
    }
}

/// Buyers out of the queue before any call: their credits released, each
/// counted; one whose deadline came is refused (429) with the wait the
/// gate predicts for its team.
async fn withdraw(app: &App, route: Route, gone: Vec<(Buyer, Left)>) {
    for (buyer, why) in gone {
        app.metrics.upstream_withdrawn(route, why.as_str());
        let team = buyer.stake.job.team.name.clone();
        buyer.stake.release(app).await;
        if why == Left::Deadline {
            let wait = app.scheduler.predicted_wait(&team);
            let refused = GatewayError::UpstreamRateLimited {
                retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
            };
            let _ = buyer.order.done.send(Share::failed(buyer.order.wanted.len(), refused));
        }
    }
}

/// One call for the buyers' ids (their stakes' purchase); each buyer's
/// share of what it said and of its bill (`purchase::shares`: its records,
/// then the rest by the ids it asked).
async fn send(app: Arc<App>, batches: Batches, buyers: Vec<Buyer>) {
    let route = buyers[0].stake.job.target.route;
    let (list, at) = union(&buyers);
    app.metrics.upstream_batch(route, list.ids.len(), buyers.len());
    let all: Vec<usize> = (0..list.ids.len()).collect();
    let mut job = buyers[0].stake.job.clone();
    let Some(target) = list.call(&all, 0) else { return };
    job.target = target;
    let mut stakes = Vec::with_capacity(buyers.len());
    let mut orders = Vec::with_capacity(buyers.len());
    for b in buyers {
        orders.push((b.stake.job.clone(), b.order));
        stakes.push(b.stake);
    }
    let called = purchase::call(&app, &job, stakes).await;
    let called = if orders.len() > 1 && refused_id(&called.outcome) {
        match called.unbilled() {
            Ok((outcome, stakes)) => return refused(&app, &batches, route, (outcome, &at), stakes, orders).await,
            Err(billed) => billed,
        }
    } else {
        called
    };
    let got = learn(&app, &list, &all, &job, called.outcome.clone()).await;
    let records: Vec<u64> = at
        .iter()
        .map(|idx| idx.iter().filter(|i| is_record(&got[**i])).count() as u64)
        .collect();
    let counted = records.iter().any(|r| *r > 0);
    let charges = called.settle(&app, counted.then_some(records.as_slice())).await;
    for (((_, order), idx), charged) in orders.into_iter().zip(at).zip(charges) {
        let got = idx.iter().map(|i| got[*i].clone()).collect();
        let _ = order.done.send(Share { got, charged });
    }
}

/// A batch the upstream refused (422, billed nothing) for some buyers'
/// ids: each of those gets the upstream's refusal of its own ids, at
/// their places in its own request (kept, so the page path answers it
/// without a call), and its credits back; the others go again together in
/// the next call, their stakes whole. A refusal that names no id of the
/// list (or names every buyer) leaves each buyer to ask alone.
async fn refused(
    app: &Arc<App>,
    batches: &Batches,
    route: Route,
    (outcome, at): (Outcome, &[Vec<usize>]),
    stakes: Vec<Stake>,
    orders: Vec<(Job, Order)>,
) {
    let refusals = match &outcome {
        Ok(f) => offenders(&f.body, at, &orders),
        Err(_) => None,
    };
    let Some(refusals) = refusals.filter(|r| r.iter().any(Option::is_none)) else {
        for (stake, (job, order)) in stakes.into_iter().zip(orders) {
            stake.release(app).await;
            app.detach(alone(app.clone(), job, order));
        }
        return;
    };
    let headers = outcome.as_ref().map(|f| f.headers.clone()).unwrap_or_default();
    let mut again = Vec::new();
    for ((stake, (_, order)), refusal) in stakes.into_iter().zip(orders).zip(refusals) {
        let Some(body) = refusal else {
            again.push(Buyer { stake, order });
            continue;
        };
        stake.release(app).await;
        let content_type = headers.get(http::header::CONTENT_TYPE).cloned();
        if let Some(key) = &order.request_key {
            app.cache.refusals.keep(key, body.clone(), content_type);
        }
        let refusal = Arc::new(Fetched {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            headers: headers.clone(),
            body,
            credits: 0,
            bill: Some(0),
            worth: 0,
            from_cache: false,
            etag: None,
        });
        let n = order.wanted.len();
        let _ = order.done.send(Share {
            got: vec![Ok(Got::Refused(refusal)); n],
            charged: 0,
        });
    }
    if batches.requeue(route, again) {
        app.detach(driver(app.clone(), batches.clone(), route));
    }
}

/// Which buyers the upstream's 422 refuses: for each, the refusal of its
/// own ids as the upstream would write it for its request as sent (each
/// `loc` index moved from the batch's list to the request's), or `None`
/// for a buyer it does not name. `None` when an error of the body is not
/// about an id of the list.
fn offenders(body: &[u8], at: &[Vec<usize>], orders: &[(Job, Order)]) -> Option<Vec<Option<bytes::Bytes>>> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut mine: Vec<Vec<serde_json::Value>> = vec![Vec::new(); orders.len()];
    for error in v.get("detail")?.as_array()? {
        let loc = error.get("loc")?.as_array()?;
        let k = match loc.as_slice() {
            [q, id, k] if q == "query" && id == "id" => usize::try_from(k.as_u64()?).ok()?,
            _ => return None,
        };
        let (b, j) = at
            .iter()
            .enumerate()
            .find_map(|(b, idx)| idx.iter().position(|i| *i == k).map(|j| (b, j)))?;
        let mut error = error.clone();
        error["loc"][2] = serde_json::json!(orders[b].1.wanted[j]);
        mine[b].push(error);
    }
    Some(
        mine.into_iter()
            .map(|errors| {
                (!errors.is_empty()).then(|| {
                    let body = serde_json::json!({ "detail": errors });
                    bytes::Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
                })
            })
            .collect(),
    )
}

/// A buyer's ids asked alone, after a batch they shared was refused and
/// the refusal could not be told apart: a purchase of its own, in its own
/// call.
async fn alone(app: Arc<App>, mut job: Job, order: Order) {
    let Order { list, wanted, done, .. } = order;
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
    let first = &buyers[0].order.list;
    let mut list = IdList {
        resource: first.resource,
        path: first.path.clone(),
        ids: Vec::new(),
        keys: Vec::new(),
    };
    let at = buyers
        .iter()
        .map(|b| {
            b.order
                .wanted
                .iter()
                .map(|i| {
                    list.ids.push(b.order.list.ids[*i].clone());
                    list.keys.push(b.order.list.keys[*i].clone());
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
fn refused_id(outcome: &Outcome) -> bool {
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
        assert!(batches.take(route, "alpha").is_empty());
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
        batches.take(route, "alpha");
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
