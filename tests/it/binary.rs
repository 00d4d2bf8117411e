//! The gateway as its users run it: the binary, its logs, its signals, TLS
//! on both sides, and the demo.

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ADMIN_TOKEN, ALPHA, BETA};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, SimConfig};
use crate::support::tls::TestPki;
use crate::support::wait::eventually;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use permit_gateway::config::LogFormat;
use std::time::Duration;

/// Two releases can be told apart (issue 59): `--version` names the
/// release and the commit it was built from, as `gateway_build_info` does.
#[test]
fn version_names_the_release_and_its_commit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_permit-gateway"))
        .arg("--version")
        .output()
        .expect("the binary runs");
    assert!(out.status.success());
    let commit = permit_gateway::COMMIT;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("permit-gateway {} (commit {commit})\n", env!("CARGO_PKG_VERSION"))
    );
    assert!(
        commit == "unknown" || (commit.len() >= 4 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "a short hash or unknown: {commit}"
    );
}

#[tokio::test]
async fn secrets_never_appear_in_responses_or_logs() {
    let sim = start_sim(SimConfig {
        credit_limit: Some(1_000_000),
        ..unlimited()
    })
    .await;
    let gw = ChildGateway::spawn(&Setup::new(), &sim.base_url(), sim.api_key());
    let s = sim.samples();
    let secrets = [sim.api_key(), ALPHA.1, BETA.1, ADMIN_TOKEN];
    let mut replies = Vec::new();
    let callers = [
        Client::new(gw.base_url(), ALPHA.1),
        Client::bearer(gw.base_url(), BETA.1),
        Client::new(gw.base_url(), "wrong-token-value"),
    ];
    for query in [
        Query::state_permits(&s).size(3),
        Query::meta_release(),
        Query::usage(),
        Query::new("/v2/nope"),
        Query::new("/v2/permits/search").size(0),
    ] {
        for caller in &callers {
            replies.push(caller.get(&query).await);
        }
    }
    replies.push(Client::anonymous(gw.admin_url()).get("/metrics").await);
    replies.push(Client::admin(gw.admin_url()).get("/admin/teams").await);
    assert!(replies.iter().any(|r| r.status == StatusCode::OK));
    for reply in &replies {
        let mut all = reply.text();
        for (k, v) in &reply.headers {
            all.push_str(&format!("\n{k}: {}", String::from_utf8_lossy(v.as_bytes())));
        }
        for secret in secrets {
            assert!(!all.contains(secret), "a secret leaked in a response: {all}");
        }
    }
    // The access log wrote a line per request; none carries a secret.
    let logs = gw.log_text();
    assert!(
        logs.matches("\"request_id\"").count() >= 15,
        "access log lines missing: {logs}"
    );
    for secret in secrets {
        assert!(!logs.contains(secret), "a secret leaked in the logs");
    }
    // And the upstream got its own key, never a team's.
    assert!(sim.log().iter().all(|e| e.api_key_ok));
}

#[tokio::test]
async fn a_request_in_flight_during_sigterm_completes() {
    let sim = start_sim(unlimited()).await;
    let mut gw = ChildGateway::spawn(&Setup::new(), &sim.base_url(), sim.api_key());
    sim.set_faults(Faults {
        kind: FaultKind::Latency,
        latency_ms: Some(1_500),
        count: Some(1),
        ..Faults::default()
    });
    let in_flight = Client::new(gw.base_url(), ALPHA.1).get(Query::meta_release()).spawn();
    // Wait until the upstream has the request, then signal.
    eventually("the request reaches the upstream", Duration::from_secs(10), || async {
        sim.stats().requests_total > 0
    })
    .await;
    gw.signal("TERM");
    let reply = in_flight.await.expect("request task");
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "in-flight request was dropped: {}",
        reply.text()
    );
    let status = tokio::task::spawn_blocking(move || gw.wait_exit(Duration::from_secs(20)))
        .await
        .expect("wait");
    assert!(status.success(), "gateway exit status {status:?}");
}

/// A rustls client for the gateway's TLS listener.
fn tls_client(
    pki: &TestPki,
) -> hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Empty<Bytes>,
> {
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(pki.client_config())
        .https_only()
        .enable_http1()
        .enable_http2()
        .build();
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https)
}

#[tokio::test]
async fn team_traffic_is_served_over_tls_with_h2_by_alpn() {
    let pki = TestPki::new();
    let sim = start_sim(unlimited()).await;
    let (cert, key) = (pki.cert_path(), pki.key_path());
    let setup = Setup::new().with(move |c| {
        c.server.tls_cert_file = Some(cert.clone());
        c.server.tls_key_file = Some(key.clone());
    });
    let gw = setup.start(&sim).await;
    // A TLS client of its own (the harness's speaks cleartext).
    let req = http::Request::get(format!("https://localhost:{}{}", gw.addr.port(), Query::meta_release()))
        .header("x-api-key", ALPHA.1)
        .body(Empty::new())
        .expect("request");
    let resp = tls_client(&pki).request(req).await.expect("TLS request");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), http::Version::HTTP_2, "ALPN picks h2");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("released_at"));
}

