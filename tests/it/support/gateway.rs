//! The real gateway for a test: in-process on 127.0.0.1:0 (most tests), or
//! as a child process of the built binary (signals, captured logs).

use super::wait::eventually_blocking;
use permit_api_sim::Sim;
use permit_gateway::config::{Config, Source};
use permit_gateway::{Listeners, Running};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// Test teams: (name, token). Tokens are long and unique so a leak scan can
/// search for them.
pub const ALPHA: (&str, &str) = ("alpha", "tok-alpha-7f3c9e1d2b4a6058");
pub const BETA: (&str, &str) = ("beta", "tok-beta-0a9b8c7d6e5f4321");
pub const ADMIN_TOKEN: &str = "tok-admin-5e6f7a8b9c0d1e2f";
pub const SMALL: (&str, &str) = ("small", "tok-small-1c2d3e4f5a6b7c8d");

/// Every token the harness hands out: the secret scan looks for each.
pub const ALL_TOKENS: [&str; 4] = [ALPHA.1, BETA.1, ADMIN_TOKEN, SMALL.1];

fn sha(token: &str) -> String {
    permit_gateway::auth::token_sha256_hex(token)
}

/// A team block for the config.
pub fn team(name: &str, token: &str, extra: &str) -> String {
    format!("[[teams]]\nname = {name:?}\ntoken_sha256 = {:?}\n{extra}\n", sha(token))
}

/// A config for a gateway in front of `sim`: the given extra lines per
/// section (`("upstream", "timeout_secs = 2")`) and teams alpha and beta
/// unless `teams` replaces them.
pub struct Setup {
    pub sections: Vec<(&'static str, String)>,
    pub teams: String,
    pub data_dir: tempfile::TempDir,
}

impl Setup {
    pub fn new() -> Setup {
        Setup {
            sections: Vec::new(),
            teams: team(ALPHA.0, ALPHA.1, "") + &team(BETA.0, BETA.1, ""),
            data_dir: tempfile::tempdir().expect("tmp"),
        }
    }

    pub fn with(mut self, section: &'static str, lines: impl Into<String>) -> Setup {
        self.sections.push((section, lines.into()));
        self
    }

    pub fn teams(mut self, teams: impl Into<String>) -> Setup {
        self.teams = teams.into();
        self
    }

    /// The TOML text for a gateway whose upstream is `base_url` with `key`.
    pub fn toml(&self, base_url: &str, key: &str) -> String {
        let extra = |name: &str| {
            self.sections
                .iter()
                .filter(|(s, _)| *s == name)
                .map(|(_, l)| format!("{l}\n"))
                .collect::<String>()
        };
        let ledger = self.data_dir.path().join("ledger");
        // Tests fire bursts; the upstream rate is the simulator's business
        // unless a test sets it.
        let upstream_rate = if extra("upstream").contains("requests_per_minute") {
            ""
        } else {
            "requests_per_minute = 600000\n"
        };
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{}\n\
             [upstream]\nbase_url = {base_url:?}\napi_key = {key:?}\n{upstream_rate}{}\n\
             [cache]\n{}\n\
             [quota]\npath = {:?}\n{}\n\
             [redis]\n{}\n\
             [admin]\ntoken_sha256 = {:?}\n{}\n\
             [log]\n{}\n\
             [tracing]\n{}\n\
             {}",
            extra("server"),
            extra("upstream"),
            extra("cache"),
            ledger.display().to_string(),
            extra("quota"),
            extra("redis"),
            sha(ADMIN_TOKEN),
            extra("admin"),
            extra("log"),
            extra("tracing"),
            self.teams,
        )
    }

    pub fn config(&self, sim: &Sim) -> Config {
        let text = self.toml(&sim.base_url(), sim.api_key());
        Config::load(Source::Text(&text)).unwrap_or_else(|e| panic!("test config invalid: {e}\n{text}"))
    }

    /// Starts the gateway in this process.
    pub async fn start(&self, sim: &Sim) -> Running {
        start_config(self.config(sim)).await
    }
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
        let listeners = Listeners {
            team: TcpListener::bind("127.0.0.1:0").await.expect("bind team"),
            admin: TcpListener::bind("127.0.0.1:0").await.expect("bind admin"),
        };
        let gw = Running::spawn_from_file(&path, listeners).expect("gateway starts");
        FromFile { gw, path, _dir: dir }
    }

    /// Replaces the file with `setup`'s config (reload it to apply).
    pub fn rewrite(&self, setup: &Setup, sim: &Sim) {
        std::fs::write(&self.path, setup.toml(&sim.base_url(), sim.api_key())).expect("rewrite config");
    }
}

pub async fn start_config(config: Config) -> Running {
    crate::support::secrets::capture_logs();
    let listeners = Listeners {
        team: TcpListener::bind("127.0.0.1:0").await.expect("bind team"),
        admin: TcpListener::bind("127.0.0.1:0").await.expect("bind admin"),
    };
    Running::spawn(config, listeners).expect("gateway starts")
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
        let mut text = setup.toml(base_url, key);
        if !setup.sections.iter().any(|(s, _)| *s == "log") {
            text = text.replace("[log]\n", "[log]\nformat = \"json\"\n");
        }
        std::fs::write(&path, text).expect("write config");
        let mut gw = ChildGateway::launch(&path, None, stall, nofile);
        gw.config_dir = Some(dir);
        gw
    }

    /// Runs `serve --config <path>` (a file already written, with JSON
    /// logs), started in `cwd` when given; the file is the caller's.
    pub fn spawn_file(path: &std::path::Path, cwd: Option<&std::path::Path>) -> ChildGateway {
        ChildGateway::launch(path, cwd, None, None)
    }

    fn launch(
        path: &std::path::Path,
        cwd: Option<&std::path::Path>,
        stall: Option<mpsc::Receiver<()>>,
        nofile: Option<u64>,
    ) -> ChildGateway {
        let mut command = match nofile {
            None => Command::new(env!("CARGO_BIN_EXE_permit-gateway")),
            Some(n) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(env!("CARGO_BIN_EXE_permit-gateway"));
                sh
            }
        };
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
