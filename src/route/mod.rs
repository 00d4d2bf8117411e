//! Routing: a request path becomes a canonical `/v2/...` path and one route
//! name from a bounded set (docs/design.md §3.5), used as a metric label and to pick
//! credit estimates, TTLs and key normalization from the route table
//! ([`table`]).
//!
//! Sits right after the method check. A path is routed the way the vendor's
//! server routes it: percent-encoding is decoded first (uvicorn hands
//! Starlette the decoded path, so `/v2/%70ermits/search` *is* permit search
//! there), and then it must be canonical. A path with an empty segment
//! (`//v2/...`, `/v2//x`, a trailing `/`) or a dot-segment (`.`, `..`, also
//! encoded) matches no route upstream, so it is a 404 here too: never
//! resolved, never forwarded, never cached, and it cannot leave `/v2`. An
//! encoded `/` or `\` or a control character inside a segment is refused
//! outright (400), because servers disagree on what it means.

#[cfg(test)]
mod conformance;
mod params;
mod path;
pub mod table;

pub(crate) use params::{credit_estimate, page_size_asked, validate};
pub use path::classify;

use std::sync::Arc;
use table::{Cost, Kind, Row, TtlClass, TABLE};

/// How many routes there are (the 34 vendor operations and `other`).
const ROUTES: usize = 35;

/// Every route name the gateway reports. Unknown `/v2` paths are `Other`.
///
/// The discriminant is the row of [`table::TABLE`] and the route's code in
/// L2 entries: new routes are appended, never inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    PermitsSearch,
    ContractorsSearch,
    ContractorPermits,
    AddressMetricsMonthly,
    CountyMetricsMonthly,
    CityMetricsMonthly,
    CityMetricsCurrent,
    Counties,
    Cities,
    Jurisdictions,
    ListZip,
    ZipcodesSearch,
    StatesSearch,
    JurisdictionsSearch,
    MetaCoverage,
    MetaRelease,
    Usage,
    Other,
    PermitsById,
    ContractorsById,
    DecisionsSearch,
    DecisionsById,
    PropertiesSearch,
    PropertiesById,
    ContractorEmployees,
    ContractorMetrics,
    AddressesSearch,
    CitiesSearch,
    CountiesSearch,
    AddressMetricsCurrent,
    CountyMetricsCurrent,
    JurisdictionMetricsMonthly,
    JurisdictionMetricsCurrent,
    AddressResidents,
    ListTags,
}

impl Route {
    /// In table order (a test checks it against [`table::TABLE`]).
    pub const ALL: [Route; ROUTES] = [
        Route::PermitsSearch,
        Route::ContractorsSearch,
        Route::ContractorPermits,
        Route::AddressMetricsMonthly,
        Route::CountyMetricsMonthly,
        Route::CityMetricsMonthly,
        Route::CityMetricsCurrent,
        Route::Counties,
        Route::Cities,
        Route::Jurisdictions,
        Route::ListZip,
        Route::ZipcodesSearch,
        Route::StatesSearch,
        Route::JurisdictionsSearch,
        Route::MetaCoverage,
        Route::MetaRelease,
        Route::Usage,
        Route::Other,
        Route::PermitsById,
        Route::ContractorsById,
        Route::DecisionsSearch,
        Route::DecisionsById,
        Route::PropertiesSearch,
        Route::PropertiesById,
        Route::ContractorEmployees,
        Route::ContractorMetrics,
        Route::AddressesSearch,
        Route::CitiesSearch,
        Route::CountiesSearch,
        Route::AddressMetricsCurrent,
        Route::CountyMetricsCurrent,
        Route::JurisdictionMetricsMonthly,
        Route::JurisdictionMetricsCurrent,
        Route::AddressResidents,
        Route::ListTags,
    ];

