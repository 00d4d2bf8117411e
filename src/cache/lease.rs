//! The cross-replica fetch lease: at most one replica buys a key at a time
//! (docs/design.md §2, `take_turn`, across processes; `proxy::flight` does it in one).
//!
//! A lease is a Redis key holding a random token. It is taken with
//! `SET NX PX`, renewed while its fetch runs and released only by the
//! replica whose token it holds (compare-and-delete in one script), so a
//! replica that gave up waiting and fetched on its own can never delete
//! another's lease. Its TTL covers the owner's whole path (reserve, fair
//! queue, upstream call, settle); renewal keeps a slow path covered, and a
//! dead owner's lease simply runs out.
//!
//! An owner stores its entry in L2 *before* it releases, so a lease that is
//! free may be free because the key was just bought: whoever takes a lease
//! looks at L2 once more before paying, and a waiter that sees the lease go
//! looks at L2 once more, then takes the lease in turn rather than fetching
//! without one (without that, replicas herding on one search bought it twice).

use super::{Cache, Entry};
use crate::clock::millis;
use crate::metrics::RedisOp;
use crate::redis_backend::keys::{Keys, LeaseKey};
use crate::redis_backend::RedisBackend;
use crate::route::Route;
use backon::{ExponentialBuilder, Retryable};
use redis::Script;
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
    /// A lease's key shares its entry's Cluster slot ([`Keys::lease`]).
    keys: Keys,
    ttl: Duration,
}

/// The result of asking for a key's lease.
pub enum Acquired {
    /// Ours: fetch, then [`Lease::release`].
    Owned(Lease),
    /// Another replica (or request) has taken it: [`Leases::wait_for_peer`],
    /// then ask again.
    Taken,
    /// No Redis, or Redis did not answer: fetch without a lease rather than
    /// wait on a store that is not there.
    Unavailable,
}

/// How a wait on a peer's lease ended.
pub(crate) enum Peer {
    /// The peer stored the key's entry: answer with it.
    Stored(Entry),
    /// The lease went and no entry came (the peer's call failed, or its
    /// answer was not to be stored): take the lease in turn, so that still
    /// only one replica buys the key at a time.
    Gone,
    /// The wait ran out, or Redis stopped answering: fetch without a lease
    /// rather than wait longer.
    GaveUp,
}

/// A lease this replica holds; renewed in the background until released.
pub struct Lease {
    redis: Arc<RedisBackend>,
    key: LeaseKey,
    token: String,
    renewer: tokio::task::JoinHandle<()>,
}

impl Leases {
    /// `ttl`: the owner's worst-case path; renewed every third of it.
    pub fn new(redis: Option<Arc<RedisBackend>>, prefix: &str, ttl: Duration) -> Leases {
        Leases {
            redis,
            keys: Keys::new(prefix),
            ttl: ttl.max(Duration::from_secs(1)),
        }
    }

    /// `SET key token NX PX ttl`.
    pub async fn acquire(&self, cache_key: &str) -> Acquired {
        let Some(redis) = &self.redis else {
            return Acquired::Unavailable;
        };
        let key = self.keys.lease(cache_key);
        let token = format!("{:032x}", rand::random::<u128>());
        let ttl_ms = millis(self.ttl);
        let (k, t) = (key.clone(), token.clone());
        let got: Result<Option<String>, _> = redis
            .call(RedisOp::Lease, |mut c| async move {
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
            Ok(None) => Acquired::Taken,
            Err(_) => Acquired::Unavailable,
        }
    }

    /// Another replica holds the lease: poll its L2 entry (backing off from
    /// 5 to 50 ms) until it appears, the lease goes away, or `wait` passes.
    ///
    /// A lease seen gone gets one more look at L2: the peer stores before it
    /// releases, so an entry that was not there at the poll's first look may
    /// have landed just before the release. Only when that look misses too
    /// did the peer store nothing ([`Peer::Gone`]).
    ///
    /// Only an entry answered at or after `since_ms` counts: a `no-cache`
    /// request must not take the old entry the peer is replacing.
    pub(crate) async fn wait_for_peer(
        &self,
        cache: &Cache,
        route: Route,
        cache_key: &str,
        wait: Duration,
        since_ms: u64,
    ) -> Peer {
        let Some(redis) = &self.redis else {
            return Peer::GaveUp;
        };
        let lease_key = self.keys.lease(cache_key);
        let stored = || async {
            let entry = cache.fresh_in_redis(route, cache_key).await;
            entry.filter(|e| e.stored_at_ms >= since_ms)
        };
        let poll = || async {
            if let Some(entry) = stored().await {
                return Ok(Peer::Stored(entry));
            }
            match lease_held(redis, &lease_key).await {
                Ok(true) => Err(PeerPending),
                Ok(false) => Ok(stored().await.map_or(Peer::Gone, Peer::Stored)),
                Err(()) => Ok(Peer::GaveUp),
            }
        };
        poll.retry(backoff(wait)).await.unwrap_or(Peer::GaveUp)
    }

    /// Another replica holds the lease of `name`, under which nothing is
    /// stored (a monthly series' turn): polls the lease alone, as
    /// [`Leases::wait_for_peer`] does. `true` once it is gone; `false`
    /// when `wait` passes or Redis stops answering.
    pub(crate) async fn wait_released(&self, name: &str, wait: Duration) -> bool {
        let Some(redis) = &self.redis else {
            return false;
        };
        let lease_key = self.keys.lease(name);
        let poll = || async {
            match lease_held(redis, &lease_key).await {
                Ok(true) => Err(PeerPending),
                Ok(false) => Ok(true),
                Err(()) => Ok(false),
            }
        };
        poll.retry(backoff(wait)).await.unwrap_or(false)
    }
}

/// Polls of a peer's lease: backing off from 5 to 50 ms, for `wait` in all.
fn backoff(wait: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(5))
        .with_max_delay(Duration::from_millis(50))
        .with_max_times(usize::MAX)
        .with_total_delay(Some(wait))
}

/// Whether the lease `lease_key` is held; `Err` when Redis did not answer.
async fn lease_held(redis: &RedisBackend, lease_key: &LeaseKey) -> Result<bool, ()> {
    let lk = lease_key.clone();
    redis
        .call(RedisOp::Lease, |mut c| async move {
            redis::cmd("EXISTS").arg(&lk).query_async::<u64>(&mut c).await
        })
        .await
        .map(|n| n == 1)
        .map_err(|_| ())
}

impl Lease {
    /// Stops renewing and deletes the lease if it is still ours.
    pub async fn release(self) {
        self.renewer.abort();
        let script = Script::new(RELEASE);
        let (key, token) = (self.key.clone(), self.token.clone());
        let _ = self
            .redis
            .call(RedisOp::Lease, |mut c| async move {
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
async fn renew(redis: Arc<RedisBackend>, key: LeaseKey, token: String, ttl: Duration) {
    let script = Script::new(RENEW);
    loop {
        tokio::time::sleep(ttl / 3).await;
        let (k, t, ms) = (key.clone(), token.clone(), millis(ttl));
        let s = script.clone();
        let renewed = redis
            .call(RedisOp::Lease, |mut c| async move {
                s.key(&k).arg(&t).arg(ms).invoke_async::<u64>(&mut c).await
            })
            .await;
        if let Ok(0) = renewed {
            return;
        }
    }
}

/// The peer's fetch is still running.
#[derive(Debug)]
struct PeerPending;
