//! The vendor's limit as the vendor states it: at most
//! `upstream.requests_per_minute` calls in **any** 60 s (a sliding window),
//! so after a burst of 120 the next call waits until the first of them is
//! 60 s old. [`Window`] keeps that log for one replica (without Redis, or
//! while Redis fails); [`super::shared`] keeps the same rules in Redis
//! for all replicas. Both answer the same way ([`Held`]).
//!
//! Three rules, in this order:
//! - **the window**: a call goes while fewer than `calls` went in the last
//!   60 s;
//! - **the reserve**: the window's last `reserve` places (a tenth, when
//!   more than one team is configured) go only to an interactive call of a
//!   team that made fewer than its share of the window's calls, `calls /
//!   (teams in the window besides it + 2)`: one team's burst cannot lock
//!   the others out for the rest of the minute, and a team arriving at a
//!   flooded gate finds places at once;
//! - **bulk last**: a bulk call (`class = "bulk"`) takes a place only when
//!   the window keeps, after it, the reserve and the places interactive
//!   calls will want before the window's oldest call ages out (their recent
//!   rate times that time): bulk takes what interactive calls will not
//!   need, not merely what they have not taken yet;
//! - **the burst** (`upstream.burst`, when lower than the window): at most
//!   that many calls back to back, then one every `60 s / calls`, by a
//!   governor limiter (GCRA).
//!
//! The log is a ring of the window's calls (at most `calls` entries): the
//! vendor's limit is a sliding log, which governor's GCRA cannot state.

use governor::{DefaultDirectRateLimiter, Quota};
use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The span of the vendor's window.
pub(crate) const SPAN: Duration = Duration::from_secs(60);

/// The gate's numbers, from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Calls in any 60 s (`upstream.requests_per_minute`).
    pub(crate) calls: u32,
    /// Calls back to back (`upstream.burst`; the whole window unset).
    pub(crate) burst: u32,
    /// The window's last places, kept for teams under their share.
    pub(crate) reserve: u32,
}

impl Limits {
    /// From the config: the reserve is a tenth of the window when more than
    /// one team could need it.
    pub(crate) fn of(config: &crate::config::Config) -> Limits {
        let calls = config.upstream.requests_per_minute.max(1);
        Limits {
            calls,
            burst: config.upstream.burst.unwrap_or(calls).clamp(1, calls),
            reserve: if config.teams.len() > 1 { calls / 10 } else { 0 },
        }
    }

    /// One replica's share when `replicas` pace alone (0: unknown, all of
    /// it), each number at least 1 but the reserve, which may be 0.
    pub(crate) fn share(self, replicas: u32) -> Limits {
        let n = replicas.max(1);
        Limits {
            calls: (self.calls / n).max(1),
            burst: (self.burst / n).max(1),
            reserve: self.reserve / n,
        }
    }

    /// Calls a second at the steady rate.
    pub(crate) fn per_sec(self) -> f64 {
        f64::from(self.calls.max(1)) / SPAN.as_secs_f64()
    }
}

/// Why a call may not go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// An upstream 429 paused every call.
    Paused,
    /// The window is full.
    Full,
    /// Only the reserve is left, and it is not this call's.
    Reserve,
    /// The burst is spent: the next call at the steady pace.
    Burst,
}

/// Not now: ask again after `wait`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Refused {
    pub(crate) wait: Duration,
    pub(crate) held: Held,
}

/// One replica's log of the window's calls.
pub(crate) struct Window {
    limits: Limits,
    /// The window's calls, oldest first, with their teams.
    calls: VecDeque<(Instant, Arc<str>)>,
    /// Calls per team in the window.
    per_team: HashMap<Arc<str>, u32>,
    /// The burst's pace; `None` when the burst is the whole window.
    burst: Option<DefaultDirectRateLimiter>,
    /// Interactive calls a second, lately.
    interactive: Rate,
}

/// A rate of events: those of the last 60 s over the time they span (at
/// least [`Rate::MIN_SPAN`]), so a crowd that began seconds ago reads as
/// the crowd it is, not as a fraction of it: bulk must not take in the first seconds
/// what the interactive calls of the minute will need.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rate {
    events: VecDeque<Instant>,
    /// When the events of the span began (after a quiet span).
    since: Option<Instant>,
}

impl Rate {
    /// The shortest span a rate is read over: two calls in the first
    /// moment are not yet a rate of two a second.
    const MIN_SPAN: Duration = Duration::from_secs(3);

