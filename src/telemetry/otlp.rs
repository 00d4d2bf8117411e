//! Span export over OTLP/HTTP (protobuf), built only when
//! `tracing.otlp_endpoint` is set.
//!
//! The SDK's batch processor runs exports on a thread of its own, outside
//! tokio; hyper needs tokio's reactor, so each export is handed to the
//! runtime the gateway started on ([`OnRuntime`]). The connector is the
//! binary's own rustls with ring (no second crypto provider), for an
//! `https://` collector as for a plain `http://` one on the node.
//! Standard `OTEL_EXPORTER_OTLP_HEADERS` (a collector's API key) are read by
//! the exporter.

use crate::config::TracingConfig;
use bytes::Bytes;
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, Tracer};
use opentelemetry_sdk::Resource;
use std::sync::Arc;
use std::time::Duration;

/// How long one export may take before it is given up (spans dropped).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds the tracer provider and its tracer. Needs a tokio runtime (the
/// exports run on it).
pub(super) fn tracer(cfg: &TracingConfig, endpoint: &str) -> Result<(SdkTracerProvider, Tracer), String> {
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|_| "tracing.otlp_endpoint: span export needs the tokio runtime".to_string())?;
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("tracing.otlp_endpoint: tls: {e}"))?
        .with_root_certificates(roots())
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let https = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let client = OnRuntime {
        runtime,
        inner: Arc::new(opentelemetry_http::hyper::HyperClient::new(https, EXPORT_TIMEOUT, None)),
    };
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| format!("tracing.otlp_endpoint: {e}"))?;
    // The trace id alone decides, for every trace: a client's sampled flag
    // is no licence to export (what export costs is the operator's), and
    // `sample_ratio` is the share of the teams' traces exported. Every span
    // of a trace gets the same answer, and so does any other service that
    // samples the same trace id at the same ratio.
    let sampler = Sampler::TraceIdRatioBased(cfg.sample_ratio);
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .with_resource(Resource::builder().with_service_name(cfg.service_name.clone()).build())
        .build();
    let tracer = provider.tracer("permit-gateway");
    Ok((provider, tracer))
}

fn roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    roots
}

/// An exporter's HTTP client whose requests run on the gateway's runtime.
#[derive(Debug)]
struct OnRuntime<C> {
    runtime: tokio::runtime::Handle,
    inner: Arc<C>,
}

#[async_trait::async_trait]
impl<C: HttpClient + 'static> HttpClient for OnRuntime<C> {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let inner = self.inner.clone();
        self.runtime
            .spawn(async move { inner.send_bytes(request).await })
            .await
            .map_err(|e| Box::new(e) as HttpError)?
    }
}
