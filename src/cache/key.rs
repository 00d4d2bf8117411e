//! The normalized cache key: two requests get the same key only when the
//! upstream must give them the same answer. Pure functions, no I/O.
//!
//! How each parameter is read comes from the route table
//! ([`crate::route::table`]). What is normalized, and why each is provably
//! equal for the upstream (FastAPI + Pydantic v2, per `docs/vendor-api.md`,
//! "How the upstream reads a query"):
//! - parameter order: FastAPI reads parameters by name;
//! - set-valued filters (`permit_tags`, `permit_status`, `property_type`,
//!   `contractor_classification_derived` on the two searches): sorted and
//!   de-duplicated, since they are AND/OR sets. Not de-duplicated when that
//!   would hide a `maxItems` violation the upstream answers with 422. The
//!   newer operations' lists (decision and property filters, lookup ids) are
//!   kept as sent: that their order and repeats do not matter is not proven,
//!   and for ids it is false where documented (`/properties?id=` answers "in
//!   request order");
//! - repeated scalar parameters: Starlette hands FastAPI the last value;
//! - documented defaults equal their absence: `size=50`,
//!   `include_count=false`, `include_tallies=true`,
//!   `include_total_count=false`; `include_count` on a cursor page, where
//!   the upstream documents it as ignored;
//! - boolean spellings Pydantic accepts (`1`, `yes`, `on`, `t`, `y`, any
//!   case) become `true`/`false`;
//! - percent-encoding and `+` for space are decoded and re-encoded one way.
//!
//! Never in the key: the team, its token, headers. Unknown parameters stay,
//! in their original relative order; anything that does not decode to UTF-8
//! leaves the whole query verbatim (no sharing, but never a wrong answer).

use crate::route::table::Kind as Param;
use crate::route::{Route, Target};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::borrow::Cow;

/// Bumped when the key format changes, so old L2 entries are never misread.
const KEY_VERSION: &str = "k1";

/// What is re-encoded in keys: everything but RFC 3986 unreserved characters.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// How the key treats one parameter of one route, from the route table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A repeatable filter with set semantics; `max_items` as validated.
    Set { max_items: Option<usize> },
    /// A scalar; `default` is the value that equals absence.
    Scalar {
        default: Option<&'static str>,
        boolean: bool,
    },
    /// Not declared for this route, or a list whose order is not proven
    /// free (ids): kept exactly as sent.
    Unknown,
}

fn kind(route: Route, name: &str) -> Kind {
    let scalar = |default, boolean| Kind::Scalar { default, boolean };
    match route.param(name) {
        Some(Param::Set { max_items }) => Kind::Set { max_items },
        Some(Param::List { .. } | Param::Ids) | None => Kind::Unknown,
        Some(Param::Scalar) => scalar(None, false),
        Some(Param::Flag { default }) => scalar(default.map(|b| if b { "true" } else { "false" }), true),
        Some(Param::Size) => scalar(Some("50"), false),
        Some(Param::Count) => scalar(Some("false"), true),
    }
}

/// Pydantic's lax booleans; `None` when the upstream would answer 422.
fn canonical_bool(value: &str) -> Option<&'static str> {
    // Compared without lowercasing into a new String: this runs on every hit.
    let is = |spellings: &[&str]| spellings.iter().any(|s| s.eq_ignore_ascii_case(value));
    if is(&["true", "1", "yes", "on", "t", "y"]) {
        Some("true")
    } else if is(&["false", "0", "no", "off", "f", "n"]) {
        Some("false")
    } else {
        None
    }
}

/// The cache key of a request target.
pub fn cache_key(target: &Target) -> String {
    let mut key = String::with_capacity(target.path.len() + target.query.as_deref().map_or(0, str::len) + 8);
    key.push_str(KEY_VERSION);
    key.push(' ');
    key.push_str(&target.path);
    if let Some(query) = target.query.as_deref() {
        let normalized = normalize_query(target.route, query);
        if !normalized.is_empty() {
            key.push('?');
            key.push_str(&normalized);
        }
    }
    key
}

