//! The shared state, built once from a validated [`Config`] and handed to
//! every connection: teams, cache and leases, ledger, scheduler, upstream,
//! metrics. What only the request path keeps (its memo of parsed targets,
//! its flights, its background refreshes) is its own, `proxy::State`.

use crate::auth::Teams;
use crate::cache::lease::Leases;
use crate::cache::Cache;
use crate::config::{Config, ConfigErrors, QuotaStore, Secret, Source};
use crate::ledger::{self, Ledger};
use crate::metrics::Metrics;
use crate::org::Org;
use crate::redis_backend::{RedisBackend, Tls};
use crate::scheduler::window::Limits;
use crate::scheduler::Scheduler;
use crate::scheduler::SharedRate;
use crate::upstream::Upstream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub struct App {
    pub config: Config,
    /// Where `reload` re-reads teams from: the `--config` file, else the
    /// default path.
    reload_from: Option<PathBuf>,
    /// Swapped whole on reload, so a request sees one consistent table.
    pub(crate) teams: arc_swap::ArcSwap<Teams>,
    pub cache: Cache,
    /// Fetch leases across replicas (through the cache's Redis).
    pub leases: Leases,
    pub(crate) ledger: Ledger,
    pub(crate) scheduler: Arc<Scheduler>,
    pub(crate) org: Org,
    pub(crate) upstream: Upstream,
    pub metrics: Arc<Metrics>,
    /// Every socket the Redis connections of the cache, the ledger and the
    /// shared rate can hold open: descriptors kept back from clients.
    redis_sockets: usize,
    /// Work no client can cancel (upstream calls, settles, background
    /// refreshes): a shutdown waits for it ([`App::detach`]).
    detached: tokio_util::task::TaskTracker,
    /// The runtime the app was built on, where detached work runs: it lives
    /// as long as the process, where a per-core loop's runtime ends with
    /// its drain (`server.runtime = "per_core"`).
    runtime: tokio::runtime::Handle,
}

impl App {
    /// Builds everything that can fail at start-up, so `serve` fails before
    /// it binds rather than on the first request. Redis is not contacted
    /// here: a Redis that is down at start-up only means misses for now.
    /// Must run inside a tokio runtime (the scheduler starts its task).
    pub fn new(config: Config, reload_from: Option<PathBuf>) -> Result<Arc<App>, String> {
        let key = config.upstream_key()?;
        let upstream = Upstream::new(&config.upstream, &key)?;
        let metrics = Arc::new(Metrics::new());
        let teams = Teams::from_config(&config.teams);
        let cache_timeout = Duration::from_millis(config.cache.redis_timeout_ms);
        let tls = Tls {
            files: crate::redis_backend::TlsFiles::load(
                config.redis.tls_ca_file.as_deref(),
                config.redis.tls_cert_file.as_deref(),
                config.redis.tls_key_file.as_deref(),
            )?,
            sentinel_username: config.redis.sentinel_username.clone(),
            sentinel_password: config.redis.sentinel_password.as_ref().map(|s| s.expose().to_string()),
        };
        let cache_redis = match &config.cache.redis_url {
            Some(url) => Some(Arc::new(RedisBackend::with_tls(
                "cache.redis_url",
                url.expose(),
                &tls,
                cache_timeout,
                config.cache.redis_pool_size(),
                metrics.clone(),
            )?)),
            None => None,
        };
        let Opened {
            ledger,
            rate_url,
            redis_sockets: ledger_sockets,
        } = open_ledger(&config, &tls, &metrics)?;
        let mut redis_sockets = ledger_sockets + cache_redis.as_ref().map_or(0, |r| r.sockets());
        // Replicas share one upstream rate through Redis: the ledger's when it
        // is there (it must be up anyway), else the cache's. Its own
        // connection and breaker: its failures must not open the breaker
        // that settles need.
        let shared_rate = match rate_url.or(config.cache.redis_url.as_ref().map(|url| ("cache.redis_url", url))) {
            Some((key, url)) => {
                let redis = Arc::new(RedisBackend::with_tls(
                    key,
                    url.expose(),
                    &tls,
                    cache_timeout,
                    1,
                    metrics.clone(),
                )?);
                redis_sockets += redis.sockets();
                Some(SharedRate::new(
                    redis,
                    &config.cache.redis_key_prefix,
                    Limits::of(&config),
                ))
            }
            None => None,
        };
        // A lease covers its owner's whole path, like a reservation.
        let lease_ttl = Duration::from_secs(config.reservation_path_secs());
        let leases = Leases::new(cache_redis.clone(), &config.cache.redis_key_prefix, lease_ttl);
        let cache = Cache::new(&config.cache, cache_redis, metrics.clone()).with_disk(
            config.cache.disk_file(&config.quota.path),
            config.cache.disk_max_bytes,
            config.cache.disk_reserve_bytes,
        );
        let scheduler = Scheduler::start(
            Limits::of(&config),
            Duration::from_secs(config.upstream.max_queue_wait_secs),
            shared_rate,
            metrics.clone(),
        );
        let app = App {
            reload_from,
            teams: arc_swap::ArcSwap::from_pointee(teams),
            cache,
            leases,
            ledger,
            scheduler,
            org: Org::new(Duration::from_secs(config.upstream.exhausted_backoff_secs)),
            upstream,
            metrics,
            config,
            redis_sockets,
            detached: tokio_util::task::TaskTracker::new(),
            runtime: tokio::runtime::Handle::current(),
        };
        app.publish_limits();
        let app = Arc::new(app);
        if app.cache.follows_purges() {
            tokio::spawn(follow_purges(Arc::downgrade(&app)));
        }
        Ok(app)
    }

