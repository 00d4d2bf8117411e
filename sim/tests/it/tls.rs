//! Protocols: h2c with prior knowledge, and HTTPS (h2 over TLS) with a
//! self-signed certificate made in the test.

use super::{sim_with, v2};
use crate::support::sim::SimConfig;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;

#[tokio::test]
async fn serves_h2c_with_prior_knowledge() {
    let sim = sim_with(SimConfig::default()).await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<Bytes>>();
    let req = http::Request::get(format!("{}/v2/meta/release", sim.base_url()))
        .header("x-api-key", sim.api_key())
        .body(Empty::new())
        .expect("request");
    let resp = client.request(req).await.expect("h2c answer");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    assert_eq!(
        v2(&sim, "/v2/meta/release").await.status,
        200,
        "HTTP/1.1 on the same port"
    );
}

#[tokio::test]
async fn serves_https_with_alpn_h2() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("self-signed cert");
    let cert_der = ck.cert.der().clone();
    let key_der = rustls::pki_types::PrivateKeyDer::try_from(ck.signing_key.serialize_der()).expect("key der");
    let server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert_der.clone()], key_der)
        .expect("server config");
    let sim = sim_with(SimConfig {
        tls: Some(Arc::new(server)),
        ..SimConfig::default()
    })
    .await;
    assert!(sim.base_url().starts_with("https://"));

    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert_der).expect("root added");
    let client_cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_cfg)
        .https_only()
        .enable_all_versions()
        .build();
    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(https);
    let url = format!("https://localhost:{}/v2/meta/release", sim.addr().port());
    let req = http::Request::get(url)
        .header("x-api-key", sim.api_key())
        .body(Empty::new())
        .expect("request");
    let resp = client.request(req).await.expect("https answer");
    assert_eq!(resp.version(), http::Version::HTTP_2, "ALPN picks h2");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert!(v["released_at"].is_string());
}
