//! Where the scheduler's permits come from: the [`SharedRate`] while Redis
//! answers, else this replica's own [`Window`] at its share of the limits.
//!
//! The share is every number of [`Limits`] divided by the replicas the
//! shared rate last counted, so N replicas that lose Redis together still
//! send about the limit, not N times it. Without Redis, and in a replica
//! that never reached it (started while it was down, so it cannot know its
//! peers), the share is the whole. When Redis answers again its shared
//! state rules again, and its count sets the next share. A replica that
//! makes no upstream call stays counted by a heartbeat.

use super::shared::{SharedRate, HEARTBEAT};
use super::window::{bulk_wait, kept_from_bulk, Held, Limits, Rate, Refused, Window, SPAN};
use crate::metrics::Metrics;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// What the last shared answer said of the window, for estimates between
/// permits (the shared window's log stays in Redis).
#[derive(Debug, Clone, Copy)]
struct Seen {
    free: u32,
    /// The window was full (or the burst spent) until then.
    blocked_until: Option<Instant>,
}

pub(super) struct Pace {
    /// The whole gate's numbers, which a reload may change.
    limits: Mutex<Limits>,
    /// Replicas the local share is for; 0 before the shared rate ever
    /// answered (or without Redis): the whole.
    replicas: AtomicU32,
    /// Paces this replica alone: without Redis, or while it fails.
    local: Mutex<Window>,
    /// The rate shared with other replicas, when Redis is configured.
    shared: Option<SharedRate>,
    /// True from a failed shared call to the next answer: `local` paces,
    /// and the queue's estimates use its share.
    alone: AtomicBool,
    seen: Mutex<Seen>,
    /// Teams the shared window's reserve held back lately, until when:
    /// their estimates leave the reserve out.
    reserve_held: Mutex<HashMap<String, Instant>>,
    /// This replica's interactive calls a second, lately (shared mode: the
    /// local window counts its own).
    interactive: Mutex<Rate>,
    metrics: Arc<Metrics>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pace {
    /// With a shared rate, also starts the heartbeat that keeps this
    /// replica counted.
    pub(super) fn start(limits: Limits, shared: Option<SharedRate>, metrics: Arc<Metrics>) -> Arc<Pace> {
        let heartbeat = shared.is_some();
        let pace = Arc::new(Pace {
            limits: Mutex::new(limits),
            replicas: AtomicU32::new(0),
            local: Mutex::new(Window::new(limits)),
            shared,
            alone: AtomicBool::new(false),
            seen: Mutex::new(Seen {
                free: limits.calls,
                blocked_until: None,
            }),
            reserve_held: Mutex::default(),
            interactive: Mutex::new(Rate::new()),
            metrics,
        });
        if heartbeat {
            tokio::spawn(stay_counted(Arc::downgrade(&pace)));
        }
        pace
    }

    fn limits(&self) -> Limits {
        *lock(&self.limits)
    }

    /// Whether this replica paces by its own window now.
    fn local_paces(&self) -> bool {
        self.shared.is_none() || self.alone.load(Ordering::Relaxed)
    }

    /// Calls a second the queue can expect now: the whole rate while it is
    /// shared (or there is no Redis), this replica's share while alone.
    pub(super) fn per_sec(&self) -> f64 {
        match self.local_paces() {
            true => lock(&self.local).limits().per_sec(),
            false => self.limits().per_sec(),
        }
    }

    /// The window's places free now, and its size (what this replica
    /// last saw of the shared one).
    pub(super) fn free(&self) -> (u32, u32) {
        if self.local_paces() {
            let mut w = lock(&self.local);
            return (w.free(Instant::now()), w.limits().calls);
        }
        (lock(&self.seen).free, self.limits().calls)
    }

    /// How long until `n` more calls could go: the estimate behind a
    /// predicted wait.
    pub(super) fn wait_for(&self, n: usize, team: &str, bulk: bool) -> Duration {
        let now = Instant::now();
        if self.local_paces() {
            return lock(&self.local).wait_for(now, n, team, bulk);
        }
        let limits = self.limits();
        let seen = *lock(&self.seen);
        let held = bulk || lock(&self.reserve_held).get(team).is_some_and(|until| *until > now);
        let kept = match bulk {
            // Until the oldest ages: unknown here, the window's span at most.
            true => kept_from_bulk(limits.reserve, lock(&self.interactive).at(now), SPAN / 2),
            false => limits.reserve,
        };
        let free = match held {
            true => seen.free.saturating_sub(kept),
            false => seen.free,
        } as usize;
        if n <= free {
            return Duration::ZERO;
        }
        if bulk {
            let left = limits.per_sec() - lock(&self.interactive).at(now);
            return bulk_wait(n - free, left);
        }
        let blocked = seen
            .blocked_until
            .map_or(Duration::ZERO, |u| u.saturating_duration_since(now));
        blocked + Duration::from_secs_f64((n - free - 1) as f64 / limits.per_sec())
    }

    /// A place in the window for a call of `team` now, or how long until
    /// asking again is worth it, and why not.
    pub(super) async fn take(&self, team: &str, bulk: bool) -> Result<(), Refused> {
        let Some(shared) = &self.shared else {
            return lock(&self.local).take(Instant::now(), team, bulk);
        };
        // Every replica's, as this one's times the replicas counted.
        let replicas = self.replicas.load(Ordering::Relaxed).max(1);
        let interactive = lock(&self.interactive).at(Instant::now()) * f64::from(replicas);
        match shared.take(team, bulk, interactive).await {
            Ok(taken) => {
                self.counted(taken.replicas);
                let now = Instant::now();
                if taken.permit.is_ok() && !bulk {
                    lock(&self.interactive).count(now);
                }
                let blocked_until = taken.permit.err().map(|r| now + r.wait);
                *lock(&self.seen) = Seen {
                    free: taken.free,
                    blocked_until,
                };
                let mut reserve = lock(&self.reserve_held);
                reserve.retain(|_, until| *until > now);
                if let Err(Refused {
                    wait,
                    held: Held::Reserve,
                }) = taken.permit
                {
                    reserve.insert(team.to_string(), now + wait);
                }
                taken.permit
            }
            // Redis gone: pace this replica at its share until it is back.
            Err(_) => {
                self.alone.store(true, Ordering::Relaxed);
                lock(&self.local).take(Instant::now(), team, bulk)
            }
        }
    }

    /// An upstream 429: every replica sharing the rate holds off for `for_`.
    pub(super) async fn pause_shared(&self, for_: Duration) {
        if let Some(shared) = &self.shared {
            shared.pause(for_).await;
        }
    }

    /// The shared rate answered, counting `replicas`: pace at that share
    /// if it fails next.
    fn counted(&self, replicas: u32) {
        self.alone.store(false, Ordering::Relaxed);
        self.metrics.upstream_rate_replicas.set(i64::from(replicas));
        if self.replicas.swap(replicas, Ordering::Relaxed) != replicas {
            lock(&self.local).set_limits(self.limits().share(replicas));
        }
    }

    /// A reload's new numbers: the local window at the new share at once,
    /// and the shared rate's from its next permit on.
    pub(super) fn set_limits(&self, limits: Limits) {
        *lock(&self.limits) = limits;
        let replicas = self.replicas.load(Ordering::Relaxed);
        lock(&self.local).set_limits(limits.share(replicas));
        if let Some(shared) = &self.shared {
            shared.set_limits(limits);
        }
    }
}

/// Keeps this replica counted by the shared rate while it makes no
/// upstream call (a permit renews it too): at once at start, so that its
/// peers count a new replica before they need to, then every
/// [`HEARTBEAT`]. Exits when the scheduler is gone.
async fn stay_counted(pace: Weak<Pace>) {
    let mut every = tokio::time::interval(HEARTBEAT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(p) = pace.upgrade() else { return };
        let Some(shared) = &p.shared else { return };
        // A failure is counted (and trips the breaker) like a permit's; the
        // share stays as last counted.
        if let Ok(replicas) = shared.join().await {
            p.counted(replicas);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_replica_counted_as_one_of_two_paces_at_half_the_window_alone() {
        let limits = Limits {
            calls: 120,
            burst: 120,
            reserve: 12,
        };
        let p = Pace::start(limits, None, Arc::new(Metrics::new()));
        assert_eq!(p.free(), (120, 120), "the whole window before any count");
        p.counted(2);
        assert_eq!(p.free(), (60, 60), "half the window");
        assert!((p.per_sec() - 1.0).abs() < 1e-9, "60 a minute");
        for _ in 0..60 {
            p.take("a", false).await.ok();
        }
        p.counted(2);
        assert_eq!(p.free().0, 6, "the same count keeps what was spent");
        assert_eq!(p.metrics.upstream_rate_replicas.get(), 2);
    }
}
