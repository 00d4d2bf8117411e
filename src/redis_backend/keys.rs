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
//!
//! **Typed keys.** A key the cache reads or writes from Rust is a type of
//! its own, tied to the type of value stored under it ([`RedisKey`], as
//! svix's `kv_def!` ties a key type to its value): an [`EntryKey`] holds an
//! encoded `cache::Entry`, a [`LeaseKey`] a lease's token, the
//! [`PurgesKey`] the purges' tokens. Its [`Keys`] method is the only way to
//! build one, so its bytes are formatted here alone. The ledger's and the
//! shared rate's keys stay strings: the Lua scripts that own them
//! (`ledger::redis::scripts`, `scheduler::shared`) read and write their values,
//! one key holding a different kind of value from another.

use crate::route::Route;
use redis::{RedisWrite, ToRedisArgs};
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// A Redis key of one kind, and the one type of value stored under it: a
/// command that writes a value takes the key it goes under ([`set_px`]),
/// so no value lands under another kind's key. Sent as its bytes.
pub(crate) trait RedisKey: ToRedisArgs {
    /// What is stored under a key of this kind.
    type Value;
}

/// `SET key value PX ms`: a value written under its own kind of key only.
pub(crate) fn set_px<K>(key: &K, value: &K::Value, px_ms: u64) -> redis::Cmd
where
    K: RedisKey,
    K::Value: ToRedisArgs,
{
    let mut set = redis::cmd("SET");
    set.arg(key).arg(value).arg("PX").arg(px_ms);
    set
}

