//! The upstream's rate limit shared by every replica through Redis: the
//! window of the last 60 s of calls (a sorted set), the calls of each team
//! in it, and the burst's GCRA (generic cell rate algorithm) state, changed
//! only by a Lua script on Redis's own clock, so replicas together stay
//! under `upstream.requests_per_minute` in any 60 s whatever their clocks
//! say, by the rules of [`crate::scheduler::window`]. An upstream 429
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

use super::window::{Held, Limits, Refused};
use crate::metrics::RedisOp;
use crate::redis_backend::keys::Keys;
use crate::redis_backend::{BackendError, RedisBackend};
use arc_swap::ArcSwap;
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

/// `{wait, replicas, free, held}`: `wait` is `0` when a call may go now
/// (its place taken), else the milliseconds until asking again is worth
/// it, and `held` why ([`Held`] as 1 to 4); `replicas` the replicas seen
/// within `ARGV[6]` ms, the caller included; `free` the window's places
/// left. With `ARGV[7] = 0` the caller only renews its membership (a
/// heartbeat). The rules are [`crate::scheduler::window`]'s: the window of
/// `ARGV[1]` calls in 60 s (a sorted set of the calls, scored by Redis's
/// time), its last `ARGV[2]` places for an interactive call (`ARGV[9]` 0)
/// of a team (`ARGV[8]`) under its share, then the burst's GCRA (`ARGV[3]`
/// ms apart, `ARGV[4]` ms of tolerance; -1: no burst limit). `ARGV[10]`
/// names the call in the sorted sets. A bulk call also leaves what
/// interactive calls at `ARGV[11]` thousandths a second will want before
/// the oldest call ages out.
const TAKE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local span = 60000
local seen_for = tonumber(ARGV[6])
redis.call('ZADD', KEYS[3], now, ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - seen_for)
redis.call('PEXPIRE', KEYS[3], seen_for)
local replicas = redis.call('ZCARD', KEYS[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - span)
local calls = tonumber(ARGV[1])
local used = redis.call('ZCARD', KEYS[1])
local free = calls - used
if free < 0 then free = 0 end
if ARGV[7] == '0' then return {0, replicas, free, 0} end
local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then return {pause, replicas, free, 1} end
local function frees(k)
  local at = redis.call('ZRANGE', KEYS[1], k - 1, k - 1, 'WITHSCORES')
  if at[2] == nil then return 1 end
  return math.max(1, tonumber(at[2]) + span - now)
end
if free == 0 then return {frees(used - calls + 1), replicas, 0, 2} end
local reserve = tonumber(ARGV[2])
if ARGV[9] == '1' then
  local until_aged = span
  if used > 0 then until_aged = frees(1) end
  local kept = math.max(reserve, math.ceil(tonumber(ARGV[11]) * until_aged / 1000000))
  if free <= kept then return {math.min(frees(1), tonumber(ARGV[3])), replicas, free, 3} end
end
if free <= reserve then
  local held = ARGV[9] == '1'
  if not held then
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - span)
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - span)
    local mine = redis.call('ZCARD', KEYS[5])
    local others = redis.call('ZCARD', KEYS[4])
    if mine > 0 then others = others - 1 end
    held = mine * (others + 2) >= calls
  end
  if held then return {frees(used - (calls - reserve) + 1), replicas, free, 3} end
end
local tolerance = tonumber(ARGV[4])
if tolerance >= 0 then
  local interval = tonumber(ARGV[3])
  local tat = tonumber(redis.call('GET', KEYS[6]) or now)
  if tat < now then tat = now end
  if now < tat - tolerance then return {tat - tolerance - now, replicas, free, 4} end
  redis.call('SET', KEYS[6], tat + interval, 'PX', tat + interval - now + tolerance + 1000)
end
redis.call('ZADD', KEYS[1], now, ARGV[10])
redis.call('PEXPIRE', KEYS[1], span + 1000)
redis.call('ZADD', KEYS[5], now, ARGV[10])
redis.call('PEXPIRE', KEYS[5], span + 1000)
redis.call('ZADD', KEYS[4], now, ARGV[8])
redis.call('PEXPIRE', KEYS[4], span + 1000)
return {0, replicas, free - 1, 0}
"#;

