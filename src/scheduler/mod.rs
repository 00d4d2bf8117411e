//! Fair sharing of the upstream's rate limit (docs/design.md §2, `fair_turn`).
//!
//! The vendor allows `upstream.requests_per_minute` calls in any 60 s: the
//! gate keeps that window ([`window`]: the whole of it usable at once
//! unless `upstream.burst` says less, its last tenth kept for teams under
//! their share), shared by every replica through Redis ([`pace`]).
//!
//! A call goes at once while its class has nobody waiting and the window
//! has a place for it. Otherwise it waits in its team's line ([`lines`]):
//! interactive lines before bulk ones (`class = "bulk"` takes only what
//! the others leave), each class shared by the teams' `weight`s. A
//! dispatcher hands each place the window frees to the first line in that
//! order whose call may take it (a line held by the reserve lets the next
//! one go).
//!
//! **Every wait has a deadline**: `upstream.max_queue_wait_secs`, or the
//! client's shorter `Prefer: wait`. A call whose predicted wait (the pause
//! left, then the window's log for the calls ahead of it) is longer is
//! refused at once with 429 and that prediction as `Retry-After`
//! (`predicted`); one still waiting [`QUEUE_SLACK`] past its bound (a pause
//! came meanwhile) is refused the same way (`deadline`). A call whose
//! request went away leaves its line and takes no place. An upstream 429
//! pauses every call for the upstream's `Retry-After` (clamped by the
//! caller). Cache hits never come here.

mod lines;
mod pace;
mod shared;
pub(crate) mod window;

pub(crate) use shared::SharedRate;

use crate::error::{GateRefusal, GatewayError};
use crate::metrics::Metrics;
use lines::{Lines, Waiter};
use pace::Pace;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};
use window::{Held, Limits};

/// How much longer than `upstream.max_queue_wait_secs` an admitted call may
/// wait before it is refused after all: the estimate at admission is a
/// lower bound, and a call admitted at the edge of the bound must not be
/// refused for a few milliseconds of jitter. Part of the margin that
/// `quota.reservation_lease_secs` keeps beyond the queue and the call.
const QUEUE_SLACK: Duration = Duration::from_millis(250);

/// The longest the dispatcher sleeps before it asks the window again.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

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

