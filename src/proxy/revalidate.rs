//! [`lookup`](super::lookup)'s verdict on a found entry,
//! stale-while-revalidate included: whether it answers this request, and as
//! what ([`usable`]: fresh is a HIT, `max-age` rejects older entries,
//! `max-stale` accepts stale ones); an entry within
//! `cache.stale_while_revalidate_secs` answers at once as STALE and starts
//! one background [`refresh`] ([`accept`]), a miss of its own, logged as
//! one. Anything else is kept only as the fallback of
//! [`stale_on_failure`](super::stale_on_failure). The response itself is
//! shaped in `respond`; the keys refreshed in the background lately are in
//! [`super::refresh`].

use super::answered::Answered;
use super::context::{Job, RequestContext};
use super::fetch::{self, Role};
use super::State;
use crate::app::App;
use crate::cache::control::Directives;
use crate::cache::Entry;
use crate::clock::now_ms;
use crate::metrics::Tier;
use std::sync::Arc;
use std::time::Instant;

/// How a cached entry may answer this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Use {
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

/// How `entry` may answer a request with directives `d` at `now`;
/// `revalidate_secs`: the stale-while-revalidate window (0: none).
pub(super) fn usable(entry: &Entry, d: &Directives, revalidate_secs: u64, now: u64) -> Use {
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

/// Whether a found entry answers this request, and as what. An entry within
/// the stale-while-revalidate window answers at once and starts one
/// background refresh per key and [`REFRESH_EVERY`], paid by this
/// team like a miss (its cost shows in the team's usage and in the
/// refresh's own access-log line, not in this free answer). `job`: the
/// refresh to start; `None` for a request that may not buy (a HEAD).
///
/// [`REFRESH_EVERY`]: super::refresh::REFRESH_EVERY
pub(super) async fn accept(
    app: &Arc<App>,
    state: &Arc<State>,
    entry: &Entry,
    d: &Directives,
    (key, tier): (&str, Tier),
    job: impl FnOnce() -> Option<Job>,
) -> Option<Answered> {
    // An answer a newer data release outdated is bought again now while
    // the upstream gate has calls to spare; while it is scarce (less than
    // half its window free), it is refreshed in the background for one
    // poll interval after the release was seen, so the first requests of
    // every hot key do not all wait at the gate at once (`cache::release`).
    let mut window = app.config.cache.stale_while_revalidate_secs;
    if app.cache.release.outdated(entry) && app.scheduler.scarce() {
        window = window.max(app.config.cache.release_poll_secs);
    }
    match usable(entry, d, window, now_ms()) {
        Use::Hit => Some(Answered::Held(tier)),
        Use::StaleAccepted => Some(Answered::Stale),
        Use::Revalidate => {
            // Boxed: a fresh hit's future does not carry a refresh's start
            // (the request's future is moved whole into its box).
            Box::pin(start_refresh(app, state, d, key, job)).await;
            Some(Answered::Stale)
        }
        Use::FallbackOnly => None,
    }
}

/// Starts `key`'s background refresh unless one started within
/// [`REFRESH_EVERY`](super::refresh::REFRESH_EVERY).
async fn start_refresh(
    app: &Arc<App>,
    state: &Arc<State>,
    d: &Directives,
    key: &str,
    job: impl FnOnce() -> Option<Job>,
) {
    // only-if-cached never reaches the upstream, not even so.
    if let (Some(job), false) = (job(), d.only_if_cached) {
        if state.refreshes.claim(key).await {
            app.detach(refresh(app.clone(), state.clone(), job));
        }
    }
}

/// A stale-while-revalidate refresh: a miss of its own, logged as one.
async fn refresh(app: Arc<App>, state: Arc<State>, job: Job) {
    let started = Instant::now();
    let mut ctx = RequestContext::new(job.request_id.clone(), job.trace.clone(), false);
    ctx.team = Some(job.team.clone());
    ctx.route = Some(job.target.route);
    let (outcome, role) = fetch::coalesce(&app, &state.flights, job).await;
    ctx.charge(fetch::charged(&outcome, role));
    if role == Role::Leader && outcome.as_ref().is_ok_and(|f| !f.from_cache) {
        ctx.answered = Answered::Bought;
    }
    let status = match &outcome {
        Ok(f) => f.status,
        Err(e) => e.status(),
    };
    ctx.log_refresh(status, started.elapsed());
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
