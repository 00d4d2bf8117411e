//! The connection under [`super::RedisBackend`]: one standalone Redis
//! (redis-rs's auto-reconnecting `ConnectionManager`) or a Redis Cluster
//! (redis-rs's async cluster client, which follows `MOVED`/`ASK` and
//! re-reads the slot map after a failover). Both sit behind one
//! [`ConnectionLike`], so every command, pipeline and script of the cache,
//! the leases, the ledger and the shared rate runs unchanged on either.
//!
//! The URL picks the kind. A cluster is spelled
//! `redis+cluster://[user:password@]host1:port1,host2:port2,...`: one string
//! fits the existing `*.redis_url` keys and their environment variables,
//! the credentials are written once for every node, it reads like the
//! `redis+unix://` scheme redis-rs already takes, and the comma-separated
//! seed list is what Lettuce and most cluster clients accept. The seeds only
//! bootstrap: the client learns every node from `CLUSTER SLOTS`.
//!
//! TLS is the `rediss` spelling of each (`rediss://`, `rediss+cluster://`,
//! `rediss+sentinel://`), with the files of `[redis]` ([`super::tls`]); a
//! Sentinel-watched primary is [`super::sentinel`].

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};
use std::time::Duration;

use super::sentinel::{SentinelConn, SentinelTarget};
use super::tls::TlsFiles;

/// The scheme of a cluster URL.
const CLUSTER_SCHEME: &str = "redis+cluster://";
/// The scheme of a cluster URL over TLS.
const TLS_CLUSTER_SCHEME: &str = "rediss+cluster://";

/// What a `redis_url` points at. No `Debug` with the URLs: they may carry
/// a password.
#[derive(PartialEq)]
pub(crate) enum Target {
    /// One server (or a proxy in front of several): the URL as given.
    Standalone(String),
    /// Seed nodes of a cluster, each as a `redis://` (or `rediss://`) URL
    /// with the credentials.
    Cluster(Vec<String>),
    /// The primary the Sentinels name.
    Sentinel(SentinelTarget),
}

impl Target {
    /// Parses a `redis_url`. Errors never echo the URL: it may hold a password.
    pub(crate) fn parse(url: &str) -> Result<Target, String> {
        if let Some(sentinel) = SentinelTarget::parse(url) {
            return sentinel.map(Target::Sentinel);
        }
        let (rest, scheme) = match (url.strip_prefix(CLUSTER_SCHEME), url.strip_prefix(TLS_CLUSTER_SCHEME)) {
            (Some(rest), _) => (rest, "redis"),
            (_, Some(rest)) => (rest, "rediss"),
            _ => {
                url.into_connection_info()
                    .map_err(|e| format!("not a valid redis URL ({:?})", e.kind()))?;
                return Ok(Target::Standalone(url.to_string()));
            }
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            // A cluster has only database 0 and takes no per-URL options.
            return Err("a cluster URL is redis+cluster://[user:password@]host:port,host:port".into());
        }
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (format!("{auth}@"), hosts),
            None => (String::new(), rest),
        };
        let nodes: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| format!("{scheme}://{auth}{h}"))
            .collect();
        if nodes.is_empty() {
            return Err("a cluster URL needs at least one host:port".into());
        }
        for node in &nodes {
            node.as_str()
                .into_connection_info()
                .map_err(|e| format!("a cluster seed node is not host:port ({:?})", e.kind()))?;
        }
        Ok(Target::Cluster(nodes))
    }

    /// The addresses a TLS target is first reached at (the start-up probe):
    /// empty when it is not TLS. A Sentinel's primary is known only later.
    /// The sockets one connection to this target can hold open: one to a
    /// standalone server; to a Sentinel-watched primary, that one and one to
    /// a Sentinel while it asks; to a cluster, one per node, and a cluster
    /// has at least three primaries whatever its URL names as seeds.
    pub(super) fn sockets_per_connection(&self) -> usize {
        match self {
            Target::Standalone(_) => 1,
            Target::Sentinel(_) => 2,
            Target::Cluster(seeds) => seeds.len().max(3),
        }
    }

    pub(super) fn tls_addresses(&self) -> Vec<(String, u16)> {
        match self {
            Target::Standalone(url) => super::tls::tls_address(url).into_iter().collect(),
            Target::Cluster(nodes) => nodes.iter().filter_map(|n| super::tls::tls_address(n)).collect(),
            Target::Sentinel(s) if s.tls => s.sentinels.clone(),
            Target::Sentinel(_) => Vec::new(),
        }
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Standalone(_) => f.write_str("Standalone(<redacted>)"),
            Target::Cluster(nodes) => write!(f, "Cluster({} seeds, <redacted>)", nodes.len()),
            Target::Sentinel(s) => write!(f, "Sentinel({s:?})"),
        }
    }
}

