//! The organisation's view of the upstream account: its credit limit and
//! remaining credits as the upstream last reported them, and whether it is
//! exhausted (the upstream answered 402).
//!
//! While exhausted, metered calls are not forwarded — every one would be a
//! 402 anyway — until `upstream.exhausted_backoff_secs` pass or a probe of
//! the upstream's own `/v2/usage` (`proxy::org_probe`) says credits are
//! available again.
//!
//! The org's spend seen upstream (limit − remaining) is kept for the
//! reconciliation against the team ledgers (`proxy::credits::reconcile`).

use crate::clock::now_ms;
use crate::metrics::Metrics;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// How often, at most, an exhausted org asks the upstream's /v2/usage.
const PROBE_EVERY_MS: u64 = 30_000;

/// `spent_seen` before the upstream reported both credit headers.
const UNSEEN: u64 = u64::MAX;

pub(crate) struct Org {
    backoff: Duration,
    /// Unix ms until which metered calls are held back (0: not exhausted).
    exhausted_until_ms: AtomicU64,
    last_probe_ms: AtomicU64,
    /// The org's credits spent in the upstream's window, as last reported
    /// (`UNSEEN` until both credit headers came).
    spent_seen: AtomicU64,
    /// The upstream's 402, replayed while exhausted.
    last_402: Mutex<Option<(HeaderMap, Bytes)>>,
}

impl Org {
    pub(crate) fn new(backoff: Duration) -> Org {
        Org {
            backoff,
            exhausted_until_ms: AtomicU64::new(0),
            last_probe_ms: AtomicU64::new(0),
            spent_seen: AtomicU64::new(UNSEEN),
            last_402: Mutex::new(None),
        }
    }

    /// Learns from every upstream answer (or its head, when the body
    /// failed): its credit headers, and a 402.
    pub(crate) fn observe(&self, status: StatusCode, headers: &HeaderMap, body: &Bytes, metrics: &Metrics) {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.trim().parse::<i64>().ok())
        };
        let (limit, remaining) = (header("x-credits-limit"), header("x-credits-remaining"));
        if let Some(limit) = limit {
            metrics.upstream_credit_limit.set(limit);
        }
        if let Some(remaining) = remaining {
            metrics.upstream_credits_remaining.set(remaining.max(0));
        }
        if let (Some(limit), Some(remaining)) = (limit, remaining) {
            let spent = u64::try_from(limit.saturating_sub(remaining.max(0))).unwrap_or(0);
            self.spent_seen.store(spent.min(UNSEEN - 1), Ordering::Release);
        }
        if status == StatusCode::PAYMENT_REQUIRED {
            let until = now_ms() + self.backoff.as_millis() as u64;
            self.exhausted_until_ms.store(until, Ordering::Release);
            *self.last_402.lock().unwrap_or_else(|p| p.into_inner()) = Some((headers.clone(), body.clone()));
            metrics.upstream_credits_remaining.set(0);
            tracing::warn!(
                backoff_secs = self.backoff.as_secs(),
                "upstream is out of credits: metered calls paused"
            );
        }
    }

    /// The 402 to answer instead of forwarding, while exhausted.
    pub(crate) fn exhausted(&self) -> Option<(HeaderMap, Bytes)> {
        let until = self.exhausted_until_ms.load(Ordering::Acquire);
        if until == 0 || until <= now_ms() {
            return None;
        }
        self.last_402.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a /v2/usage probe is due now (at most one per interval).
    pub(crate) fn probe_due(&self) -> bool {
        let now = now_ms();
        let last = self.last_probe_ms.load(Ordering::Acquire);
        now.saturating_sub(last) >= PROBE_EVERY_MS
            && self
                .last_probe_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The org's credits spent in the upstream's window, as last reported.
    pub(crate) fn spent(&self) -> Option<u64> {
        let spent = self.spent_seen.load(Ordering::Acquire);
        (spent != UNSEEN).then_some(spent)
    }

    /// The upstream says credits are available again.
    pub(crate) fn recovered(&self) {
        self.exhausted_until_ms.store(0, Ordering::Release);
        tracing::info!("upstream credits available again: metered calls resume");
    }
}
