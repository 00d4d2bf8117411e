//! Commands about the whole keyspace rather than one key: they must reach
//! every primary of a cluster (a standalone Redis is the one-primary case).
//! Used off the request path: cache purge (`/admin/cache/purge`), the cache
//! gauges at scrape time, and the ledger's readiness check (`/readyz`).

use super::conn::Conn;
use super::{BackendError, RedisBackend};
use crate::metrics::RedisOp;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue, Value};

/// Keys a purge asks each SCAN step for.
const SCAN_COUNT: u64 = 500;

impl RedisBackend {
    /// `cmd` run once on every primary: `(address, answer)` pairs. A
    /// standalone Redis answers once, with an empty address.
    async fn each_primary<T>(&self, op: RedisOp, cmd: Cmd) -> Result<Vec<(String, T)>, BackendError>
    where
        T: FromRedisValue + Send + 'static,
    {
        self.call(op, |conn| async move {
            match conn {
                Conn::Standalone(mut c) => Ok(vec![(String::new(), cmd.query_async(&mut c).await?)]),
                Conn::Sentinel(mut c) => Ok(vec![(String::new(), cmd.query_async(&mut c).await?)]),
                Conn::Cluster(mut c) => {
                    // No response policy: redis-rs answers with a map of
                    // node address → that node's reply.
                    let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                    let Value::Map(replies) = c.route_command(cmd, all).await? else {
                        return Err(redis::RedisError::from((
                            redis::ErrorKind::Client,
                            "expected one reply per primary",
                        )));
                    };
                    let mut out = Vec::with_capacity(replies.len());
                    for (addr, reply) in replies {
                        out.push((String::from_redis_value(addr)?, T::from_redis_value(reply)?));
                    }
                    Ok(out)
                }
            }
        })
        .await
    }

    /// Deletes every key matching `pattern` with SCAN + UNLINK in batches
    /// (never KEYS, which blocks a shared Redis), on every primary. Returns
    /// how many keys went; stops early (keeping the count) if Redis fails.
    pub(crate) async fn scan_delete(&self, op: RedisOp, pattern: &str) -> u64 {
        let Ok(primaries) = self.each_primary::<Value>(op, redis::cmd("PING")).await else {
            return 0;
        };
        let mut removed = 0;
        for (addr, _) in primaries {
            removed += self.scan_delete_on(op, &addr, pattern).await;
        }
        removed
    }

