//! Routing: a request path becomes a canonical `/v2/...` path and one route
//! name from a bounded set (DESIGN §3.5), used as a metric label and to pick
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
pub mod params;
pub mod table;

pub use params::{credit_estimate, validate};

use crate::error::GatewayError;
use http::Uri;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use table::{Cost, Kind, Row, TtlClass, TABLE};

/// How many routes there are (the 34 vendor operations and `other`).
pub const ROUTES: usize = 35;

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

    pub fn ttl_class(self) -> TtlClass {
        self.row().ttl
    }

    /// How this route's upstream operation reads a query parameter; `None`
    /// when it does not declare it.
    pub fn param(self, name: &str) -> Option<Kind> {
        self.row().param(name)
    }

    /// The route's stable code (its row), as stored in L2 entries.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn from_index(i: usize) -> Option<Route> {
        Route::ALL.get(i).copied()
    }
}

/// Where a request goes: its route and the canonical upstream path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub route: Route,
    /// Canonical, percent-encoded, always starting with `/v2/`.
    pub path: String,
    /// The raw query string, if any.
    pub query: Option<String>,
}

/// Characters re-encoded in a path segment (RFC 3986 `pchar` complement).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// More query parameters than any upstream call takes: the rest is abuse,
/// refused before anyone sorts thousands of pairs.
pub const MAX_QUERY_PARAMS: usize = 256;

/// Classifies a request target; the method has been checked already.
pub fn classify(uri: &Uri, max_uri_bytes: usize) -> Result<Target, GatewayError> {
    let target_len = uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if target_len > max_uri_bytes {
        return Err(GatewayError::UriTooLong);
    }
    if uri
        .query()
        .is_some_and(|q| q.split('&').filter(|p| !p.is_empty()).count() > MAX_QUERY_PARAMS)
    {
        return Err(GatewayError::BadRequest("Too many query parameters"));
    }
    let segments = canonical_segments(uri.path())?;
    if segments.first().map(|s| s.as_ref()) != Some("v2") || segments.len() < 2 {
        return Err(GatewayError::NotFound);
    }
    let names: Vec<&str> = segments.iter().map(|s| s.as_ref()).collect();
    let route = table::route_of(&names[1..]);
    let mut path = String::with_capacity(uri.path().len());
    for segment in &segments {
        path.push('/');
        path.extend(utf8_percent_encode(segment, SEGMENT));
    }
    Ok(Target {
        route,
        path,
        query: uri.query().filter(|q| !q.is_empty()).map(str::to_owned),
    })
}

/// The decoded segments of a canonical path; 404 for a path the upstream's
/// router cannot match (empty or dot-segments), 400 for one we refuse to
/// interpret.
fn canonical_segments(raw: &str) -> Result<Vec<std::borrow::Cow<'_, str>>, GatewayError> {
    let Some(rest) = raw.strip_prefix('/') else {
        return Err(GatewayError::NotFound);
    };
    // Borrowed where nothing was encoded: the common path allocates nothing.
    let mut out = Vec::with_capacity(8);
    let mut canonical = true;
    for raw_segment in rest.split('/') {
        let decoded = percent_decode_str(raw_segment)
            .decode_utf8()
            .map_err(|_| GatewayError::BadRequest("Path is not valid UTF-8"))?;
        if decoded.chars().any(|c| c == '/' || c == '\\' || c.is_control()) {
            return Err(GatewayError::BadRequest(
                "Path segment contains an encoded slash or a control character",
            ));
        }
        // Checked after every segment is decoded, so a refused encoding
        // anywhere is a 400 whatever comes before it.
        canonical &= !matches!(decoded.as_ref(), "" | "." | "..");
        out.push(decoded);
    }
    if canonical {
        Ok(out)
    } else {
        Err(GatewayError::NotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(s: &str) -> Result<Target, GatewayError> {
        classify(&s.parse::<Uri>().expect("uri"), 8192)
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
            assert_eq!(target(uri).unwrap().route.as_str(), name, "{uri}");
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

    #[test]
    fn traversal_cannot_leave_v2() {
        for uri in [
            "/v2/../admin",
            "/v2/%2e%2e/admin",
            "/v2/%2E%2E/metrics",
            "/v2/.%2e/admin/teams",
            "/v2/permits/../../admin",
            "/../v2/../healthz",
            "/v2",
            "/v2/..",
            "/admin/teams",
            "/",
        ] {
            assert_eq!(target(uri), Err(GatewayError::NotFound), "{uri}");
        }
    }

    #[test]
    fn non_canonical_paths_are_404_like_upstream() {
        for uri in [
            "/v2/permits/search/",
            "//v2/permits/search",
            "/v2//permits/search",
            "/v2/./permits/search",
            "/v2/permits/./search",
            "/v2/x/../permits/search",
            "/v2/%2e/permits/search",
            "/v2/permits/search//",
            "//v2//usage",
        ] {
            assert_eq!(target(uri), Err(GatewayError::NotFound), "{uri}");
        }
    }

    #[test]
    fn percent_encoded_names_route_like_the_decoded_path() {
        // uvicorn decodes the path before Starlette routes it.
        let t = target("/v2/%70ermits/search?size=5").unwrap();
        assert_eq!(t.route, Route::PermitsSearch);
        assert_eq!(t.path, "/v2/permits/search");
        assert_eq!(t.query.as_deref(), Some("size=5"));
    }

    #[test]
    fn encoded_slashes_controls_and_bad_utf8_are_refused() {
        for uri in ["/v2/contractors/a%2Fb/permits", "/v2/a%5Cb", "/v2/a%00b", "/v2/%ff%fe"] {
            assert!(matches!(target(uri), Err(GatewayError::BadRequest(_))), "{uri}");
        }
    }

    #[test]
    fn path_ids_are_re_encoded() {
        let t = target("/v2/contractors/a%20b/permits").unwrap();
        assert_eq!(t.path, "/v2/contractors/a%20b/permits");
    }

    #[test]
    fn thousands_of_parameters_are_refused() {
        let many = format!(
            "/v2/permits/search?{}",
            (0..300).map(|i| format!("p{i}=1")).collect::<Vec<_>>().join("&")
        );
        assert!(matches!(target(&many), Err(GatewayError::BadRequest(_))));
    }

    proptest::proptest! {
        /// Whatever the path, an accepted target stays under /v2/, has no
        /// dot-segment left, and classifies to itself (the router's fuzz
        /// target, run in CI as a property).
        #[test]
        fn no_path_escapes_v2(segments in proptest::collection::vec(
            proptest::sample::select(vec!["v2", "..", ".", "%2e%2e", "%2E.", "admin", "permits", "search", "", "%2f", "a%20b", "%ff", "metrics"]),
            0..8,
        )) {
            let path = format!("/{}", segments.join("/"));
            let Ok(uri) = path.parse::<Uri>() else { return Ok(()) };
            if let Ok(t) = classify(&uri, 8192) {
                proptest::prop_assert!(t.path.starts_with("/v2/"), "{} -> {}", path, t.path);
                proptest::prop_assert!(!t.path.split('/').any(|s| s == ".." || s == "."));
                let again = classify(&t.path.parse::<Uri>().expect("canonical parses"), 8192).expect("classifies");
                proptest::prop_assert_eq!(again.path, t.path);
            }
        }
    }

    #[test]
    fn long_targets_get_414() {
        let long = format!("/v2/permits/search?q={}", "a".repeat(9000));
        assert_eq!(target(&long), Err(GatewayError::UriTooLong));
    }
}
