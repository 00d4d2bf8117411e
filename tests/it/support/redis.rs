//! A real `redis-server` for one test: its own unix socket in a temp dir,
//! killed on drop, and killable (and restartable on the same socket) mid-test.

use super::redis_proc::spawn_redis_server;
use super::wait::{eventually, eventually_blocking};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

/// The replicas sharing the upstream rate, as `redis_backend::keys` spells
/// it under the harness's default prefix.
const RATE_REPLICAS: &str = "pgw:{rate}:upstream:replicas";

pub struct RedisServer {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts `redis-server` listening only on a unix socket in a fresh temp dir.
    pub fn start() -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir for redis");
        let mut server = RedisServer { dir, child: None };
        server.spawn();
        server
    }

    /// The socket path; the same across `kill` and `restart`.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// A URL the `redis` crate understands.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    /// Stops the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// Starts the server again on the same socket (data is not kept).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing
    /// answers, as a Redis stalled by a fork, a swap storm or a paused VM.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, sig: &str) {
        let child = self.child.as_ref().expect("redis is running");
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{sig} redis failed");
    }

    /// Keeps Redis busy for `secs` (`DEBUG SLEEP` on a connection of its
    /// own, in a thread): every other client waits, its commands queued.
    /// Returns once Redis is seen busy (a PING on another connection does
    /// not answer within 100 ms); join the handle for the end of the sleep.
    pub fn busy_for(&self, secs: f64) -> std::thread::JoinHandle<()> {
        let url = self.url();
        let sleeper = std::thread::spawn(move || {
            let client = redis::Client::open(url).expect("redis url");
            let mut c = client.get_connection().expect("a connection");
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(secs)
                .query::<()>(&mut c)
                .expect("DEBUG SLEEP");
        });
        let socket = self.socket();
        eventually_blocking("redis is busy", Duration::from_secs(5), || {
            use std::io::{Read, Write};
            let Ok(mut s) = std::os::unix::net::UnixStream::connect(&socket) else {
                return false;
            };
            let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
            let mut buf = [0u8; 7];
            s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_err()
        });
        sleeper
    }

    /// The Redis of `n` gateways: none for one alone (its file ledger),
    /// a fresh server for replicas to share.
    pub fn for_replicas(n: usize) -> Option<RedisServer> {
        (n > 1).then(RedisServer::start)
    }

    /// Reservations `team` holds in the Redis ledger (its calls in
    /// flight); `None` while Redis does not answer.
    pub async fn holds(&self, team: &str) -> Option<u64> {
        let mut c = self.connection().await?;
        redis::cmd("HLEN")
            .arg(format!("pgw:l:{{{team}}}:held"))
            .query_async(&mut c)
            .await
            .ok()
    }

    /// Polls until `team` holds a reservation (`what`: the call that
    /// should hold it), for up to `limit`.
    pub async fn wait_held(&self, team: &str, what: &str, limit: Duration) {
        eventually(what, limit, || async { self.holds(team).await.is_some_and(|n| n > 0) }).await;
    }

    /// The replicas the shared rate counts now (`pgw:{rate}:upstream:replicas`,
    /// members dropped only when a replica's script next runs); `None`
    /// while Redis does not answer.
    pub async fn rate_replicas(&self) -> Option<u64> {
        let mut c = self.connection().await?;
        redis::cmd("ZCARD").arg(RATE_REPLICAS).query_async(&mut c).await.ok()
    }

    /// Files a replica `id` in the shared rate's set as last seen `ago`
    /// before now by Redis's clock: a replica gone quiet, without waiting.
    pub async fn rate_replica_seen(&self, id: &str, ago: Duration) {
        let mut c = self.connection().await.expect("redis");
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.expect("TIME");
        let now_ms = secs * 1000 + micros / 1000;
        let _: () = redis::cmd("ZADD")
            .arg(RATE_REPLICAS)
            .arg(now_ms - ago.as_millis() as u64)
            .arg(id)
            .query_async(&mut c)
            .await
            .expect("ZADD");
    }

    /// Whether the shared rate's set still holds replica `id`.
    pub async fn rate_replica_held(&self, id: &str) -> bool {
        let mut c = self.connection().await.expect("redis");
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(RATE_REPLICAS)
            .arg(id)
            .query_async(&mut c)
            .await
            .expect("ZSCORE");
        score.is_some()
    }

    /// Cross-replica leases held now.
    pub async fn leases(&self) -> usize {
        let mut c = self.connection().await.expect("redis");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("pgw:lease:*")
            .query_async(&mut c)
            .await
            .expect("KEYS");
        keys.len()
    }

    /// Deletes every key matching `pattern` (`KEYS`: a test's small
    /// Redis): what a release that never wrote them leaves. Answers how
    /// many there were.
    pub async fn delete_matching(&self, pattern: &str) -> usize {
        let mut c = self.connection().await.expect("redis");
        let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query_async(&mut c).await.expect("KEYS");
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut c).await.expect("DEL");
        }
        keys.len()
    }

    async fn connection(&self) -> Option<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(self.url()).ok()?;
        client.get_multiplexed_async_connection().await.ok()
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn spawn(&mut self) {
        let socket = self.socket();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .args(["--unixsocketperm", "700", "--save", "", "--appendonly", "no"])
            // `DEBUG SLEEP` makes Redis busy, as a slow script or a big
            // `KEYS` would (issue 39, tests/it/money/stall.rs).
            .args(["--enable-debug-command", "yes"]);
        self.child = Some(spawn_redis_server(&mut cmd, self.dir.path()));
        wait_for_ping(&socket);
    }
}

/// Readiness: the socket answers PING. Polls the socket, not a timer.
fn wait_for_ping(socket: &std::path::Path) {
    use std::io::{Read, Write};
    let what = format!("redis-server answers PING on {}", socket.display());
    eventually_blocking(&what, Duration::from_secs(10), || {
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    })
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