    async fn scan_delete_on(&self, op: RedisOp, addr: &str, pattern: &str) -> u64 {
        let node = addr.rsplit_once(':').and_then(|(host, port)| {
            Some(SingleNodeRoutingInfo::ByAddress {
                host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
                port: port.parse().ok()?,
            })
        });
        let mut cursor: u64 = 0;
        let mut removed = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(SCAN_COUNT);
            let node = node.clone();
            let step: Result<(u64, Vec<String>), _> = self
                .call(op, |conn| async move {
                    match (conn, node) {
                        (Conn::Cluster(mut c), Some(node)) => {
                            let reply = c.route_command(scan, RoutingInfo::SingleNode(node)).await?;
                            Ok(FromRedisValue::from_redis_value(reply)?)
                        }
                        (mut c, _) => scan.query_async(&mut c).await,
                    }
                })
                .await;
            let Ok((next, keys)) = step else {
                return removed;
            };
            if !keys.is_empty() {
                let n = keys.len() as u64;
                // The cluster client splits a multi-key UNLINK by slot.
                let gone = self
                    .call(op, |mut c| async move {
                        redis::cmd("UNLINK").arg(keys).query_async::<u64>(&mut c).await
                    })
                    .await;
                removed += gone.unwrap_or(0).min(n);
            }
            if next == 0 {
                return removed;
            }
            cursor = next;
        }
    }

    /// Keys and used memory summed over every primary (the whole Redis: it
    /// may hold the ledger and other data too).
    pub(crate) async fn key_and_memory_totals(&self, op: RedisOp) -> Result<(i64, i64), BackendError> {
        let keys: i64 = self
            .each_primary::<i64>(op, redis::cmd("DBSIZE"))
            .await?
            .iter()
            .map(|(_, n)| n)
            .sum();
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        let used = self
            .each_primary::<String>(op, info)
            .await?
            .iter()
            .map(|(_, text)| info_field(text, "used_memory").unwrap_or(0))
            .sum();
        Ok((keys, used))
    }

    /// Whether the ledger can know: every primary reachable and, on a
    /// cluster, every slot covered. `Ok` carries a note on durability.
    pub(crate) async fn check_ledger_ready(&self) -> Result<&'static str, String> {
        if self.is_cluster() {
            let mut info = redis::cmd("CLUSTER");
            info.arg("INFO");
            let states = self
                .each_primary::<String>(RedisOp::LedgerCheck, info)
                .await
                .map_err(|e| format!("ledger redis cluster: {e}"))?;
            if let Some((addr, _)) = states
                .iter()
                .find(|(_, text)| !text.lines().any(|l| l.trim() == "cluster_state:ok"))
            {
                return Err(format!(
                    "ledger redis cluster: primary {addr} reports the cluster down (a slot is not covered)"
                ));
            }
        }
        let mut get = redis::cmd("CONFIG");
        get.arg("GET").arg("appendonly");
        let aof = self.each_primary::<Vec<String>>(RedisOp::LedgerCheck, get).await;
        match aof {
            Ok(nodes) if nodes.iter().any(|(_, v)| v.get(1).map(String::as_str) != Some("yes")) => {
                return Ok("ok, but Redis appendonly is off: spend is lost if Redis restarts")
            }
            Ok(_) => {}
            // CONFIG may be disabled on managed Redis: a PING decides.
            Err(_) => {
                self.each_primary::<Value>(RedisOp::LedgerCheck, redis::cmd("PING"))
                    .await
                    .map_err(|e| match self.conns.first() {
                        Conn::Sentinel(_) => format!("ledger redis sentinel: {}", self.unready_reason()),
                        _ => format!("ledger redis: {e}"),
                    })?;
                return Ok("ok (persistence unknown)");
            }
        }
        if self.is_cluster() && !self.every_primary_has_a_synced_replica().await {
            return Ok("ok, but a primary has no replica in sync: a failover now would lose its spend");
        }
        Ok("ok")
    }

    /// How many replicas the primary has connected (`INFO replication`:
    /// `connected_slaves`). On a Cluster, the fewest any primary has: a
    /// settle is waited for (its `WAIT` pipelined behind it, so sent to its
    /// slot's primary) once every primary has one to wait for.
    pub(crate) async fn connected_replicas(&self, op: RedisOp) -> Result<i64, BackendError> {
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let nodes = self.each_primary::<String>(op, info).await?;
        Ok(nodes
            .iter()
            .map(|(_, text)| info_field(text, "connected_slaves").unwrap_or(0))
            .min()
            .unwrap_or(0))
    }

    /// Each primary streams to at least one replica that finished its sync
    /// (`INFO replication`: a `slaveN:` line with `state=online`).
    async fn every_primary_has_a_synced_replica(&self) -> bool {
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        self.each_primary::<String>(RedisOp::LedgerCheck, info)
            .await
            .is_ok_and(|nodes| {
                nodes.iter().all(|(_, text)| {
                    text.lines()
                        .any(|l| l.starts_with("slave") && l.contains("state=online"))
                })
            })
    }
}

/// A numeric field of an `INFO` reply.
fn info_field(text: &str, name: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn info_field_reads_one_number() {
        let text = "# Memory\r\nused_memory:1024\r\nused_memory_human:1K\r\n";
        assert_eq!(super::info_field(text, "used_memory"), Some(1024));
        assert_eq!(super::info_field(text, "maxmemory"), None);
    }
}
