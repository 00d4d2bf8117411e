//! A team's admission limits, the `limit_team` phase of the request path
//! (docs/design.md §2), after `authenticate`: its requests in flight
//! ([`Team::enter`]), then its own request rate ([`Team::check_rate`]).
//! Both are the team's own, whatever the other teams do.

use super::Team;
use governor::{DefaultDirectRateLimiter, Quota};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One of a team's requests in flight, until dropped.
pub(crate) struct TeamInFlight(Arc<AtomicUsize>);

impl Drop for TeamInFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The limiter of a team's `requests_per_minute` (`None`, or 0: no limit of
/// its own). A new one per table: a reload starts the team's rate afresh.
pub(super) fn rate_limiter(requests_per_minute: Option<u32>) -> Option<DefaultDirectRateLimiter> {
    requests_per_minute
        .and_then(NonZeroU32::new)
        .map(|rpm| DefaultDirectRateLimiter::direct(Quota::per_minute(rpm)))
}

impl Team {
    /// Counts one more request in flight, unless `limit` are already.
    pub(crate) fn enter(&self, limit: usize) -> Option<TeamInFlight> {
        // A compare-and-swap loop (`fetch_update` is deprecated on newer
        // toolchains): never counts past `limit`, even for a moment.
        let mut n = self.in_flight.load(Ordering::Acquire);
        loop {
            if n >= limit {
                return None;
            }
            match self
                .in_flight
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(TeamInFlight(self.in_flight.clone())),
                Err(now) => n = now,
            }
        }
    }

    /// The team's own rate: `Err(seconds to wait)` when exceeded.
    pub(crate) fn check_rate(&self) -> Result<(), u64> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
            wait.as_secs_f64().ceil().max(1.0) as u64
        })
    }
}
