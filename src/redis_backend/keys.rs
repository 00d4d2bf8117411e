//! Every Redis key the gateway reads or writes, and the `{tag}` that puts it
//! on a Redis Cluster slot: cache entries and their fetch leases, records
//! and theirs, complete-page indexes, a team's ledger keys, the shared
//! upstream rate and the replicas sharing it, and the patterns a purge
//! scans. Nothing else formats a Redis key; `docs/operations.md` ("Keys
//! and hash tags") is the operator's table of the same keys.
//!
//! **The bytes are a contract with the previous release.** During a rolling
//! upgrade old and new replicas share L2, the leases, the ledger and the
//! rate: a key spelled differently would miss every entry (each bought
//! again), let two replicas buy one key under two leases, and split a
//! team's spend over two sets of keys (its budget granted twice). The tests
//! below pin each key's exact string.
//!
//! **Tags.** A Lua script or multi-key command must keep its keys in one
//! slot (else `CROSSSLOT`), so every key carries a tag: `{team}` for the
//! ledger, `{rate}` for the shared rate, `{<sha256 of the cache key>}` for
//! an entry and its lease. The prefix (`cache.redis_key_prefix`) may not
//! contain braces (`config::validate` refuses them): a tag in it would put
//! every key in one slot and take over the tags below.
//!
//! What is hashed into an entry's tag is the normalized cache key of
//! `cache::key` (its `k1` version re-keys every page when it changes) or a
//! record's key ([`record_key`]).

use crate::route::Route;
use sha2::{Digest, Sha256};

/// A team's ledger keys, one `{team}` tag for all: the reserve and settle
/// scripts touch them together (`src/ledger/redis/mod.rs` says what each holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LedgerKey {
    Days,
    Held,
    Routes,
    Settled,
    SettledAt,
    SettledScan,
    Lapsed,
}

impl LedgerKey {
    /// Every ledger key of a team, in the order `ledger::redis::scripts::SETTLE`
    /// takes them.
    pub(crate) const ALL: [LedgerKey; 7] = [
        LedgerKey::Days,
        LedgerKey::Held,
        LedgerKey::Routes,
        LedgerKey::Settled,
        LedgerKey::SettledAt,
        LedgerKey::SettledScan,
        LedgerKey::Lapsed,
    ];

    /// The key's last part, as every release since the ledger's first
    /// has written it.
    fn suffix(self) -> &'static str {
        match self {
            LedgerKey::Days => "days",
            LedgerKey::Held => "held",
            LedgerKey::Routes => "routes",
            LedgerKey::Settled => "settled",
            LedgerKey::SettledAt => "settled_at",
            LedgerKey::SettledScan => "settled_scan",
            LedgerKey::Lapsed => "lapsed",
        }
    }
}

