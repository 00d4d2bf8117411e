//! The real gateway for a test: in-process on 127.0.0.1:0 (most tests), or
//! as a child process of the built binary (signals, captured logs).

use super::redis::RedisServer;
use super::wait::eventually_blocking;
use permit_api_sim::Sim;
use permit_gateway::config::{Config, LogFormat, QuotaStore, Source, TeamConfig};
use permit_gateway::{Listeners, Running};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// A test team, `(name, token)`.
pub type Team = (&'static str, &'static str);

/// Test teams. Tokens are long and unique so a leak scan can search for
/// them.
pub const ALPHA: Team = ("alpha", "tok-alpha-7f3c9e1d2b4a6058");
pub const BETA: Team = ("beta", "tok-beta-0a9b8c7d6e5f4321");
pub const ADMIN_TOKEN: &str = "tok-admin-5e6f7a8b9c0d1e2f";
pub const SMALL: Team = ("small", "tok-small-1c2d3e4f5a6b7c8d");

/// App tokens (`[[teams.tokens]]`) of the apps tests: `(app, token)`.
pub const WEB: Team = ("web", "tok-app-web-3a4b5c6d7e8f9012");
pub const BATCH: Team = ("batch", "tok-app-batch-9e8d7c6b5a4f3210");
pub const NEXT: Team = ("next", "tok-app-next-1357924680acebdf");

/// Every token the harness hands out: the secret scan looks for each.
pub const ALL_TOKENS: [&str; 7] = [ALPHA.1, BETA.1, ADMIN_TOKEN, SMALL.1, WEB.1, BATCH.1, NEXT.1];

/// An app's token of a team (`[[teams.tokens]]`), no limit, no end.
pub fn app_token((name, token): Team) -> permit_gateway::config::TokenConfig {
    permit_gateway::config::TokenConfig {
        name: name.into(),
        token_sha256: permit_gateway::config::TokenHash::of(token),
        not_after: None,
        credit_limit: None,
        class: Default::default(),
    }
}

/// One edit of the config value.
type Edit = Arc<dyn Fn(&mut Config) + Send + Sync>;

/// A test's gateway config, as edits of the crate's own `Config` value
/// over the defaults and the harness's base: both listeners on loopback
/// port 0, the given upstream and key, the upstream rate left to the
/// simulator (600,000 a minute unless a test sets it), the admin token,
/// the ledger in a temp dir, and teams alpha and beta unless `teams`
/// replaces them.
///
/// ```ignore
/// let gw = Setup::new()
///     .teams(&[SMALL])
///     .credit_limit(SMALL, 100)
///     .with(|c| c.upstream.max_retries = 0)
///     .start(&sim)
///     .await;
/// ```
///
/// In-process gateways take the `Config` value; a child process, or a
/// gateway that reloads its file, reads the same value written out as
/// TOML (`Setup::toml`). Either way it went through `Config::load`, so a
/// test's config is validated as an operator's would be.
///
/// The fields whose types are more than plain values are reached in this
/// file only, so that a change of their type is met here: the token hashes
/// (`team_config`, and the admin token in `base`), `route_ttl`,
/// `log_level`, and the upstream's URL (`base`). Secrets (the upstream
/// key, Redis URLs) are set with `redis`, `cache_redis` and `ledger_redis`
/// and written back by `render`, since `Config` never prints them.
pub struct Setup {
    teams: Vec<TeamConfig>,
    edits: Vec<Edit>,
    cache_redis: Option<String>,
    quota_redis: Option<String>,
    data_dir: tempfile::TempDir,
}

/// Team `who` with its token's hash and no limits.
fn team_config((name, token): Team) -> TeamConfig {
    TeamConfig {
        name: name.into(),
        token_sha256: Some(permit_gateway::config::TokenHash::of(token)),
        not_after: None,
        tokens: Vec::new(),
        credit_limit: None,
        requests_per_minute: None,
        clamp_to_budget: false,
        weight: 1,
    }
}

impl Setup {
    /// The data volume of the gateways started from this setup (the
    /// ledger's folder, and the disk tier's file beside it).
    pub fn data_dir(&self) -> &std::path::Path {
        self.data_dir.path()
    }

