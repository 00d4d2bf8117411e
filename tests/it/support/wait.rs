//! Waiting on a condition, never on a clock: `eventually` polls a check
//! until it holds and fails the test with what was awaited (and why the last
//! try failed) when the bound passes. The one deadline loop of the suite.

use std::future::Future;
use std::time::{Duration, Instant};

/// Between tries: short enough not to slow a test, long enough not to spin.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// What a check returns: `true`, `Some(v)` or `Ok(v)` when it holds; the
/// `Err`'s text says what was seen instead.
pub trait Check {
    type Value;
    fn held(self) -> Result<Self::Value, String>;
}

impl Check for bool {
    type Value = ();
    fn held(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err(String::new())
        }
    }
}

impl<T> Check for Option<T> {
    type Value = T;
    fn held(self) -> Result<T, String> {
        self.ok_or_else(String::new)
    }
}

impl<T, E: std::fmt::Display> Check for Result<T, E> {
    type Value = T;
    fn held(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// Polls `check` until it holds, returning its value; panics with `what`
/// and the last failure after `limit`.
pub async fn eventually<C, F, Fut>(what: &str, limit: Duration, mut check: F) -> C::Value
where
    C: Check,
    F: FnMut() -> Fut,
    Fut: Future<Output = C>,
{
    let deadline = Instant::now() + limit;
    loop {
        let last = match check().await.held() {
            Ok(value) => return value,
            Err(last) => last,
        };
        assert!(Instant::now() < deadline, "not within {limit:?}: {what} {last}");
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// [`eventually`] for a check that blocks (a child process, a socket).
#[expect(
    clippy::disallowed_methods,
    reason = "the poll interval of a condition checked until it holds, on a blocking check"
)]
pub fn eventually_blocking<C: Check>(what: &str, limit: Duration, mut check: impl FnMut() -> C) -> C::Value {
    let deadline = Instant::now() + limit;
    loop {
        let last = match check().held() {
            Ok(value) => return value,
            Err(last) => last,
        };
        assert!(Instant::now() < deadline, "not within {limit:?}: {what} {last}");
        std::thread::sleep(POLL_EVERY);
    }
}
