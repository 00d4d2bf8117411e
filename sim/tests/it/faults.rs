//! Every injected fault kind is observable from a client.

use super::{items, permit_search, sim, v2};
use crate::support::sim::{fault, FaultKind, Faults};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::{Duration, Instant};

#[tokio::test]
async fn status_fault_answers_that_status_for_count_requests_and_charges_nothing() {
    let sim = sim().await;
    let s = sim.samples();
    sim.set_faults(Faults {
        status: Some(503),
        count: Some(2),
        retry_after_secs: Some(7),
        ..fault(FaultKind::Status)
    });
    for _ in 0..2 {
        let r = v2(&sim, &permit_search(&s, &s.state, "&size=3")).await;
        assert_eq!(r.status, 503);
        assert_eq!(r.header_u64("retry-after"), Some(7));
        assert!(r.json()["detail"].is_string());
    }
    assert_eq!(v2(&sim, &permit_search(&s, &s.state, "&size=3")).await.status, 200);
    assert_eq!(sim.stats().credits_total, 3);
    sim.set_faults(Faults {
        status: Some(429),
        ..fault(FaultKind::Status)
    });
    let r = v2(&sim, "/v2/meta/release").await;
    assert_eq!(r.status, 429);
    assert!(r.header_u64("retry-after").is_some());
}

#[tokio::test]
async fn ratio_faults_hit_some_requests_deterministically() {
    let sim = sim().await;
    sim.set_faults(Faults {
        ratio: Some(0.5),
        ..fault(FaultKind::Status)
    });
    let mut failed = 0;
    for _ in 0..40 {
        if v2(&sim, "/v2/meta/release").await.status == 500 {
            failed += 1;
        }
    }
    assert!((5..35).contains(&failed), "{failed} of 40");
}

/// Sends one request on a fresh connection and reports whether it failed.
async fn fails_at_transport(url: &str, key: &str) -> bool {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let req = http::Request::get(url)
        .header("x-api-key", key)
        .body(Empty::new())
        .expect("request");
    match tokio::time::timeout(Duration::from_secs(10), client.request(req)).await {
        Ok(Ok(resp)) => resp.into_body().collect().await.is_err(),
        Ok(Err(_)) => true,
        Err(_) => panic!("no answer within 10 s"),
    }
}

#[tokio::test]
async fn reset_and_hang_give_no_answer_and_log_status_zero() {
    let sim = sim().await;
    let url = format!("{}/v2/meta/release", sim.base_url());
    sim.set_faults(fault(FaultKind::Reset));
    assert!(fails_at_transport(&url, sim.api_key()).await);
    sim.set_faults(Faults {
        delay_ms: Some(200),
        ..fault(FaultKind::Hang)
    });
    let started = Instant::now();
    assert!(fails_at_transport(&url, sim.api_key()).await);
    assert!(started.elapsed() >= Duration::from_millis(200));
    let log = sim.log();
    assert_eq!(log.len(), 2);
    assert!(log.iter().all(|e| e.status == 0 && e.credits == 0));
}

#[tokio::test]
async fn body_faults_break_the_body_but_keep_or_drop_charges_as_documented() {
    let sim = sim().await;
    let s = sim.samples();
    let url = permit_search(&s, &s.state, "&size=4");
    sim.set_faults(fault(FaultKind::Truncated));
    let r = v2(&sim, &url).await;
    assert_eq!(r.status, 200);
    assert!(serde_json::from_slice::<serde_json::Value>(&r.body).is_err());
    assert_eq!(r.header_u64("x-credits-request"), Some(4));
    sim.set_faults(fault(FaultKind::MalformedJson));
    let r = v2(&sim, &url).await;
    assert!(r.text().starts_with("{\"items\": ["));
    assert!(serde_json::from_slice::<serde_json::Value>(&r.body).is_err());
    sim.set_faults(fault(FaultKind::WrongContentType));
    let r = v2(&sim, &url).await;
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/html")));
    let log = sim.log();
    assert_eq!(log.iter().map(|e| e.credits).collect::<Vec<_>>(), [4, 0, 0]);
}

#[tokio::test]
async fn credit_header_faults_serve_the_real_page_and_charge_it() {
    let sim = sim().await;
    let s = sim.samples();
    let url = permit_search(&s, &s.state, "&size=2");
    sim.set_faults(fault(FaultKind::AbsurdCredits));
    let mut seen = Vec::new();
    for _ in 0..3 {
        let r = v2(&sim, &url).await;
        assert_eq!(items(&r).len(), 2);
        seen.push(r.header("x-credits-request").unwrap_or_default().to_string());
    }
    assert_eq!(seen, ["-5", "99999999999999999999", "abc"]);
    sim.set_faults(fault(FaultKind::MissingCredits));
    let r = v2(&sim, &url).await;
    assert_eq!(items(&r).len(), 2);
    assert!(r.header("x-credits-request").is_none());
    assert_eq!(sim.stats().credits_total, 8);
}

#[tokio::test]
async fn huge_slow_and_latency_faults() {
    let sim = sim().await;
    let s = sim.samples();
    sim.set_faults(Faults {
        body_bytes: Some(300_000),
        ..fault(FaultKind::HugeBody)
    });
    let r = v2(&sim, "/v2/meta/release").await;
    assert!(r.body.len() >= 300_000);
    assert!(r.json()["items"].is_array());
    sim.set_faults(Faults {
        delay_ms: Some(300),
        ..fault(FaultKind::SlowBody)
    });
    let started = Instant::now();
    let r = v2(&sim, &permit_search(&s, &s.state, "&size=3")).await;
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(items(&r).len(), 3);
    sim.set_faults(Faults {
        latency_ms: Some(150),
        ..fault(FaultKind::Latency)
    });
    let started = Instant::now();
    assert_eq!(v2(&sim, "/v2/meta/release").await.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(150));
    sim.clear_faults();
    assert_eq!(v2(&sim, "/v2/meta/release").await.status, 200);
}
