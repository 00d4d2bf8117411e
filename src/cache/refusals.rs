//! The upstream's 422s, kept for a while by normalized key: a 422 costs no
//! credit, but every call takes one of the org's calls a minute, so an app
//! retrying a request the vendor refuses (a geography it does not know, a
//! date it cannot read) would otherwise burn everyone's rate, one call a
//! retry. Kept `cache.refusal_ttl_secs` (0: not kept), in this process
//! only (a replica asks once for itself), bounded in count, and dropped by
//! any purge (a purge of one answer drops its own). What the gateway
//! refuses itself before the call (`route`'s checks) never gets here.

use bytes::Bytes;
use http::HeaderValue;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Refusals kept at most: a key and a few hundred bytes each.
const KEPT: usize = 4096;

/// One refusal: the upstream's body and content type, until when it stands.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) body: Bytes,
    pub(crate) content_type: Option<HeaderValue>,
    until: Instant,
}

/// The refusals kept, by cache key.
pub(crate) struct Refusals {
    ttl: Duration,
    kept: quick_cache::sync::Cache<Arc<str>, Arc<Refusal>>,
}

impl Refusals {
    pub(crate) fn new(ttl: Duration) -> Refusals {
        Refusals {
            ttl,
            kept: quick_cache::sync::Cache::new(KEPT),
        }
    }

    /// The refusal of `key`, while it stands.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<Refusal>> {
        if self.ttl.is_zero() {
            return None;
        }
        let kept = self.kept.get(key)?;
        if kept.until <= Instant::now() {
            self.kept.remove(key);
            return None;
        }
        Some(kept)
    }

    /// Keeps the upstream's refusal of `key`.
    pub(crate) fn keep(&self, key: &str, body: Bytes, content_type: Option<HeaderValue>) {
        if self.ttl.is_zero() {
            return;
        }
        let refusal = Refusal {
            body,
            content_type,
            until: Instant::now() + self.ttl,
        };
        self.kept.insert(Arc::from(key), Arc::new(refusal));
    }

    /// Forgets every refusal (a purge).
    pub(crate) fn clear(&self) {
        self.kept.clear();
    }

    /// Forgets the refusal of `key` (a purge of one answer): whether one
    /// was kept.
    pub(crate) fn forget(&self, key: &str) -> bool {
        self.kept.remove(key).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_stands_for_its_while_and_none_is_kept_at_zero() {
        let r = Refusals::new(Duration::from_secs(60));
        r.keep("k", Bytes::from_static(b"{}"), None);
        assert_eq!(r.get("k").map(|r| r.body.clone()), Some(Bytes::from_static(b"{}")));
        assert!(r.get("other").is_none());
        r.clear();
        assert!(r.get("k").is_none());
        let off = Refusals::new(Duration::ZERO);
        off.keep("k", Bytes::new(), None);
        assert!(off.get("k").is_none());
        let past = Refusal {
            body: Bytes::new(),
            content_type: None,
            until: Instant::now(),
        };
        r.kept.insert(Arc::from("k"), Arc::new(past));
        assert!(r.get("k").is_none(), "past its while");
    }
}