    pub(crate) fn new() -> Rate {
        Rate::default()
    }

    fn age(&mut self, now: Instant) {
        while self
            .events
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= SPAN)
        {
            self.events.pop_front();
        }
        if self.events.is_empty() {
            self.since = None;
        }
    }

    /// Events a second at `now`.
    pub(crate) fn at(&mut self, now: Instant) -> f64 {
        self.age(now);
        let Some(since) = self.since else { return 0.0 };
        let span = now.saturating_duration_since(since).clamp(Rate::MIN_SPAN, SPAN);
        self.events.len() as f64 / span.as_secs_f64()
    }

    /// One event at `now`.
    pub(crate) fn count(&mut self, now: Instant) {
        self.age(now);
        self.since.get_or_insert(now);
        self.events.push_back(now);
    }
}

/// Places a bulk call must leave free: the reserve, and what interactive
/// calls at `interactive` a second will want in `until_aged` (until the
/// window's oldest call ages out and frees a place).
pub(crate) fn kept_from_bulk(reserve: u32, interactive: f64, until_aged: Duration) -> u32 {
    let want = (interactive * until_aged.as_secs_f64()).ceil();
    reserve.max(want.min(f64::from(u32::MAX)) as u32)
}

impl Window {
    pub(crate) fn new(limits: Limits) -> Window {
        Window {
            burst: burst_limiter(limits),
            limits,
            calls: VecDeque::with_capacity(limits.calls as usize),
            per_team: HashMap::new(),
            interactive: Rate::new(),
        }
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// New numbers (a reload, another share): the calls made stay counted.
    pub(crate) fn set_limits(&mut self, limits: Limits) {
        if limits != self.limits {
            self.burst = burst_limiter(limits);
            self.limits = limits;
        }
    }

    /// Drops the calls older than the window.
    fn age(&mut self, now: Instant) {
        while let Some((at, team)) = self.calls.front() {
            if now.saturating_duration_since(*at) < SPAN {
                break;
            }
            if let Some(n) = self.per_team.get_mut(team) {
                *n -= 1;
                if *n == 0 {
                    self.per_team.remove(team);
                }
            }
            self.calls.pop_front();
        }
    }

    /// Places free in the window now.
    pub(crate) fn free(&mut self, now: Instant) -> u32 {
        self.age(now);
        self.limits.calls.saturating_sub(self.calls.len() as u32)
    }

    /// When the `k`th oldest call (from 1) leaves the window.
    fn frees(&self, now: Instant, k: usize) -> Duration {
        self.calls
            .get(k.saturating_sub(1))
            .map_or(Duration::from_millis(1), |(at, _)| {
                (*at + SPAN)
                    .saturating_duration_since(now)
                    .max(Duration::from_millis(1))
            })
    }

    /// Takes a place for a call of `team` now, or says how long until one.
    pub(crate) fn take(&mut self, now: Instant, team: &str, bulk: bool) -> Result<(), Refused> {
        let free = self.free(now);
        let used = self.calls.len();
        if free == 0 {
            let wait = self.frees(now, used + 1 - self.limits.calls as usize);
            return Err(Refused { wait, held: Held::Full });
        }
        if bulk && free <= self.kept_from_bulk(now) {
            return Err(Refused {
                wait: self
                    .frees(now, 1)
                    .min(Duration::from_secs_f64(1.0 / self.limits.per_sec())),
                held: Held::Reserve,
            });
        }
        if free <= self.limits.reserve && !self.may_use_reserve(team, bulk) {
            let wait = self.frees(now, used + 1 - (self.limits.calls - self.limits.reserve) as usize);
            return Err(Refused {
                wait,
                held: Held::Reserve,
            });
        }
        if let Some(burst) = &self.burst {
            if let Err(not_until) = burst.check() {
                let wait =
                    not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
                return Err(Refused {
                    wait: wait.max(Duration::from_millis(1)),
                    held: Held::Burst,
                });
            }
        }
        let team: Arc<str> = match self.per_team.get_key_value(team) {
            Some((name, _)) => name.clone(),
            None => Arc::from(team),
        };
        *self.per_team.entry(team.clone()).or_default() += 1;
        self.calls.push_back((now, team));
        if !bulk {
            self.interactive.count(now);
        }
        Ok(())
    }

    /// What a bulk call must leave free now ([`kept_from_bulk`]).
    fn kept_from_bulk(&mut self, now: Instant) -> u32 {
        let until_aged = match self.calls.front() {
            Some(_) => self.frees(now, 1),
            None => SPAN,
        };
        kept_from_bulk(self.limits.reserve, self.interactive.at(now), until_aged)
    }

    /// The reserve is an interactive call's whose team made fewer than its
    /// share of the window's calls: `calls / (other teams in it + 2)`.
    fn may_use_reserve(&self, team: &str, bulk: bool) -> bool {
        if bulk {
            return false;
        }
        let mine = self.per_team.get(team).copied().unwrap_or(0);
        let others = self.per_team.len() as u32 - u32::from(mine > 0);
        mine.saturating_mul(others + 2) < self.limits.calls
    }

    /// How long until `n` more calls of `team` could go (the reserve
    /// counted only when it is theirs): the estimate behind a predicted wait. The
    /// window's part is read from its log; the burst's (governor keeps its
    /// state to itself) from the calls of the last burst's span.
    pub(crate) fn wait_for(&mut self, now: Instant, n: usize, team: &str, bulk: bool) -> Duration {
        self.in_window(now, n, team, bulk).max(self.in_burst(now, n))
    }

    fn in_window(&mut self, now: Instant, n: usize, team: &str, bulk: bool) -> Duration {
        let free = self.free(now) as usize;
        let usable = match (bulk, self.may_use_reserve(team, bulk)) {
            (true, _) => free.saturating_sub(self.kept_from_bulk(now) as usize),
            (false, true) => free,
            (false, false) => free.saturating_sub(self.limits.reserve as usize),
        };
        if n <= usable {
            return Duration::ZERO;
        }
        let short = n - usable;
        if bulk {
            // Places come to bulk only as fast as the window frees them
            // beyond what interactive calls take.
            let left = self.limits.per_sec() - self.interactive.at(now);
            return bulk_wait(short, left);
        }
        match self.calls.len() {
            // Beyond this window's calls: the steady pace after them.
            len if short > len => {
                let last = self.frees(now, len);
                last + Duration::from_secs_f64((short - len) as f64 / self.limits.per_sec())
            }
            _ => self.frees(now, short),
        }
    }

    /// The burst's part: the calls made in the last `burst` intervals are
    /// the burst spent; past what is left, one call an interval.
    fn in_burst(&self, now: Instant, n: usize) -> Duration {
        if self.burst.is_none() {
            return Duration::ZERO;
        }
        let interval = 1.0 / self.limits.per_sec();
        let span = Duration::from_secs_f64(interval * f64::from(self.limits.burst));
        let spent = self
            .calls
            .iter()
            .rev()
            .take_while(|(at, _)| now.saturating_duration_since(*at) < span)
            .count();
        let left = (self.limits.burst as usize).saturating_sub(spent);
        Duration::from_secs_f64(n.saturating_sub(left) as f64 * interval)
    }
}

/// How long `short` bulk calls wait when places come to bulk at `per_sec`
/// (the steady rate less the interactive calls'): past an hour, an hour.
pub(crate) fn bulk_wait(short: usize, per_sec: f64) -> Duration {
    let secs = short as f64 / per_sec.max(1.0 / 3600.0);
    Duration::from_secs_f64(secs.min(3600.0))
}

/// The burst's GCRA, when the burst is less than the whole window.
fn burst_limiter(limits: Limits) -> Option<DefaultDirectRateLimiter> {
    if limits.burst >= limits.calls {
        return None;
    }
    let calls = NonZeroU32::new(limits.calls).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(limits.burst).unwrap_or(NonZeroU32::MIN);
    Some(DefaultDirectRateLimiter::direct(
        Quota::per_minute(calls).allow_burst(burst),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(calls: u32, burst: u32, reserve: u32) -> Limits {
        Limits { calls, burst, reserve }
    }

    #[test]
    fn a_whole_window_goes_at_once_and_the_next_call_waits_for_the_first_to_age() {
        let mut w = Window::new(limits(10, 10, 0));
        let t0 = Instant::now();
        assert!((0..10).all(|_| w.take(t0, "a", false).is_ok()));
        let later = t0 + Duration::from_secs(20);
        let refused = w.take(later, "a", false).expect_err("full");
        assert_eq!(refused.held, Held::Full);
        assert_eq!(refused.wait, Duration::from_secs(40));
        assert!(w.take(t0 + SPAN, "a", false).is_ok(), "the first call aged out");
        assert_eq!(w.free(t0 + SPAN), 9, "all ten aged out together");
    }

    #[test]
    fn a_team_past_its_share_leaves_the_reserve_to_teams_under_theirs() {
        let mut w = Window::new(limits(20, 20, 2));
        let t0 = Instant::now();
        assert_eq!((0..30).filter(|_| w.take(t0, "flood", false).is_ok()).count(), 18);
        assert_eq!(w.take(t0, "flood", false).expect_err("reserve").held, Held::Reserve);
        assert_eq!(w.take(t0, "batch", true).expect_err("bulk").held, Held::Reserve);
        assert!(
            w.take(t0, "light", false).is_ok(),
            "a team that was not waiting goes at once"
        );
        assert!(w.take(t0, "light", false).is_ok());
        assert_eq!(w.take(t0, "light", false).expect_err("full").held, Held::Full);
    }

    #[test]
    fn the_reserve_stays_for_a_team_not_seen_while_two_share_the_rest() {
        let mut w = Window::new(limits(20, 20, 2));
        let t0 = Instant::now();
        let taken = (0..40)
            .filter(|i| w.take(t0, if i % 2 == 0 { "a" } else { "b" }, false).is_ok())
            .count();
        // Each has 9 when the reserve is reached: past 20 / (1 + 2).
        assert_eq!(taken, 18);
        assert!(w.take(t0, "c", false).is_ok());
    }

    #[test]
    fn bulk_leaves_what_interactive_calls_will_want_before_the_window_frees() {
        let mut w = Window::new(limits(120, 120, 12));
        let t0 = Instant::now();
        // Interactive calls at 2 a second for 10 s: 20 in the window.
        for i in 0..20 {
            w.take(t0 + Duration::from_millis(500 * i), "web", false).unwrap();
        }
        let now = t0 + Duration::from_secs(10);
        // The oldest ages in 50 s: interactive calls will want 100 of the
        // 100 free (2 a second); nothing for bulk but when they ease off.
        assert_eq!(w.take(now, "export", true).expect_err("kept").held, Held::Reserve);
        let later = now + Duration::from_secs(40);
        // 20 calls over 50 s now, 0.4 a second, 10 s until the oldest
        // ages: 4 kept, and the reserve of 12 binds.
        let bulk = (0..100).filter(|_| w.take(later, "export", true).is_ok()).count();
        assert_eq!(bulk, 88);
        assert!(w.take(later, "web", false).is_ok(), "interactive takes the reserve");
        // Nothing interactive for a long while: bulk may take all but the reserve.
        let mut idle = Window::new(limits(120, 120, 12));
        assert_eq!((0..200).filter(|_| idle.take(now, "export", true).is_ok()).count(), 108);
    }

    #[test]
    fn a_burst_lower_than_the_window_paces_the_rest() {
        let mut w = Window::new(limits(60, 3, 0));
        let t0 = Instant::now();
        assert_eq!((0..10).filter(|_| w.take(t0, "a", false).is_ok()).count(), 3);
        let refused = w.take(t0, "a", false).expect_err("burst spent");
        assert_eq!(refused.held, Held::Burst);
        assert!(refused.wait <= Duration::from_secs(1), "{refused:?}");
    }

    #[test]
    fn the_wait_for_n_calls_reads_the_log() {
        let mut w = Window::new(limits(4, 4, 0));
        let t0 = Instant::now();
        for s in 0..4 {
            w.take(t0 + Duration::from_secs(s * 10), "a", false).unwrap();
        }
        let now = t0 + Duration::from_secs(30);
        assert_eq!(w.wait_for(now, 1, "a", false), Duration::from_secs(30));
        assert_eq!(w.wait_for(now, 2, "a", false), Duration::from_secs(40));
        // Past the log: the steady pace (15 s a call) after its last.
        assert_eq!(w.wait_for(now, 5, "a", false), Duration::from_secs(75));
    }

    #[test]
    fn a_replica_s_share_divides_every_number() {
        let l = limits(120, 120, 12);
        assert_eq!(l.share(0), l, "never counted: the whole window");
        assert_eq!(l.share(2), limits(60, 60, 6));
        assert_eq!(l.share(7), limits(17, 17, 1));
        assert_eq!(limits(5, 1, 0).share(10), limits(1, 1, 0));
    }
}
