//! How long a route's next call waits for company (issue 58: calls leave
//! full when calls are scarce, at once when they are plentiful), and the
//! arrival rate of ids that the rule reads.
//!
//! From the moment a call starts gathering, it waits:
//! - **for a full call** (until it holds 50 ids, or one interval of the
//!   gate's steady pace has passed, or the window if that is longer) when
//!   ids arrive as a crowd, or when the gate says calls are scarce
//!   (`Scheduler::scarce`): at the steady pace a call could not leave much
//!   sooner anyway, and each call spent on a few ids is one the crowd
//!   will miss;
//! - **for the window** (`upstream.batch_window_ms`) when the route had a
//!   call in the last second (company is likely arriving);
//! - **not at all** otherwise: a lone lookup on an idle gateway goes at once.
//!
//! **A crowd** is ids arriving fast enough that one interval of gathering
//! holds at least half a call (`rate × interval ≥ 25` ids). Not a whole
//! call: at a load of exactly what full calls carry (100 ids a second at
//! 120 calls a minute) an estimate of the rate hovers around the whole
//! call, and half its decisions would spend calls on a window's few ids
//! that the load needs; above half a call a window's calls would come
//! dozens of times faster than the steady pace, and gathering costs an id
//! at most one interval (0.5 s at 120 calls a minute).
//!
//! **The rate** is an exponentially weighted count of the ids that joined
//! ([`TAU`]: about the last second), divided by how much of that weight the
//! time since the arrivals began carries, so a crowd after a quiet spell
//! is seen within its first tens of milliseconds rather than after a
//! second of warming up; it is not read from less than a twentieth of an
//! interval (25 ms at 120 calls a minute): two lookups in a row are no
//! crowd, a third within that time is.

use std::time::{Duration, Instant};

/// The rate's memory: ids weigh `e^(-age / TAU)`; after a quiet `TAU` the
/// route's arrivals begin again.
const TAU: Duration = Duration::from_secs(1);

/// The shortest time a rate is read from, as a share of the interval.
const MIN_SPAN_OF_INTERVAL: u32 = 20;

/// The rate at which ids join a route's queue.
#[derive(Debug, Default)]
pub(super) struct Arrivals {
    /// The ids that joined since the arrivals began, each weighted by
    /// `e^(-age / TAU)`, as of `last`.
    weight: f64,
    /// When the arrivals began: the first id after a quiet [`TAU`] (it
    /// marks the start and is not counted: n ids span n - 1 gaps).
    since: Option<Instant>,
    /// When the last id joined.
    last: Option<Instant>,
}

impl Arrivals {
    /// `ids` joined at `at`.
    pub(super) fn note(&mut self, at: Instant, ids: usize) {
        match self.last {
            Some(last) if at.saturating_duration_since(last) <= TAU => {
                self.weight = self.weight * decay(at.saturating_duration_since(last)) + ids as f64;
            }
            _ => {
                self.since = Some(at);
                self.weight = 0.0;
            }
        }
        self.last = Some(at);
    }

    /// Ids a second as of `now`, read from at least `min_span`.
    pub(super) fn per_sec(&self, now: Instant, min_span: Duration) -> f64 {
        let (Some(since), Some(last)) = (self.since, self.last) else {
            return 0.0;
        };
        let weight = self.weight * decay(now.saturating_duration_since(last));
        // The weight the time since the arrivals began carries: the whole
        // TAU once they have gone on for long, less in their first moments.
        let span = TAU.as_secs_f64() * (1.0 - decay(now.saturating_duration_since(since)));
        weight / span.max(min_span.as_secs_f64())
    }
}

/// `e^(-age / TAU)`.
fn decay(age: Duration) -> f64 {
    (-age.as_secs_f64() / TAU.as_secs_f64()).exp()
}

/// What the rule reads of the config and of the gate, now.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pace {
    /// `upstream.batch_window_ms`.
    pub(super) window: Duration,
    /// The time between calls at the gate's steady rate
    /// (`Scheduler::interval`).
    pub(super) interval: Duration,
    /// Calls are scarce now (`Scheduler::scarce`).
    pub(super) scarce: bool,
}

