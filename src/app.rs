//! The shared state, built once from a validated [`Config`] and handed to
//! every connection: teams, the upstream client, metrics.

use crate::auth::Teams;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::upstream::Upstream;
use std::sync::Arc;

pub struct App {
    pub config: Config,
    /// Swapped whole on reload, so a request sees one consistent table.
    pub teams: arc_swap::ArcSwap<Teams>,
    pub upstream: Upstream,
    pub metrics: Metrics,
}

impl App {
    /// Builds everything that can fail at start-up, so `serve` fails before
    /// it binds rather than on the first request.
    pub fn new(config: Config) -> Result<Arc<App>, String> {
        let key = config.upstream_key()?;
        let upstream = Upstream::new(&config.upstream, &key)?;
        let teams = Teams::from_config(&config.teams);
        let metrics = Metrics::new();
        for team in teams.iter() {
            if let Some(limit) = team.credit_limit {
                metrics
                    .team_credit_limit
                    .with_label_values(&[&team.name])
                    .set(i64::try_from(limit).unwrap_or(i64::MAX));
            }
        }
        Ok(Arc::new(App {
            teams: arc_swap::ArcSwap::from_pointee(teams),
            upstream,
            metrics,
            config,
        }))
    }
}