/// What the script answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Taken {
    /// `Ok` to go now, else how long until asking again, and why.
    pub(crate) permit: Result<(), Refused>,
    /// Replicas sharing the rate now, this one included (at least 1).
    pub(crate) replicas: u32,
    /// The window's places left after this answer.
    pub(crate) free: u32,
}

pub(crate) struct SharedRate {
    redis: Arc<RedisBackend>,
    keys: Keys,
    /// This replica's member of the replicas set: random, made once.
    id: String,
    /// Names each call this replica makes in the window's sorted sets.
    next_call: AtomicU64,
    /// The gate's numbers (a reload may change them).
    limits: ArcSwap<Limits>,
    take: Script,
}

/// The burst's GCRA for the script: `(interval_ms, tolerance_ms)`, the
/// tolerance -1 when the burst is the whole window (no GCRA).
fn pacing(limits: Limits) -> (u64, i64) {
    let interval_ms = (60_000 / u64::from(limits.calls.max(1))).max(1);
    match limits.burst < limits.calls {
        true => (interval_ms, (interval_ms * u64::from(limits.burst.max(1) - 1)) as i64),
        false => (interval_ms, -1),
    }
}

impl SharedRate {
    pub(crate) fn new(redis: Arc<RedisBackend>, prefix: &str, limits: Limits) -> SharedRate {
        SharedRate {
            redis,
            keys: Keys::new(prefix),
            // Per gateway, not per process: tests run several in one.
            id: format!("{:032x}", rand::random::<u128>()),
            next_call: AtomicU64::new(0),
            limits: ArcSwap::from_pointee(limits),
            take: Script::new(TAKE),
        }
    }

    /// A reload's new numbers, from the next permit on.
    pub(crate) fn set_limits(&self, limits: Limits) {
        self.limits.store(Arc::new(limits));
    }

    /// Takes one call's place for `team` (and renews this replica's
    /// membership).
    /// `interactive`: interactive calls a second lately, all replicas
    /// together (what a bulk call leaves room for).
    pub(crate) async fn take(&self, team: &str, bulk: bool, interactive: f64) -> Result<Taken, BackendError> {
        self.run(Some((team, bulk)), interactive).await
    }

    /// Renews this replica's membership only: the replicas counted now.
    pub(crate) async fn join(&self) -> Result<u32, BackendError> {
        Ok(self.run(None, 0.0).await?.replicas)
    }

    async fn run(&self, call: Option<(&str, bool)>, interactive: f64) -> Result<Taken, BackendError> {
        let limits = **self.limits.load();
        let (interval_ms, tolerance_ms) = pacing(limits);
        let (team, bulk) = call.unwrap_or(("", false));
        let n = self.next_call.fetch_add(1, Ordering::Relaxed);
        let mut inv = self.take.prepare_invoke();
        // One `{rate}` hash tag: the script's keys share a Cluster slot.
        inv.key(self.keys.rate_window())
            .key(self.keys.rate_pause())
            .key(self.keys.rate_replicas())
            .key(self.keys.rate_teams())
            .key(self.keys.rate_team(team))
            .key(self.keys.rate())
            .arg(limits.calls)
            .arg(limits.reserve)
            .arg(interval_ms)
            .arg(tolerance_ms)
            .arg(&self.id)
            .arg(SEEN_FOR.as_millis() as u64)
            .arg(u8::from(call.is_some()))
            .arg(team)
            .arg(u8::from(bulk))
            .arg(format!("{}:{n}", self.id))
            .arg((interactive * 1000.0).round() as u64);
        let (wait, replicas, free, held): (u64, u32, u32, u8) = self
            .redis
            .call(RedisOp::Rate, |mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        let held = match held {
            1 => Some(Held::Paused),
            2 => Some(Held::Full),
            3 => Some(Held::Reserve),
            4 => Some(Held::Burst),
            _ => None,
        };
        Ok(Taken {
            permit: match held {
                None => Ok(()),
                Some(held) => Err(Refused {
                    wait: Duration::from_millis(wait.max(1)),
                    held,
                }),
            },
            replicas: replicas.max(1),
            free,
        })
    }

    /// An upstream 429: every replica holds off for `for_`.
    pub(crate) async fn pause(&self, for_: Duration) {
        let key = self.keys.rate_pause();
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