/// A connection of either kind; cheap to clone (both are handles to one
/// multiplexed connection per server).
#[derive(Clone)]
pub(crate) enum Conn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConn),
}

impl Conn {
    /// Connects lazily: nothing is contacted here, so a Redis that is down
    /// at start-up does not stop the gateway.
    pub(super) fn open(target: &Target, tls: &Tls, timeout: Duration) -> redis::RedisResult<Conn> {
        let connect_timeout = timeout.max(Duration::from_millis(200));
        match target {
            Target::Standalone(url) => {
                let client = match tls.files.certificates() {
                    Some(certs) if url.starts_with("rediss") => redis::Client::build_with_tls(url.as_str(), certs)?,
                    _ => redis::Client::open(url.as_str())?,
                };
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    // No response timeout of the manager's own: every call
                    // is bounded by `RedisBackend::call`'s (the same
                    // duration), and a second timer per command was ~1.5k
                    // instructions of a Redis-tier hit (callgrind). Either
                    // one's expiry leaves the connection as it is.
                    .set_response_timeout(None)
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                Ok(Conn::Standalone(ConnectionManager::new_lazy_with_config(
                    client, config,
                )?))
            }
            Target::Cluster(nodes) => {
                // Retries follow MOVED/ASK/TRYAGAIN and ride out a failover;
                // short waits, because every call is bounded by `timeout`
                // anyway (redis-rs's default first wait is over a second).
                let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .retries(4)
                    .min_retry_wait(10)
                    .max_retry_wait(250)
                    .retry_wait_formula(10, 2);
                if let Some(certs) = tls.files.certificates().filter(|_| nodes[0].starts_with("rediss")) {
                    builder = builder.certs(certs);
                }
                let client = builder.build()?;
                let config = ClusterConfig::new()
                    .set_connection_timeout(connect_timeout)
                    .set_response_timeout(timeout);
                Ok(Conn::Cluster(client.get_pending_async_connection_with_config(config)))
            }
            Target::Sentinel(s) => {
                let login = (tls.sentinel_username.as_deref(), tls.sentinel_password.as_deref());
                Ok(Conn::Sentinel(SentinelConn::open(
                    s,
                    &tls.files,
                    login,
                    timeout,
                    connect_timeout,
                )?))
            }
        }
    }
}

/// `[redis]` as the connections use it: the TLS files, read once, and the
/// Sentinels' own login. No `Debug`: keys and passwords.
#[derive(Clone, Default)]
pub(crate) struct Tls {
    pub(crate) files: TlsFiles,
    pub(crate) sentinel_username: Option<String>,
    pub(crate) sentinel_password: Option<String>,
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn a_plain_url_is_standalone() {
        let t = Target::parse("redis://:pw@h:6379/2").expect("valid");
        assert!(t == Target::Standalone("redis://:pw@h:6379/2".into()));
        assert!(!format!("{t:?}").contains("pw"), "Debug hides the password");
    }

    #[test]
    fn a_cluster_url_gives_every_seed_the_credentials() {
        let t = Target::parse("redis+cluster://u:p%40ss@a:7000, b:7001 ,[::1]:7002/").expect("valid");
        assert!(
            t == Target::Cluster(vec![
                "redis://u:p%40ss@a:7000".into(),
                "redis://u:p%40ss@b:7001".into(),
                "redis://u:p%40ss@[::1]:7002".into(),
            ])
        );
    }

    #[test]
    fn bad_cluster_urls_are_refused_without_echoing_them() {
        for url in [
            "redis+cluster://",
            "redis+cluster://:secret@",
            "redis+cluster://:secret@h:1/3",
            "redis+cluster://:secret@h:1?tls=1",
            "redis+cluster://:secret@h:notaport",
        ] {
            let e = Target::parse(url).expect_err(url);
            assert!(!e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn tls_urls_keep_tls_for_every_seed() {
        let t = Target::parse("rediss://u:pw@h:6380").expect("valid");
        assert!(t == Target::Standalone("rediss://u:pw@h:6380".into()));
        assert_eq!(t.tls_addresses(), vec![("h".to_string(), 6380)]);
        let c = Target::parse("rediss+cluster://u:pw@a:7000,b:7001").expect("valid");
        assert!(c == Target::Cluster(vec!["rediss://u:pw@a:7000".into(), "rediss://u:pw@b:7001".into()]));
        assert_eq!(c.tls_addresses().len(), 2);
        assert!(Target::parse("redis://h:1").expect("valid").tls_addresses().is_empty());
        let s = Target::parse("redis+sentinel://:pw@a:26379/mymaster").expect("valid");
        assert!(!format!("{s:?}").contains("pw"), "Debug hides the password");
    }

    #[test]
    fn a_bad_standalone_url_is_refused() {
        assert!(Target::parse("http://h:6379").is_err());
    }
}
