//! The cache lookup phase (7): which cached entries a request accepts, and
//! as what (the response itself is shaped in `respond`; the keys refreshed
//! in the background lately are in [`crate::cache::refresh`]).

use crate::cache::control::Directives;
use crate::cache::Entry;

/// How a cached entry may answer this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Fresh enough: a hit.
    Hit,
    /// Expired, but the client's `max-stale` accepts it.
    StaleAccepted,
    /// Expired within `cache.stale_while_revalidate_secs`: served stale
    /// while one refresh runs in the background.
    Revalidate,
    /// Only as a fallback when the upstream fails.
    FallbackOnly,
}

pub fn usable(entry: &Entry, d: &Directives, revalidate_secs: u64, now: u64) -> Use {
    let age = entry.age(now).as_secs();
    if d.max_age.is_some_and(|max| age > max) {
        return Use::FallbackOnly;
    }
    if entry.is_fresh(now) {
        return Use::Hit;
    }
    let stale_by = entry.staleness(now).as_secs();
    match d.max_stale {
        Some(max) if stale_by <= max => Use::StaleAccepted,
        _ if stale_by < revalidate_secs => Use::Revalidate,
        _ => Use::FallbackOnly,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Route;
    use bytes::Bytes;
    use std::time::Duration;

    fn entry(ttl_secs: u64) -> Entry {
        let mut e = Entry::new(
            Bytes::from_static(b"{}"),
            3,
            Duration::from_secs(ttl_secs),
            Route::Other,
        );
        e.stored_at_ms = 1_000_000;
        e
    }

    #[test]
    fn max_age_max_stale_and_revalidate_decide_use() {
        let e = entry(60);
        let d = Directives::default();
        assert_eq!(usable(&e, &d, 0, 1_030_000), Use::Hit);
        assert_eq!(usable(&e, &d, 0, 1_070_000), Use::FallbackOnly);
        let young = Directives {
            max_age: Some(10),
            ..Directives::default()
        };
        assert_eq!(usable(&e, &young, 0, 1_030_000), Use::FallbackOnly);
        let tolerant = Directives {
            max_stale: Some(20),
            ..Directives::default()
        };
        assert_eq!(usable(&e, &tolerant, 0, 1_070_000), Use::StaleAccepted);
        assert_eq!(usable(&e, &tolerant, 0, 1_090_000), Use::FallbackOnly);
        assert_eq!(
            usable(&e, &d, 60, 1_070_000),
            Use::Revalidate,
            "within the revalidate window"
        );
        assert_eq!(usable(&e, &d, 60, 1_130_000), Use::FallbackOnly, "past it");
        assert_eq!(
            usable(&e, &young, 60, 1_070_000),
            Use::FallbackOnly,
            "max-age still binds"
        );
    }
}
