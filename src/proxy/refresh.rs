//! Which keys were refreshed in the background lately
//! (stale-while-revalidate), kept in [`super::State::refreshes`] and claimed
//! by [`lookup`](super::lookup)'s verdict on a stale entry
//! ([`super::revalidate`]).

use std::time::Duration;

/// How long a key that was refreshed in the background is not refreshed
/// again. A refresh that stores nothing (the upstream said `no-store`, the
/// answer was too large, the call failed) would otherwise start another
/// paid refresh on every request that finds the stale entry.
const REFRESH_EVERY: Duration = Duration::from_secs(60);

/// The keys refreshed in the background within [`REFRESH_EVERY`].
pub(crate) struct Refreshes(moka::future::Cache<String, ()>);

impl Refreshes {
    pub(crate) fn new() -> Refreshes {
        Refreshes(
            moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(REFRESH_EVERY)
                .build(),
        )
    }

    /// True for the one caller that may start this key's refresh now.
    pub(crate) async fn claim(&self, key: &str) -> bool {
        self.0.entry(key.to_string()).or_insert(()).await.is_fresh()
    }
}

impl Default for Refreshes {
    fn default() -> Self {
        Refreshes::new()
    }
}
