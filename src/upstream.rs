//! The upstream client: one pooled hyper client over rustls (HTTP/2 when the
//! upstream offers it by ALPN), the single upstream key injected, bounded
//! retries with jittered backoff, one whole-call deadline.
//!
//! The `fetch` phase (docs/design.md §2): `proxy::fetch::forward` calls
//! [`Upstream::fetch_with_heads`] once per upstream call ([`Upstream::fetch`]
//! is the same call without the heads, for the org probe); the URI is the
//! parsed `upstream.base_url` joined with the target, never a URL text
//! re-parsed. Each answer's head (status and headers) is published on a watch channel
//! as soon as it arrives, before its body, so the caller can settle what
//! the upstream billed at once; when the body then fails (cut, too large,
//! the deadline), the head is also returned with the error.
//! The upstream's `Retry-After` is never trusted beyond
//! `upstream.max_retry_after_secs`. Only an allowlist of request headers travels upstream, so a
//! team's credential, cookies and internal addresses (X-Forwarded-For) never
//! reach the third party; the W3C trace context does (`traceparent`,
//! `tracestate`, see `telemetry::trace`), from the call's `upstream` span
//! when spans are exported.

use crate::config::{BaseUrl, Secret, UpstreamConfig};
use crate::error::GatewayError;
use crate::http_util::strip_hop_by_hop;
use crate::metrics::{Metrics, UpstreamAnswer};
use crate::route::{Route, Target};
use crate::telemetry::{trace::Trace, SPANS};
use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, ACCEPT, USER_AGENT};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::{pem::PemObject, CertificateDer};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::Instrument;

/// A complete upstream answer.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// The status and headers of an answer, kept when its body then failed.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
}

/// No answer to pass on: why, and the head of the last answer when one
/// arrived (an answer whose body failed may still have been billed).
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: GatewayError,
    pub(crate) head: Option<Head>,
}

pub(crate) struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// `upstream.base_url`, parsed at load: each call's URI is its scheme
    /// and authority plus the base path and the target's path and query.
    base: BaseUrl,
    api_key: HeaderValue,
    timeout: Duration,
    max_retries: u32,
    max_response_bytes: usize,
    max_retry_after: Duration,
}

/// What every attempt of one call sends besides the target.
struct Call<'a> {
    request_id: &'a str,
    trace: &'a Trace,
    span: &'a tracing::Span,
    accept: Option<&'a HeaderValue>,
}

/// Why one attempt did not produce an answer worth returning.
#[derive(Debug)]
enum AttemptError {
    /// Never reached the upstream: safe to retry.
    Connect,
    /// Reached it but the exchange broke (reset, cut body).
    Transport,
    /// An answer that a retry may fix (502, 503, 504); kept in case
    /// retries run out, so the caller still sees what the upstream said.
    Retryable(UpstreamResponse),
    /// Larger than `max_response_bytes`.
    TooLarge,
}

