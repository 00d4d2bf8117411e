//! The upstream simulator's own behaviour, over real HTTP against
//! `start_sim`: one test binary of the `permit-api-sim` crate, without the
//! gateway (`cargo test -p permit-api-sim`).

mod support;

mod control;
mod credits;
mod endpoints;
mod errors;
mod faults;
mod filters;
mod hostile;
mod lookups;
mod pagination;
mod tls;
mod vendor_ops;

use crate::support::http::{get, Reply};
use crate::support::sim::{start_sim, Samples, Sim, SimConfig};

/// A simulator without a rate limit, so tests can send as much as they like.
pub async fn sim() -> Sim {
    sim_with(SimConfig {
        requests_per_minute: 0,
        ..SimConfig::default()
    })
    .await
}

pub async fn sim_with(cfg: SimConfig) -> Sim {
    start_sim(cfg).await
}

/// GET a `/v2` path (with query) using the simulator's key.
pub async fn v2(sim: &Sim, path_and_query: &str) -> Reply {
    let url = format!("{}{path_and_query}", sim.base_url());
    get(&url, &[("x-api-key", sim.api_key())]).await
}

/// A permit search over `geo` covering every date, plus extra parameters.
pub fn permit_search(s: &Samples, geo: &str, extra: &str) -> String {
    format!(
        "/v2/permits/search?geo_id={geo}&permit_from={}&permit_to={}{extra}",
        s.permit_from, s.permit_to
    )
}

pub fn contractor_search(s: &Samples, geo: &str, extra: &str) -> String {
    permit_search(s, geo, extra).replace("/permits/search", "/contractors/search")
}

/// The `items` array of a page.
pub fn items(r: &Reply) -> Vec<serde_json::Value> {
    r.json()["items"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no items array: {}", r.text()))
}
