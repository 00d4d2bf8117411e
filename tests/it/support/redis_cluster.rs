//! A real Redis Cluster for one test: three primaries and three replicas
//! from Debian's `redis-server` on free loopback ports, joined by
//! `redis-cli --cluster create`, each node in its own temp dir (AOF on, as
//! the ledger wants), killed on drop. A node can be killed mid-test and
//! started again on its port with its `nodes.conf`, so it rejoins.
//!
//! The calls here block (std sockets, child processes): from an async test
//! run them in `tokio::task::spawn_blocking` so the gateways keep serving.

use super::redis_proc::RedisProc;
use super::wait::eventually_blocking;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Milliseconds before a silent primary counts as failed: lowered from the
/// 15 s default so a failover takes about two seconds here.
pub const NODE_TIMEOUT_MS: u64 = 1000;

const NODES: usize = 6;

struct Node {
    server: RedisProc,
    bus_port: u16,
}

pub struct RedisCluster {
    _root: tempfile::TempDir,
    nodes: Vec<Node>,
}

impl RedisCluster {
    /// [`RedisCluster::start`] off the async runtime (it blocks for
    /// seconds), for async tests.
    pub async fn start_async() -> RedisCluster {
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("cluster start")
    }

    /// Starts six nodes, creates the cluster (1 replica per primary) and
    /// waits until every node reports `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        let mut cluster = RedisCluster::reserve();
        cluster.create();
        cluster
    }

    /// Chooses the ports (and so the URL) without starting anything: for a
    /// gateway that starts before its cluster.
    pub fn reserve() -> RedisCluster {
        let root = tempfile::tempdir().expect("temp dir for the cluster");
        // Each handed out once: none twice.
        let ports: Vec<u16> = (0..NODES * 2).map(|_| super::free_port()).collect();
        let nodes: Vec<Node> = (0..NODES)
            .map(|i| {
                let dir = root.path().join(format!("node{i}"));
                std::fs::create_dir(&dir).expect("node dir");
                Node {
                    server: RedisProc::new(ports[2 * i], dir),
                    bus_port: ports[2 * i + 1],
                }
            })
            .collect();
        RedisCluster { _root: root, nodes }
    }

    /// Starts the reserved nodes and joins them into a cluster.
    pub fn create(&mut self) {
        for node in &mut self.nodes {
            node.spawn();
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &self.nodes {
            create.arg(format!("127.0.0.1:{}", node.server.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        self.wait_ok(Duration::from_secs(20));
    }

    /// The gateway's spelling of this cluster: three seeds are enough.
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes[..3]
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.server.port))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// Which node now serves `key`'s slot as primary.
    pub fn primary_for(&self, key: &str) -> usize {
        let slot: i64 = self.query_any(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key));
        // Each range: [from, to, [host, port, id, ...] of the primary, replicas...].
        let ranges: Vec<Vec<redis::Value>> = self.query_any(redis::cmd("CLUSTER").arg("SLOTS"));
        let int = |v: &redis::Value| redis::from_redis_value::<i64>(v.clone()).ok();
        let port = ranges
            .iter()
            .find(|r| matches!((int(&r[0]), int(&r[1])), (Some(from), Some(to)) if (from..=to).contains(&slot)))
            .and_then(|r| redis::from_redis_value::<Vec<redis::Value>>(r[2].clone()).ok())
            .and_then(|primary| int(&primary[1]))
            .expect("every slot is covered");
        self.nodes
            .iter()
            .position(|n| i64::from(n.server.port) == port)
            .expect("a node of ours")
    }

    /// SIGKILL one node, as a crash would.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts a killed node again with its own `nodes.conf` and data.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].spawn();
    }

    /// `master` or `slave`, from the node's own `ROLE`.
    pub fn role(&self, i: usize) -> String {
        let role: Vec<redis::Value> = self.nodes[i].query(&redis::cmd("ROLE")).expect("ROLE answers");
        redis::from_redis_value(role[0].clone()).expect("role name")
    }

    /// Polls until every running node says `cluster_state:ok` and every
    /// running replica has finished its sync (`master_link_status:up`): a
    /// replica still syncing would lose everything if its primary died.
    pub fn wait_ok(&self, limit: Duration) {
        eventually_blocking("the cluster becomes healthy", limit, || {
            let states: Vec<Option<String>> = self
                .running()
                .map(|n| {
                    let cluster: String = n.query(redis::cmd("CLUSTER").arg("INFO"))?;
                    let replication: String = n.query(redis::cmd("INFO").arg("replication"))?;
                    Some(cluster + &replication)
                })
                .collect();
            let healthy = |s: &str| {
                s.contains("cluster_state:ok") && (s.contains("role:master") || s.contains("master_link_status:up"))
            };
            if states.iter().all(|s| s.as_deref().is_some_and(healthy)) {
                Ok(())
            } else {
                Err(format!("{states:?}"))
            }
        })
    }

    /// Polls until `key`'s slot is served by a primary other than `old`
    /// (its replica won the election) and the cluster is ok again.
    pub fn wait_failover(&self, key: &str, old: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        let what = format!("a replica takes over from node {old}");
        eventually_blocking(&what, limit, || self.primary_for(key) != old);
        self.wait_ok(deadline.saturating_duration_since(Instant::now()));
    }

    /// Polls until node `i` is a replica again (after a restart).
    pub fn wait_role(&self, i: usize, role: &str, limit: Duration) {
        eventually_blocking(&format!("node {i} becomes {role}"), limit, || {
            self.nodes[i]
                .query::<Vec<redis::Value>>(&redis::cmd("ROLE"))
                .map(|r| redis::from_redis_value::<String>(r[0].clone()).unwrap_or_default())
                == Some(role.to_string())
        });
    }

    /// How many `WAIT`s node `i` has run (`INFO commandstats`).
    pub fn waits_on(&self, i: usize) -> u64 {
        let stats: String = self.nodes[i]
            .query(redis::cmd("INFO").arg("commandstats"))
            .expect("INFO answers");
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// A command on any running node.
    pub fn query_any<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        self.running().find_map(|n| n.query(cmd)).expect("some node answers")
    }

    fn running(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.server.is_running())
    }
}

impl Node {
    /// Starts the node on its port, with its own `nodes.conf` and data.
    fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port"])
            .arg(self.server.port.to_string())
            .args(["--cluster-enabled", "yes", "--cluster-port"])
            .arg(self.bus_port.to_string())
            .args(["--cluster-config-file", "nodes.conf", "--cluster-node-timeout"])
            .arg(NODE_TIMEOUT_MS.to_string())
            // A replica may take over however long it was cut off.
            .args(["--cluster-replica-validity-factor", "0"])
            .args(["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])
            // Sync a new replica at once, not after the default 5 s wait for others.
            .args(["--repl-diskless-sync-delay", "0"]);
        self.server.start(cmd);
    }

    fn kill(&mut self) {
        self.server.kill();
    }

    /// One command on this node alone (no redirects followed).
    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Option<T> {
        self.server.query(cmd)
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}
