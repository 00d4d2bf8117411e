//! The upstream's request-rate limit: a token bucket of `requests_per_minute`
//! per 60 s for the (single) valid key, like the real 120/60 s, answered with
//! 429 and an integer `Retry-After`.

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::num::NonZeroU32;

pub struct RateLimit {
    /// `None` when the limit is off (`requests_per_minute = 0`).
    limiter: Option<DefaultDirectRateLimiter>,
}

impl RateLimit {
    pub fn new(rpm: u32) -> RateLimit {
        RateLimit {
            limiter: NonZeroU32::new(rpm).map(|n| RateLimiter::direct(Quota::per_minute(n))),
        }
    }

    /// `Err(seconds)` to wait when over the rate; never less than 1.
    pub fn check(&self) -> Result<(), u64> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            (wait.as_secs_f64().ceil() as u64).max(1)
        })
    }
}
