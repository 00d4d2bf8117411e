//! Routing: a request path becomes a canonical `/v2/...` path and one route
//! name from a bounded set (DESIGN §3.5), used as a metric label and to pick
//! credit estimates and TTLs.
//!
//! Sits right after the method check. Percent-encoding is decoded and
//! dot-segments resolved *before* the `/v2` check, so `/v2/../admin`,
//! `/v2/%2e%2e/admin` and friends cannot leave `/v2`; an encoded `/` or `\`
//! or a control character inside a segment is refused outright, because
//! servers disagree on what it means.

use crate::error::GatewayError;
use http::Uri;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

/// Every route name the gateway reports. Unknown `/v2` paths are `Other`.
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
}

impl Route {
    pub const ALL: [Route; 18] = [
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
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Route::PermitsSearch => "permits_search",
            Route::ContractorsSearch => "contractors_search",
            Route::ContractorPermits => "contractor_permits",
            Route::AddressMetricsMonthly => "address_metrics_monthly",
            Route::CountyMetricsMonthly => "county_metrics_monthly",
            Route::CityMetricsMonthly => "city_metrics_monthly",
            Route::CityMetricsCurrent => "city_metrics_current",
            Route::Counties => "counties",
            Route::Cities => "cities",
            Route::Jurisdictions => "jurisdictions",
            Route::ListZip => "list_zip",
            Route::ZipcodesSearch => "zipcodes_search",
            Route::StatesSearch => "states_search",
            Route::JurisdictionsSearch => "jurisdictions_search",
            Route::MetaCoverage => "meta_coverage",
            Route::MetaRelease => "meta_release",
            Route::Usage => "usage",
            Route::Other => "other",
        }
    }

    /// Routes the upstream bills one credit per record on. Unknown paths
    /// count as metered: we cannot prove they are free.
    pub fn is_metered(self) -> bool {
        matches!(
            self,
            Route::PermitsSearch
                | Route::ContractorsSearch
                | Route::ContractorPermits
                | Route::AddressMetricsMonthly
                | Route::CountyMetricsMonthly
                | Route::CityMetricsMonthly
                | Route::CityMetricsCurrent
                | Route::Other
        )
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

/// The most this call can cost: 0 on free routes; the number of `id`s on a
/// multi-id lookup; else the page size asked for (1..=100, default 50).
pub fn credit_estimate(target: &Target) -> u64 {
    if !target.route.is_metered() {
        return 0;
    }
    let query = target.query.as_deref().unwrap_or("");
    let mut size = None;
    let mut ids = 0u64;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "size" => size = Some(v),
            "id" => ids += 1,
            _ => {}
        }
    }
    if target.route == Route::Other && ids > 0 {
        return ids;
    }
    size.and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(50, |n| n.clamp(1, 100))
}

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
    let route = route_of(&names[1..]);
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

/// Decodes each segment and resolves `.`/`..` (RFC 3986 §5.2.4); `..` at the
/// root stays at the root, as browsers and servers do.
fn canonical_segments(raw: &str) -> Result<Vec<std::borrow::Cow<'_, str>>, GatewayError> {
    // Borrowed where nothing was encoded: the common path allocates nothing.
    let mut out = Vec::with_capacity(8);
    for raw_segment in raw.split('/') {
        let decoded = percent_decode_str(raw_segment)
            .decode_utf8()
            .map_err(|_| GatewayError::BadRequest("Path is not valid UTF-8"))?;
        if decoded.chars().any(|c| c == '/' || c == '\\' || c.is_control()) {
            return Err(GatewayError::BadRequest(
                "Path segment contains an encoded slash or a control character",
            ));
        }
        match decoded.as_ref() {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            _ => out.push(decoded),
        }
    }
    Ok(out)
}

fn route_of(rest: &[&str]) -> Route {
    match rest {
        ["permits", "search"] => Route::PermitsSearch,
        ["contractors", "search"] => Route::ContractorsSearch,
        ["contractors", _, "permits"] => Route::ContractorPermits,
        ["addresses", _, "metrics", "monthly"] => Route::AddressMetricsMonthly,
        ["counties", _, "metrics", "monthly"] => Route::CountyMetricsMonthly,
        ["cities", _, "metrics", "monthly"] => Route::CityMetricsMonthly,
        ["cities", _, "metrics", "current"] => Route::CityMetricsCurrent,
        ["counties"] => Route::Counties,
        ["cities"] => Route::Cities,
        ["jurisdictions"] => Route::Jurisdictions,
        ["list", "zip"] => Route::ListZip,
        ["zipcodes", "search"] => Route::ZipcodesSearch,
        ["states", "search"] => Route::StatesSearch,
        ["jurisdictions", "search"] => Route::JurisdictionsSearch,
        ["meta", "coverage"] => Route::MetaCoverage,
        ["meta", "release"] => Route::MetaRelease,
        ["usage"] => Route::Usage,
        _ => Route::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(s: &str) -> Result<Target, GatewayError> {
        classify(&s.parse::<Uri>().expect("uri"), 8192)
    }

    #[test]
    fn every_spec_endpoint_has_its_route_name() {
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
            ("/v2/permits", "other"),
        ];
        for (uri, name) in cases {
            assert_eq!(target(uri).unwrap().route.as_str(), name, "{uri}");
        }
        let names: std::collections::HashSet<_> = Route::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Route::ALL.len());
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
        ] {
            assert_eq!(target(uri), Err(GatewayError::NotFound), "{uri}");
        }
    }

    #[test]
    fn dot_segments_inside_v2_resolve_to_the_canonical_path() {
        let t = target("/v2/permits/./x/../search?size=5").unwrap();
        assert_eq!(t.route, Route::PermitsSearch);
        assert_eq!(t.path, "/v2/permits/search");
        assert_eq!(t.query.as_deref(), Some("size=5"));
        assert_eq!(target("//v2//usage").unwrap().path, "/v2/usage");
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
    fn credit_estimates_are_the_worst_case() {
        let est = |u: &str| credit_estimate(&target(u).unwrap());
        assert_eq!(est("/v2/permits/search?size=10"), 10);
        assert_eq!(est("/v2/permits/search"), 50);
        assert_eq!(est("/v2/permits/search?size=500"), 100);
        assert_eq!(est("/v2/permits/search?size=abc"), 50);
        assert_eq!(est("/v2/permits?id=a&id=b&id=c"), 3);
        assert_eq!(est("/v2/meta/release"), 0);
        assert_eq!(est("/v2/counties?geo_id=x"), 0);
        assert_eq!(est("/v2/cities/x/metrics/current?size=7"), 7);
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
