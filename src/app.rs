//! The shared state, built once from a validated [`Config`] and handed to
//! every connection: teams, the cache, the upstream client, metrics.

use crate::auth::Teams;
use crate::cache::flight::Flights;
use crate::cache::Cache;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::proxy::Outcome;
use crate::redis_backend::RedisBackend;
use crate::upstream::Upstream;
use std::sync::Arc;
use std::time::Duration;

pub struct App {
    pub config: Config,
    /// Swapped whole on reload, so a request sees one consistent table.
    pub teams: arc_swap::ArcSwap<Teams>,
    pub cache: Cache,
    /// Upstream fetches in flight, by cache key (in-process coalescing).
    pub flights: Flights<Outcome>,
    pub upstream: Upstream,
    pub metrics: Arc<Metrics>,
}

impl App {
    /// Builds everything that can fail at start-up, so `serve` fails before
    /// it binds rather than on the first request. Redis is not contacted
    /// here: a Redis that is down at start-up only means misses for now.
    pub fn new(config: Config) -> Result<Arc<App>, String> {
        let key = config.upstream_key()?;
        let upstream = Upstream::new(&config.upstream, &key)?;
        let teams = Teams::from_config(&config.teams);
        let metrics = Arc::new(Metrics::new());
        for team in teams.iter() {
            if let Some(limit) = team.credit_limit {
                metrics
                    .team_credit_limit
                    .with_label_values(&[&team.name])
                    .set(i64::try_from(limit).unwrap_or(i64::MAX));
            }
        }
        let redis = match &config.cache.redis_url {
            Some(url) => Some(Arc::new(RedisBackend::new(
                url.expose(),
                Duration::from_millis(config.cache.redis_timeout_ms),
                metrics.clone(),
            )?)),
            None => None,
        };
        let cache = Cache::new(&config.cache, redis, metrics.clone());
        Ok(Arc::new(App {
            teams: arc_swap::ArcSwap::from_pointee(teams),
            cache,
            flights: Flights::default(),
            upstream,
            metrics,
            config,
        }))
    }
}
