//! The timing-fault suite (issue 13): no credit lost or overspent when
//! clients hang up, bodies fail, Redis blips, processes die or the upstream
//! lies. Each scenario ends with the upstream calls per key where
//! coalescing applies, and for every team the ledger against what the
//! simulator charged it (equal; after a crash at least that, never above
//! the limit). Where replicas matter, with one and with two.

use crate::support::gateway::Setup;
use crate::support::redis::RedisServer;
use crate::support::sim::Sim;
use permit_gateway::Running;

mod calls;
mod crash;
mod days;
mod edges;
mod heads;
mod herd;
mod leases;
mod live_team;
mod marks;
mod slow_ledger;
mod stall;
mod truth;
mod upstream_numbers;

/// `n` gateways in front of `sim`: one alone (file ledger, no Redis), or
/// replicas sharing a Redis cache, leases and ledger.
async fn replicas(n: usize, sim: &Sim, redis: Option<&RedisServer>, setup: Setup) -> Vec<Running> {
    let setup = match redis {
        Some(r) => setup
            .with("cache", format!("redis_url = {:?}", r.url()))
            .with("quota", "store = \"redis\""),
        None => setup,
    };
    let mut gws = Vec::new();
    for _ in 0..n {
        gws.push(setup.start(sim).await);
    }
    gws
}

fn redis_for(n: usize) -> Option<RedisServer> {
    (n > 1).then(RedisServer::start)
}
