//! A real Sentinel setup for one test: a primary and a replica
//! (`redis-server`, AOF on as the ledger wants) and three Sentinels
//! (`redis-server s.conf --sentinel`) watching service `mymaster`, on free
//! loopback ports, each in its own temp dir, killed on drop.
//!
//! The calls block (std sockets, child processes): from an async test run
//! them in `tokio::task::spawn_blocking` so the gateways keep serving.

use super::redis_proc::RedisProc;
use super::redis_tls::free_port;
use super::wait::eventually_blocking;
use std::process::Command;
use std::time::Duration;

/// The service name the Sentinels watch.
pub const SERVICE: &str = "mymaster";

/// Milliseconds before the Sentinels count a silent primary as down:
/// lowered from the 30 s default so a failover takes a couple of seconds.
pub const DOWN_AFTER_MS: u64 = 1000;

pub struct RedisSentinel {
    _root: tempfile::TempDir,
    /// Data nodes: 0 starts as the primary, 1 as its replica.
    nodes: Vec<RedisProc>,
    sentinels: Vec<RedisProc>,
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
            RedisProc::new(free_port(), dir)
        };
        let mut nodes = vec![proc("primary"), proc("replica")];
        let sentinels = vec![proc("s0"), proc("s1"), proc("s2")];
        let primary = nodes[0].port;
        nodes[0].start(node_command(primary, None));
        let replica = nodes[1].port;
        nodes[1].start(node_command(replica, Some(primary)));
        let mut setup = RedisSentinel {
            _root: root,
            nodes,
            sentinels,
        };
        for s in &mut setup.sentinels {
            let cmd = sentinel_command(s, primary);
            s.start(cmd);
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

/// A data node: AOF on, as the ledger wants; a replica syncs at once.
fn node_command(port: u16, replica_of: Option<u16>) -> Command {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--bind", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .args(["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])
        .args(["--repl-diskless-sync-delay", "0"]);
    if let Some(primary) = replica_of {
        cmd.args(["--replicaof", "127.0.0.1"]).arg(primary.to_string());
    }
    cmd
}

/// A Sentinel watching `primary`. It rewrites its config file: one of its
/// own, writable, in its directory.
fn sentinel_command(proc: &RedisProc, primary: u16) -> Command {
    let conf = proc.dir.join("sentinel.conf");
    let text = format!(
        "bind 127.0.0.1\nport {}\ndir {}\n\
         sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
         sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n\
         sentinel failover-timeout {SERVICE} 10000\n\
         sentinel parallel-syncs {SERVICE} 1\n",
        proc.port,
        proc.dir.display()
    );
    std::fs::write(&conf, text).expect("sentinel.conf");
    let mut cmd = Command::new("redis-server");
    cmd.arg(&conf).arg("--sentinel");
    cmd
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for p in self.sentinels.iter_mut().chain(self.nodes.iter_mut()) {
            p.kill();
        }
    }
}
