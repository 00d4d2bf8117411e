//! The upstream's request-rate limit for the (single) valid key, answered
//! with 429 and an integer `Retry-After`. Two readings of the vendor's
//! "120 requests per 60 seconds":
//!
//! - [`Window::Bucket`] (the default): a token bucket of
//!   `requests_per_minute` that refills evenly, so after a burst of 120 a
//!   call is allowed every half second (what the simulator always did, and
//!   looser than the vendor's words);
//! - [`Window::Strict`]: at most `requests_per_minute` calls in **any** 60 s,
//!   so after a burst of 120 the next call waits until the first of them is
//!   60 s old (the vendor's words read strictly; gateways are tested
//!   against this one).

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

/// Which reading of the limit the simulator enforces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Window {
    /// A bucket of a minute's calls, refilled evenly.
    #[default]
    Bucket,
    /// At most a minute's calls in any 60 s.
    Strict,
}

impl std::str::FromStr for Window {
    type Err = String;
    fn from_str(s: &str) -> Result<Window, String> {
        match s {
            "bucket" => Ok(Window::Bucket),
            "strict" => Ok(Window::Strict),
            other => Err(format!("{other:?}: expected \"bucket\" or \"strict\"")),
        }
    }
}

const SPAN: Duration = Duration::from_secs(60);

pub struct RateLimit {
    /// `None` when the limit is off (`requests_per_minute = 0`).
    limiter: Option<Limiter>,
}

enum Limiter {
    Bucket(DefaultDirectRateLimiter),
    /// When each of the last `limit` calls was let through, oldest first.
    Strict {
        limit: usize,
        calls: VecDeque<Instant>,
    },
}

impl RateLimit {
    pub fn new(rpm: u32, window: Window) -> RateLimit {
        RateLimit {
            limiter: NonZeroU32::new(rpm).map(|n| match window {
                Window::Bucket => Limiter::Bucket(RateLimiter::direct(Quota::per_minute(n))),
                Window::Strict => Limiter::Strict {
                    limit: n.get() as usize,
                    calls: VecDeque::with_capacity(n.get() as usize),
                },
            }),
        }
    }

    /// `Err(seconds)` to wait when over the rate; never less than 1.
    pub fn check(&mut self) -> Result<(), u64> {
        let secs = |wait: Duration| (wait.as_secs_f64().ceil() as u64).max(1);
        match &mut self.limiter {
            None => Ok(()),
            Some(Limiter::Bucket(limiter)) => limiter
                .check()
                .map_err(|not_until| secs(not_until.wait_time_from(DefaultClock::default().now()))),
            Some(Limiter::Strict { limit, calls }) => {
                let now = Instant::now();
                while calls.front().is_some_and(|t| now.duration_since(*t) >= SPAN) {
                    calls.pop_front();
                }
                if calls.len() >= *limit {
                    let oldest = calls.front().copied().unwrap_or(now);
                    return Err(secs(SPAN.saturating_sub(now.duration_since(oldest))));
                }
                calls.push_back(now);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strict_window_lets_a_minutes_calls_go_at_once_and_then_none_for_the_minute() {
        let mut strict = RateLimit::new(5, Window::Strict);
        assert!((0..5).all(|_| strict.check().is_ok()));
        let wait = strict.check().expect_err("the sixth call in the minute");
        assert!((59..=60).contains(&wait), "{wait}");
        let mut bucket = RateLimit::new(5, Window::Bucket);
        assert!((0..5).all(|_| bucket.check().is_ok()));
        let wait = bucket.check().expect_err("the bucket is empty");
        assert!(wait <= 12, "the bucket refills a call every 12 s: {wait}");
    }
}