    pub fn new() -> Setup {
        Setup {
            teams: vec![team_config(ALPHA), team_config(BETA)],
            edits: Vec::new(),
            cache_redis: None,
            quota_redis: None,
            data_dir: tempfile::tempdir().expect("tmp"),
        }
    }

    /// An edit of the config value, applied after the teams are set and
    /// after the edits given before it.
    pub fn with(mut self, edit: impl Fn(&mut Config) + Send + Sync + 'static) -> Setup {
        self.edits.push(Arc::new(edit));
        self
    }

    /// These teams instead of alpha and beta, in this order, no limits.
    pub fn teams(mut self, teams: &[Team]) -> Setup {
        self.teams = teams.iter().copied().map(team_config).collect();
        self
    }

    /// Edits team `who`, added (last) when the setup does not have it yet.
    pub fn team(mut self, who: Team, edit: impl FnOnce(&mut TeamConfig)) -> Setup {
        let at = match self.teams.iter().position(|t| t.name == who.0) {
            Some(at) => at,
            None => {
                self.teams.push(team_config(who));
                self.teams.len() - 1
            }
        };
        edit(&mut self.teams[at]);
        self
    }

    /// `credit_limit` of team `who` (the most common team edit).
    pub fn credit_limit(self, who: Team, credits: u64) -> Setup {
        self.team(who, |t| t.credit_limit = Some(credits))
    }

    /// One upstream attempt, cut after `secs` (`upstream.timeout_secs`,
    /// no retries): a call that stalls fails at once, and billed.
    pub fn one_attempt(self, secs: u64) -> Setup {
        self.with(move |c| {
            c.upstream.timeout_secs = secs;
            c.upstream.max_retries = 0;
        })
    }

    /// Cache, leases and ledger on the Redis at `url`: what replicas share.
    pub fn redis(self, url: &str) -> Setup {
        self.cache_redis(url).with(|c| c.quota.store = QuotaStore::Redis)
    }

    /// `cache.redis_url` (the shared cache tier and leases; the ledger
    /// stays a file unless `quota.store` says otherwise).
    pub fn cache_redis(mut self, url: &str) -> Setup {
        self.cache_redis = Some(url.into());
        self
    }

    /// The ledger alone on the Redis at `url` (`quota.redis_url`, and
    /// `quota.store = "redis"`).
    pub fn ledger_redis(mut self, url: &str) -> Setup {
        self.quota_redis = Some(url.into());
        self.with(|c| c.quota.store = QuotaStore::Redis)
    }

    /// `cache.route_ttl_secs`: answers of `route` (its metrics name,
    /// `permits_search`) are fresh for `secs`.
    pub fn route_ttl(self, route: &'static str, secs: u64) -> Setup {
        self.with(move |c| {
            let route = permit_gateway::route::Route::from_name(route).expect("a route's name");
            c.cache.route_ttl_secs.insert(route, secs);
        })
    }

    /// The team listener served by `loops` per-core runtimes
    /// (`server.runtime = "per_core"`, `server.per_core_threads`).
    pub fn per_core(self, loops: usize) -> Setup {
        self.with(move |c| {
            c.server.runtime = permit_gateway::config::Runtime::PerCore;
            c.server.per_core_threads = loops;
        })
    }

    /// `log.level`: a level or a filter (`info,access=warn`).
    pub fn log_level(self, level: &'static str) -> Setup {
        self.with(move |c| c.log.level = level.parse().expect("a level or a filter"))
    }