#[tokio::test]
async fn the_upstream_is_reached_over_tls_with_a_private_ca() {
    let pki = TestPki::new();
    let sim = start_sim(SimConfig {
        tls: Some(pki.server_config()),
        ..unlimited()
    })
    .await;
    assert!(sim.base_url().starts_with("https://"));
    let ca = pki.ca_path();
    let setup = Setup::new().with(move |c| c.upstream.ca_file = Some(ca.clone()));
    let gw = setup.start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    alpha.get(Query::meta_release()).expect_status(StatusCode::OK).await;
    assert_eq!(sim.stats().requests_total, 1);

    // Without the CA the upstream's certificate is refused: no data, a 502.
    let untrusted = Setup::new().start(&sim).await;
    let r = alpha.at(untrusted.base_url()).get(Query::meta_release()).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn the_demo_serves_its_printed_curl_lines() {
    let (sim, gw) = permit_gateway::demo::start("127.0.0.1:0", "127.0.0.1:0")
        .await
        .expect("demo starts");
    let banner = permit_gateway::demo::banner(&sim, &gw);
    let url = banner
        .lines()
        .find_map(|l| l.trim().strip_prefix("curl -s -H 'X-API-Key: pgw_demo_growth' '"))
        .and_then(|rest| rest.strip_suffix('\''))
        .expect("banner has a growth curl line")
        .to_string();
    // The URL exactly as the banner printed it (no base of the client's):
    // the line is what is tested.
    let r = Client::new("", "pgw_demo_growth").get(&url).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(!r.json()["items"].as_array().expect("items").is_empty());
    let admin = Client::bearer(gw.admin_url(), "pgw_demo_admin")
        .get("/admin/teams")
        .await;
    assert_eq!(admin.status, StatusCode::OK);
    // The metrics line prints the money metrics only, not every bucket.
    assert!(
        banner.contains("/metrics' | grep -E '^gateway_(credits_(spent|saved)_total|team_credit)'"),
        "{banner}"
    );
    let _ = gw.shutdown().await;
    sim.shutdown().await;
    // Everything it wrote in a folder of its own (not a disk-tier file in
    // the temp directory, which the next demo would read back), and
    // nothing left behind.
    let dir = permit_gateway::demo::demo_dir();
    assert!(dir.join("ledger").exists(), "the demo's ledger is where clean_up looks");
    assert!(dir.join("cache.redb").exists(), "so is its disk-tier file");
    permit_gateway::demo::clean_up();
    assert!(!dir.exists(), "the demo left {} behind", dir.display());
}

#[tokio::test]
async fn sighup_reloads_the_teams_of_the_config_file() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[ALPHA]);
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let (alpha, beta) = (Client::new(gw.base_url(), ALPHA.1), Client::new(gw.base_url(), BETA.1));
    let release = Query::meta_release();
    assert_eq!(beta.get(&release).await.status, StatusCode::UNAUTHORIZED);
    // The same setup, so the ledger's folder stays the same.
    let setup = setup.credit_limit(BETA, 7);
    gw.rewrite(&setup, &sim.base_url(), sim.api_key());
    gw.signal("HUP");
    eventually("SIGHUP reloads the teams", Duration::from_secs(10), || async {
        beta.get(&release).await.status == StatusCode::OK
    })
    .await;
    assert_eq!(alpha.get(&release).await.status, StatusCode::OK, "old teams stay");
}

#[tokio::test]
async fn human_logs_carry_no_colour_codes_when_not_a_terminal() {
    use std::io::{BufRead, BufReader};
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().with(|c| c.log.format = LogFormat::Human);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, setup.toml(&sim.base_url(), sim.api_key())).expect("write");
    // stderr is a pipe here, as under systemd, Docker or a log shipper.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_permit-gateway"))
        .args(["serve", "--config"])
        .arg(&path)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("gateway binary starts");
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = || rx.recv_timeout(Duration::from_secs(30)).expect("a log line");
    let serving = std::iter::repeat_with(next)
        .find(|l| l.contains("permit-gateway serving"))
        .expect("serving line");
    let addr = serving
        .split_whitespace()
        .find_map(|w| w.strip_prefix("listen="))
        .unwrap_or_else(|| panic!("no plain listen= field in {serving:?}"))
        .to_string();
    let r = Client::new(format!("http://{addr}"), ALPHA.1)
        .get(Query::meta_release())
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let access = std::iter::repeat_with(next)
        .find(|l| l.contains("access"))
        .expect("an access-log line");
    let _ = child.kill();
    let _ = child.wait();
    for line in [&serving, &access] {
        assert!(!line.contains('\u{1b}'), "ANSI escape in {line:?}");
    }
}
