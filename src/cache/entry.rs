//! One cached upstream answer, with what it cost and when it goes stale,
//! and its byte encoding for the Redis tier.

use crate::clock::now_ms;
use crate::redis_backend::keys::{EntryKey, RedisKey};
use crate::route::Route;
use bytes::Bytes;
use http::HeaderValue;
use redis::{RedisWrite, ToRedisArgs};
use sha2::{Digest, Sha256};
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The upstream's 200 JSON body, exactly.
    pub(crate) body: Bytes,
    /// Credits the original fetch cost: what every hit saves.
    pub(crate) credits: u64,
    /// Unix milliseconds when the upstream answered.
    pub(crate) stored_at_ms: u64,
    /// Freshness lifetime from `stored_at_ms`.
    pub(crate) ttl_ms: u64,
    /// Strong validator of the body, quoted: the header value itself, so a
    /// hit copies a reference, not the text.
    pub(crate) etag: HeaderValue,
    /// For purge by route and metrics.
    pub(crate) route: Route,
    /// The vendor's data release current when it was bought, as a day
    /// number (`cache::release`); 0: unstamped (bought before any release
    /// was read, or written by 0.2.0).
    pub(crate) release: u32,
}

/// A strong ETag from the body's SHA-256.
pub(crate) fn etag_of(body: &[u8]) -> HeaderValue {
    let digest = Sha256::digest(body);
    let mut text = [b'"'; 34];
    let _ = hex::encode_to_slice(&digest[..16], &mut text[1..33]);
    HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

impl Entry {
    /// An entry whose ETag is computed here.
    pub fn new(body: Bytes, credits: u64, ttl: Duration, route: Route) -> Entry {
        let etag = etag_of(&body);
        Entry::with_etag(body, etag, credits, ttl, route)
    }

    /// `etag` is [`etag_of`] the body, computed once by the fetch that
    /// stores it.
    pub(crate) fn with_etag(body: Bytes, etag: HeaderValue, credits: u64, ttl: Duration, route: Route) -> Entry {
        Entry {
            body,
            credits,
            stored_at_ms: now_ms(),
            ttl_ms: ttl.as_millis() as u64,
            etag,
            route,
            release: 0,
        }
    }

    pub(crate) fn age(&self, now_ms: u64) -> Duration {
        Duration::from_millis(now_ms.saturating_sub(self.stored_at_ms))
    }

    /// How long past its freshness the entry is (zero while fresh).
    pub(crate) fn staleness(&self, now_ms: u64) -> Duration {
        Duration::from_millis(now_ms.saturating_sub(self.stored_at_ms + self.ttl_ms))
    }

    pub(crate) fn is_fresh(&self, now_ms: u64) -> bool {
        now_ms < self.stored_at_ms + self.ttl_ms
    }

    /// Time left before the entry is dropped, stale grace included.
    pub(super) fn remaining_life(&self, now_ms: u64, grace: Duration) -> Duration {
        let end = self.stored_at_ms + self.ttl_ms + grace.as_millis() as u64;
        Duration::from_millis(end.saturating_sub(now_ms))
    }

    /// Bytes held for this entry, for the memory tier's weigher.
    pub(super) fn weight(&self, key_len: usize) -> u32 {
        // Entry, its Arc, the key's Arc<str>, moka's node, deque links and
        // table bucket: measured by a counting allocator at ~460 bytes an
        // entry (tests/it/records/memory.rs; BENCHMARKS.md "Record weights").
        let overhead = 480;
        u32::try_from(self.body.len() + self.etag.len() + key_len + overhead).unwrap_or(u32::MAX)
    }

    /// `[3][credits u64][stored_at u64][ttl u64][route u8][etag len u8][etag][release u32][xxh3 of body u64][body]`.
    ///
    /// The checksum makes a foreign or damaged value a miss. Version 1
    /// checked the body against its SHA-256 ETag instead: ~4 µs for a 6 KB
    /// page with SHA-NI, on every hit from Redis (xxh3: ~0.3 µs). Version 2
    /// (0.2.0) had no release: it reads as unstamped; 0.2.0 reads version 3
    /// as a miss (CHANGELOG, "Upgrade and rollback").
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + HEAD + self.etag.len() + 12);
        out.push(VERSION);
        out.extend_from_slice(&self.credits.to_be_bytes());
        out.extend_from_slice(&self.stored_at_ms.to_be_bytes());
        out.extend_from_slice(&self.ttl_ms.to_be_bytes());
        // The route's stable code: rows of the route table are only appended.
        out.push(u8::try_from(self.route.index()).unwrap_or(u8::MAX));
        out.push(self.etag.len() as u8);
        out.extend_from_slice(self.etag.as_bytes());
        out.extend_from_slice(&self.release.to_be_bytes());
        out.extend_from_slice(&xxh3_64(&self.body).to_be_bytes());
        out.extend_from_slice(&self.body);
        out
    }

    /// The inverse of [`Entry::encode`] (and of versions 2 and 1, which
    /// replicas of earlier releases still write); `None` for anything else, so a
    /// foreign or truncated value is a miss, never a wrong answer. The body
    /// is a view into `bytes`, not a copy.
    pub(super) fn decode(bytes: Bytes) -> Option<Entry> {
        let version = *bytes.first()?;
        if !(1..=VERSION).contains(&version) || bytes.len() < HEAD {
            return None;
        }
        let u64_at = |at: usize| {
            bytes
                .get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
        };
        let credits = u64_at(1)?;
        let stored_at_ms = u64_at(9)?;
        let ttl_ms = u64_at(17)?;
        // A code this build does not know (a newer replica's route): a miss.
        let route = Route::from_index(usize::from(bytes[25]))?;
        let etag_end = HEAD + usize::from(bytes[26]);
        if etag_end > bytes.len() {
            return None;
        }
        // A view into `bytes` too (checked to be a valid header value).
        let etag = HeaderValue::from_maybe_shared(bytes.slice(HEAD..etag_end)).ok()?;
        let (release, sum_at) = match version {
            VERSION => {
                let stamp = bytes.get(etag_end..etag_end + 4)?;
                (u32::from_be_bytes(stamp.try_into().ok()?), etag_end + 4)
            }
            _ => (0, etag_end),
        };
        let body = if version >= 2 {
            let sum = u64_at(sum_at)?;
            let body = bytes.slice(sum_at.checked_add(8).filter(|&at| at <= bytes.len())?..);
            (xxh3_64(&body) == sum).then_some(body)?
        } else {
            let body = bytes.slice(etag_end.min(bytes.len())..);
            (etag_end <= bytes.len() && etag == etag_of(&body)).then_some(body)?
        };
        Some(Entry {
            body,
            credits,
            stored_at_ms,
            ttl_ms,
            etag,
            route,
            release,
        })
    }
}

