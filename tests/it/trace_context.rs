//! W3C trace context through the gateway (the binary, its JSON logs): a
//! client's `traceparent` reaches the upstream with the same trace id that
//! the access log names; with `tracing.otlp_endpoint` set, the spans reach
//! an OTLP/HTTP receiver, the request span a child of the client's span and
//! the phases' spans children of the request span. Spans are exported
//! only once the team is known, at `sample_ratio` whatever the client's
//! sampled flag, and a `tracestate` over 512 bytes goes nowhere (issue 34).

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::wait::eventually;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE}-{CLIENT_SPAN}-01")
}

/// The `traceparent` of the upstream request with this path and query.
fn upstream_traceparent(sim: &Sim, query: &Query) -> Option<String> {
    let path_and_query = query.to_string();
    sim.log()
        .into_iter()
        .find(|e| format!("{}?{}", e.path, e.query) == path_and_query)
        .and_then(|e| e.traceparent)
}

#[tokio::test]
async fn a_clients_traceparent_reaches_the_upstream_and_the_access_log() {
    let sim = start_sim(unlimited()).await;
    let gw = ChildGateway::spawn(&Setup::new(), &sim.base_url(), sim.api_key());
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let s = sim.samples();
    alpha
        .get(Query::state_permits(&s).size(3))
        .header("traceparent", &traceparent())
        .header("tracestate", "app=frontend")
        .expect_status(200)
        .await;
    // No export: the gateway records no span, so the client's context
    // travels on unchanged.
    let entry = sim.log().into_iter().last().expect("the upstream was called");
    assert_eq!(entry.traceparent.as_deref(), Some(traceparent().as_str()));
    assert_eq!(entry.tracestate.as_deref(), Some("app=frontend"));
    // Without a traceparent the gateway starts a trace: the upstream gets
    // it (not sampled: nothing was recorded) and the access log names it.
    let without = Query::state_permits(&s).size(4);
    alpha.get(&without).expect_status(200).await;
    let started = upstream_traceparent(&sim, &without).expect("a traceparent reached the upstream");
    let parts: Vec<&str> = started.split('-').collect();
    assert_eq!(parts.len(), 4, "{started}");
    assert_eq!((parts[0], parts[3]), ("00", "00"), "{started}");
    assert_ne!(parts[1], TRACE);
    let started_trace = parts[1].to_string();
    let lines = eventually("two access-log lines", Duration::from_secs(5), || {
        let lines = gw.access_lines();
        async move { (lines.len() >= 2).then_some(lines) }
    })
    .await;
    let ids: Vec<&str> = lines.iter().filter_map(|l| l["trace_id"].as_str()).collect();
    assert_eq!(ids, [TRACE, started_trace.as_str()], "{lines:?}");
    gw.assert_logs_clean();
}

