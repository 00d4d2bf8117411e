//! Fair sharing of the upstream's rate limit (docs/design.md §2, `fair_turn`).
//!
//! Every upstream call takes a permit from one governor limiter paced at
//! `upstream.requests_per_minute`. When permits run short, calls queue per
//! team and a dispatcher hands permits out round-robin across teams, so one
//! team's flood waits behind itself, not in front of everyone. A call whose
//! expected wait is longer than `upstream.max_queue_wait_secs` is refused at
//! once with 429 and an honest `Retry-After`; the bound is also enforced: a
//! call still waiting [`QUEUE_SLACK`] after it (a pause came meanwhile, or
//! other teams joined the round) is refused the same way, so the wait a
//! reservation covers is really bounded.
//! An upstream 429 pauses the dispatcher for the upstream's `Retry-After`
//! (clamped by the caller), and the dispatcher looks at the pause again
//! after every permit it waited for. Cache hits never come here.
//!
//! With Redis, permits come from [`SharedRate`] instead, so several replicas
//! together stay under the one key's limit; the local limiter is then only
//! the fallback for when Redis does not answer, and it paces at this
//! replica's share: the whole rate divided by the replicas the shared rate
//! last counted, so N replicas that lose Redis together still send about
//! the limit, not N times it ([`pace`] says how, and what a replica that
//! never reached Redis does).

mod pace;

use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::shared_rate::SharedRate;
use pace::Pace;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};

/// How much longer than `upstream.max_queue_wait_secs` an admitted call may
/// wait before it is refused after all: the estimate at admission is a
/// lower bound, and a call admitted at the edge of the bound must not be
/// refused for a few milliseconds of jitter. Part of the margin that
/// `quota.reservation_lease_secs` keeps beyond the queue and the call.
const QUEUE_SLACK: Duration = Duration::from_secs(1);

/// Who asks the gate for a call: its team's line, the team's share
/// (`weight`) and whether the call is bulk (`class = "bulk"`: it takes
/// only what interactive calls leave).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asker<'a> {
    pub(crate) team: &'a str,
    pub(crate) weight: u32,
    pub(crate) bulk: bool,
}

impl<'a> Asker<'a> {
    /// A call of `team`'s, interactive unless `bulk`.
    pub(crate) fn of(team: &'a crate::auth::Team, bulk: bool) -> Asker<'a> {
        Asker {
            team: &team.name,
            weight: team.weight,
            bulk,
        }
    }
}

#[derive(Default)]
struct Queues {
    /// Waiters per team, oldest first.
    waiting: HashMap<String, VecDeque<(Instant, oneshot::Sender<()>)>>,
    /// Teams with waiters, in round-robin order.
    turn: VecDeque<String>,
    len: usize,
}

pub(crate) struct Scheduler {
    /// The permits: shared through Redis, or this replica's own.
    pace: Arc<Pace>,
    /// `upstream.max_queue_wait_secs` in milliseconds (a reload may change it).
    max_wait_ms: AtomicU64,
    queues: Mutex<Queues>,
    /// Until when an upstream 429 told us to hold off.
    paused_until: Mutex<Option<Instant>>,
    /// Wakes the dispatcher when a call queues. `notify_one` keeps a permit
    /// when nobody waits, so a wake-up between check and wait is not lost.
    wake: Arc<Notify>,
    metrics: Arc<Metrics>,
}

impl Scheduler {
    /// Builds the scheduler and starts its dispatcher task.
    pub(crate) fn start(
        requests_per_minute: u32,
        max_wait: Duration,
        shared: Option<SharedRate>,
        metrics: Arc<Metrics>,
    ) -> Arc<Scheduler> {
        let scheduler = Arc::new(Scheduler {
            pace: Pace::start(requests_per_minute, shared, metrics.clone()),
            max_wait_ms: AtomicU64::new(max_wait.as_millis() as u64),
            queues: Mutex::default(),
            paused_until: Mutex::new(None),
            wake: Arc::new(Notify::new()),
            metrics,
        });
        tokio::spawn(dispatch(Arc::downgrade(&scheduler)));
        scheduler
    }

    fn max_wait(&self) -> Duration {
        Duration::from_millis(self.max_wait_ms.load(Ordering::Relaxed))
    }