impl Upstream {
    pub(crate) fn new(cfg: &UpstreamConfig, key: &Secret) -> Result<Upstream, String> {
        let tls = client_tls(cfg)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(cfg.connect_timeout_secs)));
        let https = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .build(https);
        let mut api_key = HeaderValue::from_str(key.expose())
            .map_err(|_| "upstream.api_key: not a valid header value".to_string())?;
        // Marked sensitive so hyper's HPACK never indexes it and debug output hides it.
        api_key.set_sensitive(true);
        Ok(Upstream {
            client,
            base: cfg.base_url.clone(),
            api_key,
            timeout: Duration::from_secs(cfg.timeout_secs),
            max_retries: cfg.max_retries,
            max_response_bytes: cfg.max_response_bytes,
            max_retry_after: Duration::from_secs(cfg.max_retry_after_secs),
        })
    }

    /// GETs the target upstream with retries inside one deadline. Any answer
    /// the upstream gave (including 4xx/5xx after retries) is `Ok`; `Err`
    /// means there is no answer to pass on.
    pub(crate) async fn fetch(
        &self,
        target: &Target,
        request_id: &str,
        trace: &Trace,
        accept: Option<&HeaderValue>,
        metrics: &Metrics,
    ) -> Result<UpstreamResponse, Failed> {
        let (heads, _) = watch::channel(None);
        self.fetch_with_heads(target, request_id, trace, accept, metrics, &heads)
            .await
    }

    /// As [`Upstream::fetch`], publishing each answer's head on `heads` as
    /// soon as it arrives.
    pub(crate) async fn fetch_with_heads(
        &self,
        target: &Target,
        request_id: &str,
        trace: &Trace,
        accept: Option<&HeaderValue>,
        metrics: &Metrics,
        heads: &watch::Sender<Option<Head>>,
    ) -> Result<UpstreamResponse, Failed> {
        let span = call_span(target.route);
        let call = Call {
            request_id,
            trace,
            span: &span,
            accept,
        };
        let uri = self.uri_for(target).map_err(|error| Failed { error, head: None })?;
        let started = Instant::now();
        let deadline = started + self.timeout;
        let route = target.route;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(2))
            .with_max_times(self.max_retries as usize)
            .with_jitter();
        // Written by each attempt when its head arrives; read after the
        // deadline may have dropped the attempt halfway through its body.
        let attempt = || self.attempt(&uri, &call, route, metrics, heads);
        let retried = attempt
            .retry(backoff)
            .when(|e| !matches!(e, AttemptError::TooLarge | AttemptError::Transport))
            .adjust(|e, backoff| retry_delay(e, backoff, deadline, self.max_retry_after))
            .notify(|_, _| metrics.upstream_retry(route));
        let outcome = tokio::time::timeout_at(deadline.into(), retried)
            .instrument(span.clone())
            .await;
        if let (false, Ok(Ok(resp) | Err(AttemptError::Retryable(resp)))) = (span.is_disabled(), &outcome) {
            span.record("http.response.status_code", resp.status.as_u16());
        }
        metrics.upstream_duration(route, started.elapsed());
        let failed = |error| Failed {
            error,
            head: heads.borrow().clone(),
        };
        match outcome {
            Err(_) => {
                metrics.upstream_answer(route, UpstreamAnswer::Timeout);
                Err(failed(GatewayError::UpstreamTimeout))
            }
            Ok(Ok(resp)) | Ok(Err(AttemptError::Retryable(resp))) => Ok(resp),
            Ok(Err(AttemptError::Connect | AttemptError::Transport)) => Err(failed(GatewayError::UpstreamUnavailable)),
            Ok(Err(AttemptError::TooLarge)) => {
                Err(failed(GatewayError::UpstreamInvalid("Upstream response too large")))
            }
        }
    }

    fn uri_for(&self, target: &Target) -> Result<Uri, GatewayError> {
        self.base
            .join(&target.path, target.query.as_deref())
            .ok_or(GatewayError::BadRequest("Request target cannot be forwarded"))
    }

    async fn attempt(
        &self,
        uri: &Uri,
        call: &Call<'_>,
        route: Route,
        metrics: &Metrics,
        heads: &watch::Sender<Option<Head>>,
    ) -> Result<UpstreamResponse, AttemptError> {
        let mut req = Request::get(uri.clone())
            .header(USER_AGENT, concat!("permit-gateway/", env!("CARGO_PKG_VERSION")))
            .header("x-request-id", call.request_id)
            .header(
                ACCEPT,
                call.accept
                    .cloned()
                    .unwrap_or(HeaderValue::from_static("application/json")),
            )
            .body(Empty::new())
            .map_err(|_| AttemptError::Transport)?;
        req.headers_mut().insert("x-api-key", self.api_key.clone());
        call.trace.inject(call.span, req.headers_mut());
        let resp = self.client.request(req).await.map_err(|e| {
            let answer = if e.is_connect() {
                UpstreamAnswer::ConnectError
            } else {
                UpstreamAnswer::TransportError
            };
            metrics.upstream_answer(route, answer);
            tracing::warn!(route = route.as_str(), error = %ErrorChain(&e), "upstream request failed");
            if e.is_connect() {
                AttemptError::Connect
            } else {
                AttemptError::Transport
            }
        })?;
        let (parts, body) = resp.into_parts();
        heads.send_replace(Some(Head {
            status: parts.status,
            headers: parts.headers.clone(),
        }));
        metrics.upstream_answer(route, UpstreamAnswer::Status(parts.status));
        let body = Limited::new(body, self.max_response_bytes)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                    AttemptError::TooLarge
                } else {
                    AttemptError::Transport
                }
            })?
            .to_bytes();
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        let answer = UpstreamResponse {
            status: parts.status,
            headers,
            body,
        };
        match answer.status.as_u16() {
            // Not 429: it pauses the scheduler instead, which every team's
            // calls go through (a retry here would jump that queue).
            502..=504 => Err(AttemptError::Retryable(answer)),
            _ => Ok(answer),
        }
    }
}

/// One span for the call, retries included: its context is the parent the
/// upstream sees (a disabled span without export).
fn call_span(route: Route) -> tracing::Span {
    tracing::info_span!(
        target: SPANS,
        "upstream",
        otel.kind = "client",
        http.route = route.as_str(),
        http.response.status_code = tracing::field::Empty,
    )
}

/// The wait before the next attempt: the jittered backoff, or the upstream's
/// `Retry-After` on a 503; no retry when that would pass the deadline.
fn retry_delay(e: &AttemptError, backoff: Option<Duration>, deadline: Instant, max: Duration) -> Option<Duration> {
    let wait = match e {
        AttemptError::Retryable(resp) => retry_after(&resp.headers, max).or(backoff)?,
        _ => backoff?,
    };
    Instant::now()
        .checked_add(wait)
        .is_some_and(|at| at < deadline)
        .then_some(wait)
}

pub(crate) use crate::http_util::retry_after;

fn client_tls(cfg: &UpstreamConfig) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = &cfg.ca_file {
        let certs =
            CertificateDer::pem_file_iter(path).map_err(|e| format!("upstream.ca_file: {}: {e}", path.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("upstream.ca_file: {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("upstream.ca_file: {}: {e}", path.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tls: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Displays an error with its sources: hyper's top-level text is vague.
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_clamped_and_never_overflows() {
        let max = Duration::from_secs(120);
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::RETRY_AFTER, HeaderValue::from_static(v));
            retry_after(&h, max)
        };
        assert_eq!(with("3"), Some(Duration::from_secs(3)));
        assert_eq!(with("100000"), Some(max));
        assert_eq!(with("18446744073709551615"), Some(max));
        assert_eq!(with("18446744073709551616"), None, "not a u64: ignored");
        assert_eq!(with("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        let deadline = Instant::now() + Duration::from_secs(1);
        let huge = AttemptError::Retryable(UpstreamResponse {
            status: StatusCode::SERVICE_UNAVAILABLE,
            headers: {
                let mut h = HeaderMap::new();
                h.insert(
                    http::header::RETRY_AFTER,
                    HeaderValue::from_static("18446744073709551615"),
                );
                h
            },
            body: Bytes::new(),
        });
        assert_eq!(
            retry_delay(&huge, None, deadline, Duration::MAX),
            None,
            "no panic, no retry"
        );
    }
}
