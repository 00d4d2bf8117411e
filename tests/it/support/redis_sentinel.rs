//! A real Sentinel setup for one test: a primary and a replica
//! (`redis-server`, AOF on as the ledger wants) and three Sentinels
//! (`redis-server s.conf --sentinel`) watching service `mymaster`, on free
//! loopback ports, each in its own temp dir, killed on drop.
//!
//! The calls block (std sockets, child processes): from an async test run
//! them in `tokio::task::spawn_blocking` so the gateways keep serving.

use super::free_port;
use super::redis_proc::RedisProc;
use super::stall_relay::StallRelay;
use super::wait::eventually_blocking;
use std::process::Command;
use std::time::Duration;

/// The service name the Sentinels watch.
pub const SERVICE: &str = "mymaster";

/// Milliseconds before the Sentinels count a silent primary as down:
/// lowered from the 30 s default so a failover takes a couple of seconds.
pub const DOWN_AFTER_MS: u64 = 1000;

/// The Sentinels' `failover-timeout` unless a test asks otherwise.
const FAILOVER_TIMEOUT_MS: u64 = 10_000;

pub struct RedisSentinel {
    _root: tempfile::TempDir,
    /// Data nodes: 0 starts as the primary, 1 as its replica.
    nodes: Vec<RedisProc>,
    sentinels: Vec<RedisProc>,
    /// The replica's link to the primary, when it goes through a relay.
    relay: Option<StallRelay>,
}

impl RedisSentinel {
    /// Starts both data nodes and the three Sentinels, and waits until the
    /// replica is in sync and every Sentinel knows the replica and the
    /// other two (so a failover can be authorised).
    pub fn start() -> RedisSentinel {
        RedisSentinel::start_with(false, FAILOVER_TIMEOUT_MS)
    }

    /// As [`RedisSentinel::start`], with a failover timeout of 2 s: a
    /// Sentinel starts a new failover of the same service only twice that
    /// long after the last one, so failovers can follow each other every
    /// few seconds.
    pub fn start_for_repeated_failovers() -> RedisSentinel {
        RedisSentinel::start_with(false, 2_000)
    }

    /// As [`RedisSentinel::start`], the replica's link to the primary
    /// through a [`StallRelay`] ([`RedisSentinel::stall_replication`]).
    pub fn start_behind_relay() -> RedisSentinel {
        RedisSentinel::start_with(true, FAILOVER_TIMEOUT_MS)
    }

    /// A primary and its replica behind a [`StallRelay`], and no Sentinel:
    /// a stall that lasts (a Sentinel would point the replica at the
    /// primary itself within seconds, ending the stall).
    pub fn pair_behind_relay() -> RedisSentinel {
        RedisSentinel::start_with(true, 0)
    }

    /// The primary's own URL (node 0).
    pub fn primary_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.nodes[0].port)
    }

    /// `failover_timeout_ms` 0: no Sentinels.
    fn start_with(relayed: bool, failover_timeout_ms: u64) -> RedisSentinel {
        let root = tempfile::tempdir().expect("temp dir");
        let proc = |name: &str| {
            let dir = root.path().join(name);
            std::fs::create_dir(&dir).expect("dir");
            RedisProc::new(free_port(), dir)
        };
        let mut nodes = vec![proc("primary"), proc("replica")];
        let sentinels = match failover_timeout_ms {
            0 => Vec::new(),
            _ => vec![proc("s0"), proc("s1"), proc("s2")],
        };
        let primary = nodes[0].port;
        nodes[0].start(node_command(primary, None));
        let replica = nodes[1].port;
        let relay = relayed.then(|| StallRelay::start(primary));
        let upstream = relay.as_ref().map_or(primary, |r| r.port);
        nodes[1].start(node_command(replica, Some(upstream)));
        let mut setup = RedisSentinel {
            _root: root,
            nodes,
            sentinels,
            relay,
        };
        for s in &mut setup.sentinels {
            let cmd = sentinel_command(s, primary, failover_timeout_ms);
            s.start(cmd);
        }
        // Setup, not an assertion: Sentinels learn of the replica from
        // the primary's INFO, read every 10 s; on a loaded CI machine 30 s
        // was once too short.
        setup.wait_ready(Duration::from_secs(60));
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

    /// The replica stops receiving the primary's writes; its ACKs still
    /// flow, so the primary counts it as a replica in sync.
    pub fn stall_replication(&self) {
        self.relay.as_ref().expect("started behind a relay").stall();
    }

    /// SIGKILLs the current primary (as a crash would); returns its index.
    pub fn kill_primary(&mut self) -> usize {
        let port = self.primary_port().expect("a primary is named");
        let i = self.nodes.iter().position(|n| n.port == port).expect("one of ours");
        self.nodes[i].kill();
        i
    }

    /// Starts node `i` again (after [`RedisSentinel::kill_primary`]) as a
    /// replica of the primary named now, and waits until it is in sync and
    /// every Sentinel lists it: the next failover has a replica to promote.
    pub fn rejoin(&mut self, i: usize, limit: Duration) {
        let primary = self.primary_port().expect("a primary is named");
        let port = self.nodes[i].port;
        self.nodes[i].start(node_command(port, Some(primary)));
        let what = format!("node {i} rejoins as an in-sync replica");
        eventually_blocking(&what, limit, || {
            let synced = self.nodes[i]
                .query::<String>(redis::cmd("INFO").arg("replication"))
                .is_some_and(|info| info.contains("role:slave") && info.contains("master_link_status:up"));
            let known = self.sentinels.iter().all(|s| {
                let replicas: Option<Vec<std::collections::HashMap<String, String>>> =
                    s.query(redis::cmd("SENTINEL").arg("REPLICAS").arg(SERVICE));
                replicas.is_some_and(|r| {
                    r.iter().any(|m| {
                        m.get("port").is_some_and(|p| *p == port.to_string())
                            && m.get("flags")
                                .is_some_and(|f| !f.contains("down") && !f.contains("disconnected"))
                            && m.get("master-link-status").is_some_and(|l| l == "ok")
                    })
                })
            });
            synced && known
        });
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
fn sentinel_command(proc: &RedisProc, primary: u16, failover_timeout_ms: u64) -> Command {
    let conf = proc.dir.join("sentinel.conf");
    let text = format!(
        "bind 127.0.0.1\nport {}\ndir {}\n\
         sentinel monitor {SERVICE} 127.0.0.1 {primary} 2\n\
         sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n\
         sentinel failover-timeout {SERVICE} {failover_timeout_ms}\n\
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
