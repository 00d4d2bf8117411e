//! [`State`]: what the request path keeps between requests of its own,
//! beside the shared [`App`](crate::app::App) (teams, cache, ledger,
//! upstream). Built once in `lib.rs` and handed to [`super::handle`] with
//! the app; nothing outside `proxy/` reads it but the tests.

use super::flight::{Flights, Outcome};
use super::parsed::ParsedTargets;
use super::refresh::Refreshes;
use super::reuse::Buyers;

/// Request targets kept routed and keyed ([`super::parsed`]), about
/// 0.5 MB: the queries dashboards repeat. The memo is quick_cache's
/// CLOCK-Pro, which keeps the targets read again over those seen once, so a
/// stream of one-off queries does not push them out.
const PARSED_TARGETS: u64 = 1024;

/// The request path's own state.
pub struct State {
    /// Request targets already routed, validated and keyed.
    pub(super) parsed: ParsedTargets,
    /// Upstream fetches in flight, by cache key (in-process coalescing).
    /// Public so that a test can hold a flight open (`Flights::join`).
    pub flights: Flights<Outcome>,
    /// The pieces this process's requests are buying, and whose turn it
    /// is to buy a series (`reuse`).
    pub(super) buyers: Buyers,
    /// Keys refreshed in the background lately (stale-while-revalidate).
    pub(super) refreshes: Refreshes,
}

impl State {
    pub fn new() -> State {
        State {
            parsed: ParsedTargets::new(PARSED_TARGETS),
            flights: Flights::default(),
            buyers: Buyers::default(),
            refreshes: Refreshes::new(),
        }
    }
}

impl Default for State {
    fn default() -> Self {
        State::new()
    }
}