/// Prefix of a complete-page index key ([`complete_key`]): a key space of
/// its own, so an index entry is never taken for the answer of a request
/// that has that text as its own key.
const COMPLETE_VERSION: &str = "k1c";

/// Whether `key` is a complete-page index ([`complete_key`]).
pub(super) fn is_complete_index(key: &str) -> bool {
    key.strip_prefix(COMPLETE_VERSION)
        .is_some_and(|rest| rest.starts_with(' '))
}

/// The path and normalized query of a key; `None` for a verbatim
/// (undecodable) query, which is never shared.
fn key_parts(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix(KEY_VERSION)?.strip_prefix(' ')?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    (!query.starts_with('!')).then_some((path, query))
}

fn joined(version: &str, path: &str, query: &str) -> String {
    if query.is_empty() {
        format!("{version} {path}")
    } else {
        format!("{version} {path}?{query}")
    }
}

/// The index a complete page (`next_cursor: null`) of `key` is filed under:
/// the key without `size`. Every page filed there for one query is the
/// same answer (all of its records from the cursor on), and it answers a
/// `size` only when it holds no more records than that size
/// ([`super::Cache::held`] checks). `None` on routes without `size`.
pub(super) fn complete_key(route: Route, key: &str) -> Option<String> {
    if route.param("size") != Some(Param::Size) {
        return None;
    }
    let (path, query) = key_parts(key)?;
    // The default, appended last, wins and is then dropped: no size left.
    let sizeless = normalize_query(route, &format!("{query}&size=50"));
    Some(joined(COMPLETE_VERSION, path, &sizeless))
}

/// The page size a key asks for (`size`, or the documented default of 50
/// that normalization drops); `None` on routes without `size`, for a
/// verbatim query and for a value that is no page size.
pub(super) fn size_of(route: Route, key: &str) -> Option<u64> {
    if route.param("size") != Some(Param::Size) {
        return None;
    }
    let (_, query) = key_parts(key)?;
    let pairs = decode_pairs(query)?;
    match pairs.iter().rev().find(|(k, _)| k == "size") {
        None => Some(50),
        Some((_, v)) => v.parse().ok(),
    }
}

/// The key of the same first page asked with `include_count=true`, which
/// holds the answer to `key` plus its count. `None` on a cursor page (the
/// count is ignored there, so that key is `key` itself), on a page already
/// counted and on routes without `include_count`.
pub(super) fn counted_key(route: Route, key: &str) -> Option<String> {
    if route.param("include_count") != Some(Param::Count) {
        return None;
    }
    let (path, query) = key_parts(key)?;
    let counted = normalize_query(route, &format!("{query}&include_count=true"));
    (counted != query).then(|| joined(KEY_VERSION, path, &counted))
}

/// The canonical form of a query string for a route.
pub fn normalize_query(route: Route, query: &str) -> String {
    let Some(pairs) = decode_pairs(query) else {
        // Not UTF-8 once decoded: keep it byte for byte.
        return format!("!{query}");
    };
    let has_cursor = pairs
        .iter()
        .any(|(k, _)| k == "cursor" && kind(route, k) != Kind::Unknown);
    let mut names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_ref()).collect();
    names.sort_unstable();
    names.dedup();
    // Borrowed from `pairs` (or static): building the key copies each byte once.
    let mut out: Vec<(&str, &str)> = Vec::with_capacity(pairs.len());
    for name in names {
        let mut values = pairs.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_ref());
        match kind(route, name) {
            Kind::Unknown => out.extend(values.map(|v| (name, v))),
            Kind::Set { max_items } => {
                let mut vs: Vec<&str> = values.collect();
                vs.sort_unstable();
                if max_items.is_none_or(|max| vs.len() <= max) {
                    vs.dedup();
                }
                out.extend(vs.into_iter().map(|v| (name, v)));
            }
            Kind::Scalar { default, boolean } => {
                let Some(last) = values.next_back() else { continue };
                let value = if boolean {
                    canonical_bool(last).unwrap_or(last)
                } else {
                    last
                };
                let ignored = has_cursor && route.param(name) == Some(Param::Count) && canonical_bool(last).is_some();
                if default == Some(value) || ignored {
                    continue;
                }
                out.push((name, value));
            }
        }
    }
    let mut text = String::with_capacity(query.len());
    for (i, (k, v)) in out.iter().enumerate() {
        if i > 0 {
            text.push('&');
        }
        text.extend(utf8_percent_encode(k, QUERY_VALUE));
        text.push('=');
        text.extend(utf8_percent_encode(v, QUERY_VALUE));
    }
    text
}

