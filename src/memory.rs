//! Memory given back after a burst. The allocator (mimalloc, `main.rs`)
//! keeps the pages a thread freed in that thread's heap, to reuse them;
//! a worker thread that goes idle after an attack (thousands of HTTP/2
//! streams closed at once) never allocates again to notice, so the memory
//! stayed taken: RSS leveled at 5 to 6 times its start and stayed there
//! (issue 50). [`trim_when_idle`] asks the allocator to collect the
//! calling thread's heap and return what it can, at most once per
//! [`TRIM_EVERY`] per thread; it runs when a runtime's worker parks (it has
//! nothing to do), and from [`trim_periodically`]'s little tasks, since a
//! worker whose last park came less than [`TRIM_EVERY`] after its last
//! collection would otherwise sleep on with its freed pages.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The least time between two collections on one thread: a worker parks
/// between bursts of a busy gateway too, and a collection walks its heap.
pub const TRIM_EVERY: Duration = Duration::from_secs(1);

thread_local! {
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Called on a runtime's thread when it parks (`on_thread_park`).
#[expect(
    unsafe_code,
    reason = "one FFI call into the allocator, no pointer passed: see the SAFETY note"
)]
pub fn trim_when_idle() {
    let now = Instant::now();
    let due = LAST.with(|last| match last.get() {
        Some(at) if now.duration_since(at) < TRIM_EVERY => false,
        _ => {
            last.set(Some(now));
            true
        }
    });
    if due {
        // SAFETY: `mi_collect` takes no pointer and may be called on any
        // thread at any time; it only visits the calling thread's heap
        // (and, forced, the abandoned pages no thread owns).
        unsafe { libmimalloc_sys::mi_collect(true) };
    }
}

/// Every other [`TRIM_EVERY`], one tiny task per worker of the current
/// runtime that runs [`trim_when_idle`] wherever the scheduler puts it (an
/// idle worker is woken to take one): over a few rounds every worker
/// collects its heap, busy or not. Runs until the runtime ends.
pub async fn trim_periodically() {
    let workers = tokio::runtime::Handle::current().metrics().num_workers().max(1);
    loop {
        tokio::time::sleep(TRIM_EVERY * 2).await;
        for _ in 0..workers {
            tokio::spawn(async { trim_when_idle() });
        }
    }
}
