//! Settles no replica has acknowledged yet: a queue in this process's
//! memory, written through to a durable journal ([`super::journal`],
//! `settles.redb` beside `quota.path`). It is what lets a settle survive a
//! Redis failover, and this gateway's crash during one.
//!
//! Replication is asynchronous: a settle the primary acknowledged and then
//! lost with it (killed before its replica received the write) is spend the
//! team could spend again. So each settle, on a primary that has replicas,
//! is followed by `WAIT 1 <ms>` in the same pipeline (one socket): once a
//! replica has it, a failover keeps it. A settle no replica acknowledged in
//! time (a stalled replication link whose ACKs still flow, so
//! `min-replicas-max-lag` does not trip) is written to the journal (one
//! fsync'd commit, before its caller moves on) and kept here, and applied
//! again every [`REPLAY_EVERY`] to whatever primary the Sentinels name then
//! until a replica acknowledges it (or the primary it lands on has none:
//! then its AOF is all there is to wait for). A gateway that restarts
//! loads the journal and goes on.
//!
//! **Exactly once, however long the stall.** Applying a settle again is
//! idempotent by reservation id (the `settled` mark). Marks are forgotten
//! twice a reservation's term after they were written, which a stall (or a
//! crashed gateway's downtime) can outlast; so a settle applied on a
//! primary that has replicas **pins** its mark for [`PIN`] (its score in
//! `settled_at` is set that far ahead) and unpins it once a replica
//! acknowledged it. A settle that may be applied again keeps its mark for
//! a day; one applied again after that (a gateway down for more than a day
//! with its journal) may count twice: over-, never under-charged.
//!
//! Settles run on a connection of their own (`with_settle_connection`):
//! a `WAIT` no replica answers blocks its connection for `WAIT_MS`, and
//! reserves must not queue behind it. Reserves are not waited for.
//! A replay applies up to [`REPLAY_CHUNK`] settles, then waits once.
//! On a Redis Cluster the same, once every primary has a replica: the
//! `WAIT` rides in the settle's pipeline, which goes to its slot's primary
//! (one pipeline per team, whose keys share one slot).

use super::journal::{Journal, Pending};
use super::{FORGET_PER_SETTLE, WALK_PER_SETTLE};
use crate::clock::{millis, Clock};
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

/// How long the mark of a settle that may be applied again is kept
/// (the mark makes applying it again count nothing).
pub(super) const PIN: Duration = Duration::from_secs(24 * 3600);

/// Settles one replay applies before its one `WAIT`: a call stays well
/// inside the Redis timeout however long the queue.
const REPLAY_CHUNK: usize = 256;

/// How long a primary's replica count is trusted.
const REPLICAS_FRESH: Duration = Duration::from_secs(2);