#[tokio::test]
async fn exported_spans_have_the_clients_span_as_parent() {
    let sim = start_sim(unlimited()).await;
    let (collector, spans) = start_collector().await;
    let setup = exporting_to(collector, 1.0);
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let s = sim.samples();
    let path = Query::state_permits(&s).size(3);
    alpha
        .get(&path)
        .header("traceparent", &traceparent())
        .expect_status(200)
        .await;
    // A second request without a context: the gateway's own root trace.
    let other = Query::state_permits(&s).size(4);
    alpha.get(&other).expect_status(200).await;
    // A drain flushes the batched spans.
    gw.signal("TERM");
    gw.wait_exit(Duration::from_secs(30));
    let requests = eventually("two request spans at the collector", Duration::from_secs(10), || {
        let got = spans.lock().expect("lock").clone();
        async move {
            let requests: Vec<Span> = got.iter().filter(|s| s.name == "request").cloned().collect();
            (requests.len() >= 2).then_some(requests)
        }
    })
    .await;
    let all = spans.lock().expect("lock").clone();
    let request = requests
        .iter()
        .find(|s| hex(&s.trace_id) == TRACE)
        .unwrap_or_else(|| panic!("no request span in the client's trace: {requests:?}"));
    assert_eq!(
        hex(&request.parent_span_id),
        CLIENT_SPAN,
        "the client's span is the parent"
    );
    let children: Vec<&Span> = all.iter().filter(|s| s.parent_span_id == request.span_id).collect();
    let names: Vec<&str> = children.iter().map(|s| s.name.as_str()).collect();
    for phase in ["cache_lookup", "lease_wait", "reserve", "upstream", "settle"] {
        assert!(
            names.contains(&phase),
            "no {phase} span under the request span: {names:?}"
        );
    }
    assert!(children.iter().all(|s| hex(&s.trace_id) == TRACE));
    // The upstream saw the gateway's upstream span as its parent.
    let upstream = children.iter().find(|s| s.name == "upstream").expect("upstream span");
    let expected = format!("00-{TRACE}-{}-01", hex(&upstream.span_id));
    assert_eq!(upstream_traceparent(&sim, &path).as_deref(), Some(expected.as_str()));
    // The root trace: no parent, and the same id at the upstream and in
    // the access log.
    let root = requests
        .iter()
        .find(|s| hex(&s.trace_id) != TRACE)
        .expect("the second request's span");
    assert!(root.parent_span_id.is_empty(), "{root:?}");
    let sent = upstream_traceparent(&sim, &other).expect("traceparent upstream");
    assert!(sent.starts_with(&format!("00-{}-", hex(&root.trace_id))), "{sent}");
    let logged: Vec<String> = gw
        .access_lines()
        .iter()
        .filter_map(|l| l["trace_id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(logged, [TRACE.to_string(), hex(&root.trace_id)]);
}

/// The `tracestate` of the upstream request with this path and query.
fn upstream_tracestate(sim: &Sim, query: &Query) -> Option<String> {
    let path_and_query = query.to_string();
    sim.log()
        .into_iter()
        .find(|e| format!("{}?{}", e.path, e.query) == path_and_query)
        .and_then(|e| e.tracestate)
}

/// A valid `tracestate` of exactly `len` bytes, in members of at most 250
/// bytes (a value may have 256): only its length is at issue.
fn tracestate(len: usize) -> String {
    let mut members = Vec::new();
    let mut left = len;
    while left > 0 {
        let comma = usize::from(!members.is_empty());
        let key = format!("k{}=", members.len());
        let member = (left - comma).min(250);
        members.push(format!("{key}{}", "x".repeat(member - key.len())));
        left -= member + comma;
    }
    members.join(",")
}

#[tokio::test]
async fn a_tracestate_over_512_bytes_is_not_forwarded() {
    let sim = start_sim(unlimited()).await;
    let gw = ChildGateway::spawn(&Setup::new(), &sim.base_url(), sim.api_key());
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let s = sim.samples();
    let (short, long) = (tracestate(300), tracestate(600));
    let (kept, dropped) = (Query::state_permits(&s).size(3), Query::state_permits(&s).size(4));
    for (query, state) in [(&kept, &short), (&dropped, &long)] {
        alpha
            .get(query)
            .header("traceparent", &traceparent())
            .header("tracestate", state)
            .expect_status(200)
            .await;
    }
    assert_eq!(upstream_tracestate(&sim, &kept).as_deref(), Some(short.as_str()));
    // The context itself still travels: only the list is dropped.
    assert_eq!(upstream_traceparent(&sim, &dropped), Some(traceparent()));
    assert_eq!(
        upstream_tracestate(&sim, &dropped),
        None,
        "600 bytes of tracestate forwarded"
    );
}

#[tokio::test]
async fn anonymous_sampled_requests_export_no_span() {
    let sim = start_sim(unlimited()).await;
    let (collector, spans) = start_collector().await;
    let setup = exporting_to(collector, 1.0);
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let anonymous = Client::anonymous(gw.base_url());
    let s = sim.samples();
    for i in 0..50u32 {
        let sampled = format!("00-{:032x}-{CLIENT_SPAN}-01", 0xa000_0000u64 + u64::from(i));
        anonymous
            .get(Query::state_permits(&s).size(3))
            .header("traceparent", &sampled)
            .expect_status(422)
            .await;
    }
    // A team's request in a trace of its own, with a tracestate too long to
    // keep: it is exported (export works), and only it.
    alpha_request(&gw, &s, &tracestate(600)).await;
    gw.signal("TERM");
    gw.wait_exit(Duration::from_secs(30));
    let all = eventually(
        "the team's request span at the collector",
        Duration::from_secs(10),
        || {
            let got = spans.lock().expect("lock").clone();
            async move { got.iter().any(|s| s.name == "request").then_some(got) }
        },
    )
    .await;
    let traces: std::collections::BTreeSet<String> = all.iter().map(|s| hex(&s.trace_id)).collect();
    assert_eq!(traces, [TRACE.to_string()].into(), "only the team's trace is exported");
    assert_eq!(all.iter().filter(|s| s.name == "request").count(), 1);
    assert!(
        all.iter().all(|s| s.trace_state.is_empty()),
        "a 600-byte tracestate was copied into a span"
    );
}

#[tokio::test]
async fn a_sampled_traceparent_does_not_override_sample_ratio() {
    // `sample_ratio` decides by the trace id (OpenTelemetry's
    // TraceIdRatioBased: its low 63 bits against the ratio): at 0.5, `OUT`
    // is never exported and `IN` always, both sent with the sampled flag.
    const OUT: &str = "4bf92f3577b34da6fffffffffffffff0";
    const IN: &str = "4bf92f3577b34da60000000000000001";
    let sim = start_sim(unlimited()).await;
    let (collector, spans) = start_collector().await;
    let setup = exporting_to(collector, 0.5);
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let s = sim.samples();
    // The one not to export first: once the later one is at the collector,
    // the earlier one's spans, had they been exported, would be too.
    for (trace, size) in [(OUT, 5), (IN, 6)] {
        Client::new(gw.base_url(), ALPHA.1)
            .get(Query::state_permits(&s).size(size))
            .header("traceparent", &format!("00-{trace}-{CLIENT_SPAN}-01"))
            .expect_status(200)
            .await;
    }
    gw.signal("TERM");
    gw.wait_exit(Duration::from_secs(30));
    let all = eventually("the sampled trace's request span", Duration::from_secs(10), || {
        let got = spans.lock().expect("lock").clone();
        async move {
            got.iter()
                .any(|s| s.name == "request" && hex(&s.trace_id) == IN)
                .then_some(got)
        }
    })
    .await;
    let out: Vec<&Span> = all.iter().filter(|s| hex(&s.trace_id) == OUT).collect();
    assert!(
        out.is_empty(),
        "a client's sampled flag exported {} spans: {out:?}",
        out.len()
    );
}

/// Spans exported to the collector at `collector`, a share `sample_ratio`
/// of the teams' traces.
fn exporting_to(collector: SocketAddr, sample_ratio: f64) -> Setup {
    Setup::new().with(move |c| {
        c.tracing.otlp_endpoint = Some(format!("http://{collector}"));
        c.tracing.sample_ratio = sample_ratio;
    })
}

/// A team's request with the client's sampled `traceparent`.
async fn alpha_request(gw: &ChildGateway, s: &crate::support::sim::Samples, state: &str) {
    Client::new(gw.base_url(), ALPHA.1)
        .get(Query::state_permits(s).size(5))
        .header("traceparent", &traceparent())
        .header("tracestate", state)
        .expect_status(200)
        .await;
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP receiver on 127.0.0.1:0: decodes each protobuf export of
/// `/v1/traces` and keeps its spans.
async fn start_collector() -> (SocketAddr, Arc<Mutex<Vec<Span>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("addr");
    let spans = Arc::new(Mutex::new(Vec::new()));
    let sink = spans.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let sink = sink.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let sink = sink.clone();
                    async move {
                        let path_ok = req.uri().path() == "/v1/traces";
                        let body = req.into_body().collect().await?.to_bytes();
                        let status = match ExportTraceServiceRequest::decode(body) {
                            Ok(export) if path_ok => {
                                let mut kept = sink.lock().expect("lock");
                                for rs in export.resource_spans {
                                    for ss in rs.scope_spans {
                                        kept.extend(ss.spans);
                                    }
                                }
                                200
                            }
                            _ => 400,
                        };
                        let mut resp = hyper::Response::new(Full::new(Bytes::new()));
                        *resp.status_mut() = hyper::StatusCode::from_u16(status).expect("status");
                        Ok::<_, hyper::Error>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, spans)
}
