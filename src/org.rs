//! The organisation's view of the upstream account: its credit limit and
//! remaining credits as the upstream last reported them, and whether it is
//! exhausted (the upstream answered 402).
//!
//! While exhausted, metered calls are not forwarded — every one would be a
//! 402 anyway — until `upstream.exhausted_backoff_secs` pass or a probe of
//! the upstream's own `/v2/usage` says credits are available again.

use crate::cache::now_ms;
use crate::metrics::Metrics;
use crate::upstream::UpstreamResponse;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// How often, at most, an exhausted org asks the upstream's /v2/usage.
const PROBE_EVERY_MS: u64 = 30_000;

pub struct Org {
    backoff: Duration,
    /// Unix ms until which metered calls are held back (0: not exhausted).
    exhausted_until_ms: AtomicU64,
    last_probe_ms: AtomicU64,
    /// The upstream's 402, replayed while exhausted.
    last_402: Mutex<Option<(HeaderMap, Bytes)>>,
}

impl Org {
    pub fn new(backoff: Duration) -> Org {
        Org {
            backoff,
            exhausted_until_ms: AtomicU64::new(0),
            last_probe_ms: AtomicU64::new(0),
            last_402: Mutex::new(None),
        }
    }

    /// Learns from every upstream answer: its credit headers, and a 402.
    pub fn observe(&self, resp: &UpstreamResponse, metrics: &Metrics) {
        let header = |name: &str| {
            resp.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.trim().parse::<i64>().ok())
        };
        if let Some(limit) = header("x-credits-limit") {
            metrics.upstream_credit_limit.set(limit);
        }
        if let Some(remaining) = header("x-credits-remaining") {
            metrics.upstream_credits_remaining.set(remaining.max(0));
        }
        if resp.status == StatusCode::PAYMENT_REQUIRED {
            let until = now_ms() + self.backoff.as_millis() as u64;
            self.exhausted_until_ms.store(until, Ordering::Release);
            *self.last_402.lock().unwrap_or_else(|p| p.into_inner()) = Some((resp.headers.clone(), resp.body.clone()));
            metrics.upstream_credits_remaining.set(0);
            tracing::warn!(
                backoff_secs = self.backoff.as_secs(),
                "upstream is out of credits: metered calls paused"
            );
        }
    }

    /// The 402 to answer instead of forwarding, while exhausted.
    pub fn exhausted(&self) -> Option<(HeaderMap, Bytes)> {
        let until = self.exhausted_until_ms.load(Ordering::Acquire);
        if until == 0 || until <= now_ms() {
            return None;
        }
        self.last_402.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a /v2/usage probe is due now (at most one per interval).
    pub fn probe_due(&self) -> bool {
        let now = now_ms();
        let last = self.last_probe_ms.load(Ordering::Acquire);
        now.saturating_sub(last) >= PROBE_EVERY_MS
            && self
                .last_probe_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The upstream says credits are available again.
    pub fn recovered(&self) {
        self.exhausted_until_ms.store(0, Ordering::Release);
        tracing::info!("upstream credits available again: metered calls resume");
    }
}