    /// The harness's part of every config, as TOML over the defaults.
    fn base(&self, base_url: &str, key: &str) -> String {
        let ledger = self.data_dir.path().join("ledger").display().to_string();
        let admin = permit_gateway::auth::token_sha256_hex(ADMIN_TOKEN);
        let line = |key: &str, value: &Option<String>| match value {
            Some(v) => format!("{key} = {v:?}\n"),
            None => String::new(),
        };
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
             [upstream]\nbase_url = {base_url:?}\napi_key = {key:?}\nrequests_per_minute = 600000\n\
             [cache]\nrelease_poll_secs = 0\n{}\
             [quota]\npath = {ledger:?}\n{}\
             [admin]\ntoken_sha256 = {admin:?}\n",
            line("redis_url", &self.cache_redis),
            line("redis_url", &self.quota_redis),
        )
    }

    /// The base, the teams, the edits and then `last`, as a value not yet
    /// validated.
    fn value(&self, base_url: &str, key: &str, last: &dyn Fn(&mut Config)) -> Config {
        let base = self.base(base_url, key);
        let mut config =
            Config::load(Source::Text(&base)).unwrap_or_else(|e| panic!("the harness's base config: {e}\n{base}"));
        config.teams = self.teams.clone();
        for edit in &self.edits {
            edit(&mut config);
        }
        last(&mut config);
        config
    }

    /// `value` as TOML, with the secrets `Config` redacts put back.
    fn render(&self, config: &Config, key: &str) -> String {
        let mut doc: toml::Table = toml::from_str(&config.redacted_toml()).expect("the config renders as TOML");
        let mut put = |section: &str, name: &str, value: Option<&str>| {
            if let Some(value) = value {
                let table = doc.entry(section).or_insert_with(|| toml::Table::new().into());
                let table = table.as_table_mut().expect("a section is a table");
                table.insert(name.into(), value.into());
            }
        };
        put("upstream", "api_key", Some(key));
        put("cache", "redis_url", self.cache_redis.as_deref());
        put("quota", "redis_url", self.quota_redis.as_deref());
        toml::to_string(&doc).expect("TOML")
    }

    /// The config as a file's text, `last` applied after every edit.
    fn toml_with(&self, base_url: &str, key: &str, last: &dyn Fn(&mut Config)) -> String {
        self.render(&self.value(base_url, key, last), key)
    }

    /// The TOML text of the config for a gateway whose upstream is
    /// `base_url` with `key` (secrets included: a file to start from).
    pub fn toml(&self, base_url: &str, key: &str) -> String {
        self.toml_with(base_url, key, &|_| {})
    }

    /// The config value for a gateway in front of `base_url`, loaded from
    /// its own text: validated, and the same a child process would read.
    pub fn config_for(&self, base_url: &str, key: &str) -> Config {
        let text = self.toml(base_url, key);
        Config::load(Source::Text(&text)).unwrap_or_else(|e| panic!("test config invalid: {e}\n{text}"))
    }

    pub fn config(&self, sim: &Sim) -> Config {
        self.config_for(&sim.base_url(), sim.api_key())
    }

    /// Starts the gateway in this process.
    pub async fn start(&self, sim: &Sim) -> Running {
        start_config(self.config(sim)).await
    }
}

/// `n` gateways in front of `sim`: one alone (its own file ledger, no
/// Redis), or replicas sharing `redis` for cache, leases and ledger.
pub async fn replicas(n: usize, sim: &Sim, redis: Option<&RedisServer>, setup: Setup) -> Vec<Running> {
    let setup = match redis {
        Some(r) => setup.redis(&r.url()),
        None => setup,
    };
    let mut gws = Vec::new();
    for _ in 0..n {
        gws.push(setup.start(sim).await);
    }
    gws
}

/// A gateway started from a config file, so a test can rewrite the file and
/// reload (`POST /admin/reload` or SIGHUP).
pub struct FromFile {
    pub gw: Running,
    pub path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl FromFile {
    /// Writes `setup`'s config to a fresh file and starts the gateway on it.
    pub async fn start(setup: &Setup, sim: &Sim) -> FromFile {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, setup.toml(&sim.base_url(), sim.api_key())).expect("write config");
        let listeners = Listeners::bind(&setup.config(sim).server).await.expect("bind");
        let gw = Running::spawn_from_file(&path, listeners).expect("gateway starts");
        FromFile { gw, path, _dir: dir }
    }

    /// Replaces the file with `setup`'s config (reload it to apply).
    pub fn rewrite(&self, setup: &Setup, sim: &Sim) {
        std::fs::write(&self.path, setup.toml(&sim.base_url(), sim.api_key())).expect("rewrite config");
    }

    /// Asks the gateway to reload its file (`POST /admin/reload`).
    pub async fn reload(&self) -> super::http::Reply {
        super::client::Client::admin(self.gw.admin_url())
            .post("/admin/reload")
            .await
    }
}

