//! The cross-replica fetch lease: at most one replica buys a key at a time
//! (DESIGN §2 step 8, across processes; [`super::flight`] does it in one).
//!
//! A lease is a Redis key holding a random token. It is taken with
//! `SET NX PX`, renewed while its fetch runs and released only by the
//! replica whose token it holds (compare-and-delete in one script), so a
//! replica that gave up waiting and fetched on its own can never delete
//! another's lease. Its TTL covers the owner's whole path (reserve, fair
//! queue, upstream call, settle); renewal keeps a slow path covered, and a
//! dead owner's lease simply runs out.

use super::{Cache, Entry};
use crate::clock::now_ms;
use crate::redis_backend::RedisBackend;
use crate::route::Route;
use backon::{ExponentialBuilder, Retryable};
use redis::Script;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// Deletes the lease only if it still holds our token.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

/// Extends the lease only if it still holds our token.
const RENEW: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"#;

/// Takes, renews, releases and waits on leases; one per gateway.
pub struct Leases {
    redis: Option<Arc<RedisBackend>>,
    prefix: String,
    ttl: Duration,
}

/// The result of asking for a key's lease.
pub enum Acquired {
    /// Ours: fetch, then [`Lease::release`].
    Owned(Lease),
    /// Another replica holds it: [`Leases::wait_for_peer`].
    Held,
    /// No Redis, or Redis did not answer: fetch without a lease rather than
    /// wait on a store that is not there.
    Unavailable,
}

/// A lease this replica holds; renewed in the background until released.
pub struct Lease {
    redis: Arc<RedisBackend>,
    key: String,
    token: String,
    renewer: tokio::task::JoinHandle<()>,
}

impl Leases {
    /// `ttl`: the owner's worst-case path; renewed every third of it.
    pub fn new(redis: Option<Arc<RedisBackend>>, prefix: &str, ttl: Duration) -> Leases {
        Leases {
            redis,
            prefix: prefix.to_string(),
            ttl: ttl.max(Duration::from_secs(1)),
        }
    }

    fn key(&self, cache_key: &str) -> String {
        format!(
            "{}lease:{{{}}}",
            self.prefix,
            hex::encode(Sha256::digest(cache_key.as_bytes()))
        )
    }

    /// `SET key token NX PX ttl`.
    pub async fn acquire(&self, cache_key: &str) -> Acquired {
        let Some(redis) = &self.redis else {
            return Acquired::Unavailable;
        };
        let key = self.key(cache_key);
        let token = format!("{:032x}", rand::random::<u128>());
        let ttl_ms = millis(self.ttl);
        let (k, t) = (key.clone(), token.clone());
        let got: Result<Option<String>, _> = redis
            .call("lease", |mut c| async move {
                redis::cmd("SET")
                    .arg(&k)
                    .arg(&t)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .query_async(&mut c)
                    .await
            })
            .await;
        match got {
            Ok(Some(_)) => {
                let renewer = tokio::spawn(renew(redis.clone(), key.clone(), token.clone(), self.ttl));
                Acquired::Owned(Lease {
                    redis: redis.clone(),
                    key,
                    token,
                    renewer,
                })
            }
            Ok(None) => Acquired::Held,
            Err(_) => Acquired::Unavailable,
        }
    }

    /// Another replica holds the lease: poll its L2 entry (backing off from
    /// 5 to 50 ms) until it appears, the lease goes away without one, or
    /// `wait` passes. `None`: fetch ourselves.
    pub async fn wait_for_peer(&self, cache: &Cache, route: Route, cache_key: &str, wait: Duration) -> Option<Entry> {
        let redis = self.redis.as_ref()?;
        let lease_key = self.key(cache_key);
        let poll = || async {
            if let Some(entry) = cache
                .lookup_redis(route, cache_key)
                .await
                .filter(|e| e.is_fresh(now_ms()))
            {
                return Ok(Some(entry));
            }
            let lk = lease_key.clone();
            let held: Result<u64, _> = redis
                .call("lease", |mut c| async move {
                    redis::cmd("EXISTS").arg(&lk).query_async(&mut c).await
                })
                .await;
            match held {
                Ok(1) => Err(PeerPending),
                // Released without an entry (a failed fetch), or Redis is gone.
                _ => Ok(None),
            }
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(5))
            .with_max_delay(Duration::from_millis(50))
            .with_max_times(usize::MAX)
            .with_total_delay(Some(wait));
        poll.retry(backoff).await.ok().flatten()
    }
}

impl Lease {
    /// Stops renewing and deletes the lease if it is still ours.
    pub async fn release(self) {
        self.renewer.abort();
        let script = Script::new(RELEASE);
        let (key, token) = (self.key.clone(), self.token.clone());
        let _ = self
            .redis
            .call("lease", |mut c| async move {
                script.key(&key).arg(&token).invoke_async::<u64>(&mut c).await
            })
            .await;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Released or not, never renew past the owner: an unreleased lease
        // then runs out by its TTL.
        self.renewer.abort();
    }
}

/// Extends the lease every third of its TTL while the owner works; stops
/// when the lease is no longer ours.
async fn renew(redis: Arc<RedisBackend>, key: String, token: String, ttl: Duration) {
    let script = Script::new(RENEW);
    loop {
        tokio::time::sleep(ttl / 3).await;
        let (k, t, ms) = (key.clone(), token.clone(), millis(ttl));
        let s = script.clone();
        let renewed = redis
            .call("lease", |mut c| async move {
                s.key(&k).arg(&t).arg(ms).invoke_async::<u64>(&mut c).await
            })
            .await;
        if let Ok(0) = renewed {
            return;
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The peer's fetch is still running.
#[derive(Debug)]
struct PeerPending;
