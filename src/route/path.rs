//! The request path: percent-decoded, checked canonical, re-encoded. The
//! rules and why are in the [`route`](super) module doc.

use super::{table, Target};
use crate::error::GatewayError;
use http::Uri;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use std::sync::Arc;

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
const MAX_QUERY_PARAMS: usize = 256;

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
        path: path.into(),
        query: uri.query().filter(|q| !q.is_empty()).map(Arc::from),
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
    use crate::route::Route;

    fn target(s: &str) -> Result<Target, GatewayError> {
        classify(&s.parse::<Uri>().expect("uri"), 8192)
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
        assert_eq!(&*t.path, "/v2/permits/search");
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
        assert_eq!(&*t.path, "/v2/contractors/a%20b/permits");
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