pub async fn start_config(config: Config) -> Running {
    try_start_config(config).await.expect("gateway starts")
}

/// The gateway started in this process on `config`, or its start-up error.
pub async fn try_start_config(config: Config) -> Result<Running, String> {
    crate::support::secrets::capture_logs();
    // The binary's own binding (port 0 here): `SO_REUSEPORT` on the team
    // socket when `server.runtime` is `per_core`.
    let listeners = Listeners::bind(&config.server).await.expect("bind");
    Running::spawn(config, listeners)
}

/// A child killed when the test is done with it (or fails).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The gateway binary as a child process, its JSON logs captured.
pub struct ChildGateway {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub logs: Arc<Mutex<Vec<String>>>,
    config_path: std::path::PathBuf,
    /// The folder of a config file written for this process, removed with it.
    config_dir: Option<tempfile::TempDir>,
    /// Held while the gateway's stderr is not read ([`Self::spawn_stalled`]);
    /// dropped, the reader goes on.
    stalled: Option<mpsc::Sender<()>>,
}

impl ChildGateway {
    /// Runs `permit-gateway serve --config <file>` with JSON logs and waits
    /// for its "serving" line, which carries the bound addresses.
    pub fn spawn(setup: &Setup, base_url: &str, key: &str) -> ChildGateway {
        Self::start(setup, base_url, key, None, None)
    }

    /// As [`ChildGateway::spawn`], under `ulimit -n nofile` (soft and hard):
    /// the descriptor pool of a constrained container.
    pub fn spawn_limited(setup: &Setup, base_url: &str, key: &str, nofile: u64) -> ChildGateway {
        Self::start(setup, base_url, key, None, Some(nofile))
    }

    /// As [`Self::spawn`], but nothing more of its stderr is read after the
    /// "serving" line until [`Self::resume_logs`]: the pipe fills (64 KiB)
    /// and the gateway's writes to stderr block, like a log shipper that
    /// stopped reading.
    pub fn spawn_stalled(setup: &Setup, base_url: &str, key: &str) -> ChildGateway {
        let (resume, stalled) = mpsc::channel();
        let mut gw = Self::start(setup, base_url, key, Some(stalled), None);
        gw.stalled = Some(resume);
        gw
    }

    /// The start-up warning that the connection caps were clamped to the
    /// descriptors (`ulimit -n`), once it is logged.
    pub fn clamp_warning(&self) -> String {
        eventually_blocking("a start-up warning names the clamp", Duration::from_secs(10), || {
            self.logs
                .lock()
                .expect("logs")
                .iter()
                .find(|l| l.contains("server.max_connections clamped"))
                .cloned()
        })
    }

    /// Reads the stalled stderr again (what the gateway still writes).
    pub fn resume_logs(&mut self) {
        self.stalled = None;
    }

