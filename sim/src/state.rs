//! The mutable state of one `Sim`: credits, rate limiter, counters, faults.
//!
//! Each piece sits behind its own short-lived `Mutex` (never held across an
//! await), so requests contend only on what they touch. Nothing here is
//! global: several simulators live side by side in one test process.

use crate::credits::Credits;
use crate::dataset::Dataset;
use crate::faults::{FaultState, Faults};
use crate::ratelimit::RateLimit;
use crate::stats::{LogEntry, Stats, StatsBook};
use crate::SimConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::{Arc, Mutex, MutexGuard};

pub struct Shared {
    pub cfg: SimConfig,
    /// The current data release: a publish swaps it whole
    /// ([`Shared::publish_release`]).
    data: Mutex<Arc<Dataset>>,
    /// What `/v2/meta/release` answers for `released_at` instead of the
    /// dataset's date, when set ([`Shared::garble_release`]).
    release_text: Mutex<Option<String>>,
    credits: Mutex<Credits>,
    limiter: Mutex<RateLimit>,
    stats: Mutex<StatsBook>,
    faults: Mutex<FaultState>,
    /// Seeded so that a run with jitter is reproducible.
    jitter: Mutex<ChaCha8Rng>,
}

/// Locks, recovering from poisoning: a panicked request must not wedge the sim.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(cfg: SimConfig) -> Shared {
        Shared {
            data: Mutex::new(Dataset::for_seed(cfg.seed)),
            release_text: Mutex::new(None),
            credits: Mutex::new(Credits::new(cfg.credit_limit)),
            limiter: Mutex::new(RateLimit::new(cfg.requests_per_minute, cfg.rate_window)),
            stats: Mutex::new(StatsBook::default()),
            faults: Mutex::new(FaultState::new(cfg.seed)),
            jitter: Mutex::new(ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5151)),
            cfg,
        }
    }

    /// The dataset of the current release.
    pub fn data(&self) -> Arc<Dataset> {
        lock(&self.data).clone()
    }

    /// Publishes the next data release, `days` later: `released_at`
    /// advances and the data changes (`Dataset::published`); a garbled
    /// release text is cleared. Returns the new date.
    pub fn publish_release(&self, days: u32) -> chrono::NaiveDate {
        let next = Arc::new(self.data().published(days));
        let date = next.released_at;
        *lock(&self.data) = next;
        *lock(&self.release_text) = None;
        date
    }

    /// `/v2/meta/release` answers `text` as its `released_at` (not a date,
    /// or an older one) until the next publish; the data stays.
    pub fn garble_release(&self, text: Option<String>) {
        *lock(&self.release_text) = text;
    }

    /// What `/v2/meta/release` answers as `released_at`.
    pub fn release_text(&self) -> String {
        lock(&self.release_text)
            .clone()
            .unwrap_or_else(|| self.data().released_at.to_string())
    }

    pub fn credits(&self) -> MutexGuard<'_, Credits> {
        lock(&self.credits)
    }

    pub fn stats_book(&self) -> MutexGuard<'_, StatsBook> {
        lock(&self.stats)
    }

    pub fn faults(&self) -> MutexGuard<'_, FaultState> {
        lock(&self.faults)
    }

    pub fn stats(&self) -> Stats {
        let window = self.credits().window_used();
        self.stats_book().snapshot(window)
    }

    pub fn log(&self) -> Vec<LogEntry> {
        self.stats_book().log()
    }

    pub fn set_faults(&self, faults: Faults) {
        self.faults().set(faults);
    }

    pub fn set_requests_per_minute(&self, rpm: u32) {
        *lock(&self.limiter) = RateLimit::new(rpm, self.cfg.rate_window);
    }

    /// `Err(retry_after_secs)` when the key is over its request rate.
    pub fn check_rate(&self) -> Result<(), u64> {
        lock(&self.limiter).check()
    }

    /// The configured latency plus this request's seeded jitter, in ms.
    pub fn latency_ms(&self) -> u64 {
        let jitter = match self.cfg.latency_jitter_ms {
            0 => 0,
            j => lock(&self.jitter).random_range(0..=j),
        };
        self.cfg.latency_ms + jitter
    }

    /// Counters, log, spend and faults back to zero (limits and clock stay).
    pub fn reset(&self) {
        *self.stats_book() = StatsBook::default();
        self.credits().clear_spend();
        self.faults().set(Faults::default());
    }
}
