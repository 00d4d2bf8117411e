//! A counting allocator: the bytes each thread has allocated and not yet
//! freed, by the allocator's own count (not RSS).
//!
//! A `#[tokio::test]` (current-thread runtime) runs the in-process gateway
//! and simulator on its own thread, so the thread's count is what they keep
//! alive; other tests, on other threads, do not touch it. A block freed by
//! another thread counts there, so a count is a bound, not a ledger.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed by this thread.
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn add(n: usize, sign: i64) {
    // `try_with`: an allocation during the thread's teardown is not counted.
    let _ = LIVE.try_with(|l| l.set(l.get() + sign * n as i64));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// count is a side effect on a const-initialized thread-local (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size(), 1);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(layout.size(), -1);
        System.dealloc(ptr, layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size(), 1);
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(layout.size(), -1);
        add(new_size, 1);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Bytes this thread has allocated and not freed.
pub fn live_here() -> i64 {
    LIVE.with(Cell::get)
}