    /// Runs `work` in a task of its own that no client can cancel and that
    /// a shutdown waits for ([`App::detached_done`]): an upstream call the
    /// upstream may bill, the settle that books it. Without the wait, a
    /// SIGTERM ended the calls of clients that had hung up with the process:
    /// bought and lost, or billed and never booked.
    pub(crate) fn detach<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.detached.spawn_on(work, &self.runtime)
    }

    /// Resolves once every detached task has ended; none may start after.
    pub(crate) async fn detached_done(&self) {
        self.detached.close();
        self.detached.wait().await;
    }

    /// Every socket the Redis connections of the cache, the ledger and the
    /// shared rate can hold open at once.
    pub(crate) fn redis_sockets(&self) -> usize {
        self.redis_sockets
    }

    /// Re-reads the teams (added, removed, new budgets or tokens) without a
    /// restart. Spend is keyed by team name in the ledger, so nothing is
    /// lost; other settings need a restart: the answer names each one that
    /// changed in the file (and the log says it, as a warning), so a
    /// reload never looks like it applied what it did not.
    pub fn reload(&self) -> Result<Reloaded, ConfigErrors> {
        let source = self.reload_from.as_deref().map_or(Source::Default, Source::File);
        let config = Config::load(source)?;
        // A file cut by an editor or a `>` redirect as the reload lands has
        // no team: applied, it would refuse every team at once.
        if config.teams.is_empty() && !config.teams_declared() {
            return Err(ConfigErrors(vec![format!(
                "teams: {} has no [[teams]] (an empty or cut file?): applied, every team would get 401; \
                 the old teams stay. Write `teams = []` in it to remove every team on purpose",
                config.origin()
            )]));
        }
        let teams = self.teams.load().reloaded(&config.teams);
        let count = config.teams.len();
        self.teams.store(Arc::new(teams));
        self.publish_limits();
        let changed = self.config.restart_required(&config);
        let live = self.apply_live(&config, &changed);
        let restart_required: Vec<String> = changed.into_iter().filter(|k| !live.contains(k)).collect();
        if restart_required.is_empty() {
            tracing::info!(teams = count, applied = %live.join(","), "reloaded");
        } else {
            tracing::warn!(
                teams = count,
                applied = %live.join(","),
                restart_required = %restart_required.join(","),
                "reloaded; other settings changed in the file and apply only after a restart"
            );
        }
        Ok(Reloaded {
            teams: count,
            applied: live,
            restart_required,
        })
    }

    /// Applies what of `new` can change without a restart, of the keys
    /// `changed` names: route TTLs (between two values), the upstream rate
    /// and queue wait, the log level. Returns the keys applied.
    fn apply_live(&self, new: &Config, changed: &[String]) -> Vec<String> {
        let mut applied = Vec::new();
        let ttl_keys = |k: &String| k.starts_with("cache.route_ttl_secs") || k == "cache.default_ttl_secs";
        if changed.iter().any(ttl_keys) {
            let stuck = self.cache.reload_ttls(&new.cache);
            // A route turned cached or uncached keeps its old TTL: both of
            // its keys wait for the restart.
            if stuck.is_empty() {
                applied.extend(changed.iter().filter(|k| ttl_keys(k)).cloned());
            } else {
                applied.extend(changed.iter().filter(|k| ttl_keys(k) && !stuck.contains(k)).cloned());
                applied.retain(|k| k != "cache.default_ttl_secs");
            }
        }
        // The queue's bound is covered by every reservation's term and by
        // the wait for a peer's lease, both fixed at start-up: a longer
        // bound than they cover waits for the restart that brings them.
        let wait = new.upstream.max_queue_wait_secs;
        let path = wait + self.config.upstream.timeout_secs + crate::config::SETTLE_MARGIN_SECS;
        let wait_fits = path <= self.config.quota.reservation_lease_secs
            && path.saturating_mul(1000) <= self.config.cache.coalesce_wait_ms;
        let rate_changed = changed.iter().any(|k| k == "upstream.requests_per_minute");
        let burst_changed = changed.iter().any(|k| k == "upstream.burst");
        let wait_changed = changed.iter().any(|k| k == "upstream.max_queue_wait_secs");
        // The reserve follows the number of teams, which a reload may change.
        let limits_changed = Limits::of(new) != Limits::of(&self.config);
        if limits_changed || (wait_changed && wait_fits) {
            let applied_wait = if wait_fits {
                wait
            } else {
                self.config.upstream.max_queue_wait_secs
            };
            self.scheduler
                .set_limits(Limits::of(new), std::time::Duration::from_secs(applied_wait));
            if rate_changed {
                applied.push("upstream.requests_per_minute".into());
            }
            if burst_changed {
                applied.push("upstream.burst".into());
            }
            if wait_changed && wait_fits {
                applied.push("upstream.max_queue_wait_secs".into());
            }
        }
        if changed.iter().any(|k| k == "log.level") && crate::telemetry::set_level(&new.log.level) {
            applied.push("log.level".into());
        }
        applied
    }

    /// One start-up line of what was configured, paths absolute and URLs
    /// without their password: where the config came from, the teams, the
    /// ledger, the cache tiers and the Redis target (and whether it
    /// answered), so an operator reading the log sees what runs.
    pub async fn log_configuration(&self) {
        let c = &self.config;
        let teams: Vec<String> = self.teams.load().iter().map(|t| t.name.clone()).collect();
        let ledger = match c.quota.store {
            QuotaStore::File => format!("file {}", c.quota.path.display()),
            QuotaStore::Redis => format!(
                "redis {}",
                c.quota_redis_url().map_or_else(|| "-".into(), Secret::url_redacted)
            ),
        };
        let disk = match (self.cache.disk_path(), c.cache.disk_file(&c.quota.path)) {
            (Some(path), _) => path.display().to_string(),
            (None, Some(wanted)) => format!("unusable ({}): serving from memory", wanted.display()),
            (None, None) => "off".into(),
        };
        let redis = match (self.cache.redis(), &c.cache.redis_url) {
            (Some(redis), Some(url)) => match redis.ping().await {
                Ok(()) => format!("{} (answered)", url.url_redacted()),
                Err(_) => format!(
                    "{} (did not answer: serving from memory until it does)",
                    url.url_redacted()
                ),
            },
            _ => "none".into(),
        };
        tracing::info!(
            config = %c.origin(),
            teams = teams.len(),
            team_names = %teams.join(","),
            ledger = %ledger,
            memory_bytes = c.cache.memory_max_bytes,
            disk = %disk,
            redis = %redis,
            "configured"
        );
    }

    /// Team limits, and every team's metric children at 0 (new teams too).
    fn publish_limits(&self) {
        let teams = self.teams.load();
        let redis = self.config.cache.redis_url.is_some() || self.config.quota.store == QuotaStore::Redis;
        self.metrics.preset(teams.iter().map(|t| t.name.as_str()), redis);
        self.metrics.preset_apps(
            teams
                .iter()
                .flat_map(|t| t.members.iter().map(|a| (t.name.as_str(), a.name.as_str()))),
        );
        self.metrics
            .publish_teams(teams.iter().map(|t| (t.name.as_str(), t.credit_limit)));
    }
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Teams now configured.
    pub teams: usize,
    /// Other keys changed in the file and applied now, sorted as found.
    pub applied: Vec<String>,
    /// Keys changed in the file that only a restart applies, sorted.
    pub restart_required: Vec<String>,
}

