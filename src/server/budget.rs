//! The answer-bytes pool of one listener: the response bytes HTTP/2 streams
//! hold (`body.rs` counts them), against `server.http2_max_buffered_bytes`.
//! A leaf: the connections (`conns/`) and the overload manager
//! (`overload.rs`) read it, it reads neither.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Response bytes held for HTTP/2 streams, against a bound: the
/// answer-bytes pool of the overload manager (`overload.rs` shares it out).
pub(super) struct Budget {
    max: usize,
    used: AtomicUsize,
}

impl Budget {
    pub(super) fn new(max: usize) -> Arc<Budget> {
        Arc::new(Budget {
            max,
            used: AtomicUsize::new(0),
        })
    }

    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// Bytes held now.
    pub(super) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Whether any stream may start without the manager's say: the bound
    /// is not reached.
    pub(super) fn has_room(&self) -> bool {
        self.used() < self.max
    }

    /// Whether an anonymous stream may start: anonymous peers together get
    /// half the bound, so teams always have the other half.
    pub(super) fn anonymous_has_room(&self) -> bool {
        self.used() < self.max / 2
    }

    /// Counts `n` bytes (an answer already bought is never refused here:
    /// streams are refused before their handler runs); `false` when the
    /// bound is now passed and room must be made.
    pub(super) fn take(&self, n: usize) -> bool {
        self.used.fetch_add(n, Ordering::AcqRel) + n <= self.max
    }

    pub(super) fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}
