//! The timing-fault suite (issue 13): no credit lost or overspent when
//! clients hang up, bodies fail, Redis blips, processes die or the upstream
//! lies. Each scenario ends with the upstream calls per key where
//! coalescing applies, and for every team the ledger against what the
//! simulator charged it (equal; after a crash at least that, never above
//! the limit). Where replicas matter, with one and with two.

use crate::support::gateway::Setup;

mod calls;
mod crash;
mod days;
mod edges;
mod heads;
mod herd;
mod leases;
mod ledger_file;
mod live_team;
mod marks;
mod slow_ledger;
mod stall;
mod truth;
mod upstream_numbers;

/// Permit searches fresh for a second, then served stale and refreshed in
/// the background for ten minutes (stale-while-revalidate).
fn revalidating() -> Setup {
    Setup::new()
        .with(|c| c.cache.stale_while_revalidate_secs = 600)
        .route_ttl("permits_search", 1)
}
