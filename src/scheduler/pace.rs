//! Where the scheduler's permits come from: the [`SharedRate`] while Redis
//! answers, else a local governor limiter paced at this replica's share of
//! `upstream.requests_per_minute`.
//!
//! The share is the whole rate (and burst) divided by the replicas the
//! shared rate last counted, each at least 1, so N replicas that lose Redis
//! together still send about the limit, not N times it. Without Redis, and
//! in a replica that never reached it (started while it was down, so it
//! cannot know its peers), the share is the whole rate. When Redis answers
//! again its shared state rules again, and its count sets the next share.
//! A replica that makes no upstream call stays counted by a heartbeat.

use crate::metrics::Metrics;
use crate::shared_rate::{SharedRate, HEARTBEAT};
use arc_swap::ArcSwap;
use governor::{DefaultDirectRateLimiter, Quota};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The local limiter at one share of the upstream rate. A governor quota
/// is fixed when the limiter is built, so a new share is a new `Local`.
struct Local {
    /// Replicas the share is for; 0 before the shared rate ever answered
    /// (or without Redis): the whole rate.
    replicas: u32,
    limiter: DefaultDirectRateLimiter,
    per_sec: f64,
}

impl Local {
    fn new(requests_per_minute: u32, replicas: u32) -> Local {
        let (rpm, burst) = share(requests_per_minute, replicas);
        // `share` never answers 0.
        let rpm = NonZeroU32::new(rpm).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        Local {
            replicas,
            limiter: DefaultDirectRateLimiter::direct(Quota::per_minute(rpm).allow_burst(burst)),
            per_sec: f64::from(rpm.get()) / 60.0,
        }
    }
}

/// One replica's share of `requests_per_minute` and of its
/// [`super::burst`] when `replicas` share them (0: unknown, the whole of
/// each), each at least 1.
fn share(requests_per_minute: u32, replicas: u32) -> (u32, u32) {
    let n = replicas.max(1);
    (
        (requests_per_minute / n).max(1),
        (super::burst(requests_per_minute) / n).max(1),
    )
}

pub(super) struct Pace {
    /// `upstream.requests_per_minute`, which a reload may change.
    requests_per_minute: AtomicU32,
    /// Paces this replica alone: without Redis, or while it fails. Swapped,
    /// not locked, when the shared rate counts another number of replicas
    /// (the permit path reads it; a count changes rarely).
    local: ArcSwap<Local>,
    /// The rate shared with other replicas, when Redis is configured.
    shared: Option<SharedRate>,
    /// True from a failed shared call to the next answer: `local` paces,
    /// and the queue's estimates use its share.
    alone: AtomicBool,
    metrics: Arc<Metrics>,
}

impl Pace {
    /// With a shared rate, also starts the heartbeat that keeps this
    /// replica counted.
    pub(super) fn start(requests_per_minute: u32, shared: Option<SharedRate>, metrics: Arc<Metrics>) -> Arc<Pace> {
        let heartbeat = shared.is_some();
        let pace = Arc::new(Pace {
            requests_per_minute: AtomicU32::new(requests_per_minute),
            local: ArcSwap::from_pointee(Local::new(requests_per_minute, 0)),
            shared,
            alone: AtomicBool::new(false),
            metrics,
        });
        if heartbeat {
            tokio::spawn(stay_counted(Arc::downgrade(&pace)));
        }
        pace
    }

    /// Calls a second the queue can expect now: the whole rate while it is
    /// shared (or there is no Redis), this replica's share while alone.
    pub(super) fn per_sec(&self) -> f64 {
        match self.alone.load(Ordering::Relaxed) {
            true => self.local.load().per_sec,
            false => f64::from(self.rate().max(1)) / 60.0,
        }
    }

    /// A permit right now, if one is free.
    pub(super) async fn try_permit(&self) -> bool {
        match &self.shared {
            Some(shared) => match shared.take().await {
                Ok(taken) => {
                    self.counted(taken.replicas);
                    taken.wait.is_zero()
                }
                Err(_) => self.local_after_failure().limiter.check().is_ok(),
            },
            None => self.local.load().limiter.check().is_ok(),
        }
    }

    /// Waits for the next permit.
    pub(super) async fn next_permit(&self) {
        let Some(shared) = &self.shared else {
            return self.local.load_full().limiter.until_ready().await;
        };
        loop {
            match shared.take().await {
                Ok(taken) => {
                    self.counted(taken.replicas);
                    if taken.wait.is_zero() {
                        return;
                    }
                    tokio::time::sleep(taken.wait.min(Duration::from_secs(1))).await;
                }
                // Redis gone: pace this replica at its share until it is back.
                Err(_) => return self.local_after_failure().limiter.until_ready().await,
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
        if self.local.load().replicas != replicas {
            self.local.store(Arc::new(Local::new(self.rate(), replicas)));
        }
    }

    fn rate(&self) -> u32 {
        self.requests_per_minute.load(Ordering::Relaxed)
    }

    /// A reload's new `upstream.requests_per_minute`: the local limiter at
    /// the new share at once, and the shared rate's interval from its next
    /// permit on.
    pub(super) fn set_rate(&self, requests_per_minute: u32) {
        if self.requests_per_minute.swap(requests_per_minute, Ordering::Relaxed) == requests_per_minute {
            return;
        }
        let replicas = self.local.load().replicas;
        self.local.store(Arc::new(Local::new(requests_per_minute, replicas)));
        if let Some(shared) = &self.shared {
            shared.set_rate(requests_per_minute, super::burst(requests_per_minute));
        }
    }

    /// The shared rate failed: this replica paces alone, at its share.
    fn local_after_failure(&self) -> Arc<Local> {
        self.alone.store(true, Ordering::Relaxed);
        self.local.load_full()
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

    #[test]
    fn a_replica_s_share_divides_the_rate_and_the_burst_by_the_replicas_counted() {
        assert_eq!(share(120, 0), (120, 12), "never counted: the whole rate");
        assert_eq!(share(120, 1), (120, 12));
        assert_eq!(share(120, 2), (60, 6));
        assert_eq!(share(120, 7), (17, 1), "the burst is at least 1");
        assert_eq!(share(5, 10), (1, 1), "at least 1 a minute");
    }

    #[tokio::test]
    async fn a_replica_counted_as_one_of_two_paces_at_half_the_rate_alone() {
        let free_now = |p: &Pace| (0..100).take_while(|_| p.local.load().limiter.check().is_ok()).count();
        let p = Pace::start(120, None, Arc::new(Metrics::new()));
        assert_eq!(free_now(&p), 12, "the whole burst before any count");
        p.counted(2);
        assert_eq!(free_now(&p), 6, "half the burst, on a new limiter");
        assert!((p.local.load().per_sec - 1.0).abs() < 1e-9, "60 a minute");
        p.counted(2);
        assert_eq!(free_now(&p), 0, "the same count keeps the limiter and what it spent");
        assert_eq!(p.metrics.upstream_rate_replicas.get(), 2);
        p.local_after_failure();
        assert!((p.per_sec() - 1.0).abs() < 1e-9, "alone, the queue expects the share");
        p.counted(2);
        assert!((p.per_sec() - 2.0).abs() < 1e-9, "shared again: the whole rate");
    }
}
