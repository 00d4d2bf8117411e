//! permit-gateway: a caching, credit-aware reverse proxy in front of one paid,
//! metered REST API (the permit data upstream, `/v2/...`).
//!
//! Teams call it with their own tokens; it swaps in the one upstream key,
//! answers what it can from cache, enforces each team's credit budget and
//! shares the upstream's rate limit fairly.
//!
//! # Layout
//! Nothing is `pub` unless the binary (`src/main.rs`), the integration
//! tests (`tests/it/`), the benches (`benches/`) or the fuzz targets
//! (`fuzz/fuzz_targets/`) use it, so the compiler flags dead code. Inside
//! the crate an item is `pub(crate)`, `pub(super)` when only its parent
//! module uses it, or private when only its own module does.
//!
//! The public surface, each module exporting only what those callers use:
//! - [`Running`], [`Listeners`] and [`run`]: a gateway served on bound
//!   sockets (the binary, the tests, the demo).
//! - [`config`]: embedded defaults → file → env, validated all at once.
//! - [`app`]: the shared state built once from a config.
//! - [`server`]: accept loop, TLS, HTTP/1.1 + HTTP/2, connection deadlines
//!   from accept, graceful shutdown, the team listener's thread-per-core
//!   mode (`server.runtime`), and the overload manager: every shared
//!   transport pool (connection slots, HTTP/2 answer bytes, descriptors)
//!   shared out per tenant, anonymous peers first to go.
//! - [`proxy`]: the life of a team request, one named function per phase,
//!   one concept per file (its own doc maps them), and the state the
//!   request path keeps (`proxy::State`: parsed targets, flights,
//!   background refreshes); `proxy::reuse`, the one engine for answers
//!   built from held pieces (id lookups record by record, monthly windows
//!   month by month).
//! - [`route`]: path → canonical path and route; the route table (every
//!   vendor operation: name, cost, TTL class, parameters); `size`/`id` checks
//!   and the credit estimate.
//! - [`auth`]: token → team and member; a team's in-flight and rate limits.
//! - [`cache`]: normalized keys, L1 moka + L2 Redis, staleness;
//!   coalescing across replicas (`cache::lease`; in process it is the
//!   proxy's, `proxy::flight`); the one tier chain, memory → disk → Redis
//!   (`cache::tiers`); the records of stored pages (`cache::records`) and
//!   the monthly-metrics rows (`cache::months`) that `proxy::reuse`
//!   answers from; answers held by another key's page (`cache::covered`);
//!   purges that reach every replica's memory tier (`cache::purge`); the
//!   disk tier (`cache::disk`) that keeps what was bought across restarts.
//! - `page`: the vendor's page envelope, read and written in one place.
//! - [`clock`]: wall-clock milliseconds, the one clock the modules share.
//! - [`memory`]: the process's allocator, and memory given back when idle.
//! - [`redis_backend`]: a Redis connection (standalone, Cluster or the
//!   primary Sentinel names; plain or TLS) with
//!   timeouts and a breaker (one each for the cache, the ledger and the
//!   shared rate); every Redis key and its Cluster hash tag
//!   (`redis_backend::keys`).
//! - [`ledger`]: team budgets: reserve, settle, release; file or Redis store;
//!   the chargeback export (`ledger::export`) and the file's format version.
//! - [`error`]: the one error type and its one mapping to HTTP.
//! - [`metrics`]: every metric name, recorded through typed methods.
//! - [`telemetry`]: logs (human or JSON) through a bounded queue that never
//!   holds a request, one access-log line per request; the W3C trace
//!   context and, when configured, spans over OTLP (teams' requests only).
//! - [`demo`]: the newcomer's one command.
//!
//! Internal to the crate:
//! - `scheduler`: fair sharing of the upstream rate limit across teams.
//! - `scheduler::shared`: the upstream rate shared by replicas through Redis, and
//!   the count of replicas that sets each one's share when Redis fails.
//! - `org`: the org's upstream credits, and pausing when they run out.
//! - `upstream`: the pooled rustls client with retries and deadlines.
//! - `admin`: `/metrics`, `/healthz`, `/readyz`, `/admin/*`.
//! - `http_util`: the body type, JSON responses, hop-by-hop header
//!   stripping and request ids, shared by the team and admin listeners.
//! - `guarded`: redb calls whose panic means a damaged file, caught.
//! - `stored`: the format each stored file records, and the refusal of a
//!   newer one.
//! - `volume`: the free space on the data volume (the disk tier's reserve).
//! - `release`: reads the vendor's data release, one call per interval for
//!   all replicas (what it does to held answers: `cache::release`).
//!
//! Imports run one way: [`run`] hands [`server`] the handlers of [`proxy`]
//! and `admin`; those two use [`app`]; [`app`] holds only state defined
//! below them (`cache`, `ledger`, `scheduler`, ...) and imports neither.
//! The request path's own state is `proxy`'s, so `app` need not name it.
//!
//! # The life of a request
//! The phases of [`proxy`], in the order the code runs them, each a
//! function of `src/proxy/` by this name (docs/design.md §2 describes each):
//!
//! - `admit`: method, framing, size
//! - `resolve`: the route
//! - `authenticate`: token → team, the connection's tenant
//! - `limit_team`: the team's requests in flight, then its rate
//! - `validate`: a `size` or `id` list the upstream would refuse
//! - `usage`: `/v2/usage` answered locally
//! - `cache_key`: the normalized key
//! - `lookup_pieces`: an answer built from held pieces (an id lookup,
//!   a monthly-metrics window), buying only the missing ones
//! - `lookup`: the cache, memory then the disk tier then Redis
//! - `covered_answer`: an answer another key's page covers
//! - `may_buy`: a HEAD or `only-if-cached` never buys
//! - `clamp`: a page cut to the team's remaining credits
//! - `fetch`: coalesce (in process, then across replicas), reserve credits,
//!   a fair turn at the upstream rate, forward, settle, store
//! - `stale_on_failure`: a stale copy when the upstream failed
//! - `respond`: the answer; then, for every request, its metrics and one
//!   access-log line
//!
//! `fetch` runs in a task of its own that no client can cancel. What the
//! request path keeps between requests is its own `proxy::State`, built
//! here and handed to `proxy::handle` beside the [`app::App`].