    /// This route's row of the table.
    pub fn row(self) -> &'static Row {
        &TABLE[self as usize]
    }

    pub fn as_str(self) -> &'static str {
        self.row().name
    }

    /// The route of a metric label or config key, if it is one.
    pub fn from_name(name: &str) -> Option<Route> {
        TABLE.iter().find(|r| r.name == name).map(|r| r.route)
    }

    /// Routes the upstream bills one credit per record on. Unknown paths
    /// count as metered: we cannot prove they are free.
    pub fn is_metered(self) -> bool {
        self.row().cost != Cost::Free
    }

    pub(crate) fn ttl_class(self) -> TtlClass {
        self.row().ttl
    }

    /// How this route's upstream operation reads a query parameter; `None`
    /// when it does not declare it.
    pub(crate) fn param(self, name: &str) -> Option<Kind> {
        self.row().param(name)
    }

    /// The route's stable code (its row), as stored in L2 entries.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    pub(crate) fn from_index(i: usize) -> Option<Route> {
        Route::ALL.get(i).copied()
    }
}

/// Every route's name, in table order: the names a config key may use.
static NAMES: std::sync::LazyLock<Vec<&'static str>> =
    std::sync::LazyLock::new(|| Route::ALL.iter().map(|r| r.as_str()).collect());

/// A route is written as its name (`cache.route_ttl_secs.<route>`).
impl serde::Serialize for Route {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Read from its name; any other text is refused listing every name.
impl<'de> serde::Deserialize<'de> for Route {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Route, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Route;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a route name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Route, E> {
                Route::from_name(name).ok_or_else(|| E::unknown_variant(name, NAMES.as_slice()))
            }
        }
        d.deserialize_str(Name)
    }
}

/// Where a request goes: its route and the canonical upstream path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub route: Route,
    /// Canonical, percent-encoded, always starting with `/v2/`. Shared, not
    /// owned: a memoized target is cloned into every request that repeats
    /// it (`proxy::parsed`), and a clone is then a reference count.
    pub path: Arc<str>,
    /// The raw query string, if any.
    pub query: Option<Arc<str>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(s: &str) -> Target {
        classify(&s.parse::<http::Uri>().expect("uri"), 8192).expect("classifies")
    }

    #[test]
    fn the_contract_route_names_are_unchanged() {
        let cases = [
            ("/v2/permits/search?geo_id=CA", "permits_search"),
            ("/v2/contractors/search", "contractors_search"),
            ("/v2/contractors/abc/permits", "contractor_permits"),
            ("/v2/addresses/x/metrics/monthly", "address_metrics_monthly"),
            ("/v2/counties/x/metrics/monthly", "county_metrics_monthly"),
            ("/v2/cities/x/metrics/monthly", "city_metrics_monthly"),
            ("/v2/cities/x/metrics/current", "city_metrics_current"),
            ("/v2/counties?geo_id=x", "counties"),
            ("/v2/cities", "cities"),
            ("/v2/jurisdictions", "jurisdictions"),
            ("/v2/list/zip", "list_zip"),
            ("/v2/zipcodes/search", "zipcodes_search"),
            ("/v2/states/search", "states_search"),
            ("/v2/jurisdictions/search", "jurisdictions_search"),
            ("/v2/meta/coverage", "meta_coverage"),
            ("/v2/meta/release", "meta_release"),
            ("/v2/usage", "usage"),
            ("/v2/permits/x/y", "other"),
            ("/v2/states/x/metrics/monthly", "other"),
        ];
        for (uri, name) in cases {
            assert_eq!(target(uri).route.as_str(), name, "{uri}");
        }
        // The contract's 18 keep their codes (L2 entries, metrics order).
        for (i, name) in [
            "permits_search",
            "contractors_search",
            "contractor_permits",
            "address_metrics_monthly",
            "county_metrics_monthly",
            "city_metrics_monthly",
            "city_metrics_current",
            "counties",
            "cities",
            "jurisdictions",
            "list_zip",
            "zipcodes_search",
            "states_search",
            "jurisdictions_search",
            "meta_coverage",
            "meta_release",
            "usage",
            "other",
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(Route::from_index(i).map(Route::as_str), Some(name));
        }
    }

    #[test]
    fn the_table_is_in_route_order_with_unique_names() {
        let names: std::collections::HashSet<_> = Route::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), ROUTES);
        for (i, route) in Route::ALL.iter().enumerate() {
            assert_eq!(route.index(), i);
            assert_eq!(TABLE[i].route, *route, "row {i}");
            assert_eq!(Route::from_name(route.as_str()), Some(*route));
            assert!(
                route.as_str().bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{}",
                route.as_str()
            );
        }
        assert_eq!(Route::from_name("nope"), None);
    }
}
