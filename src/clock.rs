//! Wall-clock milliseconds since the Unix epoch: the one clock that cache
//! entries, the Redis breaker, the org's back-off and the Redis ledger's
//! reservation expiries agree on. A module of its own so that none of them
//! has to import another for it. And [`coarse_ms`], a cheap monotonic
//! reading for clocks that count seconds, and [`millis`], a duration in
//! the milliseconds Redis takes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds on the system's coarse monotonic clock
/// (`CLOCK_MONOTONIC_COARSE`: the time of the last tick, a few
/// milliseconds behind at most). For the connection registry's progress
/// and idle clocks, read several times a request: a fraction of a precise
/// reading's cost (no time-stamp counter read, no `Duration` arithmetic).
pub(crate) fn coarse_ms() -> u64 {
    coarse(libc::CLOCK_MONOTONIC_COARSE)
}

/// Unix time in milliseconds on the coarse wall clock
/// (`CLOCK_REALTIME_COARSE`: up to a tick behind [`now_ms`]): for what a
/// hit reads at a second's or a day's grain (an answer's `Age`, the
/// ledger's day, a token's end), a quarter of a precise reading's cost on
/// the machine of BENCHMARKS.md (4.7 ns against 19.5).
pub(crate) fn coarse_now_ms() -> u64 {
    coarse(libc::CLOCK_REALTIME_COARSE)
}

#[expect(
    unsafe_code,
    reason = "one FFI call that writes the struct it is given: see the SAFETY note"
)]
fn coarse(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes one `timespec` through the pointer,
    // which points at a live one of ours; both clock ids are constants the
    // kernel has had since 2.6.32 (on failure `t` stays zero).
    unsafe { libc::clock_gettime(clock, &mut t) };
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let millis = u64::try_from(t.tv_nsec).unwrap_or(0) / 1_000_000;
    secs.saturating_mul(1000).saturating_add(millis)
}

/// Unix time in milliseconds (0 if the system clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `d` in whole milliseconds, as Redis takes times (`PX`, a script's
/// deadlines); saturating, not wrapping, past `u64::MAX`.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A Unix time in milliseconds as RFC 3339 (`2026-12-31T00:00:00+00:00`),
/// as the admin API and the logs show times.
pub(crate) fn rfc3339(ms: u64) -> Option<String> {
    let ms = i64::try_from(ms).ok()?;
    chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339())
}

/// The ledger's clock: wall-clock time shifted by `quota.clock_offset_secs`
/// (0 in production). A shift exists only so that tests can make a
/// reservation on one day and see it turned into spend on another (across
/// midnight, across a month's end) without waiting for either; it moves
/// only the days the ledger books on and its reservations' expiries, never
/// the cache, the breaker or the upstream's deadlines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clock {
    offset_ms: i64,
}

impl Clock {
    /// The wall clock shifted by `secs` (negative: into the past).
    pub fn shifted(secs: i64) -> Clock {
        Clock {
            offset_ms: secs.saturating_mul(1000),
        }
    }

    pub(crate) fn now_ms(self) -> u64 {
        now_ms().saturating_add_signed(self.offset_ms)
    }

    /// Today as days since the epoch, UTC (Unix time has no leap seconds:
    /// whole days since the epoch are UTC days). On the coarse wall clock
    /// ([`coarse_now_ms`]): a hit reads it twice, and the day a call is
    /// booked on may turn a tick late.
    pub(crate) fn today(self) -> u32 {
        let now = coarse_now_ms().saturating_add_signed(self.offset_ms);
        u32::try_from(now / 86_400_000).unwrap_or(u32::MAX)
    }
}