/// Applies other replicas' cache purges to this one's memory tier
/// (`cache::purge`), the first look at once; ends with the app.
async fn follow_purges(app: std::sync::Weak<App>) {
    loop {
        match app.upgrade() {
            Some(app) => app.cache.follow_purges().await,
            None => return,
        }
        tokio::time::sleep(crate::cache::purge::FOLLOW_EVERY).await;
    }
}

/// A Redis URL and the name of its setting (for start-up errors).
type SettingUrl<'c> = (&'static str, &'c Secret);

/// The ledger as opened.
struct Opened<'c> {
    ledger: Ledger,
    /// Its Redis URL when it is the Redis store (the shared rate's too).
    rate_url: Option<SettingUrl<'c>>,
    /// The sockets its Redis connections can hold open.
    redis_sockets: usize,
}

/// The ledger, and its Redis URL when it is the Redis store.
fn open_ledger<'c>(config: &'c Config, tls: &Tls, metrics: &Arc<Metrics>) -> Result<Opened<'c>, String> {
    let window = config.quota.window;
    let term = Duration::from_secs(config.quota.reservation_lease_secs);
    let clock = crate::clock::Clock::shifted(config.quota.clock_offset_secs);
    if config.quota.clock_offset_secs != 0 {
        tracing::warn!(
            offset_secs = config.quota.clock_offset_secs,
            "quota.clock_offset_secs is set: the ledger books spend on a shifted clock (tests only)"
        );
    }
    if config.quota.store == QuotaStore::Redis {
        let url = config.quota_redis_url().ok_or("quota.redis_url: not set")?;
        // Its own connection and breaker: a slow cache must not trip the ledger.
        let key = match config.quota.redis_url {
            Some(_) => "quota.redis_url",
            None => "cache.redis_url",
        };
        let connect = || {
            RedisBackend::with_tls(
                key,
                url.expose(),
                tls,
                Duration::from_millis(config.quota.redis_timeout_ms),
                1,
                metrics.clone(),
            )
            .map(Arc::new)
        };
        let redis = connect()?;
        // Settles have a connection (and breaker) of their own: their
        // `WAIT` for a replica must not hold up reserves (one sent on the
        // shared connection made a miss 503 after a failover).
        let settles = connect()?;
        let redis_sockets = redis.sockets() + settles.sockets();
        let ledger = ledger::redis::RedisLedger::new(redis, &config.cache.redis_key_prefix, window, term)
            .with_clock(clock)
            .with_teams(config.teams.iter().map(|t| t.name.clone()).collect())
            .with_settle_connection(settles)
            .with_journal(&ledger::redis::journal_path(&config.quota.path));
        Ok(Opened {
            ledger: Ledger::Redis(ledger),
            rate_url: Some((key, url)),
            redis_sockets,
        })
    } else {
        // Absolute, so an operator sees which ledger this is: a different
        // path would start a new, empty one (every budget back to full).
        let path = std::path::absolute(&config.quota.path).unwrap_or_else(|_| config.quota.path.clone());
        tracing::info!(path = %path.display(), "credit ledger: file store");
        Ok(Opened {
            ledger: Ledger::File(ledger::file::FileLedger::open_at(&path, window, term, clock)?),
            rate_url: None,
            redis_sockets: 0,
        })
    }
}
