//! Settles no replica has acknowledged yet: a queue in this process's
//! memory, lost with the process. It is what lets a settle survive a
//! Redis failover.
//!
//! Replication is asynchronous: a settle the primary acknowledged and then
//! lost with it (killed before its replica received the write) is spend the
//! team could spend again. So each settle, on a primary that has replicas,
//! is followed on the same connection by `WAIT 1 <ms>`: once a replica has
//! it, a failover keeps it. A settle no replica acknowledged in time (a
//! stalled replication link whose ACKs still flow, so
//! `min-replicas-max-lag` does not trip) is kept here, in memory, and
//! applied again every [`REPLAY_EVERY`] to whatever primary the Sentinels
//! name then — idempotently, by reservation id (the `settled` mark) — until
//! a replica acknowledges it or the primary it lands on has none (then its
//! AOF is all there is to wait for).
//!
//! Settles run on a connection of their own (`with_settle_connection`):
//! a `WAIT` no replica answers blocks its connection for `WAIT_MS`, and
//! reserves must not queue behind it. Reserves are not waited for.
//!
//! Nothing here is written to disk: the queue is lost with the process.
//! Each settle in it was applied once already, so a gateway replica that
//! dies with settles in it loses them only if the Redis primary dies too
//! before its replica caught up.
//! On a Redis Cluster settles are not waited for (docs/operations.md).

use super::{millis, FORGET_PER_SETTLE, WALK_PER_SETTLE};
use crate::clock::Clock;
use crate::metrics::RedisOp;
use crate::redis_backend::keys::{Keys, LedgerKey};
use crate::redis_backend::{BackendError, RedisBackend};
use redis::Script;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How often unacknowledged settles are applied again.
const REPLAY_EVERY: Duration = Duration::from_secs(1);

/// The longest a settle waits for a replica's acknowledgement (bounded
/// by a quarter of the ledger's Redis timeout).
const WAIT_MS: u64 = 200;

/// How long a primary's replica count is trusted.
const REPLICAS_FRESH: Duration = Duration::from_secs(2);

/// Settles kept at most; past it the oldest is dropped (logged): a
/// queue that grows this far means no replica has acknowledged
/// anything for a long while, which `/readyz` and the alerts show.
const MAX_PENDING: usize = 100_000;

/// One settle, as it is applied (again).
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) id: u64,
    pub(super) team: String,
    pub(super) actual: u64,
    pub(super) route: &'static str,
    pub(super) day: u32,
}

pub(super) struct Settler {
    redis: Arc<RedisBackend>,
    keys: Keys,
    script: Script,
    clock: Clock,
    /// A reservation's term, set by `quota.reservation_lease_secs`:
    /// settled marks are kept for twice it.
    term: Duration,
    /// Applied, not yet acknowledged by a replica.
    unacked: Mutex<VecDeque<Pending>>,
    /// The primary's connected replicas as last read, and when.
    replicas: Mutex<Option<(i64, Instant)>>,
}

impl Settler {
    /// Must run inside a tokio runtime: it starts the replay task.
    pub(super) fn new(
        redis: Arc<RedisBackend>,
        keys: Keys,
        script: Script,
        clock: Clock,
        term: Duration,
    ) -> Arc<Settler> {
        let settler = Arc::new(Settler {
            redis,
            keys,
            script,
            clock,
            term,
            unacked: Mutex::default(),
            replicas: Mutex::default(),
        });
        tokio::spawn(replay(Arc::downgrade(&settler)));
        settler
    }

    /// Applies one settle; `Ok(true)` once it is durable: a replica
    /// acknowledged it, or the primary has none to wait for.
    pub(super) async fn apply(&self, p: &Pending) -> Result<bool, BackendError> {
        let replicas = self.replicas(true).await;
        let keys = LedgerKey::ALL.map(|k| self.keys.ledger(&p.team, k));
        let now = self.clock.now_ms();
        let mut inv = self.script.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        inv.arg(p.id)
            .arg(p.actual)
            .arg(p.day)
            .arg(p.route)
            .arg(p.day.saturating_sub(crate::ledger::ROLLING_DAYS + 32))
            .arg(now)
            .arg(now.saturating_sub(millis(self.term).saturating_mul(2)))
            .arg(FORGET_PER_SETTLE)
            .arg(WALK_PER_SETTLE);
        let wait_ms = self.wait_ms();
        self.redis
            .call(RedisOp::LedgerSettle, |mut c| async move {
                inv.invoke_async::<u64>(&mut c).await?;
                if replicas == 0 {
                    return Ok(true);
                }
                // The same connection: WAIT counts the replicas that have
                // every write it made, the settle's included.
                let acked: i64 = redis::cmd("WAIT").arg(1).arg(wait_ms).query_async(&mut c).await?;
                Ok(acked >= 1)
            })
            .await
    }

    /// How long a write waits for a replica's acknowledgement: [`WAIT_MS`],
    /// at most a quarter of the Redis timeout the call runs under.
    fn wait_ms(&self) -> u64 {
        WAIT_MS.min(millis(self.redis.timeout()) / 4).max(1)
    }

    /// Keeps a settle no replica acknowledged, to be applied again.
    pub(super) fn keep(&self, p: Pending) {
        tracing::warn!(team = %p.team, credits = p.actual, "ledger settle not acknowledged by a replica: kept to be applied again");
        let mut unacked = self.lock();
        if unacked.len() >= MAX_PENDING {
            if let Some(dropped) = unacked.pop_front() {
                tracing::error!(team = %dropped.team, credits = dropped.actual, "ledger journal full: the oldest unacknowledged settle is no longer re-applied");
            }
        }
        unacked.push_back(p);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        self.unacked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The primary's connected replicas, as read within
    /// [`REPLICAS_FRESH`]. For a settle (`recheck_none`) "none" is read
    /// again every time, so a replica that has just (re)joined is waited
    /// for at once (a count above 0 that is stale costs nothing: a settle
    /// that finds no replica is kept anyway); a reserve takes the
    /// cached figure either way (no extra round trip on a Redis without
    /// replicas). Unknown (the read failed): one is assumed, erring towards
    /// waiting.
    async fn replicas(&self, recheck_none: bool) -> i64 {
        let cached = *self.replicas.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((n, at)) = cached {
            if (n > 0 || !recheck_none) && at.elapsed() < REPLICAS_FRESH {
                return n;
            }
        }
        let n = self.redis.connected_replicas(RedisOp::LedgerCheck).await.unwrap_or(1);
        *self.replicas.lock().unwrap_or_else(|p| p.into_inner()) = Some((n, Instant::now()));
        n
    }

    fn forget_replicas(&self) {
        *self.replicas.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Applies the unacknowledged settles again every [`REPLAY_EVERY`] until
/// each is acknowledged. Ends with the ledger.
async fn replay(settler: Weak<Settler>) {
    loop {
        tokio::time::sleep(REPLAY_EVERY).await;
        let Some(s) = settler.upgrade() else { return };
        let pending: Vec<Pending> = s.lock().drain(..).collect();
        if pending.is_empty() {
            continue;
        }
        // The primary may be another one now.
        s.forget_replicas();
        let mut kept = Vec::new();
        for p in pending {
            match s.apply(&p).await {
                Ok(true) => {
                    tracing::info!(team = %p.team, credits = p.actual, "ledger settle re-applied and acknowledged")
                }
                _ => kept.push(p),
            }
        }
        let mut unacked = s.lock();
        for p in kept.into_iter().rev() {
            unacked.push_front(p);
        }
    }
}