pub(crate) struct Scheduler {
    /// The places in the window: shared through Redis, or this replica's own.
    pace: Arc<Pace>,
    /// `upstream.max_queue_wait_secs` in milliseconds (a reload may change it).
    max_wait_ms: AtomicU64,
    lines: Mutex<Lines>,
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
        limits: Limits,
        max_wait: Duration,
        shared: Option<SharedRate>,
        metrics: Arc<Metrics>,
    ) -> Arc<Scheduler> {
        let scheduler = Arc::new(Scheduler {
            pace: Pace::start(limits, shared, metrics.clone()),
            max_wait_ms: AtomicU64::new(max_wait.as_millis() as u64),
            lines: Mutex::default(),
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

    /// A reload's numbers (`upstream.requests_per_minute`, `burst`, the
    /// teams) and `upstream.max_queue_wait_secs`, for the calls from now on.
    pub(crate) fn set_limits(&self, limits: Limits, max_wait: Duration) {
        self.pace.set_limits(limits);
        self.max_wait_ms.store(max_wait.as_millis() as u64, Ordering::Relaxed);
        self.wake.notify_one();
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, Lines> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
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

    /// Waits for `asker`'s turn at the upstream, or refuses at once when
    /// the predicted wait passes the bound: `upstream.max_queue_wait_secs`,
    /// or `wait` when the client asked for a shorter one (`Prefer: wait`).
    pub(crate) async fn acquire(&self, asker: Asker<'_>, wait: Option<Duration>) -> Result<(), GatewayError> {
        let started = Instant::now();
        let bound = wait.map_or(self.max_wait(), |w| w.min(self.max_wait()));
        let first = !self.lines().any_ahead(asker) && self.pause_left().is_zero();
        if first && self.pace.take(asker.team, asker.bulk).await.is_ok() {
            self.metrics.upstream_queue_wait_seconds.observe(0.0);
            return Ok(());
        }
        let rx = {
            let mut lines = self.lines();
            let expected = self.expected_wait(&lines, asker);
            if expected > bound {
                return Err(GatewayError::UpstreamRateLimited {
                    retry_after_secs: expected.as_secs_f64().ceil() as u64,
                    why: GateRefusal::Predicted,
                });
            }
            let (tx, rx) = oneshot::channel();
            lines.push(
                asker,
                Waiter {
                    since: Instant::now(),
                    tx,
                },
            );
            self.metrics.upstream_queue_depth.set(lines.len() as i64);
            rx
        };
        self.wake.notify_one();
        // Dropping `rx` on timeout takes us out of the line: the dispatcher
        // hands that place to the next call.
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
                let ahead = self.expected_wait(&self.lines(), asker);
                let secs = ahead.max(bound).as_secs_f64().ceil() as u64;
                Err(GatewayError::UpstreamRateLimited {
                    retry_after_secs: secs.saturating_add(1),
                    why: GateRefusal::Deadline,
                })
            }
        }
    }

    /// The pressure at the gate, per team with calls waiting: how many,
    /// how long the oldest has waited, and the wait a new (interactive)
    /// call of the team can expect now (the Envoy overload manager's idea:
    /// what a team would meet, before it meets it).
    pub(crate) fn pressure(&self, weight_of: impl Fn(&str) -> u32) -> Vec<(String, usize, Duration, Duration)> {
        let lines = self.lines();
        lines
            .per_team(Instant::now())
            .into_iter()
            .map(|(team, (waiting, oldest))| {
                let asker = Asker {
                    team,
                    weight: weight_of(team),
                    bulk: false,
                };
                (team.to_string(), waiting, oldest, self.expected_wait(&lines, asker))
            })
            .collect()
    }

    /// The wait a new call of `asker` can expect now (a `Retry-After`).
    pub(crate) fn predicted_wait(&self, asker: Asker<'_>) -> Duration {
        self.expected_wait(&self.lines(), asker)
    }

    /// Whether calls are scarce now: less than half the window is free (a
    /// batch then gathers ids rather than leave at once).
    pub(crate) fn scarce(&self) -> bool {
        let (free, calls) = self.pace.free();
        free.saturating_mul(2) < calls
    }

    /// The time between calls at the steady rate: `60 s /
    /// upstream.requests_per_minute` (a scarce batch gathers at most this).
    pub(crate) fn interval(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.pace.per_sec())
    }

    /// The wait a new call of `asker` can expect: the pause left, then the
    /// window's places for the calls ahead of it and its own.
    fn expected_wait(&self, lines: &Lines, asker: Asker<'_>) -> Duration {
        self.pause_left() + self.pace.wait_for(lines.ahead(asker) + 1, asker.team, asker.bulk)
    }

    /// Hands one place of the window to the first line whose call may take
    /// it; `None` when one went, else how long until asking again.
    async fn give(&self) -> Option<Duration> {
        let order = {
            let mut lines = self.lines();
            let order = lines.order();
            // Calls whose requests went away left their lines just now.
            self.metrics.upstream_queue_depth.set(lines.len() as i64);
            order
        };
        let mut soonest = LOOK_AGAIN;
        for key in &order {
            match self.pace.take(&key.team, key.bulk).await {
                Ok(()) => {
                    let mut lines = self.lines();
                    // Nobody took it (all left meanwhile): it is spent.
                    lines.grant(&order, key);
                    self.metrics.upstream_queue_depth.set(lines.len() as i64);
                    return None;
                }
                // Held by the reserve: the next line may be under its share.
                Err(refused) if refused.held == Held::Reserve => soonest = soonest.min(refused.wait),
                Err(refused) => return Some(soonest.min(refused.wait)),
            }
        }
        Some(soonest)
    }
}

/// Hands out the window's places to the waiting calls while the
/// scheduler lives.
async fn dispatch(scheduler: Weak<Scheduler>) {
    loop {
        let Some(s) = scheduler.upgrade() else { return };
        let wake = s.wake.clone();
        if s.lines().len() == 0 {
            // Hold no strong reference while idle, so the scheduler can drop.
            drop(s);
            wake.notified().await;
            continue;
        }
        let pause = s.pause_left();
        let next = match pause.is_zero() {
            true => s.give().await,
            false => Some(pause),
        };
        drop(s);
        if let Some(wait) = next {
            // A new call (perhaps of a team the reserve is for) looks again.
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = wake.notified() => {}
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

    /// A scheduler of 60 calls a minute whose burst of 6 is used up: the
    /// next call waits about a second.
    async fn busy(max_wait: Duration) -> Arc<Scheduler> {
        let limits = Limits {
            calls: 60,
            burst: 6,
            reserve: 0,
        };
        let s = Scheduler::start(limits, max_wait, None, Arc::new(Metrics::new()));
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
            Err(GatewayError::UpstreamRateLimited { retry_after_secs, why }) => {
                assert!(retry_after_secs >= 2);
                assert_eq!(why, GateRefusal::Predicted);
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