/// An entry is stored in Redis under an [`EntryKey`] only, and an
/// [`EntryKey`] holds nothing else (`redis_backend::keys`, "Typed keys").
impl RedisKey for EntryKey {
    type Value = Entry;
}

/// Sent to Redis as its encoding ([`Entry::encode`]).
impl ToRedisArgs for Entry {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg(&self.encode());
    }
}

/// The encoding [`Entry::encode`] writes.
const VERSION: u8 = 3;
/// Bytes before the ETag: version, three `u64`s, route, ETag length.
const HEAD: usize = 27;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_rejects_damage() {
        let e = Entry::new(
            Bytes::from_static(b"{\"items\":[]}"),
            7,
            Duration::from_secs(60),
            Route::PermitsSearch,
        );
        let bytes = Bytes::from(e.encode());
        assert_eq!(Entry::decode(bytes.clone()), Some(e.clone()));
        assert_eq!(e.to_redis_args(), [e.encode()], "sent to Redis as its encoding");
        assert_eq!(
            Entry::decode(bytes.slice(..bytes.len() - 1)),
            None,
            "a cut body fails its checksum"
        );
        let mut flipped = bytes.to_vec();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(Entry::decode(Bytes::from(flipped)), None, "a changed byte fails it");
        for cut in 0..HEAD + e.etag.len() + 12 {
            assert_eq!(Entry::decode(bytes.slice(..cut)), None, "cut at {cut}");
        }
        assert_eq!(Entry::decode(Bytes::from_static(b"garbage")), None);
        assert_eq!(Entry::decode(Bytes::new()), None);
    }

    #[test]
    fn the_release_stamp_round_trips_and_version_2_reads_unstamped() {
        let mut e = Entry::new(
            Bytes::from_static(b"{\"items\":[2]}"),
            5,
            Duration::from_secs(60),
            Route::PermitsSearch,
        );
        e.release = 20_284;
        assert_eq!(Entry::decode(Bytes::from(e.encode())), Some(e.clone()));
        // What 0.2.0 writes: version 2, no stamp.
        let mut v2 = vec![2u8];
        v2.extend_from_slice(&e.credits.to_be_bytes());
        v2.extend_from_slice(&e.stored_at_ms.to_be_bytes());
        v2.extend_from_slice(&e.ttl_ms.to_be_bytes());
        v2.push(e.route.index() as u8);
        v2.push(e.etag.len() as u8);
        v2.extend_from_slice(e.etag.as_bytes());
        v2.extend_from_slice(&xxh3_64(&e.body).to_be_bytes());
        v2.extend_from_slice(&e.body);
        e.release = 0;
        assert_eq!(Entry::decode(Bytes::from(v2)), Some(e));
    }

    #[test]
    fn version_1_values_still_read() {
        // What the previous release wrote: no checksum, the ETag checked.
        let e = Entry::new(
            Bytes::from_static(b"{\"items\":[1]}"),
            3,
            Duration::from_secs(60),
            Route::PermitsSearch,
        );
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&e.credits.to_be_bytes());
        v1.extend_from_slice(&e.stored_at_ms.to_be_bytes());
        v1.extend_from_slice(&e.ttl_ms.to_be_bytes());
        v1.push(e.route.index() as u8);
        v1.push(e.etag.len() as u8);
        v1.extend_from_slice(e.etag.as_bytes());
        v1.extend_from_slice(&e.body);
        assert_eq!(Entry::decode(Bytes::from(v1.clone())), Some(e));
        *v1.last_mut().unwrap() ^= 1;
        assert_eq!(Entry::decode(Bytes::from(v1)), None, "a changed body fails its ETag");
    }

    #[test]
    fn freshness_and_staleness() {
        let mut e = Entry::new(Bytes::new(), 0, Duration::from_secs(10), Route::Other);
        e.stored_at_ms = 1_000_000;
        assert!(e.is_fresh(1_005_000));
        assert!(!e.is_fresh(1_010_000));
        assert_eq!(e.staleness(1_013_000), Duration::from_secs(3));
        assert_eq!(
            e.remaining_life(1_013_000, Duration::from_secs(5)),
            Duration::from_secs(2)
        );
    }
}
