//! Reading the vendor's data release, `GET /v2/meta/release` (free), every
//! `cache.release_poll_secs`, one call per interval for all replicas; what
//! was read goes to [`crate::cache::release::Release`], which decides what
//! it does to held answers.
//!
//! - **Alone** (no `cache.redis_url`): this gateway reads it at start and
//!   then once per interval.
//! - **With Redis**, every replica tries each second to take the release
//!   lease (`pgw:release:lease`, `SET NX` with the interval as its expiry):
//!   the one that takes it reads the release and writes what it read
//!   (`pgw:release`); the others read that key. So the upstream sees one
//!   call per interval whatever the number of replicas, and a replica that
//!   dies hands the reading to another when its lease expires. While Redis
//!   fails, each replica reads for itself, once per interval.
//!
//! The call goes through the upstream gate like any call (an interactive
//! call of its own asker, `_release`, weight 1: one call an interval, which
//! a busy gate must not starve, or the release would go unread exactly when
//! teams ask most) and through the same upstream client; it costs no credits. A turn the gate
//! refuses is no read (tried again next interval); an upstream error, a
//! timeout or a body without a date that parses is an unreadable release.

use crate::app::App;
use crate::cache::release::{self, Read, Seen};
use crate::clock::now_ms;
use crate::metrics::RedisOp;
use crate::redis_backend::RedisBackend;
use crate::route::{Route, Target};
use crate::scheduler::Asker;
use http::StatusCode;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The scheduler's asker of the release call (not a team: `_` is no team
/// name's first character).
const ASKER: &str = "_release";

/// How often a replica sharing Redis tries the lease and reads what the
/// reader saw.
const TICK: Duration = Duration::from_secs(1);

/// Reads the release until the app goes away (`serve` spawns it when
/// `cache.release_poll_secs` is above 0).
pub(crate) async fn watch(app: Weak<App>, poll: Duration) {
    let mut last_own: Option<u64> = None;
    loop {
        let Some(app) = app.upgrade() else { return };
        let now = now_ms();
        let own_due = last_own.is_none_or(|at| now.saturating_sub(at) >= poll.as_millis() as u64);
        let shared = match app.cache.redis() {
            Some(redis) => shared_turn(&app, redis, poll).await,
            None => None,
        };
        match shared {
            Some(Duty::Read(read, at)) => apply(&app, read, at),
            Some(Duty::Ours) => {
                if let Some(read) = read_upstream(&app).await {
                    publish(&app, read).await;
                    apply(&app, read, now_ms());
                }
            }
            Some(Duty::NothingYet) => {}
            None if own_due => {
                last_own = Some(now);
                if let Some(read) = read_upstream(&app).await {
                    apply(&app, read, now_ms());
                }
            }
            None => {}
        }
        let wait = if app.cache.redis().is_some() { TICK } else { poll };
        drop(app);
        tokio::time::sleep(wait).await;
    }
}

/// What a replica sharing Redis does this tick.
enum Duty {
    /// It holds the lease: it reads the upstream.
    Ours,
    /// Another replica read this (when, Unix ms).
    Read(Read, u64),
    /// The lease is taken and nothing was written yet.
    NothingYet,
}

/// The lease, or what the replica holding it wrote; `None` when Redis
/// failed (this replica reads for itself).
async fn shared_turn(app: &App, redis: &Arc<RedisBackend>, poll: Duration) -> Option<Duty> {
    let keys = app.cache.release_keys();
    let token = format!("{:x}", crate::http_util::random_id());
    let px = (poll.as_millis() as u64).max(1);
    let lease = &keys.0;
    let taken: Option<String> = redis
        .call(RedisOp::Lease, |mut c| {
            let token = token.clone();
            async move {
                redis::cmd("SET")
                    .arg(lease)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(px)
                    .query_async(&mut c)
                    .await
            }
        })
        .await
        .ok()?;
    if taken.is_some() {
        return Some(Duty::Ours);
    }
    let value = &keys.1;
    let got: Option<String> = redis
        .call(RedisOp::CacheGet, |mut c| async move {
            redis::cmd("GET").arg(value).query_async(&mut c).await
        })
        .await
        .ok()?;
    Some(
        got.as_deref()
            .and_then(decode)
            .map_or(Duty::NothingYet, |(r, at)| Duty::Read(r, at)),
    )
}