mod admin;
pub mod app;
pub mod auth;
pub mod cache;
pub mod clock;
pub mod config;
#[cfg(feature = "demo")]
pub mod demo;
pub mod error;
mod guarded;
mod http_util;
pub mod ledger;
pub mod memory;
pub mod metrics;
mod org;
mod page;
pub mod proxy;
pub mod redis_backend;
mod release;
pub mod route;
mod scheduler;
pub mod server;
mod stored;
pub mod telemetry;
mod upstream;
mod volume;

/// This release: `Cargo.toml`'s version, bumped by every change of a stored
/// format, an export's columns, a config key or a metric (CHANGELOG.md).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit this binary was built from (short), or `unknown` when
/// the build had no git (`build.rs`).
pub const COMMIT: &str = env!("GATEWAY_COMMIT");

/// What `permit-gateway --version` prints after the name.
pub const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("GATEWAY_COMMIT"), ")");

use app::App;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The two sockets a gateway serves, bound by the caller (port 0 in tests).
pub struct Listeners {
    pub team: TcpListener,
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds `server.listen` and `server.admin_listen`; the team socket
    /// with `SO_REUSEPORT` when `server.runtime` is `per_core`, whose other
    /// loops bind the same address. Only then: a second gateway started by
    /// mistake on a port in use must fail, not share it.
    pub async fn bind(cfg: &config::ServerConfig) -> std::io::Result<Listeners> {
        let team = match cfg.runtime {
            config::Runtime::MultiThread => TcpListener::bind(cfg.listen).await?,
            config::Runtime::PerCore => server::bind_reuseport(cfg.listen)?,
        };
        Ok(Listeners {
            team,
            admin: TcpListener::bind(cfg.admin_listen).await?,
        })
    }
}

/// Serves both listeners until `shutdown` resolves, then drains in-flight
/// requests within `server.shutdown_grace_secs`.
pub async fn run(
    app: Arc<App>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    serve(app, Arc::new(proxy::State::new()), listeners, shutdown).await
}

