//! Phases 2, 4 (validation) and 6 memoized by the raw request target: what
//! `route::classify`, `route::validate` and `cache::key::cache_key` make of
//! one `path?query`, kept so that a repeated request skips them. The shared
//! state (`app`) holds the memo; the proxy fills and reads it.
//!
//! Repeated request targets are what a cache serves: dashboards and apps
//! send the same bytes again and again. Routing, validating and normalizing
//! an 8-parameter query was ~14k of the ~46k instructions of a memory hit
//! (callgrind, `bench/instructions.py`); a lookup here is ~1.5k. All three
//! are pure functions of the target's bytes and of settings a reload does
//! not change, so a memoized answer is the answer. Only targets that
//! classify and validate are kept; an invalid one is worked out, and
//! refused, every time.

use crate::route::Target;
use std::sync::Arc;

/// What a valid request target means to the gateway.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) target: Target,
    /// The normalized cache key; `None` for routes that are never cached.
    pub(crate) key: Option<String>,
}

/// A bounded map from raw `path?query` to its [`Parsed`] form.
pub(crate) struct ParsedTargets {
    memo: moka::sync::Cache<Box<str>, Arc<Parsed>, foldhash::fast::RandomState>,
}

impl ParsedTargets {
    /// Holds up to `capacity` targets (about 0.5 KB each), least recently
    /// and least frequently used first out.
    pub(crate) fn new(capacity: u64) -> ParsedTargets {
        ParsedTargets {
            memo: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .build_with_hasher(foldhash::fast::RandomState::default()),
        }
    }

    pub(crate) fn get(&self, raw: &str) -> Option<Arc<Parsed>> {
        self.memo.get(raw)
    }

    pub(crate) fn insert(&self, raw: &str, parsed: Parsed) {
        self.memo.insert(raw.into(), Arc::new(parsed));
    }
}