/// Writes what this replica read for the others, kept ten intervals.
async fn publish(app: &App, read: Read) {
    let Some(redis) = app.cache.redis() else { return };
    let poll = Duration::from_secs(app.config.cache.release_poll_secs);
    let value = encode(read, now_ms());
    let key = &app.cache.release_keys().1;
    let px = (poll.as_millis() as u64).saturating_mul(10).max(1);
    let _ = redis
        .call(RedisOp::CacheSet, |mut c| async move {
            redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("PX")
                .arg(px)
                .query_async::<()>(&mut c)
                .await
        })
        .await;
}

/// `d <day> <read_at_ms>` or `u <read_at_ms>`.
fn encode(read: Read, at_ms: u64) -> String {
    match read {
        Read::Date(day) => format!("d {day} {at_ms}"),
        Read::Unreadable => format!("u {at_ms}"),
    }
}

fn decode(value: &str) -> Option<(Read, u64)> {
    let mut parts = value.split(' ');
    match (parts.next()?, parts.next()?, parts.next()) {
        ("d", day, Some(at)) => Some((Read::Date(day.parse().ok()?), at.parse().ok()?)),
        ("u", at, None) => Some((Read::Unreadable, at.parse().ok()?)),
        _ => None,
    }
}

/// One read of the upstream's release; `None` when the gate gave no turn.
async fn read_upstream(app: &Arc<App>) -> Option<Read> {
    let asker = Asker {
        team: ASKER,
        weight: 1,
        bulk: false,
    };
    if app.scheduler.acquire(asker, None).await.is_err() {
        tracing::info!("data release not read this interval: no turn at the upstream gate");
        return None;
    }
    let target = Target {
        route: Route::MetaRelease,
        path: "/v2/meta/release".into(),
        query: None,
    };
    let request_id = format!("{:032x}", crate::http_util::random_id());
    let trace = crate::telemetry::trace::Trace::of(false, &http::HeaderMap::new());
    let read = match app
        .upstream
        .fetch(&target, &request_id, &trace, None, &app.metrics)
        .await
    {
        Ok(resp) if resp.status == StatusCode::OK => release::parse_body(&resp.body),
        Ok(resp) => {
            tracing::warn!(
                status = resp.status.as_u16(),
                "data release unreadable: route TTLs rule"
            );
            return Some(Read::Unreadable);
        }
        Err(_) => {
            tracing::warn!("data release unreadable (no answer): route TTLs rule");
            return Some(Read::Unreadable);
        }
    };
    if read == Read::Unreadable {
        tracing::warn!("data release unreadable (no date in its body): route TTLs rule");
    }
    Some(read)
}

/// A read, taken by the cache's release and shown in the metrics.
fn apply(app: &App, read: Read, at_ms: u64) {
    let r = &app.cache.release;
    let seen = r.observe(read, at_ms);
    if matches!(seen, Seen::Newer | Seen::First) {
        tracing::info!(
            released_at = %release::date_of(r.stamp()),
            first = seen == Seen::First,
            "data release read"
        );
    }
    app.metrics.data_release(r.stamp(), r.last_ok_ms(), r.readable());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_value_round_trips() {
        assert_eq!(decode(&encode(Read::Date(20_000), 17)), Some((Read::Date(20_000), 17)));
        assert_eq!(decode(&encode(Read::Unreadable, 5)), Some((Read::Unreadable, 5)));
        assert_eq!(decode("d x 1"), None);
        assert_eq!(decode(""), None);
    }
}