/// The Redis keys of one gateway: every key starts with its prefix, so
/// gateways (or tests) with different prefixes share a Redis safely.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_string(),
        }
    }

    /// A cached answer (page or record). The route in it lets a purge find
    /// a route's keys ([`Keys::purge_pattern`]); the `{hash}` tag puts it
    /// in its lease's slot ([`Keys::lease`]), so one primary answers a
    /// waiter's poll of both and a failover moves both at once.
    pub(crate) fn entry(&self, route: Route, cache_key: &str) -> String {
        self.cached(route, "", &Tag::of(cache_key))
    }

    /// [`Keys::entry`] with the key's [`Tag`] worked out before (a
    /// memoized request target carries it: `proxy::parsed`).
    pub(crate) fn entry_tagged(&self, route: Route, tag: &Tag) -> String {
        self.cached(route, "", tag)
    }

    /// A complete page filed again under its size-free index key
    /// (`cache::covered`). Marked `i:` so that it can be counted apart from
    /// the answers bought (`bench/run.py` counts the keys bought so); never leased: never
    /// fetched under this key.
    pub(crate) fn complete_index(&self, route: Route, index_key: &str) -> String {
        self.cached(route, "i:", &Tag::of(index_key))
    }

    /// `{prefix}c:{route}:{mark}{{hash}}`, written into one buffer of the
    /// right size: it is formatted on every lookup (a Redis-tier hit), where
    /// `format!` and `hex::encode`'s string of chars were ~3.7k instructions
    /// (callgrind) against the few hundred of this.
    fn cached(&self, route: Route, mark: &str, tag: &Tag) -> String {
        let route = route.as_str();
        let mut key = String::with_capacity(self.prefix.len() + route.len() + mark.len() + 64 + 5);
        key.push_str(&self.prefix);
        key.push_str("c:");
        key.push_str(route);
        key.push(':');
        key.push_str(mark);
        key.push('{');
        key.push_str(tag.as_str());
        key.push('}');
        key
    }

    /// The cross-replica fetch lease of a cache key (`cache::lease`): the
    /// same `{hash}` tag as the entry it guards.
    pub(crate) fn lease(&self, cache_key: &str) -> String {
        format!("{}lease:{{{}}}", self.prefix, Tag::of(cache_key).as_str())
    }

    /// What a purge `SCAN`s for: every entry, or one route's (its complete
    /// indexes and, for a lookup route, its records included).
    pub(crate) fn purge_pattern(&self, route: Option<Route>) -> String {
        match route {
            None => format!("{}c:*", self.prefix),
            Some(r) => format!("{}c:{}:*", self.prefix, r.as_str()),
        }
    }

    /// The purges of every replica (`cache::purge`): route name or `all` →
    /// the token of its last purge. Untagged: read alone, by one command.
    pub(crate) fn purges(&self) -> String {
        format!("{}purges", self.prefix)
    }

    /// One of a team's ledger keys; the `{team}` tag keeps a script's keys
    /// (and the saved-credits pipeline of one team) in one slot.
    pub(crate) fn ledger(&self, team: &str, key: LedgerKey) -> String {
        format!("{}l:{{{team}}}:{}", self.prefix, key.suffix())
    }

    /// The shared upstream rate's GCRA state (`shared_rate`).
    pub(crate) fn rate(&self) -> String {
        format!("{}{{rate}}:upstream", self.prefix)
    }

    /// The pause every replica honours after an upstream 429; `{rate}` as
    /// [`Keys::rate`]: the rate script reads both.
    pub(crate) fn rate_pause(&self) -> String {
        format!("{}{{rate}}:upstream:pause", self.prefix)
    }

    /// The replicas sharing the rate (`shared_rate`): a sorted set of
    /// replica ids scored by when Redis last saw each; `{rate}` as
    /// [`Keys::rate`]: the rate script counts them as it takes a permit.
    pub(crate) fn rate_replicas(&self) -> String {
        format!("{}{{rate}}:upstream:replicas", self.prefix)
    }
}

/// A record's cache key: its L1 key and its flight's key, and, hashed, the
/// tag of its L2 entry and of its lease. Here because its bytes are part of
/// those Redis keys. `rec ` cannot begin a page key (`k1 /v2/…`), so the
/// two never meet in L1.
pub(crate) fn record_key(lookup_route: Route, id: &str) -> String {
    format!("rec {} {id}", lookup_route.as_str())
}

/// A monthly-metrics row's cache key (`cache::months`): its L1 key and,
/// hashed, the tag of its L2 entry. `mon ` cannot begin a page key.
pub(crate) fn row_key(series: &str, year: i32, month: u32) -> String {
    format!("mon {series} {year:04}-{month:02}")
}

/// The name a monthly series' turn is leased under across replicas
/// (`proxy::reuse::turn`): hashed into its lease key like a cache key;
/// `months ` cannot begin a page, record or row key.
pub(crate) fn series_key(series: &str) -> String {
    format!("months {series}")
}

/// The hash tag's content: the cache key's SHA-256 in lowercase hex (as
/// `hex::encode` writes it): fixed length whatever the key, and no `{` or
/// `}` from the query inside a tag. A pure function of the cache key, so
/// a memoized request target keeps it (`proxy::parsed`) and a hit from
/// Redis hashes nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag([u8; 64]);

impl Tag {
    pub(crate) fn of(cache_key: &str) -> Tag {
        let mut hex = [0u8; 64];
        // 32 bytes always fit 64 digits.
        let _ = hex::encode_to_slice(Sha256::digest(cache_key.as_bytes()), &mut hex);
        Tag(hex)
    }

    fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Debug for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::cluster_routing::Slot;

    const PAGE: &str = "k1 /v2/permits/search?geo_id=CA";
    const PAGE_HASH: &str = "ad5cb07a470f427746d3e3ea3462b7a246c69abf73d64bef5ac99f8d8ccf5061";
    const INDEX: &str = "k1c /v2/permits/search?geo_id=CA";
    const INDEX_HASH: &str = "bd51f80e6ed548f92e95621ba673ac94c09eb3c4abd77a0a3b14b81c3890c648";
    const RECORD_HASH: &str = "e63241dae22a10677c0ed286b4f646f99e067ad73b8e790dd8148dc8427d45b3";
    const LEDGER: [LedgerKey; 7] = LedgerKey::ALL;