/// Settles kept at most; past it the oldest is dropped (logged): a
/// queue that grows this far means no replica has acknowledged
/// anything for a long while, which `/readyz` and the alerts show.
const MAX_PENDING: usize = 100_000;

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
    /// Where `unacked` is written through; `None`: memory only.
    journal: Option<Arc<Journal>>,
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
        journal: Option<Journal>,
    ) -> Arc<Settler> {
        let loaded = journal.as_ref().map(|j| match j.load() {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::error!(path = %j.path().display(), error = %e, "ledger settle journal unreadable: its settles are not applied again");
                Vec::new()
            }
        });
        let loaded = loaded.unwrap_or_default();
        if !loaded.is_empty() {
            let credits: u64 = loaded.iter().map(|p| p.actual).sum();
            tracing::warn!(
                settles = loaded.len(),
                credits,
                "ledger: settles no replica acknowledged before this gateway stopped, from its journal: applied again"
            );
        }
        let settler = Arc::new(Settler {
            redis,
            keys,
            script,
            clock,
            term,
            unacked: Mutex::new(loaded.into()),
            journal: journal.map(Arc::new),
            replicas: Mutex::default(),
        });
        tokio::spawn(replay(Arc::downgrade(&settler)));
        settler
    }

    /// Applies one settle; `Ok(true)` once it is durable: a replica
    /// acknowledged it, or the primary has none to wait for. While earlier
    /// settles wait for a replica (a stalled link) it is not waited for
    /// either: `Ok(false)`, kept with them, and the replay's one `WAIT`
    /// covers it (a stall costs each settle a journal commit, not `WAIT_MS`).
    pub(super) async fn apply(&self, p: &Pending) -> Result<bool, BackendError> {
        let wait = self.lock().is_empty();
        self.apply_all(std::slice::from_ref(p), wait).await
    }

    /// Applies `settles` on one connection, then (`wait`) waits once for a
    /// replica: `Ok(true)` once all are durable. On a primary with replicas
    /// each mark is pinned for [`PIN`] until a replica acknowledged it.
    async fn apply_all(&self, settles: &[Pending], wait: bool) -> Result<bool, BackendError> {
        if !self.redis.is_cluster() {
            return self.apply_on_one_node(settles, wait).await;
        }
        // A Cluster pipeline goes to one slot's primary, and its `WAIT`
        // with it: one pipeline per team (a team's keys share its tag).
        let mut teams: Vec<&str> = Vec::new();
        for p in settles {
            if !teams.contains(&p.team.as_str()) {
                teams.push(&p.team);
            }
        }
        let mut durable = true;
        for team in teams {
            let of_team: Vec<Pending> = settles.iter().filter(|p| p.team == team).cloned().collect();
            durable &= self.apply_on_one_node(&of_team, wait).await?;
        }
        Ok(durable)
    }

    /// [`Settler::apply_all`] of settles whose keys are on one node.
    async fn apply_on_one_node(&self, settles: &[Pending], wait: bool) -> Result<bool, BackendError> {
        let replicas = self.replicas(true).await;
        let now = self.clock.now_ms();
        let pin = if replicas == 0 {
            0
        } else {
            now.saturating_add(millis(PIN))
        };
        let invocations: Vec<_> = settles.iter().map(|p| self.invocation(p, now, pin)).collect();
        let marks: Vec<(String, u64)> = settles
            .iter()
            .map(|p| (self.keys.ledger(&p.team, LedgerKey::SettledAt), p.id))
            .collect();
        let wait_ms = self.wait_ms();
        self.redis
            .call(RedisOp::LedgerSettle, |mut c| async move {
                if replicas == 0 || !wait {
                    for inv in &invocations {
                        inv.invoke_async::<u64>(&mut c).await?;
                    }
                    // None to wait for, or kept and waited for by the replay.
                    return Ok(replicas == 0);
                }
                // One pipeline, so one socket: `WAIT` counts the replicas
                // that have every write *its connection* made. Sent apart,
                // a `WAIT` that went out on a socket reconnected after the
                // settle (another call's error or timeout dropped the old
                // one) has no writes to wait for and counts every replica
                // at once: a settle the primary may lose, taken as safe.
                // The script is loaded in front (a primary just promoted
                // has no script cache; settles are few, the load is cheap).
                let mut pipe = redis::pipe();
                pipe.load_script(&self.script).ignore();
                for inv in &invocations {
                    pipe.invoke_script(inv).ignore();
                }
                pipe.cmd("WAIT").arg(1).arg(wait_ms);
                let (acked,): (i64,) = pipe.query_async(&mut c).await?;
                if acked < 1 {
                    return Ok(false);
                }
                // A replica has them: their marks age like any other. Not
                // unpinned (an error, a crash): kept a day, harmless.
                let mut unpin = redis::pipe();
                for (key, id) in &marks {
                    unpin.cmd("ZADD").arg(key).arg("XX").arg(now).arg(*id).ignore();
                }
                if let Err(e) = unpin.query_async::<()>(&mut c).await {
                    tracing::debug!(error = %e, "ledger: settle marks left pinned");
                }
                Ok(true)
            })
            .await
    }

    /// The settle script's call for `p` (`scripts::SETTLE`).
    fn invocation(&self, p: &Pending, now: u64, pin: u64) -> redis::ScriptInvocation<'_> {
        let mut inv = self.script.prepare_invoke();
        for k in LedgerKey::ALL {
            inv.key(self.keys.ledger(&p.team, k));
        }
        inv.arg(p.id)
            .arg(p.actual)
            .arg(p.day)
            .arg(p.route.as_str())
            .arg(p.day.saturating_sub(crate::ledger::ROLLING_DAYS + 32))
            .arg(now)
            .arg(now.saturating_sub(millis(self.term).saturating_mul(2)))
            .arg(FORGET_PER_SETTLE)
            .arg(WALK_PER_SETTLE)
            .arg(pin);
        inv
    }

    /// How long a write waits for a replica's acknowledgement: [`WAIT_MS`],
    /// at most a quarter of the Redis timeout the call runs under.
    fn wait_ms(&self) -> u64 {
        WAIT_MS.min(millis(self.redis.timeout()) / 4).max(1)
    }

    /// Keeps a settle no replica acknowledged, to be applied again: in
    /// the journal (durable when this returns, unless the journal is
    /// unusable: then logged) and in memory.
    pub(super) async fn keep(&self, p: Pending) {
        // Once per stall: the settles after the first are kept without
        // waiting (`apply`).
        if self.lock().is_empty() {
            tracing::warn!(team = %p.team, credits = p.actual, "ledger settle not acknowledged by a replica: kept (journal and memory) and applied again until one does");
        }
        let row = p.clone();
        if let Some(Err(e)) = self.on_journal(move |j| j.put(&[row])).await {
            tracing::error!(team = %p.team, credits = p.actual, error = %e, "ledger settle journal: not written; the settle is kept in memory only");
        }
        let mut unacked = self.lock();
        if unacked.len() >= MAX_PENDING {
            if let Some(dropped) = unacked.pop_front() {
                tracing::error!(team = %dropped.team, credits = dropped.actual, "ledger: queue of unacknowledged settles full: the oldest is applied again only from the journal, after a restart");
            }
        }
        unacked.push_back(p);
    }

    /// Deletes acknowledged settles from the journal.
    async fn forget(&self, ids: Vec<u64>) {
        if let Some(Err(e)) = self.on_journal(move |j| j.delete(&ids)).await {
            // Applied again after a restart: its pinned mark counts it once.
            tracing::warn!(error = %e, "ledger settle journal: acknowledged settles not deleted");
        }
    }

    /// Runs `write` on the journal on a blocking thread (a commit is an
    /// fsync); `None` without a journal.
    async fn on_journal(
        &self,
        write: impl FnOnce(&Journal) -> Result<(), String> + Send + 'static,
    ) -> Option<Result<(), String>> {
        let journal = self.journal.clone()?;
        let done = tokio::task::spawn_blocking(move || write(&journal)).await;
        Some(done.unwrap_or_else(|e| Err(e.to_string())))
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

/// Applies the unacknowledged settles again every [`REPLAY_EVERY`], a
/// chunk at a time with one `WAIT` each, until each is acknowledged. Ends
/// with the ledger.
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
        for chunk in pending.chunks(REPLAY_CHUNK) {
            if let Ok(true) = s.apply_all(chunk, true).await {
                let credits: u64 = chunk.iter().map(|p| p.actual).sum();
                tracing::info!(
                    settles = chunk.len(),
                    credits,
                    "ledger settles re-applied and acknowledged"
                );
                s.forget(chunk.iter().map(|p| p.id).collect()).await;
            } else {
                kept.extend_from_slice(chunk);
            }
        }
        let mut unacked = s.lock();
        for p in kept.into_iter().rev() {
            unacked.push_front(p);
        }
    }
}
