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

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// The process's allocator: mimalloc, asked the way the C programs that
/// use it ask. The `mimalloc` crate's allocator passes every request's
/// alignment to `mi_malloc_aligned`, whose fast path takes only blocks of
/// at most 1 KiB; each larger block (a request's handler future, its
/// access line, hyper's head buffer: about four an L1 hit) went through
/// mimalloc's over-allocating aligned path, ~200 instructions each, and
/// every small one through the aligned path's extra checks (callgrind,
/// BENCHMARKS.md, issue 50). Every mimalloc block is aligned to a
/// pointer's size, so a layout asking no more than that is served by
/// `mi_malloc` / `mi_realloc` / `mi_zalloc`; larger alignments (rare: the
/// cache-padded structures of tokio and crossbeam) still take the aligned
/// calls.
pub struct Allocator;

/// What every mimalloc block is aligned to (`MI_INTPTR_SIZE`).
const PLAIN_ALIGN: usize = std::mem::size_of::<usize>();

#[expect(
    unsafe_code,
    reason = "a global allocator is unsafe by contract: FFI calls into mimalloc with the pointers Rust gave back"
)]
// SAFETY: each method hands mimalloc a size and alignment Rust's
// `Layout` vouches for (a power-of-two alignment; a size that does not
// overflow when rounded up to it), and `dealloc`/`realloc` only pointers
// this allocator returned; mimalloc's blocks are at least `PLAIN_ALIGN`
// aligned, so the plain calls meet every layout they serve.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl's note.
        unsafe {
            match layout.align() <= PLAIN_ALIGN {
                true => libmimalloc_sys::mi_malloc(layout.size()),
                false => libmimalloc_sys::mi_malloc_aligned(layout.size(), layout.align()),
            }
        }
        .cast()
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl's note.
        unsafe {
            match layout.align() <= PLAIN_ALIGN {
                true => libmimalloc_sys::mi_zalloc(layout.size()),
                false => libmimalloc_sys::mi_zalloc_aligned(layout.size(), layout.align()),
            }
        }
        .cast()
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: see the impl's note.
        unsafe { libmimalloc_sys::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let ptr = ptr.cast::<c_void>();
        // SAFETY: see the impl's note.
        unsafe {
            match layout.align() <= PLAIN_ALIGN {
                true => libmimalloc_sys::mi_realloc(ptr, new_size),
                false => libmimalloc_sys::mi_realloc_aligned(ptr, new_size, layout.align()),
            }
        }
        .cast()
    }
}

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
