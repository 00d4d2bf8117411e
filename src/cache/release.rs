//! The vendor's data release (`GET /v2/meta/release`) as this gateway last
//! read it, and what it does to a held answer's freshness ([`Release::view`]).
//!
//! Every answer, record and monthly row is stamped with the release current
//! when it was bought ([`Entry::release`], a day number; 0: bought before
//! this gateway read any, or by a release that did not stamp). Reading the
//! release is `crate::release`'s loop; this holds what it saw:
//!
//! - **A newer release outdates older answers.** An entry stamped with an
//!   older release than the current one is fresh no longer: it is expired
//!   from the moment the newer release was first seen (or its own TTL, if
//!   sooner), so the stale rules (stale-while-revalidate, stale-if-error,
//!   `max-stale`) treat it like any expired entry and its next request buys
//!   it again (coalesced as any miss).
//! - **`cache.freshness = "release"`.** An entry of the current release
//!   stays fresh past its route TTL, up to `cache.release_max_age_secs`
//!   from when it was bought, while the release is read successfully: the
//!   last read succeeded and is at most two poll intervals old. Otherwise
//!   (the upstream down, a body that does not parse, a release that went
//!   backwards) the route TTLs are the rule.
//! - **Unstamped entries** (written by 0.2.0, or before the first read)
//!   count as bought under the first release this process read: an upgrade
//!   re-buys nothing at once; they are outdated by the next newer release.
//!
//! A date that is missing, does not parse or is older than the current one
//! is never taken as new data; one that goes backwards or jumps more than
//! [`ODD_JUMP_DAYS`] ahead is logged (a jump is still taken: the vendor
//! says so). Nothing here ever empties the cache.

use super::Entry;
use crate::clock::now_ms;
use chrono::NaiveDate;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A release more than this many days after the current one is logged as
/// odd (the vendor publishes about monthly).
pub(crate) const ODD_JUMP_DAYS: u32 = 120;

/// What the last read of the release said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// A date (as a day number): the release the vendor serves now.
    Date(u32),
    /// No usable answer: the upstream failed, refused, or its body had no
    /// date that parses.
    Unreadable,
}

/// What [`Release::observe`] made of a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The first release this process read.
    First,
    /// A newer release: older answers are outdated from now.
    Newer,
    /// The same release again.
    Same,
    /// An older date than the current one: logged, ignored.
    Backwards,
    /// No date.
    Unreadable,
}

/// The release as this gateway knows it. Written by the release loop only,
/// read by every lookup: atomics, no lock on the hot path.
pub(crate) struct Release {
    /// `cache.freshness = "release"`.
    release_bound: bool,
    max_age_ms: u64,
    /// Two poll intervals: how old the last good read may be for
    /// release-bound freshness to hold.
    trust_ms: u64,
    /// The current release (day number); 0: none read yet.
    current: AtomicU32,
    /// The first release read: what an unstamped entry counts as.
    baseline: AtomicU32,
    /// When the current release was first seen here (Unix ms).
    seen_at_ms: AtomicU64,
    /// When a read last succeeded (Unix ms); 0: never.
    last_ok_ms: AtomicU64,
    /// Whether the last read succeeded.
    healthy: AtomicBool,
}

/// A `YYYY-MM-DD` release date as a day number (days since 1970-01-01);
/// `None` for anything else (and for dates before 1970).
pub(crate) fn day_of(text: &str) -> Option<u32> {
    let date = NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d").ok()?;
    let days = date
        .signed_duration_since(NaiveDate::from_ymd_opt(1970, 1, 1)?)
        .num_days();
    u32::try_from(days).ok().filter(|d| *d > 0)
}

/// A day number as its `YYYY-MM-DD` date.
pub(crate) fn date_of(day: u32) -> String {
    NaiveDate::from_ymd_opt(1970, 1, 1)
        .and_then(|epoch| epoch.checked_add_days(chrono::Days::new(u64::from(day))))
        .map_or_else(String::new, |d| d.format("%Y-%m-%d").to_string())
}

/// The release a `/v2/meta/release` body names: `{"released_at": "YYYY-MM-DD"}`.
pub(crate) fn parse_body(body: &[u8]) -> Read {
    let value: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    value
        .as_ref()
        .and_then(|v| v.get("released_at"))
        .and_then(serde_json::Value::as_str)
        .and_then(day_of)
        .map_or(Read::Unreadable, Read::Date)
}