    fn start(
        setup: &Setup,
        base_url: &str,
        key: &str,
        stall: Option<mpsc::Receiver<()>>,
        nofile: Option<u64>,
    ) -> ChildGateway {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, ChildGateway::file_text(setup, base_url, key)).expect("write config");
        let mut gw = ChildGateway::launch(&path, None, stall, nofile);
        gw.config_dir = Some(dir);
        gw
    }

    /// `setup`'s config with JSON logs, which the harness reads (the
    /// "serving" line, the access lines): what a child is started with.
    pub fn file_text(setup: &Setup, base_url: &str, key: &str) -> String {
        setup.toml_with(base_url, key, &|c| c.log.format = LogFormat::Json)
    }

    /// Replaces the process's config file with `setup`'s (HUP it or
    /// `POST /admin/reload` to apply).
    pub fn rewrite(&self, setup: &Setup, base_url: &str, key: &str) {
        std::fs::write(&self.config_path, ChildGateway::file_text(setup, base_url, key)).expect("rewrite config");
    }

    /// Runs `serve --config <path>` (a file already written, with JSON
    /// logs), started in `cwd` when given; the file is the caller's.
    pub fn spawn_file(path: &std::path::Path, cwd: Option<&std::path::Path>) -> ChildGateway {
        ChildGateway::launch(path, cwd, None, None)
    }

    /// `serve` on `setup` when it must not start (under `ulimit -n nofile`
    /// when given): its exit status and what it logged. Fails if it is
    /// still running after 30 s.
    pub fn refused(
        setup: &Setup,
        base_url: &str,
        key: &str,
        nofile: Option<u64>,
    ) -> (std::process::ExitStatus, String) {
        let dir = tempfile::tempdir().expect("tmp");
        let config = dir.path().join("gateway.toml");
        std::fs::write(&config, setup.toml(base_url, key)).expect("config");
        let mut child = Killed(
            ChildGateway::command(nofile)
                .arg("serve")
                .arg("--config")
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("gateway binary starts"),
        );
        let status = eventually_blocking(
            "the gateway refuses to start and exits",
            Duration::from_secs(30),
            || child.0.try_wait().expect("try_wait"),
        );
        let mut logs = String::new();
        std::io::Read::read_to_string(&mut child.0.stderr.take().expect("stderr"), &mut logs).expect("logs");
        (status, logs)
    }

    /// The gateway binary's command, under `ulimit -n nofile` (soft and
    /// hard) when given.
    fn command(nofile: Option<u64>) -> Command {
        match nofile {
            None => Command::new(env!("CARGO_BIN_EXE_permit-gateway")),
            Some(n) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(env!("CARGO_BIN_EXE_permit-gateway"));
                sh
            }
        }
    }

    fn launch(
        path: &std::path::Path,
        cwd: Option<&std::path::Path>,
        stall: Option<mpsc::Receiver<()>>,
        nofile: Option<u64>,
    ) -> ChildGateway {
        let mut command = ChildGateway::command(nofile);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let mut child = command
            .arg("serve")
            .arg("--config")
            .arg(path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("gateway binary starts");
        let stderr = child.stderr.take().expect("stderr piped");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let serving = line.contains("permit-gateway serving");
                if serving {
                    let _ = ready_tx.send(line.clone());
                }
                sink.lock().expect("log lock").push(line);
                if let (true, Some(stall)) = (serving, &stall) {
                    // Until the sender is dropped: no more reads.
                    let _ = stall.recv();
                }
            }
        });
        let line = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("gateway did not start; logs: {:?}", logs.lock().expect("lock")));
        let v: serde_json::Value = serde_json::from_str(&line).expect("json log line");
        let addr = v["listen"].as_str().expect("listen field").parse().expect("addr");
        let admin_addr = v["admin"].as_str().expect("admin field").parse().expect("addr");
        ChildGateway {
            child,
            addr,
            admin_addr,
            logs,
            config_path: path.to_path_buf(),
            config_dir: None,
            stalled: None,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }

    /// The config file the process was started with (rewrite it, then HUP).
    pub fn config_path(&self) -> std::path::PathBuf {
        self.config_path.clone()
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{sig} failed");
    }

    /// Waits for the process to exit; panics after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        eventually_blocking("the gateway exits", limit, || self.child.try_wait().expect("try_wait"))
    }

    pub fn log_text(&self) -> String {
        self.logs.lock().expect("lock").join("\n")
    }

    /// The access-log lines (JSON, target `access`) logged so far.
    pub fn access_lines(&self) -> Vec<serde_json::Value> {
        self.logs
            .lock()
            .expect("lock")
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "access")
            .collect()
    }

    /// The access line of `request_id`, once it is written (bounded).
    pub async fn access_line(&self, request_id: &str) -> serde_json::Value {
        let what = format!("the access-log line of {request_id}");
        super::wait::eventually(&what, Duration::from_secs(10), || {
            let found = self.access_lines().into_iter().find(|l| l["request_id"] == request_id);
            async move { found }
        })
        .await
    }

    /// Fails when any line this process logged so far carries a secret.
    pub fn assert_logs_clean(&self) {
        crate::support::secrets::assert_clean(&self.log_text(), "the gateway's logs");
    }
}

impl Drop for ChildGateway {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.assert_logs_clean();
        }
        let _ = self.child.kill();
        // A stalled reader reads on to the end of the dead process's pipe.
        self.stalled = None;
        let _ = self.child.wait();
    }
}
