//! Small HTTP helpers shared by the team and admin listeners: the body type,
//! JSON responses, hop-by-hop header stripping and request ids.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Every response body is complete in memory: pages are bounded (≤ 100
/// records) and the cache and the ledger need the whole answer anyway.
pub(crate) type Body = Full<Bytes>;

pub(crate) fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    bytes_response(status, "application/json", Bytes::from(value.to_string()))
}

pub(crate) fn bytes_response(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), plus
/// whatever the `Connection` header names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// `X-Request-Id`, typed once: a `&str` name is parsed on every use.
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// [`request_id_of`] a header map's first `X-Request-Id`.
#[cfg(test)]
pub(crate) fn request_id(headers: &HeaderMap) -> String {
    request_id_of(headers.get(X_REQUEST_ID))
}

/// The client's `X-Request-Id` (its first, as the pipeline's one pass over
/// the headers picks it) when it is a sane token, else a new one.
///
/// A client-chosen id is echoed and forwarded, so it must not carry header
/// injection or unbounded size.
pub(crate) fn request_id_of(sent: Option<&HeaderValue>) -> String {
    sent.and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        })
        .map(str::to_owned)
        .unwrap_or_else(new_request_id)
}

thread_local! {
    /// Ids need to be unique, not secret (what OpenTelemetry's SDK does
    /// too): a fast generator per thread, seeded from the OS-seeded one.
    static IDS: std::cell::RefCell<SmallRng> = std::cell::RefCell::new(SmallRng::from_rng(&mut rand::rng()));
}

/// 128 random bits from this thread's id generator: request, trace and
/// span ids.
pub(crate) fn random_id() -> u128 {
    IDS.with(|rng| rng.borrow_mut().random::<u128>())
}

fn new_request_id() -> String {
    // Unique, not secret: not the reseeding CSPRNG behind `rand::random`.
    let bits = random_id();
    let mut hex = [0u8; 32];
    // Through `hex`, not `format!`: the formatting machinery was ~1k
    // instructions of every request that brought no id of its own.
    let _ = hex::encode_to_slice(bits.to_be_bytes(), &mut hex);
    String::from_utf8(hex.to_vec()).unwrap_or_default()
}

/// `Retry-After` in whole seconds (the upstream sends integers), clamped to
/// `max`: the upstream's number decides how long every team waits, so a
/// huge or hostile value must not pause the gateway for hours.
pub(crate) fn retry_after(headers: &HeaderMap, max: std::time::Duration) -> Option<std::time::Duration> {
    let secs: u64 = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(std::time::Duration::from_secs(secs).min(max))
}

/// Counts below this are answered from a table of static header values.
const SMALL_NUMBERS: usize = 4096;

/// A count as a header value. Counts below [`SMALL_NUMBERS`] (an Age in
/// the first hour, a page's credits, most budgets' remainders) come from a
/// table made once, so a hit clones a static value instead of formatting
/// and allocating one (`HeaderValue::from(u64)` was ~250 instructions a
/// header, three headers a hit).
pub(crate) fn number_header(n: u64) -> HeaderValue {
    static TABLE: std::sync::LazyLock<Vec<HeaderValue>> = std::sync::LazyLock::new(|| {
        (0..SMALL_NUMBERS)
            .map(|n| HeaderValue::from_static(Box::leak(n.to_string().into_boxed_str())))
            .collect()
    });
    thread_local! {
        /// The last larger count this thread formatted: a big budget's
        /// remainder, the same on hit after hit until a settle moves it.
        static LAST: std::cell::RefCell<Option<(u64, HeaderValue)>> = const { std::cell::RefCell::new(None) };
    }
    match usize::try_from(n).ok().and_then(|i| TABLE.get(i)) {
        Some(v) => v.clone(),
        None => LAST.with(|last| {
            let mut last = last.borrow_mut();
            match &*last {
                Some((seen, v)) if *seen == n => v.clone(),
                _ => {
                    let v = HeaderValue::from(n);
                    *last = Some((n, v.clone()));
                    v
                }
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret-hop"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::CONTENT_TYPE));
    }

    #[test]
    fn request_id_is_propagated_only_when_sane() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&h), "abc-123");
        h.insert("x-request-id", HeaderValue::from_static("has space"));
        let generated = request_id(&h);
        assert_eq!(generated.len(), 32);
        assert!(generated.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn number_headers_read_as_their_number() {
        // Repeats and changes: the per-thread memo of the last larger count.
        for n in [
            0u64,
            1,
            9,
            10,
            4095,
            4096,
            4096,
            4097,
            4096,
            999_999_995,
            999_999_995,
            u64::MAX,
            u64::MAX,
        ] {
            assert_eq!(super::number_header(n).to_str().unwrap(), n.to_string());
        }
    }
}
