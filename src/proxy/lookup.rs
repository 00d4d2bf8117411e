//! The cache lookup phase (DESIGN §2 step 7) and stale serving (step 14):
//! which cached entries a request accepts, and the response made from one.

use super::answer::{X_CACHE, X_CREDITS_REQUEST};
use super::context::CacheState;
use crate::cache::control::Directives;
use crate::cache::{now_ms, Entry};
use crate::http_util::Body;
use http::header::{HeaderMap, HeaderValue, AGE, CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use http::{Response, StatusCode};
use http_body_util::Full;

/// How a cached entry may answer this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Fresh enough: a hit.
    Hit,
    /// Expired, but the client's `max-stale` accepts it.
    StaleAccepted,
    /// Expired within `cache.stale_while_revalidate_secs`: served stale
    /// while one refresh runs in the background.
    Revalidate,
    /// Only as a fallback when the upstream fails.
    FallbackOnly,
}

pub fn usable(entry: &Entry, d: &Directives, revalidate_secs: u64, now: u64) -> Use {
    let age = entry.age(now).as_secs();
    if d.max_age.is_some_and(|max| age > max) {
        return Use::FallbackOnly;
    }
    if entry.is_fresh(now) {
        return Use::Hit;
    }
    let stale_by = entry.staleness(now).as_secs();
    match d.max_stale {
        Some(max) if stale_by <= max => Use::StaleAccepted,
        _ if stale_by < revalidate_secs => Use::Revalidate,
        _ => Use::FallbackOnly,
    }
}

/// The response for a cached entry (HIT or STALE): 0 credits for the team,
/// `Age`, `ETag`, and 304 when the client already has this body.
pub fn respond(entry: &Entry, state: CacheState, request_headers: &HeaderMap) -> Response<Body> {
    let metered = entry.route.is_metered();
    let not_modified = request_headers
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|tag| {
            let tag = tag.trim();
            tag == "*" || tag.trim_start_matches("W/") == entry.etag
        });
    let mut resp = if not_modified {
        let mut r = Response::new(Full::default());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        let mut r = Response::new(Full::new(entry.body.clone()));
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    };
    let h = resp.headers_mut();
    h.insert(X_CACHE, HeaderValue::from_static(state.header()));
    h.insert(AGE, HeaderValue::from(entry.age(now_ms()).as_secs()));
    if let Ok(etag) = HeaderValue::from_str(&entry.etag) {
        h.insert(ETAG, etag);
    }
    if metered {
        h.insert(X_CREDITS_REQUEST, HeaderValue::from(0u64));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Route;
    use bytes::Bytes;
    use std::time::Duration;

    fn entry(ttl_secs: u64) -> Entry {
        let mut e = Entry::new(
            Bytes::from_static(b"{}"),
            3,
            Duration::from_secs(ttl_secs),
            Route::Other,
        );
        e.stored_at_ms = 1_000_000;
        e
    }

    #[test]
    fn max_age_max_stale_and_revalidate_decide_use() {
        let e = entry(60);
        let d = Directives::default();
        assert_eq!(usable(&e, &d, 0, 1_030_000), Use::Hit);
        assert_eq!(usable(&e, &d, 0, 1_070_000), Use::FallbackOnly);
        let young = Directives {
            max_age: Some(10),
            ..Directives::default()
        };
        assert_eq!(usable(&e, &young, 0, 1_030_000), Use::FallbackOnly);
        let tolerant = Directives {
            max_stale: Some(20),
            ..Directives::default()
        };
        assert_eq!(usable(&e, &tolerant, 0, 1_070_000), Use::StaleAccepted);
        assert_eq!(usable(&e, &tolerant, 0, 1_090_000), Use::FallbackOnly);
        assert_eq!(
            usable(&e, &d, 60, 1_070_000),
            Use::Revalidate,
            "within the revalidate window"
        );
        assert_eq!(usable(&e, &d, 60, 1_130_000), Use::FallbackOnly, "past it");
        assert_eq!(
            usable(&e, &young, 60, 1_070_000),
            Use::FallbackOnly,
            "max-age still binds"
        );
    }

    #[test]
    fn if_none_match_gets_304() {
        let e = entry(60);
        let mut h = HeaderMap::new();
        h.insert(IF_NONE_MATCH, HeaderValue::from_str(&e.etag).unwrap());
        assert_eq!(respond(&e, CacheState::Hit, &h).status(), StatusCode::NOT_MODIFIED);
        h.insert(IF_NONE_MATCH, HeaderValue::from_static("\"other\""));
        assert_eq!(respond(&e, CacheState::Hit, &h).status(), StatusCode::OK);
    }
}
