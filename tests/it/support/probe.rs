//! Reading a running gateway's state from its admin listener, for tests
//! that wait on a condition rather than a clock.

use super::http::get;
use super::prometheus::Exposition;
use super::wait::eventually;
use std::time::Duration;

/// One scrape of the admin listener's `/metrics`, parsed.
pub async fn scrape(admin: &str) -> Exposition {
    Exposition::parse(&get(&format!("{admin}/metrics"), &[]).await.text())
}

/// Sum of `gateway_backend_errors_total` for Redis in one scrape.
pub async fn redis_errors(admin: &str) -> u64 {
    get(&format!("{admin}/metrics"), &[])
        .await
        .text()
        .lines()
        .filter(|l| l.starts_with("gateway_backend_errors_total{backend=\"redis\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Polls `/readyz` until the cache Redis is reported ok (bounded).
pub async fn wait_cache_redis_ok(admin: &str) {
    eventually("the cache Redis recovers", Duration::from_secs(15), || async {
        let r = get(&format!("{admin}/readyz"), &[]).await;
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
