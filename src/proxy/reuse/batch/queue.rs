//! The queues of ids waiting for a call, by route: who waits (a buyer: its
//! stake and its order), in which team's line, since when and until when,
//! and what a call takes from them.

use super::super::kind::PieceOutcome;
use super::gather::{self, Arrivals, Pace};
use crate::auth::Team;
use crate::cache::records::IdList;
use crate::error::GatewayError;
use crate::proxy::purchase::Stake;
use crate::route::Route;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};

/// The most ids one by-id call takes (the upstream's limit).
pub(super) const MAX_IDS: usize = 50;

/// How long after a route's last call a new id still gathers company.
const RECENT: Duration = Duration::from_secs(1);

/// Now, on tokio's clock (converted at once to the one clock type): a
/// test's paused clock moves the window.
#[expect(clippy::disallowed_types, reason = "tokio's clock read, converted at once")]
pub(super) fn now() -> Instant {
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
    /// The rate its ids arrive at (the gathering rule reads it).
    arrivals: Arrivals,
    /// Told when a buyer joins, so the driver asks a turn for its team
    /// at once rather than after the turns it waits for.
    joined: Arc<Notify>,
}

/// A team with ids waiting, and whether its turn is bulk (every id it has
/// waiting is a bulk app's: it takes only what interactive calls leave).
pub(super) type WaitingTeam = (Arc<Team>, bool);

/// Whether anyone still waits for a buyer's ids: its request, or another
/// request that needs the same ids (their flights' [`Watch`]es).
pub(crate) type Waited = Box<dyn Fn() -> bool + Send + Sync>;

/// One request's ids, waiting for a call.
pub(super) struct Buyer {
    /// Its stake in the call: its ids' credits reserved in its own budgets
    /// (`purchase`).
    pub(super) stake: Stake,
    pub(super) order: Order,
}

/// What a buyer asked and how it is answered, apart from its stake (which
/// a call takes).
pub(super) struct Order {
    pub(super) list: IdList,
    pub(super) wanted: Vec<usize>,
    /// The request's own cache key: where the upstream's refusal of its ids
    /// is kept, for the page path to answer it without a call.
    pub(super) request_key: Option<String>,
    pub(super) waited: Waited,
    /// When its wait at the gate ends (`upstream.max_queue_wait_secs` after
    /// it joined): no call has taken it by then, it leaves with a 429.
    pub(super) deadline: Instant,
    pub(super) done: oneshot::Sender<Share>,
}

/// Why a buyer left its queue before a call took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Left {
    /// Nobody waits for its ids any more.
    Abandoned,
    /// Its deadline came.
    Deadline,
}

