//! A Redis connection, to a standalone Redis or a Redis Cluster ([`conn`]),
//! or a small pool of them ([`pool`]), with a short timeout on every call and a circuit breaker so a dead Redis
//! costs no latency: after a few consecutive failures calls fail at once for
//! a cool-down, then one probe call is let through to see if it is back.
//! Keyspace-wide commands (purge, gauges, readiness) are in [`nodes`].
//!
//! `app` builds one per user, each with its own breaker, so that one user's
//! failures never open the breaker another needs: the cache (L2 tier and
//! fetch leases), the Redis ledger, and the shared upstream rate.
//!
//! Every Redis key, and the `{tag}` that keeps a multi-key script's or
//! command's keys in one Cluster hash slot, is spelled in `keys`:
//! `{team}` for the ledger, `{rate}` for the shared upstream rate,
//! `{<key hash>}` for a cache entry and its fetch lease.

mod conn;
pub(crate) mod keys;
mod nodes;
mod pool;
mod sentinel;
mod tls;

pub(crate) use conn::{Conn, Target, Tls};
pub(crate) use tls::TlsFiles;

use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::metrics::RedisOp;
use pool::Pool;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Consecutive failures that open the breaker.
const TRIP_AFTER: u32 = 3;

#[derive(Debug)]
pub(crate) enum BackendError {
    /// The breaker is open: Redis failed recently, not tried.
    Open,
    /// The call took longer than the timeout.
    Timeout,
    /// Redis answered with an error or the connection failed.
    Redis(redis::RedisError),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Open => f.write_str("circuit open"),
            BackendError::Timeout => f.write_str("timed out"),
            // The error kind only: a message could echo a URL with a password.
            BackendError::Redis(e) => write!(f, "redis error ({:?})", e.kind()),
        }
    }
}

pub struct RedisBackend {
    /// One or more multiplexed connections to the same target; calls are
    /// spread over them so that one socket (and the one task that drives
    /// it) does not cap the calls of every core.
    conns: Pool,
    /// The sockets `conns` can hold open at once (descriptors kept for
    /// them at start, `server::fit_descriptors`).
    sockets: usize,
    timeout: Duration,
    cool_down: Duration,
    failures: AtomicU32,
    /// Unix ms until which the breaker stays open (0: closed).
    open_until_ms: AtomicU64,
    metrics: Arc<Metrics>,
}

impl RedisBackend {
    /// Connects lazily: a Redis that is down at start-up does not stop the
    /// gateway, the first calls just fail (and open the breaker).
    pub fn new(url: &str, timeout: Duration, metrics: Arc<Metrics>) -> Result<RedisBackend, String> {
        RedisBackend::with_tls("redis url", url, &Tls::default(), timeout, 1, metrics)
    }

    /// [`RedisBackend::new`] with the `[redis]` settings and `connections`
    /// connections (at least one). Over TLS, one probe first: a certificate
    /// that does not match is an error here (naming the setting), not a
    /// breaker that stays open. `key` is the URL's setting, for errors.
    pub(crate) fn with_tls(
        key: &str,
        url: &str,
        tls: &Tls,
        timeout: Duration,
        connections: usize,
        metrics: Arc<Metrics>,
    ) -> Result<RedisBackend, String> {
        let target = Target::parse(url).map_err(|e| format!("{key}: {e}"))?;
        tls.files.probe(key, &target.tls_addresses())?;
        let conns = (0..connections.max(1))
            .map(|_| Conn::open(&target, tls, timeout))
            .collect::<redis::RedisResult<Vec<_>>>()
            .map_err(|e| format!("{key}: {:?}", e.kind()))?;
        Ok(RedisBackend {
            sockets: conns.len() * target.sockets_per_connection(),
            conns: Pool::new(conns),
            timeout,
            cool_down: Duration::from_secs(2),
            failures: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
            metrics,
        })
    }

    /// The sockets this backend's connections can hold open at once.
    pub(crate) fn sockets(&self) -> usize {
        self.sockets
    }