    /// A reload's `upstream.requests_per_minute` and
    /// `upstream.max_queue_wait_secs`, applied to the calls from now on.
    pub(crate) fn set_limits(&self, requests_per_minute: u32, max_wait: Duration) {
        self.pace.set_rate(requests_per_minute);
        self.max_wait_ms.store(max_wait.as_millis() as u64, Ordering::Relaxed);
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pause_left(&self) -> Duration {
        let until = *self.paused_until.lock().unwrap_or_else(|p| p.into_inner());
        until.map_or(Duration::ZERO, |u| u.saturating_duration_since(Instant::now()))
    }

    /// An upstream 429: hold every call (of every replica) for `for_`
    /// (already clamped to `upstream.max_retry_after_secs`).
    pub(crate) async fn pause(&self, for_: Duration) {
        {
            let mut until = self.paused_until.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(new) = Instant::now().checked_add(for_) {
                if until.is_none_or(|u| u < new) {
                    *until = Some(new);
                }
            }
        }
        self.pace.pause_shared(for_).await;
    }

    /// Waits for this team's turn at the upstream, or refuses at once when
    /// the wait would pass the bound: `upstream.max_queue_wait_secs`, or
    /// `wait` when the client asked for a shorter one (`Prefer: wait`).
    pub(crate) async fn acquire(&self, asker: Asker<'_>, wait: Option<Duration>) -> Result<(), GatewayError> {
        let team = asker.team;
        let started = Instant::now();
        let bound = wait.map_or(self.max_wait(), |w| w.min(self.max_wait()));
        let idle = self.queues().len == 0 && self.pause_left().is_zero();
        if idle && self.pace.try_permit().await {
            self.metrics.upstream_queue_wait_seconds.observe(0.0);
            return Ok(());
        }
        let rx = {
            let mut q = self.queues();
            let expected = self.expected_wait(&q, team);
            if expected > bound {
                return Err(GatewayError::UpstreamRateLimited {
                    retry_after_secs: expected.as_secs_f64().ceil() as u64,
                });
            }
            let (tx, rx) = oneshot::channel();
            if !q.waiting.contains_key(team) {
                q.turn.push_back(team.to_string());
            }
            q.waiting
                .entry(team.to_string())
                .or_default()
                .push_back((Instant::now(), tx));
            q.len += 1;
            self.metrics.upstream_queue_depth.set(q.len as i64);
            rx
        };
        self.wake.notify_one();
        // Dropping `rx` on timeout takes us out of the queue: the dispatcher
        // hands that permit to the next waiter.
        let granted = tokio::time::timeout(bound + QUEUE_SLACK, rx).await;
        self.metrics
            .upstream_queue_wait_seconds
            .observe(started.elapsed().as_secs_f64());
        match granted {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(GatewayError::Internal),
            Err(_) => {
                // It waited the whole bound: come back after more than it,
                // or after what is ahead of a new call now, if longer.
                let ahead = self.expected_wait(&self.queues(), team);
                let secs = ahead.max(bound).as_secs_f64().ceil() as u64;
                Err(GatewayError::UpstreamRateLimited {
                    retry_after_secs: secs.saturating_add(1),
                })
            }
        }
    }

    /// The pressure at the gate, per team with calls waiting: how many,
    /// how long the oldest has waited, and the wait a new call of the team
    /// can expect now (the Envoy overload manager's idea: what a team
    /// would meet, before it meets it).
    pub(crate) fn pressure(&self) -> Vec<(String, usize, Duration, Duration)> {
        let q = self.queues();
        let now = Instant::now();
        q.waiting
            .iter()
            .map(|(team, line)| {
                let oldest = line
                    .front()
                    .map_or(Duration::ZERO, |(since, _)| now.saturating_duration_since(*since));
                (team.clone(), line.len(), oldest, self.expected_wait(&q, team))
            })
            .collect()
    }

    /// Whether calls are scarce now: less than half the window is free (a
    /// batch then gathers ids rather than leave at once).
    pub(crate) fn scarce(&self) -> bool {
        self.queues().len > 0
    }

    /// The time between calls at the steady rate: `60 s /
    /// upstream.requests_per_minute` (a scarce batch gathers at most this).
    pub(crate) fn interval(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.pace.per_sec())
    }

    /// The wait a new call of `team` can expect now (a `Retry-After`).
    pub(crate) fn predicted_wait(&self, team: &str) -> Duration {
        self.expected_wait(&self.queues(), team)
    }

    /// The wait a new call of `team` can expect: the pause left, then one
    /// call of every other waiting team per place ahead of it in its own
    /// queue (round-robin).
    fn expected_wait(&self, q: &Queues, team: &str) -> Duration {
        let ours = q.waiting.get(team).map_or(0, VecDeque::len) as f64 + 1.0;
        let teams = q.turn.len() as f64 + if q.waiting.contains_key(team) { 0.0 } else { 1.0 };
        self.pause_left() + Duration::from_secs_f64(ours * teams / self.pace.per_sec())
    }

