//! Client `Cache-Control` request directives (RFC 9111 §5.2.1) and the
//! upstream's response directives that forbid storing.

use http::header::{HeaderMap, CACHE_CONTROL, PRAGMA};

/// What the client asked of the cache for this request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Directives {
    /// Do not answer from the cache; the fresh answer is still stored.
    pub(crate) no_cache: bool,
    /// Do not store the answer.
    pub(crate) no_store: bool,
    /// Never go upstream: answer from the cache or 504.
    pub(crate) only_if_cached: bool,
    /// Accept an entry no older than this many seconds.
    pub(crate) max_age: Option<u64>,
    /// Accept an entry stale by up to this many seconds (`Some(u64::MAX)`
    /// for a bare `max-stale`).
    pub(crate) max_stale: Option<u64>,
}

impl Directives {
    pub(crate) fn from_headers(headers: &HeaderMap) -> Directives {
        let mut d = Directives::default();
        let mut saw_cache_control = false;
        for value in headers.get_all(CACHE_CONTROL) {
            saw_cache_control = true;
            let Ok(text) = value.to_str() else { continue };
            for token in text.split(',') {
                let (name, arg) = match token.trim().split_once('=') {
                    Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                    None => (token.trim(), None),
                };
                let secs = || arg.and_then(|a| a.parse::<u64>().ok());
                match name.to_ascii_lowercase().as_str() {
                    "no-cache" => d.no_cache = true,
                    "no-store" => d.no_store = true,
                    "only-if-cached" => d.only_if_cached = true,
                    "max-age" => d.max_age = secs().or(d.max_age),
                    "max-stale" => d.max_stale = Some(if arg.is_some() { secs().unwrap_or(0) } else { u64::MAX }),
                    _ => {}
                }
            }
        }
        // HTTP/1.0 clients say it with Pragma (RFC 9111 §5.4).
        if !saw_cache_control
            && headers
                .get_all(PRAGMA)
                .iter()
                .any(|v| v.to_str().is_ok_and(|s| s.to_ascii_lowercase().contains("no-cache")))
        {
            d.no_cache = true;
        }
        d
    }
}

/// The upstream said this answer must not be kept by a shared cache.
pub(crate) fn forbids_storing(headers: &HeaderMap) -> bool {
    headers.get_all(CACHE_CONTROL).iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .any(|t| t == "no-store" || t == "private" || t.starts_with("private="))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn parse(values: &[&'static str]) -> Directives {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(CACHE_CONTROL, HeaderValue::from_static(v));
        }
        Directives::from_headers(&h)
    }

    #[test]
    fn directives_parse() {
        assert!(parse(&["no-cache"]).no_cache);
        assert!(parse(&["No-Store, max-age=5"]).no_store);
        assert_eq!(parse(&["max-age=5"]).max_age, Some(5));
        assert_eq!(parse(&["max-stale"]).max_stale, Some(u64::MAX));
        assert_eq!(parse(&["max-stale=30"]).max_stale, Some(30));
        assert!(parse(&["only-if-cached"]).only_if_cached);
        assert_eq!(parse(&["max-age=abc"]).max_age, None);
        let mut h = HeaderMap::new();
        h.insert(PRAGMA, HeaderValue::from_static("no-cache"));
        assert!(Directives::from_headers(&h).no_cache);
    }

    #[test]
    fn upstream_no_store_and_private_forbid_storing() {
        for v in ["no-store", "private", "max-age=0, private=\"x\""] {
            let mut h = HeaderMap::new();
            h.insert(CACHE_CONTROL, HeaderValue::from_static(v));
            assert!(forbids_storing(&h), "{v}");
        }
        let mut h = HeaderMap::new();
        h.insert(CACHE_CONTROL, HeaderValue::from_static("public, max-age=60"));
        assert!(!forbids_storing(&h));
    }
}