    /// How long a call waits for its reply.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs one command (or pipeline, or script invocation) under the
    /// timeout and the breaker, on the pool's next connection. `op` labels
    /// the error metric.
    pub(crate) async fn call<T, F, Fut>(&self, op: RedisOp, f: F) -> Result<T, BackendError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        self.call_on(self.conns.next(), op, f).await
    }

    /// [`RedisBackend::call`] on the pool's connection `conn`.
    async fn call_on<T, F, Fut>(&self, conn: &Conn, op: RedisOp, f: F) -> Result<T, BackendError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let open_until = self.open_until_ms.load(Ordering::Acquire);
        let now = now_ms();
        if open_until > now {
            return Err(BackendError::Open);
        }
        if open_until != 0 {
            // Half-open: exactly one caller wins the probe; others keep failing fast.
            let probe_until = now + self.cool_down.as_millis() as u64;
            if self
                .open_until_ms
                .compare_exchange(open_until, probe_until, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return Err(BackendError::Open);
            }
        }
        let result = match tokio::time::timeout(self.timeout, f(conn.clone())).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(BackendError::Redis(e)),
            Err(_) => Err(BackendError::Timeout),
        };
        match &result {
            // Read before written: a store on every success would bounce
            // these cache lines between the cores on every Redis call.
            Ok(_) => {
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Release);
                }
                if self.open_until_ms.load(Ordering::Relaxed) != 0 {
                    self.open_until_ms.store(0, Ordering::Release);
                }
            }
            Err(e) => self.failed(op, e),
        }
        result
    }

    /// As [`RedisBackend::call`], tried once more when the connection had
    /// dropped: after a Redis restart the first call of an idle replica
    /// finds its old connection dead (the manager reconnects only then), and
    /// a budget must not answer 503 for that. After a Sentinel failover the
    /// old connection may also reach a demoted primary (`READONLY`): the
    /// Sentinel connection is dropped then and the retry asks the Sentinels
    /// again, so the first call after a failover succeeds. Once: a Redis
    /// that is down stays a quick failure.
    /// Only for reads and idempotent writes (a script that runs twice
    /// counts once: reserve by id, settle and end by their marks). The
    /// retry goes to the same connection of the pool, the one that has just
    /// reconnected: after a restart the others are as stale as it was.
    pub(crate) async fn call_reconnecting<T, F, Fut>(&self, op: RedisOp, f: F) -> Result<T, BackendError>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.conns.next();
        match self.call_on(conn, op, &f).await {
            Err(BackendError::Redis(e)) if stale_connection(&e) => {
                tracing::info!(
                    op = op.as_str(),
                    "redis connection dropped: retrying once on a fresh one"
                );
                self.call_on(conn, op, f).await
            }
            other => other,
        }
    }

    fn failed(&self, op: RedisOp, e: &BackendError) {
        self.metrics.redis_error(op);
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= TRIP_AFTER {
            let until = now_ms() + self.cool_down.as_millis() as u64;
            self.open_until_ms.store(until, Ordering::Release);
        }
        tracing::warn!(op = op.as_str(), error = %e, failures, "redis call failed");
    }

    /// True for a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conns.first(), Conn::Cluster(_))
    }

    /// Why a failed call failed, for `/readyz`: a Sentinel that named no
    /// primary says so; otherwise just "unreachable". Never a URL.
    pub(crate) fn unready_reason(&self) -> String {
        // Each connection of the pool asks the Sentinels on its own: the
        // first that has a reason gives it.
        self.conns
            .iter()
            .find_map(|c| match c {
                Conn::Sentinel(s) => s.last_error(),
                _ => None,
            })
            .unwrap_or_else(|| "unreachable".into())
    }

    /// PING under the breaker: readiness probes and recovery.
    pub(crate) async fn ping(&self) -> Result<(), BackendError> {
        self.call(RedisOp::Ping, |mut c| async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        })
        .await
        .map(|_| ())
    }
}

/// An error of a connection from before a restart or a failover: dropped,
/// or to a primary since demoted.
fn stale_connection(e: &redis::RedisError) -> bool {
    e.is_connection_dropped()
        || e.is_io_error()
        || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}