/// One kind of Redis key: a newtype over its bytes, built only by a method
/// of [`Keys`], sent to Redis as those bytes; with `=> Value`, the value
/// stored under it (else tied where the value's type is defined).
macro_rules! key_kind {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub(crate) struct $name(String);

        #[cfg(test)]
        impl $name {
            /// The key's bytes, as the tests pin them (elsewhere a key only
            /// goes to Redis).
            pub(crate) fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl ToRedisArgs for $name {
            fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
                out.write_arg(self.0.as_bytes());
            }
        }
    };
    ($(#[$doc:meta])* $name:ident => $value:ty) => {
        key_kind!($(#[$doc])* $name);

        impl RedisKey for $name {
            type Value = $value;
        }
    };
}

key_kind! {
    /// A cached answer (page, record, monthly row) or a complete-page
    /// index: its value is an encoded `cache::Entry`, tied to it in
    /// `cache::entry` (this module sits below the cache).
    EntryKey
}

key_kind! {
    /// A key's cross-replica fetch lease: its value is the owner's random
    /// token, compared before a renewal or a release.
    LeaseKey => String
}

key_kind! {
    /// The purges of every replica: a hash of route name or `all` to the
    /// token of its last purge ([`PurgeTokens`]).
    PurgesKey => PurgeTokens
}

/// The value of the [`PurgesKey`]: route name or `all` → its last token.
pub(crate) type PurgeTokens = HashMap<String, String>;

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
    /// The company's account only (`ledger::redis::seed`): set once its
    /// spend is whole (seeded from the teams', or found with its own),
    /// so that no other replica seeds it again. Not in [`LedgerKey::ALL`]:
    /// no team has one.
    Seeded,
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
            LedgerKey::Seeded => "seeded",
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
    pub(crate) fn entry(&self, route: Route, cache_key: &str) -> EntryKey {
        self.cached(route, "", &Tag::of(cache_key))
    }

    /// [`Keys::entry`] with the key's [`Tag`] worked out before (a
    /// memoized request target carries it: `proxy::parsed`).
    pub(crate) fn entry_tagged(&self, route: Route, tag: &Tag) -> EntryKey {
        self.cached(route, "", tag)
    }

    /// A complete page filed again under its size-free index key
    /// (`cache::covered`). Marked `i:` so that it can be counted apart from
    /// the answers bought (`bench/run.py` counts the keys bought so); never leased: never
    /// fetched under this key.
    pub(crate) fn complete_index(&self, route: Route, index_key: &str) -> EntryKey {
        self.cached(route, "i:", &Tag::of(index_key))
    }

    /// `{prefix}c:{route}:{mark}{{hash}}`, written into one buffer of the
    /// right size: it is formatted on every lookup (a Redis-tier hit), where
    /// `format!` and `hex::encode`'s string of chars were ~3.7k instructions
    /// (callgrind) against the few hundred of this.
    fn cached(&self, route: Route, mark: &str, tag: &Tag) -> EntryKey {
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
        EntryKey(key)
    }

    /// The cross-replica fetch lease of a cache key (`cache::lease`): the
    /// same `{hash}` tag as the entry it guards.
    pub(crate) fn lease(&self, cache_key: &str) -> LeaseKey {
        LeaseKey(format!("{}lease:{{{}}}", self.prefix, Tag::of(cache_key).as_str()))
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
    pub(crate) fn purges(&self) -> PurgesKey {
        PurgesKey(format!("{}purges", self.prefix))
    }

    /// One of a team's ledger keys; the `{team}` tag keeps a script's keys
    /// (and the saved-credits pipeline of one team) in one slot.
    pub(crate) fn ledger(&self, team: &str, key: LedgerKey) -> String {
        format!("{}l:{{{team}}}:{}", self.prefix, key.suffix())
    }

    /// The format the ledger's keys are in (`ledger::redis::format`): a hash
    /// of `format` and `since`.
    pub(crate) fn ledger_format(&self) -> String {
        format!("{}l:format", self.prefix)
    }

    /// The shared upstream rate's GCRA state (`scheduler::shared`).
    pub(crate) fn rate(&self) -> String {
        format!("{}{{rate}}:upstream", self.prefix)
    }

    /// The pause every replica honours after an upstream 429; `{rate}` as
    /// [`Keys::rate`]: the rate script reads both.
    pub(crate) fn rate_pause(&self) -> String {
        format!("{}{{rate}}:upstream:pause", self.prefix)
    }

    /// The replicas sharing the rate (`scheduler::shared`): a sorted set of
    /// replica ids scored by when Redis last saw each; `{rate}` as
    /// [`Keys::rate`]: the rate script counts them as it takes a permit.
    pub(crate) fn rate_replicas(&self) -> String {
        format!("{}{{rate}}:upstream:replicas", self.prefix)
    }

    /// The calls of the last 60 s (`scheduler::shared`): a sorted set scored by
    /// Redis's time; `{rate}` as [`Keys::rate`].
    pub(crate) fn rate_window(&self) -> String {
        format!("{}{{rate}}:upstream:window", self.prefix)
    }

    /// The teams with calls in the window, scored by their last.
    pub(crate) fn rate_teams(&self) -> String {
        format!("{}{{rate}}:upstream:teams", self.prefix)
    }

    /// One team's calls in the window (a team name is `[a-z0-9_-]`).
    pub(crate) fn rate_team(&self, team: &str) -> String {
        format!("{}{{rate}}:upstream:team:{team}", self.prefix)
    }

    /// The data release as the replica reading it last saw it
    /// (`crate::release`). Untagged: read alone, by one command.
    pub(crate) fn release(&self) -> String {
        format!("{}release", self.prefix)
    }

    /// Which replica reads the data release this interval: its token, with
    /// the interval as its expiry (`crate::release`). Untagged, as
    /// [`Keys::release`].
    pub(crate) fn release_lease(&self) -> String {
        format!("{}release:lease", self.prefix)
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
    const SERIES: &str = "county_metrics_monthly /v2/counties/abc/metrics/monthly tag=solar&property_type=vacant+land";
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
        // A page: its entry (from the key, or from its memoized tag) and its lease.
        let page = "pgw:c:permits_search:{ad5cb07a470f427746d3e3ea3462b7a246c69abf73d64bef5ac99f8d8ccf5061}";
        assert_eq!(k.entry(Route::PermitsSearch, PAGE).as_str(), page);
        assert_eq!(k.entry_tagged(Route::PermitsSearch, &Tag::of(PAGE)).as_str(), page);
        assert_eq!(
            k.lease(PAGE).as_str(),
            "pgw:lease:{ad5cb07a470f427746d3e3ea3462b7a246c69abf73d64bef5ac99f8d8ccf5061}"
        );
        assert_eq!(
            k.complete_index(Route::PermitsSearch, INDEX).as_str(),
            "pgw:c:permits_search:i:{bd51f80e6ed548f92e95621ba673ac94c09eb3c4abd77a0a3b14b81c3890c648}"
        );
        // A record: its cache key, its entry and its lease.
        let record = record_key(Route::PermitsById, "P1");
        assert_eq!(record, "rec permits_by_id P1");
        assert_eq!(
            k.entry(Route::PermitsById, &record).as_str(),
            "pgw:c:permits_by_id:{e63241dae22a10677c0ed286b4f646f99e067ad73b8e790dd8148dc8427d45b3}"
        );
        assert_eq!(
            k.lease(&record).as_str(),
            "pgw:lease:{e63241dae22a10677c0ed286b4f646f99e067ad73b8e790dd8148dc8427d45b3}"
        );
        // A monthly series: a row's cache key and entry, the lease of its turn.
        let row = row_key(SERIES, 2024, 3);
        assert_eq!(row, format!("mon {SERIES} 2024-03"));
        assert_eq!(
            k.entry(Route::CountyMetricsMonthly, &row).as_str(),
            "pgw:c:county_metrics_monthly:{cde527c76a57a82bbb95da3589d4a42f5c513ad0d5f89145fd9d6011e4915abc}"
        );
        let turn = series_key(SERIES);
        assert_eq!(turn, format!("months {SERIES}"));
        assert_eq!(
            k.lease(&turn).as_str(),
            "pgw:lease:{7895235fba2a209eb3e72293907baa281da61f2e141dc60e9da6545a30c12b94}"
        );
        // Purges.
        assert_eq!(k.purge_pattern(None), "pgw:c:*");
        assert_eq!(k.purge_pattern(Some(Route::PermitsById)), "pgw:c:permits_by_id:*");
        assert_eq!(k.purges().as_str(), "pgw:purges");
        // A team's ledger, the shared rate.
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
        assert_eq!(k.ledger("*org", LedgerKey::Seeded), "pgw:l:{*org}:seeded");
        assert_eq!(k.ledger_format(), "pgw:l:format", "no team's: a team's keys are tagged");
        assert_eq!(k.rate(), "pgw:{rate}:upstream");
        assert_eq!(k.rate_pause(), "pgw:{rate}:upstream:pause");
        assert_eq!(k.rate_replicas(), "pgw:{rate}:upstream:replicas");
        assert_eq!(Keys::new("").rate(), "{rate}:upstream", "the prefix is all that varies");
    }

    #[test]
    fn a_typed_key_is_sent_as_its_bytes() {
        let k = keys();
        let entry = k.entry(Route::PermitsSearch, PAGE);
        assert_eq!(entry.to_redis_args(), [entry.as_str().as_bytes().to_vec()]);
        let set = set_px(&k.lease(PAGE), &"token".to_string(), 1500);
        assert_eq!(
            redis::cmd("SET")
                .arg(k.lease(PAGE).as_str())
                .arg("token")
                .arg("PX")
                .arg(1500u64)
                .get_packed_command(),
            set.get_packed_command()
        );
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
        let page = slot(k.entry(Route::PermitsSearch, PAGE).as_str());
        assert_eq!(page, slot(k.lease(PAGE).as_str()), "an entry and its lease");
        assert_eq!(page, slot(PAGE_HASH), "the tag is the key's hash");
        let record = record_key(Route::PermitsById, "P1");
        assert_eq!(
            slot(k.entry(Route::PermitsById, &record).as_str()),
            slot(k.lease(&record).as_str()),
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
