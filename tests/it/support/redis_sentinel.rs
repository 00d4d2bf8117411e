//! A real Sentinel setup for one test: a primary and a replica
//! (`redis-server`, AOF on as the ledger wants) and three Sentinels
//! (`redis-server s.conf --sentinel`) watching service `mymaster`, on free
//! loopback ports, each in its own temp dir, killed on drop.
//!
//! The calls block (std sockets, child processes): from an async test run
//! them in `tokio::task::spawn_blocking` so the gateways keep serving.

use super::redis_tls::free_port;
use super::wait::eventually_blocking;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The service name the Sentinels watch.
pub const SERVICE: &str = "mymaster";

/// Milliseconds before the Sentinels count a silent primary as down:
/// lowered from the 30 s default so a failover takes a couple of seconds.
pub const DOWN_AFTER_MS: u64 = 1000;

struct Proc {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

pub struct RedisSentinel {
    _root: tempfile::TempDir,
    /// Data nodes: 0 starts as the primary, 1 as its replica.
    nodes: Vec<Proc>,
    sentinels: Vec<Proc>,
}

impl RedisSentinel {
    /// Starts both data nodes and the three Sentinels, and waits until the
    /// replica is in sync and every Sentinel knows the replica and the
    /// other two (so a failover can be authorised).
    pub fn start() -> RedisSentinel {
        let root = tempfile::tempdir().expect("temp dir");
        let proc = |name: &str| {
            let dir = root.path().join(name);
            std::fs::create_dir(&dir).expect("dir");
            Proc {
                port: free_port(),
                dir,
                child: None,
            }
        };
        let mut nodes = vec![proc("primary"), proc("replica")];
        let sentinels = vec![proc("s0"), proc("s1"), proc("s2")];
        let primary = nodes[0].port;
        nodes[0].spawn_node(None);
        nodes[1].spawn_node(Some(primary));
        let mut setup = RedisSentinel {
            _root: root,
            nodes,
            sentinels,
        };
        for s in &mut setup.sentinels {
            s.spawn_sentinel(primary);
        }
        setup.wait_ready(Duration::from_secs(30));
        setup
    }

    /// `redis+sentinel://` URL of the three Sentinels and the service.
    pub fn url(&self, service: &str) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("redis+sentinel://{}/{service}", hosts.join(","))
    }

    /// The port of the node the Sentinels name as the primary now.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let addr: Vec<String> = s.query(redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(SERVICE))?;
            addr.get(1)?.parse().ok()
        })
    }

    /// SIGKILLs the current primary (as a crash would); returns its index.
    pub fn kill_primary(&mut self) -> usize {
        let port = self.primary_port().expect("a primary is named");
        let i = self.nodes.iter().position(|n| n.port == port).expect("one of ours");
        self.nodes[i].kill();
        i
    }

    /// Polls until the Sentinels name a primary other than node `old`.
    pub fn wait_failover(&self, old: usize, limit: Duration) {
        let old_port = self.nodes[old].port;
        eventually_blocking("the Sentinels promote the replica", limit, || {
            self.primary_port().is_some_and(|p| p != old_port)
        });
    }

    fn wait_ready(&self, limit: Duration) {
        eventually_blocking("the replica syncs and the Sentinels know each other", limit, || {
            let synced = self.nodes[1]
                .query::<String>(redis::cmd("INFO").arg("replication"))
                .is_some_and(|i| i.contains("master_link_status:up"));
            let quorum = self.sentinels.iter().all(|s| {
                let replicas: Option<Vec<redis::Value>> = s.query(redis::cmd("SENTINEL").arg("REPLICAS").arg(SERVICE));
                let others: Option<Vec<redis::Value>> = s.query(redis::cmd("SENTINEL").arg("SENTINELS").arg(SERVICE));
                replicas.is_some_and(|r| !r.is_empty()) && others.is_some_and(|o| o.len() == 2)
            });
            synced && quorum
        });
    }
}

impl Proc {
    fn spawn_node(&mut self, replica_of: Option<u16>) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .args(["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])
            .args(["--repl-diskless-sync-delay", "0"]);
        if let Some(primary) = replica_of {
            cmd.args(["--replicaof", "127.0.0.1"]).arg(primary.to_string());
        }
        self.run(cmd);
    }

    fn spawn_sentinel(&mut self, primary: u16) {
        // Sentinel rewrites its config file: one of its own, writable.
        let conf = self.dir.join("sentinel.conf");
        let text = format!(
            "bind 127.0.0.1\nport {}\ndir {}\n\
             sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
             sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {SERVICE} 10000\n\
             sentinel parallel-syncs {SERVICE} 1\n",
            self.port,
            self.dir.display()
        );
        std::fs::write(&conf, text).expect("sentinel.conf");
        let mut cmd = Command::new("redis-server");
        cmd.arg(&conf).arg("--sentinel");
        self.run(cmd);
    }

    fn run(&mut self, mut cmd: Command) {
        let child = cmd
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}): install it (Debian: apt-get install redis-server)")
            });
        self.child = Some(child);
        let what = format!("redis on {} answers", self.port);
        eventually_blocking(&what, Duration::from_secs(10), || {
            self.query::<String>(&redis::cmd("PING")).is_some()
        });
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Option<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).ok()?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(1)).ok()?;
        cmd.query(&mut conn).ok()
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for p in self.sentinels.iter_mut().chain(self.nodes.iter_mut()) {
            p.kill();
        }
    }
}