/// `application/x-www-form-urlencoded` pairs, strictly: `None` when any
/// name or value is not UTF-8 after decoding (a lossy decode could make two
/// different queries equal).
pub(crate) fn decode_pairs(query: &str) -> Option<Vec<(Cow<'_, str>, Cow<'_, str>)>> {
    let mut pairs = Vec::new();
    for part in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        pairs.push((decode(k)?, decode(v)?));
    }
    Some(pairs)
}

/// Borrows when there is nothing to decode (the common case: no allocation).
fn decode(s: &str) -> Option<Cow<'_, str>> {
    if s.contains('+') {
        let spaced = s.replace('+', " ");
        return percent_decode_str(&spaced)
            .decode_utf8()
            .ok()
            .map(|c| Cow::Owned(c.into_owned()));
    }
    percent_decode_str(s).decode_utf8().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(route: Route, path: &str, query: &str) -> String {
        cache_key(&Target {
            route,
            path: path.into(),
            query: Some(query.into()),
        })
    }

    fn permits(query: &str) -> String {
        key(Route::PermitsSearch, "/v2/permits/search", query)
    }

    #[test]
    fn order_defaults_booleans_and_encoding_do_not_matter() {
        let base = permits("geo_id=CA&permit_from=2024-01-01&permit_to=2024-12-31");
        for same in [
            "permit_to=2024-12-31&geo_id=CA&permit_from=2024-01-01",
            "geo_id=CA&permit_from=2024-01-01&permit_to=2024-12-31&size=50",
            "geo_id=CA&permit_from=2024-01-01&permit_to=2024-12-31&include_count=false",
            "geo_id=CA&permit_from=2024-01-01&permit_to=2024-12-31&include_count=0",
            "geo_id=C%41&permit_from=2024-01-01&permit_to=2024-12-31",
            "geo_id=CA&&permit_from=2024-01-01&permit_to=2024-12-31&",
            "geo_id=TX&geo_id=CA&permit_from=2024-01-01&permit_to=2024-12-31",
        ] {
            assert_eq!(permits(same), base, "{same}");
        }
    }

    #[test]
    fn sets_are_sorted_and_deduplicated_within_their_limits() {
        let a = permits("permit_tags=solar&permit_tags=-roofing&permit_tags=solar");
        let b = permits("permit_tags=-roofing&permit_tags=solar");
        assert_eq!(a, b);
        // Five statuses is a 422 upstream, four is not: never made equal.
        let five = permits(
            "permit_status=active&permit_status=active&permit_status=final&permit_status=final&permit_status=in_review",
        );
        let three = permits("permit_status=active&permit_status=final&permit_status=in_review");
        assert_ne!(five, three);
    }

    #[test]
    fn meaningful_differences_give_different_keys() {
        let base = permits("geo_id=CA&size=10");
        for other in [
            "geo_id=CA&size=11",
            "geo_id=ca&size=10",
            "geo_id=CA&size=10&include_count=true",
            "geo_id=CA&size=10&permit_q=",
            "geo_id=CA&size=010",
        ] {
            assert_ne!(permits(other), base, "{other}");
        }
        assert_ne!(
            key(
                Route::ContractorsSearch,
                "/v2/contractors/search",
                "geo_id=CA&include_tallies=false"
            ),
            key(Route::ContractorsSearch, "/v2/contractors/search", "geo_id=CA"),
        );
        assert_ne!(
            permits("geo_id=CA"),
            key(Route::ContractorsSearch, "/v2/contractors/search", "geo_id=CA")
        );
    }

    #[test]
    fn defaults_are_route_specific() {
        // jurisdictions/search has no size: unknown there, so it stays.
        assert_ne!(
            key(Route::JurisdictionsSearch, "/v2/jurisdictions/search", "q=a&size=50"),
            key(Route::JurisdictionsSearch, "/v2/jurisdictions/search", "q=a"),
        );
        // include_tallies means nothing on permit search.
        assert_ne!(permits("geo_id=CA&include_tallies=true"), permits("geo_id=CA"));
        // On metrics, property_type is a scalar: last one wins, no set.
        let m = |q| key(Route::CityMetricsMonthly, "/v2/cities/x/metrics/monthly", q);
        assert_eq!(m("property_type=office&property_type=all"), m("property_type=all"));
    }

    #[test]
    fn new_operations_normalize_only_what_is_proven() {
        // Lookup ids: order and repeats kept (answer order not known yet).
        let ids = |q| key(Route::PermitsById, "/v2/permits", q);
        assert_ne!(ids("id=a&id=b"), ids("id=b&id=a"));
        assert_ne!(ids("id=a&id=a"), ids("id=a"));
        assert_eq!(ids("id=a&id=b&unknown=1"), ids("unknown=1&id=a&id=b"));
        // Decision filters: lists whose order is not proven free.
        let d = |q| key(Route::DecisionsSearch, "/v2/decisions/search", q);
        assert_ne!(d("category=a&category=b"), d("category=b&category=a"));
        assert_eq!(d("geo_id=CA&size=50&include_count=false"), d("geo_id=CA"));
        assert_eq!(d("geo_id=CA&cursor=x&include_count=true"), d("geo_id=CA&cursor=x"));
        assert_eq!(d("decision_q=a&decision_q=b"), d("decision_q=b"));
        // Documented defaults of the new operations.
        let p = |q| key(Route::PropertiesSearch, "/v2/properties/search", q);
        assert_eq!(p("geo_id=CA&include_total_count=0"), p("geo_id=CA"));
        assert_ne!(p("geo_id=CA&include_total_count=1"), p("geo_id=CA"));
        let m = |q| key(Route::ContractorMetrics, "/v2/contractors/x/metrics", q);
        assert_eq!(m("tag=all&size=50"), m("tag=all"));
        // Geo searches declare no size: it stays in the key.
        let c = |q| key(Route::CitiesSearch, "/v2/cities/search", q);
        assert_ne!(c("q=a&size=50"), c("q=a"));
    }

    #[test]
    fn include_count_on_a_cursor_page_is_ignored() {
        assert_eq!(
            permits("geo_id=CA&cursor=abc&include_count=true"),
            permits("geo_id=CA&cursor=abc")
        );
        assert_ne!(permits("geo_id=CA&include_count=true"), permits("geo_id=CA"));
    }

    #[test]
    fn derived_keys_drop_size_or_add_the_count_and_nothing_else() {
        let complete = |q: &str| complete_key(Route::PermitsSearch, &permits(q)).expect("paged");
        assert_eq!(complete("geo_id=CA&size=10"), complete("geo_id=CA&size=100"));
        assert_eq!(complete("geo_id=CA&size=10"), complete("geo_id=CA"));
        assert_ne!(complete("geo_id=CA&size=10"), complete("geo_id=TX&size=10"));
        assert_ne!(complete("geo_id=CA"), complete("geo_id=CA&include_count=true"));
        assert_ne!(complete("geo_id=CA&cursor=a"), complete("geo_id=CA&cursor=b"));
        assert!(is_complete_index(&complete("geo_id=CA")), "a key space of its own");
        assert!(!is_complete_index(&permits("geo_id=CA")));
        assert_ne!(complete("geo_id=CA"), permits("geo_id=CA"));
        let counted = |q: &str| counted_key(Route::PermitsSearch, &permits(q));
        assert_eq!(
            counted("size=5&geo_id=CA"),
            Some(permits("geo_id=CA&size=5&include_count=true"))
        );
        assert_eq!(counted("geo_id=CA&cursor=x"), None, "ignored on a cursor page");
        assert_eq!(counted("geo_id=CA&include_count=1"), None, "already counted");
        assert_eq!(complete_key(Route::CitiesSearch, "k1 /v2/cities/search?q=a"), None);
        assert_eq!(counted_key(Route::ZipcodesSearch, "k1 /v2/zipcodes/search?q=1"), None);
        assert_eq!(complete_key(Route::PermitsSearch, &permits("geo_id=%FF")), None);
    }

    #[test]
    fn undecodable_queries_are_kept_verbatim() {
        assert_ne!(permits("geo_id=%FF"), permits("geo_id=%FE"));
        assert_eq!(permits("geo_id=%FF"), permits("geo_id=%FF"));
    }

    #[test]
    fn plus_is_a_space() {
        assert_eq!(permits("permit_q=heat+pump"), permits("permit_q=heat%20pump"));
    }

    fn param() -> impl Strategy<Value = (String, String)> {
        let names = prop::sample::select(vec![
            "geo_id",
            "permit_tags",
            "permit_status",
            "size",
            "permit_q",
            "cursor",
            "unknown_x",
            "include_count",
        ]);
        (names, "[a-zA-Z0-9 _-]{0,6}").prop_map(|(n, v)| (n.to_string(), v))
    }

    fn encode(pairs: &[(String, String)]) -> String {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish()
    }

    proptest! {
        #[test]
        fn any_permutation_of_distinct_params_gives_the_same_key(
            pairs in prop::collection::vec(param(), 0..8).prop_shuffle(),
            seed in any::<u64>(),
        ) {
            // Unknown and scalar repeats are order-sensitive by design; use distinct names there.
            let mut seen = std::collections::HashSet::new();
            let pairs: Vec<_> = pairs.into_iter().filter(|(k, _)| k.starts_with("permit_tags") || k.starts_with("permit_status") || seen.insert(k.clone())).collect();
            let mut shuffled = pairs.clone();
            let len = shuffled.len();
            if len > 1 {
                for i in 0..len {
                    let j = ((seed.rotate_left(i as u32) as usize) ^ i) % len;
                    shuffled.swap(i, j);
                }
            }
            prop_assert_eq!(permits(&encode(&pairs)), permits(&encode(&shuffled)));
        }

        #[test]
        fn changing_a_value_changes_the_key(
            pairs in prop::collection::vec(param(), 1..6),
            extra in "[a-z]{1,5}",
        ) {
            let mut seen = std::collections::HashSet::new();
            let pairs: Vec<_> = pairs.into_iter().filter(|(k, _)| seen.insert(k.clone())).collect();
            let mut changed = pairs.clone();
            // A value no default or boolean spelling can absorb.
            changed[0].1 = format!("{}zz{extra}", changed[0].1);
            prop_assert_ne!(permits(&encode(&pairs)), permits(&encode(&changed)));
        }

        #[test]
        fn normalizing_twice_changes_nothing(query in "[a-z_=&%0-9A-F+]{0,40}|(id|size|cursor|include_count|category)=[a-z0-9,]{0,3}(&(id|size|cursor|include_count|category)=[a-z0-9,]{0,3}){0,5}") {
            for route in Route::ALL {
                let once = normalize_query(route, &query);
                if !once.starts_with('!') {
                    prop_assert_eq!(normalize_query(route, &once), once.clone(), "{:?}", route);
                }
            }
        }
    }
}