    fn keys() -> Keys {
        Keys::new("pgw:")
    }

    fn slot(key: &str) -> Slot {
        Slot::for_key(key)
    }

    #[test]
    fn every_key_is_spelled_as_the_previous_release_spelled_it() {
        let k = keys();
        assert_eq!(
            k.entry(Route::PermitsSearch, PAGE),
            format!("pgw:c:permits_search:{{{PAGE_HASH}}}")
        );
        assert_eq!(k.lease(PAGE), format!("pgw:lease:{{{PAGE_HASH}}}"));
        assert_eq!(
            k.complete_index(Route::PermitsSearch, INDEX),
            format!("pgw:c:permits_search:i:{{{INDEX_HASH}}}")
        );
        let record = record_key(Route::PermitsById, "P1");
        assert_eq!(record, "rec permits_by_id P1");
        assert_eq!(
            k.entry(Route::PermitsById, &record),
            format!("pgw:c:permits_by_id:{{{RECORD_HASH}}}")
        );
        assert_eq!(k.lease(&record), format!("pgw:lease:{{{RECORD_HASH}}}"));
        assert_eq!(k.purge_pattern(None), "pgw:c:*");
        assert_eq!(k.purge_pattern(Some(Route::PermitsById)), "pgw:c:permits_by_id:*");
        assert_eq!(k.purges(), "pgw:purges");
        let ledger: Vec<String> = LEDGER.iter().map(|l| k.ledger("alpha", *l)).collect();
        assert_eq!(
            ledger,
            [
                "pgw:l:{alpha}:days",
                "pgw:l:{alpha}:held",
                "pgw:l:{alpha}:routes",
                "pgw:l:{alpha}:settled",
                "pgw:l:{alpha}:settled_at",
                "pgw:l:{alpha}:settled_scan",
                "pgw:l:{alpha}:lapsed",
            ]
        );
        assert_eq!(k.rate(), "pgw:{rate}:upstream");
        assert_eq!(k.rate_pause(), "pgw:{rate}:upstream:pause");
        assert_eq!(k.rate_replicas(), "pgw:{rate}:upstream:replicas");
        assert_eq!(Keys::new("").rate(), "{rate}:upstream", "the prefix is all that varies");
    }

    #[test]
    fn a_memoized_tag_spells_the_same_key() {
        let k = keys();
        assert_eq!(format!("{:?}", Tag::of(PAGE)), PAGE_HASH);
        for route in Route::ALL {
            assert_eq!(k.entry_tagged(route, &Tag::of(PAGE)), k.entry(route, PAGE));
        }
    }

    #[test]
    fn the_slot_helper_follows_the_cluster_spec() {
        // The spec's check value: CRC16/XMODEM("123456789") = 0x31C3 = 12739.
        assert_eq!(Some(slot("123456789")), Slot::new(12739));
        // Only the first `{...}` counts, and an empty one is no tag.
        assert_eq!(slot("a{user1000}.following"), slot("b{user1000}.followers"));
        assert_eq!(slot("a{user1000}{x}"), slot("user1000"));
        assert_ne!(slot("a{}{user1000}"), slot("user1000"));
    }

    #[test]
    fn keys_used_together_share_a_cluster_slot() {
        let k = keys();
        let page = slot(&k.entry(Route::PermitsSearch, PAGE));
        assert_eq!(page, slot(&k.lease(PAGE)), "an entry and its lease");
        assert_eq!(page, slot(PAGE_HASH), "the tag is the key's hash");
        let record = record_key(Route::PermitsById, "P1");
        assert_eq!(
            slot(&k.entry(Route::PermitsById, &record)),
            slot(&k.lease(&record)),
            "a record and its lease"
        );
        for team in ["alpha", "beta gamma", "x:y"] {
            let first = slot(&k.ledger(team, LEDGER[0]));
            assert!(
                LEDGER.iter().all(|l| slot(&k.ledger(team, *l)) == first),
                "every ledger key of {team}"
            );
            assert_eq!(first, slot(team), "tagged by the team's name");
        }
        let rate = slot(&k.rate());
        assert_eq!(rate, slot(&k.rate_pause()), "the rate script's keys: the pause");
        assert_eq!(rate, slot(&k.rate_replicas()), "the rate script's keys: the replicas");
    }
}