/// [`run`] with the request path's state built by the caller (a test's
/// [`Running`] keeps it to reach the flights).
async fn serve(
    app: Arc<App>,
    state: Arc<proxy::State>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let tls = match (&app.config.server.tls_cert_file, &app.config.server.tls_key_file) {
        (Some(cert), Some(key)) => Some(server::tls_acceptor(cert, key)?),
        _ => None,
    };
    // The data release, read while the gateway serves (`release`).
    if app.config.cache.release_poll_secs > 0 {
        let poll = std::time::Duration::from_secs(app.config.cache.release_poll_secs);
        tokio::spawn(release::watch(Arc::downgrade(&app), poll));
    }
    let mut team_limits = server::Limits::from_config(&app.config.server);
    let mut admin_limits = server::Limits::admin_from_config(&app.config.server);
    // The descriptor pool: client connections get what RLIMIT_NOFILE leaves
    // once the upstream pool, Redis and the ledger have theirs.
    let fit = server::fit_descriptors(
        team_limits.max_connections(),
        admin_limits.max_connections(),
        app.redis_sockets(),
    )?;
    if let Some(warning) = &fit.clamped {
        tracing::warn!(nofile = fit.limit, "{warning}");
    }
    team_limits.clamp(fit.team_max);
    admin_limits.clamp(fit.admin_max);
    // Freed memory back to the system once a burst is over (`memory`).
    let trimmer = tokio::spawn(memory::trim_periodically());
    let (stop_tx, stop_rx) = watch::channel(false);
    let team_app = app.clone();
    let actions = app.metrics.overload_actions_total.clone();
    let team_limits = server::Limits {
        open_connections: Some(app.metrics.open_connections.clone()),
        actions: server::Actions::new(actions.clone(), "team"),
        ..team_limits
    };
    let admin_limits = server::Limits {
        actions: server::Actions::new(actions, "admin"),
        ..admin_limits
    };
    let team_handler = move |req, mark| proxy::handle(team_app.clone(), state.clone(), req, Some(mark));
    // Before the admin listener serves: per-core sockets that cannot be
    // bound fail the start (the loops already started end with `stop_tx`,
    // dropped on the way out).
    let team = server::serve_team(
        &app.config.server,
        listeners.team,
        tls,
        team_limits,
        team_handler,
        stop_rx.clone(),
    )?;
    let admin_app = app.clone();
    let admin = server::serve(
        listeners.admin,
        None,
        admin_limits,
        move |req, _| admin::handle(admin_app.clone(), req),
        server::stopped(stop_rx.clone()),
    );
    // The calls of clients that hung up, and the settles behind answers
    // already sent, finish within the same grace as the requests.
    let grace = std::time::Duration::from_secs(app.config.server.shutdown_grace_secs);
    let detached_app = app.clone();
    let detached = async move {
        server::stopped(stop_rx).await;
        if tokio::time::timeout(grace, detached_app.detached_done()).await.is_err() {
            tracing::warn!(
                grace_secs = grace.as_secs(),
                "shutdown grace ran out with upstream calls or settles still running"
            );
        }
    };
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let (team, (), ()) = tokio::join!(team, admin, detached);
    trimmer.abort();
    // The disk tier's last writes, durable before the process ends.
    app.cache.close().await;
    team
}

/// A gateway running in this process: for tests and the demo.
pub struct Running {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub app: Arc<App>,
    /// The request path's own state (its flights: a test holds one open).
    pub proxy: Arc<proxy::State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl Running {
    /// Builds the app and serves it on the given listeners in a task.
    pub fn spawn(config: config::Config, listeners: Listeners) -> Result<Running, String> {
        Running::spawn_app(App::new(config, None)?, listeners)
    }

    /// As [`Running::spawn`], with teams re-read from `path` on reload.
    pub fn spawn_from_file(path: &std::path::Path, listeners: Listeners) -> Result<Running, String> {
        let config = config::Config::load(config::Source::File(path)).map_err(|e| e.to_string())?;
        Running::spawn_app(App::new(config, Some(path.to_path_buf()))?, listeners)
    }

    fn spawn_app(app: Arc<App>, listeners: Listeners) -> Result<Running, String> {
        let addr = listeners.team.local_addr().map_err(|e| e.to_string())?;
        let admin_addr = listeners.admin.local_addr().map_err(|e| e.to_string())?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let proxy = Arc::new(proxy::State::new());
        let task = tokio::spawn(serve(app.clone(), proxy.clone(), listeners, async move {
            let _ = stopped.await;
        }));
        Ok(Running {
            addr,
            admin_addr,
            app,
            proxy,
            stop: Some(stop),
            task,
        })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }

    /// Graceful stop: waits until in-flight requests finished.
    pub async fn shutdown(mut self) -> Result<(), String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.map_err(|e| e.to_string())?
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}
