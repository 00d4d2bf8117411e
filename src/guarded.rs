//! Calls into redb that may panic, caught. redb asserts on pages it does
//! not recognise (a file changed outside it); for the disk tier (a cache)
//! and the ledger's settle journal that is a damaged file to move aside,
//! never a reason to stop the gateway or to print a panic into its log.

thread_local! {
    /// Set while [`guarded`] runs on this thread: the panic hook keeps
    /// quiet about a panic that is caught and reported as corruption.
    static GUARDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, a call into redb, catching a panic: `None` when it panicked.
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    let was = GUARDED.with(|g| g.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok();
    GUARDED.with(|g| g.set(was));
    result
}
