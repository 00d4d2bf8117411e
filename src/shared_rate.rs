//! The upstream's rate limit shared by every replica through Redis: a GCRA
//! (generic cell rate algorithm) state of one key, changed only by a Lua
//! script on Redis's own clock, so replicas together stay under
//! `upstream.requests_per_minute` whatever their clocks say. An upstream 429
//! pauses every replica through a second key.
//!
//! Used by [`crate::scheduler`] when Redis is configured; when Redis fails,
//! the scheduler falls back to its local limiter (each replica then paces
//! itself alone, as without Redis).

use crate::metrics::RedisOp;
use crate::redis_backend::keys::Keys;
use crate::redis_backend::{BackendError, RedisBackend};
use redis::Script;
use std::sync::Arc;
use std::time::Duration;

/// `0` when a call may go now, else the milliseconds to wait.
const TAKE: &str = r#"
local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then return pause end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local allow_at = tat - tolerance
if now < allow_at then return allow_at - now end
local new_tat = tat + interval
redis.call('SET', KEYS[1], new_tat, 'PX', new_tat - now + tolerance + 1000)
return 0
"#;

pub(crate) struct SharedRate {
    redis: Arc<RedisBackend>,
    tat_key: String,
    pause_key: String,
    interval_ms: u64,
    tolerance_ms: u64,
    take: Script,
}

impl SharedRate {
    /// `burst` calls may go back to back; then one per `60 s / rpm`.
    pub(crate) fn new(redis: Arc<RedisBackend>, prefix: &str, requests_per_minute: u32, burst: u32) -> SharedRate {
        let interval_ms = 60_000 / u64::from(requests_per_minute.max(1));
        let keys = Keys::new(prefix);
        SharedRate {
            redis,
            // One `{rate}` hash tag: the script's two keys share a Cluster slot.
            tat_key: keys.rate(),
            pause_key: keys.rate_pause(),
            interval_ms: interval_ms.max(1),
            tolerance_ms: interval_ms * u64::from(burst.max(1) - 1),
            take: Script::new(TAKE),
        }
    }

    /// Takes one call's place: `Ok(ZERO)` to go now, else how long to wait
    /// before asking again.
    pub(crate) async fn take(&self) -> Result<Duration, BackendError> {
        let mut inv = self.take.prepare_invoke();
        inv.key(&self.tat_key)
            .key(&self.pause_key)
            .arg(self.interval_ms)
            .arg(self.tolerance_ms);
        let wait: u64 = self
            .redis
            .call(RedisOp::Rate, |mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        Ok(Duration::from_millis(wait))
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
