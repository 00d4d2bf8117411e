//! The request headers the pipeline reads, picked out in one pass over the
//! request's header map ([`Heads::of`]): its size, its credentials, its
//! request id, and whether it says anything of tracing, caching or
//! framing. Each lookup by name hashes the name and probes the map (about
//! 150 instructions, callgrind); a cache hit made eight of them, for
//! headers most requests do not send. A phase whose header is absent
//! skips its parse.

use crate::auth::Credentials;
use crate::http_util::X_REQUEST_ID;
use crate::telemetry::trace::TRACEPARENT;
use http::header::{HeaderMap, HeaderValue, CACHE_CONTROL, IF_NONE_MATCH, PRAGMA, TRANSFER_ENCODING};

/// What the pipeline needs of a request's headers (see the module doc).
#[derive(Default)]
pub(super) struct Heads<'a> {
    /// Names and values, with `": "` and CRLF: what `server.max_header_bytes`
    /// bounds.
    pub(super) bytes: usize,
    pub(super) transfer_encoding: bool,
    pub(super) credentials: Credentials<'a>,
    /// The first `X-Request-Id`, as `HeaderMap::get` finds it.
    pub(super) request_id: Option<&'a HeaderValue>,
    pub(super) traceparent: bool,
    /// `Cache-Control` or `Pragma`: request directives to parse.
    pub(super) directives: bool,
    pub(super) if_none_match: bool,
}

impl<'a> Heads<'a> {
    pub(super) fn of(headers: &'a HeaderMap) -> Heads<'a> {
        let mut heads = Heads::default();
        for (name, value) in headers {
            heads.bytes += name.as_str().len() + value.len() + 4;
            if heads.credentials.see(name, value) {
                continue;
            }
            if *name == X_REQUEST_ID {
                heads.request_id = heads.request_id.or(Some(value));
            } else if *name == TRACEPARENT {
                heads.traceparent = true;
            } else if *name == CACHE_CONTROL || *name == PRAGMA {
                heads.directives = true;
            } else if *name == IF_NONE_MATCH {
                heads.if_none_match = true;
            } else if *name == TRANSFER_ENCODING {
                heads.transfer_encoding = true;
            }
        }
        heads
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;

    #[test]
    fn one_pass_finds_what_lookups_by_name_find() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("host", "gw"),
            ("x-api-key", "a"),
            ("x-api-key", "b"),
            ("x-request-id", "first"),
            ("x-request-id", "second"),
            ("pragma", "no-cache"),
            ("if-none-match", "\"e\""),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let heads = Heads::of(&h);
        let bytes: usize = h.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
        assert_eq!(heads.bytes, bytes);
        assert!(matches!(heads.credentials.api_key, crate::auth::Once::Repeated));
        assert!(matches!(heads.credentials.authorization, crate::auth::Once::Absent));
        assert_eq!(heads.request_id, h.get(X_REQUEST_ID));
        assert!(heads.directives && heads.if_none_match);
        assert!(!heads.traceparent && !heads.transfer_encoding);
    }
}