impl Left {
    pub(super) fn as_str(self) -> &'static str {
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
pub(crate) struct Share {
    pub(crate) got: Vec<PieceOutcome>,
    pub(crate) charged: u64,
}

impl Share {
    pub(super) fn failed(n: usize, e: GatewayError) -> Share {
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
    pub(super) fn join(&self, route: Route, buyer: Buyer) -> bool {
        let mut queues = self.lock();
        let q = queues.entry(route).or_default();
        let team = buyer.stake.job.team.name.clone();
        if !q.waiting.contains_key(&team) {
            q.turn.push_back(team.clone());
        }
        q.ids += buyer.order.wanted.len();
        q.arrivals.note(now(), buyer.order.wanted.len());
        q.waiting.entry(team).or_default().push_back(buyer);
        q.joined.notify_one();
        !std::mem::replace(&mut q.driven, true)
    }

    /// What tells the route's driver that a buyer joined.
    pub(super) fn joined(&self, route: Route) -> Arc<Notify> {
        self.lock().entry(route).or_default().joined.clone()
    }

    /// Puts buyers back at the head of their teams' lines (their call was
    /// refused for another's id): they go in the next call. `true` when
    /// one is to drive the queue.
    pub(super) fn requeue(&self, route: Route, buyers: Vec<Buyer>) -> bool {
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

    /// Until when the route's next call, gathering since `started`, waits
    /// for company (`gather::span`: a crowd or scarce calls wait for a
    /// full call, a route called in the last second for the window); never
    /// later than one interval before the earliest buyer's deadline, so
    /// that its turn can still come. `None`: it leaves now (a full call
    /// always does).
    pub(super) fn gathering(&self, route: Route, started: Instant, pace: Pace) -> Option<Instant> {
        let queues = self.lock();
        let q = queues.get(&route)?;
        if q.ids >= MAX_IDS {
            return None;
        }
        let now = now();
        let recently = q
            .last_call
            .is_some_and(|t| started.saturating_duration_since(t) < RECENT);
        let mut until = started + gather::span(pace, &q.arrivals, now, recently, MAX_IDS);
        if let Some(earliest) = q.waiting.values().flatten().map(|b| b.order.deadline).min() {
            until = until.min(earliest.checked_sub(pace.interval).unwrap_or(now));
        }
        (until > now).then_some(until)
    }

    /// The buyers that are to leave at `now` (nobody waits for them, or
    /// their deadline came), out of the queue, with why.
    pub(super) fn leaving(&self, route: Route, now: Instant) -> Vec<(Buyer, Left)> {
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
    pub(super) fn teams(&self, route: Route) -> Option<(Vec<WaitingTeam>, Instant)> {
        let mut queues = self.lock();
        let q = queues.get_mut(&route)?;
        // A team's turn is bulk when every id it has waiting is a bulk app's.
        let teams: Vec<WaitingTeam> = q
            .turn
            .iter()
            .filter_map(|t| {
                let line = q.waiting.get(t)?;
                let bulk = line.iter().all(|b| b.stake.job.member.bulk);
                line.front().map(|b| (b.stake.job.team.clone(), bulk))
            })
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
    pub(super) fn take_team(&self, route: Route, team: &str) -> Vec<Buyer> {
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
    pub(super) fn take(&self, route: Route, first: &str) -> Vec<Buyer> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// 120 calls a minute and the default window, calls plentiful.
    const PACE: Pace = Pace {
        window: Duration::from_millis(20),
        interval: Duration::from_millis(500),
        scarce: false,
    };

    /// How long a call starting to gather now would wait.
    fn waits(batches: &Batches, route: Route, pace: Pace) -> Duration {
        let started = now();
        batches
            .gathering(route, started, pace)
            .map_or(Duration::ZERO, |until| until - started)
    }

    /// The window on tokio's paused clock: an idle route's lookup goes at
    /// once; within a second of the route's last call the next gathers for
    /// the window; a second later it goes at once again.
    #[tokio::test(start_paused = true)]
    async fn a_route_called_within_the_last_second_gathers_for_the_window() {
        let batches = Batches::default();
        let route = Route::PermitsById;
        assert_eq!(waits(&batches, route, PACE), Duration::ZERO, "never called");
        // A call goes (an empty take marks it as the route's last).
        batches.lock().entry(route).or_default();
        assert!(batches.take(route, "alpha").is_empty());
        assert_eq!(waits(&batches, route, PACE), PACE.window, "just called");
        tokio::time::advance(RECENT - Duration::from_millis(1)).await;
        assert_eq!(waits(&batches, route, PACE), PACE.window, "still within the second");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(waits(&batches, route, PACE), Duration::ZERO, "a second on: idle again");
    }

    /// A full batch never waits for company, however recent the last call,
    /// however scarce the calls.
    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once() {
        let batches = Batches::default();
        let route = Route::PermitsById;
        batches.lock().entry(route).or_default();
        batches.take(route, "alpha");
        batches.lock().get_mut(&route).expect("queued").ids = MAX_IDS;
        assert_eq!(waits(&batches, route, PACE), Duration::ZERO);
        let scarce = Pace { scarce: true, ..PACE };
        assert_eq!(waits(&batches, route, scarce), Duration::ZERO);
    }

    /// Ids arriving as a crowd (100 a second: a full call each interval)
    /// make the next call wait an interval for a full call, not the window.
    #[tokio::test(start_paused = true)]
    async fn a_crowd_waits_an_interval_for_a_full_call() {
        let batches = Batches::default();
        let route = Route::PermitsById;
        batches.lock().entry(route).or_default();
        batches.take(route, "alpha");
        for _ in 0..5 {
            batches.lock().get_mut(&route).expect("queued").arrivals.note(now(), 1);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        assert_eq!(waits(&batches, route, PACE), PACE.interval);
    }
}
