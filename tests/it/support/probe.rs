//! Reading a running gateway's state from its admin listener, for tests
//! that wait on a condition rather than a clock.

use super::client::Client;
use super::prometheus::Exposition;
use super::wait::eventually;
use http::StatusCode;
use std::time::Duration;

/// One scrape of the admin listener's `/metrics`, parsed. The scrape
/// itself settles moka's lazy counts (`Cache::observe`), so the
/// memory-tier gauges it reads are exact.
pub async fn scrape(admin: &str) -> Exposition {
    Exposition::parse(&metrics_text(admin).await)
}

/// The admin listener's `/metrics` as text (open: `metrics_auth` off).
pub async fn metrics_text(admin: &str) -> String {
    let reply = Client::anonymous(admin)
        .get("/metrics")
        .expect_status(StatusCode::OK)
        .await;
    reply.text()
}

/// Sum of `gateway_backend_errors_total` for Redis in one scrape.
pub async fn redis_errors(admin: &str) -> u64 {
    scrape(admin)
        .await
        .sum("gateway_backend_errors_total", &[("backend", "redis")]) as u64
}

/// `/readyz` of the admin listener: its status and its checks.
pub async fn readyz(admin: &str) -> super::http::Reply {
    Client::anonymous(admin).get("/readyz").await
}

/// Polls `/readyz` until the cache Redis is reported ok (bounded).
pub async fn wait_cache_redis_ok(admin: &str) {
    eventually("the cache Redis recovers", Duration::from_secs(15), || async {
        let r = readyz(admin).await;
        match r.json()["checks"]["cache_redis"] == "ok" {
            true => Ok(()),
            false => Err(r.text()),
        }
    })
    .await;
}

/// A cleartext HTTP/2 (prior knowledge) client.
pub fn h2c_client() -> hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Empty<bytes::Bytes>,
> {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http()
}