    /// The next waiter in round-robin order, if any.
    fn next_waiter(&self) -> Option<oneshot::Sender<()>> {
        let mut q = self.queues();
        while let Some(team) = q.turn.pop_front() {
            let Some(list) = q.waiting.get_mut(&team) else {
                continue;
            };
            let waiter = list.pop_front();
            if list.is_empty() {
                q.waiting.remove(&team);
            } else {
                q.turn.push_back(team);
            }
            if let Some((_, w)) = waiter {
                q.len -= 1;
                self.metrics.upstream_queue_depth.set(q.len as i64);
                return Some(w);
            }
        }
        None
    }
}

/// Calls that may go back to back: a tenth of a minute's worth, smooth
/// enough for the upstream's window, roomy enough that a quiet gateway adds
/// no wait.
pub(crate) fn burst(requests_per_minute: u32) -> u32 {
    (requests_per_minute / 10).max(1)
}

/// Hands out one permit per limiter token to the next waiter. Exits when the
/// scheduler is gone.
async fn dispatch(scheduler: Weak<Scheduler>) {
    loop {
        let Some(s) = scheduler.upgrade() else { return };
        if s.queues().len == 0 {
            let wake = s.wake.clone();
            // Hold no strong reference while idle, so the scheduler can drop.
            drop(s);
            wake.notified().await;
            continue;
        }
        let pause = s.pause_left();
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
            continue;
        }
        s.pace.next_permit().await;
        // A pause may have come while we waited for the permit: honour it
        // before anyone calls.
        let pause = s.pause_left();
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        // A waiter that gave up (its request was cancelled) does not use
        // the token: the next one gets it.
        while let Some(waiter) = s.next_waiter() {
            if waiter.send(()).is_ok() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asker(team: &str) -> Asker<'_> {
        Asker {
            team,
            weight: 1,
            bulk: false,
        }
    }

    /// A scheduler of 60 calls a minute whose burst of 6 (a tenth of a
    /// minute) is used up: the next call waits about a second.
    async fn busy(max_wait: Duration) -> Arc<Scheduler> {
        let s = Scheduler::start(60, max_wait, None, Arc::new(Metrics::new()));
        for _ in 0..6 {
            s.acquire(asker("a"), None).await.expect("within burst");
        }
        s
    }

    /// One more call of team "a", queued in a task of its own.
    fn queue(s: &Arc<Scheduler>) -> tokio::task::JoinHandle<Result<(), GatewayError>> {
        let s = s.clone();
        tokio::spawn(async move { s.acquire(asker("a"), None).await })
    }

    #[tokio::test]
    async fn an_idle_scheduler_adds_no_wait_and_a_long_queue_is_refused() {
        let s = busy(Duration::from_secs(2)).await;
        // The next calls wait ~1 s each: a queue of 3 is past the 2 s bound.
        let first = queue(&s);
        tokio::task::yield_now().await;
        let second = queue(&s);
        tokio::task::yield_now().await;
        match s.acquire(asker("a"), None).await {
            Err(GatewayError::UpstreamRateLimited { retry_after_secs }) => {
                assert!(retry_after_secs >= 2)
            }
            other => panic!("expected 429, got {other:?}"),
        }
        first.await.unwrap().expect("queued call served");
        second.await.unwrap().expect("queued call served");
    }

    #[tokio::test]
    async fn a_pause_that_comes_while_a_call_waits_for_its_permit_holds_it() {
        let s = busy(Duration::from_secs(5)).await;
        let started = Instant::now();
        // Queued: the dispatcher now waits ~1 s for the next permit.
        let queued = queue(&s);
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.pause(Duration::from_secs(2)).await;
        queued.await.unwrap().expect("served after the pause");
        assert!(
            started.elapsed() >= Duration::from_millis(2_000),
            "granted before the pause ended: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_queued_call_never_waits_past_the_bound() {
        let s = busy(Duration::from_secs(1)).await;
        let started = Instant::now();
        let queued = queue(&s);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A long pause after admission: the estimate said ~1 s, the bound holds.
        s.pause(Duration::from_secs(30)).await;
        let refused = queued.await.unwrap();
        assert!(
            matches!(refused, Err(GatewayError::UpstreamRateLimited { .. })),
            "{refused:?}"
        );
        let bound = Duration::from_secs(1) + QUEUE_SLACK;
        assert!(
            started.elapsed() < bound + Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_teams_flood_of_calls_waits_behind_itself_not_in_front_of_another_team() {
        // The scheduler never asks what a call costs: a free call queues
        // like a paid one, in its team's own line.
        let s = busy(Duration::from_secs(10)).await;
        let flood: Vec<_> = (0..3).map(|_| queue(&s)).collect();
        tokio::task::yield_now().await;
        let started = Instant::now();
        s.acquire(asker("b"), None).await.expect("served");
        let b_waited = started.elapsed();
        let flood_done = flood.iter().filter(|q| q.is_finished()).count();
        for q in flood {
            q.await.unwrap().expect("queued call served");
        }
        // One permit a second: "b" gets the second, after one of "a"'s three.
        assert!(flood_done <= 1, "b waited behind {flood_done} of a's calls");
        assert!(b_waited < Duration::from_millis(2_500), "{b_waited:?}");
    }
}