/// How long a gathering lasts from its start (the module doc), for a call
/// of at most `full` ids: a crowd on `arrivals` at `now` or scarce calls
/// wait for a full call, a route called `recently` for the window.
pub(super) fn span(pace: Pace, arrivals: &Arrivals, now: Instant, recently: bool, full: usize) -> Duration {
    let rate = arrivals.per_sec(now, pace.interval / MIN_SPAN_OF_INTERVAL);
    let crowd = rate * pace.interval.as_secs_f64() >= full as f64 / 2.0;
    if crowd || pace.scarce {
        pace.interval.max(pace.window)
    } else if recently {
        pace.window
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// 120 calls a minute and the default window, calls plentiful.
    const PACE: Pace = Pace {
        window: Duration::from_millis(20),
        interval: Duration::from_millis(500),
        scarce: false,
    };

    /// One id every `every` from `start`, `n` of them; the time of the last.
    fn steady(arrivals: &mut Arrivals, start: Instant, every: Duration, n: u32) -> Instant {
        for i in 0..n {
            arrivals.note(start + every * i, 1);
        }
        start + every * (n - 1)
    }

    #[test]
    fn a_steady_rate_is_read_as_itself_from_its_first_tens_of_milliseconds() {
        let start = Instant::now();
        for n in [6, 50, 300] {
            let mut arrivals = Arrivals::default();
            let last = steady(&mut arrivals, start, 10 * MS, n);
            let rate = arrivals.per_sec(last, 25 * MS);
            assert!((90.0..=110.0).contains(&rate), "{n} ids, 10 ms apart: {rate}/s");
        }
    }

    #[test]
    fn two_lookups_in_a_row_are_no_crowd_and_a_third_soon_after_is() {
        let start = Instant::now();
        let mut arrivals = Arrivals::default();
        let last = steady(&mut arrivals, start, 10 * MS, 2);
        assert_eq!(span(PACE, &arrivals, last, true, 50), PACE.window, "a window, as ever");
        arrivals.note(start + 20 * MS, 1);
        assert_eq!(
            span(PACE, &arrivals, start + 20 * MS, true, 50),
            PACE.interval,
            "a crowd gathers a full call"
        );
    }

    #[test]
    fn a_crowd_that_stopped_a_quiet_second_ago_is_forgotten() {
        let start = Instant::now();
        let mut arrivals = Arrivals::default();
        let last = steady(&mut arrivals, start, 10 * MS, 100);
        assert_eq!(span(PACE, &arrivals, last, true, 50), PACE.interval);
        // A lone id after a quiet second begins the arrivals again.
        let later = last + TAU + MS;
        arrivals.note(later, 1);
        assert_eq!(arrivals.per_sec(later, 25 * MS), 0.0);
        assert_eq!(span(PACE, &arrivals, later, false, 50), Duration::ZERO, "at once");
    }

    #[test]
    fn a_light_rate_gathers_the_window_only_after_a_recent_call() {
        let start = Instant::now();
        let mut arrivals = Arrivals::default();
        // 20 ids a second: 10 ids an interval, a fifth of a call.
        let last = steady(&mut arrivals, start, 50 * MS, 40);
        assert_eq!(span(PACE, &arrivals, last, true, 50), PACE.window);
        assert_eq!(span(PACE, &arrivals, last, false, 50), Duration::ZERO);
    }

    #[test]
    fn scarce_calls_gather_a_full_call_whatever_the_rate() {
        let scarce = Pace { scarce: true, ..PACE };
        let now = Instant::now();
        assert_eq!(span(scarce, &Arrivals::default(), now, false, 50), PACE.interval);
        // A window longer than the interval is never cut short.
        let long = Pace {
            window: Duration::from_secs(2),
            ..scarce
        };
        assert_eq!(span(long, &Arrivals::default(), now, false, 50), long.window);
    }
}
