//! [`resolve`](super::resolve), [`validate`](super::validate) and
//! [`cache_key`](super::cache_key) memoized by the raw request target: what
//! `route::classify`, `route::validate` and `cache::key::cache_key` make of
//! one `path?query`, kept so that a repeated request skips them
//! ([`super::State::parsed`]).
//!
//! Repeated request targets are what a cache serves: dashboards and apps
//! send the same bytes again and again. Routing, validating and normalizing
//! an 8-parameter query was ~14k of the ~46k instructions of a memory hit
//! (callgrind, `bench/instructions.py`); a lookup here is ~1.5k. All three
//! are pure functions of the target's bytes and of settings a reload does
//! not change, so a memoized answer is the answer. Only targets that
//! classify and validate are kept; an invalid one is worked out, and
//! refused, every time.

use super::context::Parsed;
use std::sync::Arc;

/// A bounded map from raw `path?query` to its [`Parsed`] form.
///
/// quick_cache, not moka: a read is a hash, a shard's read lock and one
/// reference bit (CLOCK-Pro), where moka records every read for its
/// TinyLFU policy (callgrind: ~800 instructions of a hit for this lookup
/// with moka). CLOCK-Pro keeps the targets read again over those seen
/// once, which is what a scan of one-off queries needs.
pub(crate) struct ParsedTargets {
    memo: quick_cache::sync::Cache<Box<str>, Arc<Parsed>, quick_cache::UnitWeighter, foldhash::fast::RandomState>,
}

impl ParsedTargets {
    /// Holds up to `capacity` targets (about 0.5 KB each), the ones read
    /// again kept over the ones seen once.
    pub(crate) fn new(capacity: u64) -> ParsedTargets {
        let capacity = capacity.max(1);
        ParsedTargets {
            memo: quick_cache::sync::Cache::with(
                usize::try_from(capacity).unwrap_or(usize::MAX),
                capacity,
                quick_cache::UnitWeighter,
                foldhash::fast::RandomState::default(),
                quick_cache::sync::DefaultLifecycle::default(),
            ),
        }
    }

    pub(crate) fn get(&self, raw: &str) -> Option<Arc<Parsed>> {
        self.memo.get(raw)
    }

    pub(crate) fn insert(&self, raw: &str, parsed: Arc<Parsed>) {
        self.memo.insert(raw.into(), parsed);
    }
}
