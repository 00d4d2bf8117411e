//! The hit path's metric children, resolved once instead of per request.
//!
//! `with_label_values` hashes every label and takes the vector's lock; a hit
//! recorded four of them (~1k instructions of a ~30k hit, callgrind). The
//! label sets of a hit are known in advance: every route × cache state ×
//! tier, and every configured team × route for a 200. So they are looked up
//! here by index, with one map lookup for the team. Anything else (another
//! status, a team the table does not hold) goes through the vector as
//! before, into the same series.

use super::labels::{CACHE_STATES, STATUS_OK, TIERS};
use super::SavedReason;
use crate::route::Route;
use arc_swap::ArcSwap;
use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};
use std::collections::HashMap;
use std::sync::Arc;

type ByCache<T> = [T; CACHE_STATES.len()];

/// One route's children that do not depend on the team.
pub(super) struct RouteChildren {
    pub(super) durations: ByCache<Histogram>,
    pub(super) hits: [IntCounter; TIERS.len()],
}

/// One team's children, by route index.
pub(super) struct TeamChildren {
    /// `gateway_requests_total{status="200"}` by cache state.
    pub(super) answered: Vec<ByCache<IntCounter>>,
    /// `gateway_credits_saved_total{reason="cache"}` by route (the other
    /// reasons are rare: through the vector, from their first event).
    pub(super) saved: Vec<IntCounter>,
}

pub(super) struct Children {
    pub(super) routes: Vec<RouteChildren>,
    teams: ArcSwap<HashMap<String, Arc<TeamChildren>, foldhash::fast::RandomState>>,
}

impl Children {
    pub(super) fn new(durations: &HistogramVec, hits: &IntCounterVec) -> Children {
        let routes = Route::ALL
            .iter()
            .map(|route| {
                let r = route.as_str();
                RouteChildren {
                    durations: CACHE_STATES.map(|cache| durations.with_label_values(&[r, cache])),
                    hits: TIERS.map(|tier| hits.with_label_values(&[r, tier])),
                }
            })
            .collect();
        Children {
            routes,
            teams: ArcSwap::from_pointee(HashMap::default()),
        }
    }

    /// Resolves the children of exactly these teams (start-up and reload).
    pub(super) fn set_teams<'a>(
        &self,
        teams: impl IntoIterator<Item = &'a str>,
        requests: &IntCounterVec,
        saved: &IntCounterVec,
    ) {
        let map = teams
            .into_iter()
            .map(|team| {
                let by_route = |route: &Route| {
                    let r = route.as_str();
                    CACHE_STATES.map(|cache| requests.with_label_values(&[team, r, STATUS_OK, cache]))
                };
                let children = TeamChildren {
                    answered: Route::ALL.iter().map(by_route).collect(),
                    saved: Route::ALL
                        .iter()
                        .map(|route| saved.with_label_values(&[team, route.as_str(), SavedReason::Cache.as_str()]))
                        .collect(),
                };
                (team.to_string(), Arc::new(children))
            })
            .collect();
        self.teams.store(Arc::new(map));
    }

    /// Runs `f` on a team's children, if the table holds the team. Borrowed
    /// under arc-swap's guard: cloning the `Arc` would make both cores
    /// write its count on every request.
    pub(super) fn with_team<R>(&self, team: &str, f: impl FnOnce(&TeamChildren) -> R) -> Option<R> {
        self.teams.load().get(team).map(|t| f(t))
    }
}
