//! One `redis-server` process (a data node or a Sentinel) on a loopback
//! port, in a directory of its own: started by a harness (the Cluster's and
//! the Sentinel setup's), killed on demand (a crash) and on drop.
//!
//! Blocking (a child process, std sockets): from an async test, call it in
//! `tokio::task::spawn_blocking` so the gateways keep serving.

use super::wait::eventually_blocking;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct RedisProc {
    pub port: u16,
    /// Its data (AOF, `nodes.conf`, a Sentinel's rewritten config): kept
    /// across a kill, so a restarted node comes back as it was.
    pub dir: PathBuf,
    child: Option<Child>,
}

impl RedisProc {
    /// A process to be, on `port` in `dir` (which must exist).
    pub fn new(port: u16, dir: PathBuf) -> RedisProc {
        RedisProc { port, dir, child: None }
    }

    /// Runs `cmd` (a `redis-server` command line; `--dir` is added here)
    /// and waits until the server answers PING on its port.
    pub fn start(&mut self, mut cmd: Command) {
        self.child = Some(spawn_redis_server(&mut cmd, &self.dir));
        let what = format!("redis-server on {} answers", self.port);
        eventually_blocking(&what, Duration::from_secs(10), || {
            self.query::<String>(&redis::cmd("PING")).is_some()
        });
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// One command on this process alone (no redirects followed).
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Option<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).ok()?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
        cmd.query(&mut conn).ok()
    }
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `cmd` (a `redis-server` command line) with its data in `dir`, its
/// output discarded; says how to install Redis when it is missing.
pub fn spawn_redis_server(cmd: &mut Command, dir: &Path) -> Child {
    cmd.arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start redis-server ({e}): install it (Debian: apt-get install redis-server); .ci/run does this"
            )
        })
}
