//! The upstream's rate limit shared by every replica through Redis: a GCRA
//! (generic cell rate algorithm) state of one key, changed only by a Lua
//! script on Redis's own clock, so replicas together stay under
//! `upstream.requests_per_minute` whatever their clocks say. An upstream 429
//! pauses every replica through a second key.
//!
//! The same script counts the replicas: each names itself (a random id made
//! when its gateway starts) in a sorted set scored by Redis's time, members
//! not seen for [`SEEN_FOR`] are dropped, and the count comes back with the
//! wait, in the permit's one round trip. A replica with no upstream calls
//! stays counted by a heartbeat ([`SharedRate::join`], every [`HEARTBEAT`]).
//!
//! Used by [`crate::scheduler`] when Redis is configured; when Redis fails,
//! the scheduler falls back to its local limiter paced at this replica's
//! share: the whole rate divided by the replicas last counted, so the
//! replicas together still stay under the limit while Redis is away.

use crate::metrics::RedisOp;
use crate::redis_backend::keys::Keys;
use crate::redis_backend::{BackendError, RedisBackend};
use redis::Script;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often a replica renews its membership when it makes no upstream
/// call: one tiny script per replica every 30 s.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(30);

/// A replica not seen for this long is no longer counted: four heartbeats,
/// so one slow or failed heartbeat (a Redis blip, the breaker's 2 s
/// cool-down, a paused pod) never drops a live replica, whose share of the
/// fallback would then be too large. A replica that died is still counted
/// for up to this long: its peers fall back to a smaller share than they
/// could, which costs waits, not 429s.
pub(crate) const SEEN_FOR: Duration = Duration::from_secs(120);

/// `{wait, replicas}`: `wait` is `0` when a call may go now, else the
/// milliseconds to wait; `replicas` the replicas seen within `ARGV[4]` ms,
/// the caller included. With `ARGV[5] = 0` the caller only renews its
/// membership (a heartbeat): no permit is taken and `wait` is 0.
const TAKE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local seen_for = tonumber(ARGV[4])
redis.call('ZADD', KEYS[3], now, ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - seen_for)
redis.call('PEXPIRE', KEYS[3], seen_for)
local replicas = redis.call('ZCARD', KEYS[3])
if ARGV[5] == '0' then return {0, replicas} end
local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then return {pause, replicas} end
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local allow_at = tat - tolerance
if now < allow_at then return {allow_at - now, replicas} end
local new_tat = tat + interval
redis.call('SET', KEYS[1], new_tat, 'PX', new_tat - now + tolerance + 1000)
return {0, replicas}
"#;

/// What the script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    /// `ZERO` to go now, else how long to wait before asking again.
    pub(crate) wait: Duration,
    /// Replicas sharing the rate now, this one included (at least 1).
    pub(crate) replicas: u32,
}

pub(crate) struct SharedRate {
    redis: Arc<RedisBackend>,
    tat_key: String,
    pause_key: String,
    replicas_key: String,
    /// This replica's member of the replicas set: random, made once.
    id: String,
    /// Set from `upstream.requests_per_minute` (a reload may change it).
    interval_ms: AtomicU64,
    tolerance_ms: AtomicU64,
    take: Script,
}

/// The script's pacing for a rate: one call per interval, `burst` back to back.
fn pacing(requests_per_minute: u32, burst: u32) -> (u64, u64) {
    let interval_ms = (60_000 / u64::from(requests_per_minute.max(1))).max(1);
    (interval_ms, interval_ms * u64::from(burst.max(1) - 1))
}

impl SharedRate {
    /// `burst` calls may go back to back; then one per `60 s / rpm`.
    pub(crate) fn new(redis: Arc<RedisBackend>, prefix: &str, requests_per_minute: u32, burst: u32) -> SharedRate {
        let (interval_ms, tolerance_ms) = pacing(requests_per_minute, burst);
        let keys = Keys::new(prefix);
        SharedRate {
            redis,
            // One `{rate}` hash tag: the script's three keys share a Cluster slot.
            tat_key: keys.rate(),
            pause_key: keys.rate_pause(),
            replicas_key: keys.rate_replicas(),
            // Per gateway, not per process: tests run several in one.
            id: format!("{:032x}", rand::random::<u128>()),
            interval_ms: AtomicU64::new(interval_ms),
            tolerance_ms: AtomicU64::new(tolerance_ms),
            take: Script::new(TAKE),
        }
    }

    /// A reload's new rate, from the next permit on.
    pub(crate) fn set_rate(&self, requests_per_minute: u32, burst: u32) {
        let (interval_ms, tolerance_ms) = pacing(requests_per_minute, burst);
        self.interval_ms.store(interval_ms, Ordering::Relaxed);
        self.tolerance_ms.store(tolerance_ms, Ordering::Relaxed);
    }

    /// Takes one call's place (and renews this replica's membership).
    pub(crate) async fn take(&self) -> Result<Taken, BackendError> {
        self.run(true).await
    }

    /// Renews this replica's membership only: the replicas counted now.
    pub(crate) async fn join(&self) -> Result<u32, BackendError> {
        Ok(self.run(false).await?.replicas)
    }

    async fn run(&self, take: bool) -> Result<Taken, BackendError> {
        let mut inv = self.take.prepare_invoke();
        inv.key(&self.tat_key)
            .key(&self.pause_key)
            .key(&self.replicas_key)
            .arg(self.interval_ms.load(Ordering::Relaxed))
            .arg(self.tolerance_ms.load(Ordering::Relaxed))
            .arg(&self.id)
            .arg(SEEN_FOR.as_millis() as u64)
            .arg(u8::from(take));
        let (wait, replicas): (u64, u32) = self
            .redis
            .call(RedisOp::Rate, |mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        Ok(Taken {
            wait: Duration::from_millis(wait),
            replicas: replicas.max(1),
        })
    }

    /// An upstream 429: every replica holds off for `for_`.
    pub(crate) async fn pause(&self, for_: Duration) {
        let key = self.pause_key.clone();
        let ms = for_.as_millis().max(1) as u64;
        let _ = self
            .redis
            .call(RedisOp::Rate, |mut c| async move {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(1)
                    .arg("PX")
                    .arg(ms)
                    .query_async::<()>(&mut c)
                    .await
            })
            .await;
    }
}