impl Release {
    pub(crate) fn new(release_bound: bool, max_age: Duration, poll: Duration) -> Arc<Release> {
        Arc::new(Release {
            release_bound,
            max_age_ms: max_age.as_millis() as u64,
            trust_ms: 2 * poll.as_millis() as u64,
            current: AtomicU32::new(0),
            baseline: AtomicU32::new(0),
            seen_at_ms: AtomicU64::new(0),
            last_ok_ms: AtomicU64::new(0),
            healthy: AtomicBool::new(false),
        })
    }

    /// The stamp of an answer bought now: the current release (0: none read).
    pub(crate) fn stamp(&self) -> u32 {
        self.current.load(Ordering::Acquire)
    }

    /// Whether the last read succeeded.
    pub(crate) fn readable(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// When a read last succeeded (Unix ms; 0: never).
    pub(crate) fn last_ok_ms(&self) -> u64 {
        self.last_ok_ms.load(Ordering::Relaxed)
    }

    /// The release an entry came from: its stamp, or for an unstamped one
    /// the first release read; 0 when unknown.
    pub(crate) fn of(&self, entry: &Entry) -> u32 {
        match entry.release {
            0 => self.baseline.load(Ordering::Relaxed),
            r => r,
        }
    }

    /// A read of the release at `now`. `read_at`: when the read was made
    /// (another replica's, through Redis, may be older than now).
    pub(crate) fn observe(&self, read: Read, read_at_ms: u64) -> Seen {
        let Read::Date(day) = read else {
            self.healthy.store(false, Ordering::Relaxed);
            return Seen::Unreadable;
        };
        let current = self.current.load(Ordering::Acquire);
        let seen = if current == 0 {
            self.baseline.store(day, Ordering::Relaxed);
            Seen::First
        } else if day > current {
            if day - current > ODD_JUMP_DAYS {
                tracing::warn!(
                    from = %date_of(current),
                    to = %date_of(day),
                    "data release jumped far ahead; taken, as the vendor says"
                );
            }
            Seen::Newer
        } else if day < current {
            tracing::warn!(
                current = %date_of(current),
                read = %date_of(day),
                "data release went backwards: ignored, the cache is kept; route TTLs rule until it reads right"
            );
            self.healthy.store(false, Ordering::Relaxed);
            return Seen::Backwards;
        } else {
            Seen::Same
        };
        if seen != Seen::Same {
            self.seen_at_ms.store(now_ms(), Ordering::Relaxed);
            self.current.store(day, Ordering::Release);
        }
        self.last_ok_ms.fetch_max(read_at_ms, Ordering::Relaxed);
        self.healthy.store(true, Ordering::Relaxed);
        seen
    }

    /// Whether release-bound freshness holds at `now` (`cache.freshness =
    /// "release"`, the last read succeeded and is recent).
    pub(crate) fn bound(&self, now: u64) -> bool {
        self.release_bound
            && self.healthy.load(Ordering::Relaxed)
            && now.saturating_sub(self.last_ok_ms.load(Ordering::Relaxed)) <= self.trust_ms
    }

    /// Whether `entry` came from a release older than the current one.
    pub(crate) fn outdated(&self, entry: &Entry) -> bool {
        let of = self.of(entry);
        of != 0 && of < self.current.load(Ordering::Acquire)
    }

    /// The entry as the release makes it at `now`: outdated by a newer
    /// release (expired from when that release was first seen), fresh past
    /// its TTL under release-bound freshness, or as it is. A changed view is
    /// a copy (the body and ETag shared), never written back to a tier.
    pub(crate) fn view(&self, entry: Arc<Entry>, now: u64) -> Arc<Entry> {
        let current = self.current.load(Ordering::Acquire);
        if current == 0 {
            return entry;
        }
        let of = self.of(&entry);
        let expires = entry.stored_at_ms.saturating_add(entry.ttl_ms);
        let until = if of != 0 && of < current {
            let seen = self.seen_at_ms.load(Ordering::Relaxed);
            expires.min(seen.max(entry.stored_at_ms))
        } else if of == current && self.bound(now) {
            expires.max(entry.stored_at_ms.saturating_add(self.max_age_ms))
        } else {
            expires
        };
        if until == expires {
            return entry;
        }
        Arc::new(Entry {
            ttl_ms: until - entry.stored_at_ms,
            ..Entry::clone(&entry)
        })
    }

    /// The extra life an entry is kept for beyond its TTL and stale grace:
    /// `cache.release_max_age_secs` under release-bound freshness.
    pub(crate) fn extra_life(&self) -> Duration {
        match self.release_bound {
            true => Duration::from_millis(self.max_age_ms),
            false => Duration::ZERO,
        }
    }

    /// Whether `entry` (as [`Release::view`] made it), answering at `now`,
    /// is fresh only because of release-bound freshness: older than `ttl`,
    /// its route's TTL.
    pub(crate) fn kept_by_release(&self, entry: &Entry, ttl: Duration, now: u64) -> bool {
        self.release_bound && entry.is_fresh(now) && entry.age(now) >= ttl
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Route;
    use bytes::Bytes;

    fn entry(release: u32, stored_at_ms: u64, ttl_secs: u64) -> Arc<Entry> {
        let mut e = Entry::new(Bytes::new(), 1, Duration::from_secs(ttl_secs), Route::Other);
        e.stored_at_ms = stored_at_ms;
        e.release = release;
        Arc::new(e)
    }

    #[test]
    fn dates_parse_and_print() {
        let day = day_of("2025-07-15").unwrap();
        assert_eq!(date_of(day), "2025-07-15");
        assert_eq!(day_of("soon"), None);
        assert_eq!(day_of(""), None);
        assert_eq!(parse_body(br#"{"released_at":"2025-07-15"}"#), Read::Date(day));
        assert_eq!(parse_body(br#"{"released_at":"15/07/2025"}"#), Read::Unreadable);
        assert_eq!(parse_body(b"<html>"), Read::Unreadable);
        assert_eq!(parse_body(br#"{"released":"2025-07-15"}"#), Read::Unreadable);
    }

    #[test]
    fn a_newer_release_outdates_older_answers_and_backwards_is_ignored() {
        let r = Release::new(false, Duration::from_secs(3600), Duration::from_secs(60));
        let now = now_ms();
        let old = entry(0, now - 1_000, 3600);
        assert!(Arc::ptr_eq(&r.view(old.clone(), now), &old), "nothing read: as it is");
        assert_eq!(r.observe(Read::Date(100), now), Seen::First);
        assert!(
            r.view(old.clone(), now).is_fresh(now),
            "unstamped: the first release read"
        );
        assert_eq!(r.observe(Read::Date(100), now), Seen::Same);
        assert_eq!(r.observe(Read::Date(107), now), Seen::Newer);
        assert!(!r.view(old.clone(), now + 1).is_fresh(now + 1), "outdated");
        let stamped = entry(100, now - 1_000, 3600);
        assert!(r.outdated(&stamped));
        assert!(!r.view(stamped, now + 1).is_fresh(now + 1));
        let current = entry(107, now, 3600);
        assert!(r.view(current.clone(), now + 1).is_fresh(now + 1));
        assert_eq!(r.observe(Read::Date(90), now), Seen::Backwards);
        assert_eq!(r.stamp(), 107, "a release never goes backwards");
        assert!(r.view(current, now + 1).is_fresh(now + 1), "the cache is kept");
        assert_eq!(r.observe(Read::Unreadable, now), Seen::Unreadable);
        assert_eq!(r.stamp(), 107);
    }

    #[test]
    fn release_bound_freshness_holds_only_while_the_release_reads() {
        let r = Release::new(true, Duration::from_secs(3600), Duration::from_secs(60));
        let now = now_ms();
        let e = entry(100, now - 20_000, 10);
        assert!(!r.view(e.clone(), now).is_fresh(now), "nothing read: the TTL");
        r.observe(Read::Date(100), now);
        assert!(r.view(e.clone(), now).is_fresh(now), "past its TTL, same release");
        assert!(r.kept_by_release(&r.view(e.clone(), now), Duration::from_secs(10), now));
        assert!(
            !r.kept_by_release(&e, Duration::from_secs(10), now),
            "not fresh as it is"
        );
        assert!(!r.view(e.clone(), now + 3_600_000).is_fresh(now + 3_600_000), "max age");
        r.observe(Read::Unreadable, now);
        assert!(!r.view(e.clone(), now).is_fresh(now), "unreadable: the TTL");
        r.observe(Read::Date(100), now);
        assert!(
            !r.view(e.clone(), now + 121_000).is_fresh(now + 121_000),
            "last read too old"
        );
        r.observe(Read::Date(101), now);
        assert!(!r.view(e, now).is_fresh(now), "a newer release outdates it");
    }
}
