//! A key's in-process flight led by the test (`proxy::State::flights`): a
//! request for the key follows it, held in flight, until the test ends it.

use super::wait::eventually;
use permit_gateway::error::GatewayError;
use permit_gateway::proxy::flight::{Flights, Join, Leader};
use std::time::Duration;

/// Leads the flight of `key`; panics when one is already running.
pub fn lead<T: Clone>(flights: &Flights<T>, key: &str) -> Leader<T> {
    let Join::Leader(held) = flights.join(key) else {
        panic!("the test leads the first flight")
    };
    held
}

/// Waits until `n` requests follow `held`.
pub async fn followed<T>(held: &Leader<T>, n: usize) {
    eventually("the request follows the held flight", Duration::from_secs(5), || {
        let waiting = held.waiting();
        async move { (waiting == n).then_some(()).ok_or(format!("{waiting} waiting")) }
    })
    .await;
}

/// Ends `held` with an error of the leader's own (its quota refused it):
/// nothing a follower may take as its answer, so each buys the key itself.
pub fn fail<T>(held: Leader<Result<T, GatewayError>>) {
    held.complete(Err(GatewayError::QuotaExceeded {
        limit: 0,
        needed: 1,
        remaining: 0,
        upgrade_url: String::new(),
        budget: permit_gateway::error::Spent::Team,
    }));
}
