//! Issue 38's thread-per-core mode (`server.runtime = "per_core"`): the team
//! listener served by single-threaded runtimes, each on its own
//! `SO_REUSEPORT` socket of one address. Every loop serves; answers, upstream
//! calls and metrics are what one loop would give; the connection cap holds
//! across the loops (one registry, not one per loop); a shutdown drains
//! every loop and ends its thread; the key is validated like the others.

use crate::support::client::Client;
use crate::support::conn::{anonymous_head, KeptAlive};
use crate::support::flight;
use crate::support::gateway::{ChildGateway, Setup, ALPHA, BETA};
use crate::support::probe::scrape;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, SimConfig};
use crate::support::threads::per_core_loops;
use crate::support::traffic::{distinct_search, distinct_searches};
use crate::support::wait::eventually;
use bytes::Bytes;
use http::StatusCode;
use permit_gateway::{Listeners, Running};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output};
use std::time::Duration;
use tokio::net::TcpListener;

/// Loops of these tests: more than the machine's two cores, so that they
/// take turns as well as run side by side.
const LOOPS: usize = 3;

/// Distinct searches, HTTP/1.1 and HTTP/2 connections, and requests per
/// connection of the load test.
const KEYS: usize = 8;
const HTTP1: usize = 24;
const HTTP2: usize = 6;
const ROUNDS: usize = 8;

/// One connection's requests, one after another: `(key, team, status, body)`.
async fn client_rounds(
    mut conn: KeptAlive,
    c: usize,
    keys: Vec<Query>,
) -> (KeptAlive, Vec<(usize, &'static str, StatusCode, Bytes)>) {
    let team = if c % 2 == 0 { ALPHA } else { BETA };
    let mut answers = Vec::new();
    for r in 0..ROUNDS {
        let key = (c + r) % KEYS;
        let (head, body) = conn.fetch(&keys[key], team.1).await.expect("answered");
        answers.push((key, team.0, head.status, body));
    }
    (conn, answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_core_loops_serve_concurrent_clients_buying_each_key_once_and_counting_every_request() {
    let sim = start_sim(SimConfig {
        latency_ms: 20,
        ..unlimited()
    })
    .await;
    let gw = Setup::new().per_core(LOOPS).start(&sim).await;
    let keys = distinct_searches(&sim, KEYS as u32, 3);
    let mut conns = Vec::new();
    for c in 0..HTTP1 + HTTP2 {
        let conn = match c < HTTP1 {
            true => KeptAlive::open(gw.addr).await,
            false => KeptAlive::open_h2(gw.addr).await,
        };
        conns.push(conn.expect("connects"));
    }
    // Every connection at once: the first round's misses of one key come
    // on several loops and must share one upstream call.
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(c, conn)| tokio::spawn(client_rounds(conn, c, keys.clone())))
        .collect();
    let (mut kept, mut answers) = (Vec::new(), Vec::new());
    for t in tasks {
        let (conn, a) = t.await.expect("client task");
        kept.push(conn);
        answers.extend(a);
    }
    assert_eq!(answers.len(), (HTTP1 + HTTP2) * ROUNDS);

    let log = sim.log();
    let bought: BTreeSet<_> = log.iter().map(|e| (e.path.clone(), e.query.clone())).collect();
    assert_eq!(log.len(), KEYS, "one upstream call per distinct key: {bought:#?}");
    assert_eq!(bought.len(), KEYS);
    // Every answer is the upstream's own for its key.
    let upstream = Client::upstream(&sim);
    let mut truth = BTreeMap::new();
    for (i, key) in keys.iter().enumerate() {
        truth.insert(i, upstream.get(key).expect_status(StatusCode::OK).await.body);
    }
    let mut per_team = BTreeMap::<&str, usize>::new();
    for (key, team, status, body) in &answers {
        assert_eq!(*status, StatusCode::OK, "key {key} for {team}");
        assert_eq!(body, &truth[key], "key {key} for {team}");
        *per_team.entry(team).or_default() += 1;
    }

    // The metrics count every request once, whichever loop served it.
    let admin = gw.admin_url();
    let total = answers.len() as f64;
    eventually("the metrics count every request", Duration::from_secs(10), || {
        let admin = admin.clone();
        async move {
            let m = scrape(&admin).await;
            let counted = m.sum("gateway_requests_total", &[]);
            (counted == total).then_some(m).ok_or(format!("{counted} of {total}"))
        }
    })
    .await;
    let m = scrape(&admin).await;
    for (team, n) in &per_team {
        assert_eq!(
            m.sum("gateway_requests_total", &[("team", team), ("status", "200")]),
            *n as f64,
            "{team}"
        );
    }
    let open = (HTTP1 + HTTP2) as f64;
    assert_eq!(
        m.get("gateway_open_connections", &[]),
        Some(open),
        "one gauge across the loops"
    );
    drop(kept);
    eventually("every connection is counted closed", Duration::from_secs(10), || {
        let admin = admin.clone();
        async move {
            let open = scrape(&admin).await.get("gateway_open_connections", &[]);
            (open == Some(0.0)).then_some(()).ok_or(format!("{open:?}"))
        }
    })
    .await;

    // Each loop served: its thread was woken at least once per request of
    // one connection (an idle loop sleeps in epoll from its start).
    let loops = per_core_loops(gw.addr.port());
    eprintln!("per-core loops after the load: {loops:?}");
    assert_eq!(loops.len(), LOOPS, "{loops:?}");
    assert!(
        loops.iter().all(|t| t.switches >= ROUNDS as u64),
        "a loop was idle: {loops:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_holds_across_the_loops_and_teams_still_get_in() {
    const CAP: usize = 8;
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new()
        .per_core(LOOPS)
        .with(|c| {
            c.server.max_connections = CAP;
            c.server.max_connections_per_peer = CAP;
        })
        .start(&sim)
        .await;
    let admin = gw.admin_url();
    let team_actions = [("listener", "team")];
    // Up to the cap nobody goes; past it, each newcomer, whichever loop
    // took it, makes one anonymous connection go: one registry of CAP,
    // neither CAP per loop (no action) nor CAP split over the loops (actions
    // below the cap).
    let mut kept = Vec::new();
    for k in 1..=2 * CAP {
        let (socket, answered) = anonymous_head(gw.addr).await.expect("connects");
        assert!(answered, "anonymous connection {k} got no 4xx");
        kept.push(socket);
        let m = scrape(&admin).await;
        let acted = m.sum("gateway_overload_actions_total", &team_actions);
        assert_eq!(acted as usize, k.saturating_sub(CAP), "after {k} connections");
        let open = m.get("gateway_open_connections", &[]).unwrap_or_default() as usize;
        // The overload manager's spare: an eighth more on their way out.
        assert!(open <= CAP + CAP / 8 + 1, "{open} open after {k} connections");
    }
    eventually("the evicted connections are gone", Duration::from_secs(10), || {
        let admin = admin.clone();
        async move {
            let open = scrape(&admin).await.get("gateway_open_connections", &[]);
            (open == Some(CAP as f64)).then_some(()).ok_or(format!("{open:?}"))
        }
    })
    .await;
    // At the cap, one team and then another get in (and stay), each in an
    // anonymous connection's place.
    let mut teams = Vec::new();
    for team in [ALPHA, BETA] {
        let mut conn = KeptAlive::open(gw.addr).await.expect("connects");
        let (status, _) = conn.get(Query::meta_release(), team.1).await.expect("answered");
        assert_eq!(status, StatusCode::OK, "{}", team.0);
        teams.push(conn);
    }
    let m = scrape(&admin).await;
    let anonymous = [("listener", "team"), ("action", "anonymous")];
    assert_eq!(m.sum("gateway_overload_actions_total", &anonymous), (CAP + 2) as f64);
    assert_eq!(m.sum("gateway_overload_actions_total", &team_actions), (CAP + 2) as f64);
    assert_eq!(sim.stats().requests_total, 1, "one fetch, then a hit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_lets_the_request_in_flight_finish_then_ends_every_loop() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().per_core(LOOPS).start(&sim).await;
    let (addr, port) = (gw.addr, gw.addr.port());
    // The loops start in the gateway's task, once it runs.
    eventually("every loop runs", Duration::from_secs(5), || {
        let n = per_core_loops(port).len();
        async move { (n == LOOPS).then_some(()).ok_or(format!("{n} loops")) }
    })
    .await;
    let query = distinct_search(&sim, 0, 3);
    // The test leads the key's flight: the request follows it, in flight
    // on its loop, until the test lets it go.
    let held = flight::lead(&gw.proxy.flights, &query.cache_key());
    let waiting = Client::new(gw.base_url(), ALPHA.1).get(&query).spawn();
    flight::followed(&held, 1).await;
    let stopping = tokio::spawn(gw.shutdown());
    // Every loop's socket closed: the drain is under way.
    eventually(
        "the team address refuses connections",
        Duration::from_secs(10),
        || async move { tokio::net::TcpStream::connect(addr).await.is_err() },
    )
    .await;
    assert!(
        !stopping.is_finished(),
        "the shutdown returned with a request in flight"
    );
    // The held flight fails for its own reasons: the request buys the
    // answer itself, during the drain.
    flight::fail(held);
    let r = waiting.await.expect("the request in flight");
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let stopped = tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("the shutdown returns once the request is done");
    stopped.expect("shutdown task").expect("a clean shutdown");
    assert_eq!(sim.stats().requests_total, 1);
    eventually("every loop's thread ended", Duration::from_secs(5), || {
        let left = per_core_loops(port);
        async move { left.is_empty().then_some(()).ok_or(format!("{left:?}")) }
    })
    .await;
}

#[tokio::test]
async fn the_binary_serves_per_core_with_its_loops_logged_and_stops_on_sigterm() {
    let sim = start_sim(unlimited()).await;
    let mut gw = ChildGateway::spawn(&Setup::new().per_core(2), &sim.base_url(), sim.api_key());
    let r = Client::new(gw.base_url(), ALPHA.1).get(Query::meta_release()).await;
    assert_eq!(r.status, StatusCode::OK);
    let logs = gw.log_text();
    assert!(
        logs.lines()
            .any(|l| l.contains("team listener served by per-core runtimes") && l.contains("\"loops\":2")),
        "{logs}"
    );
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(30)).success(), "{}", gw.log_text());
}

#[tokio::test]
async fn a_team_socket_bound_without_reuseport_fails_the_start_naming_the_key() {
    let sim = start_sim(unlimited()).await;
    let config = Setup::new().per_core(2).config(&sim);
    // Bound as the multi-thread mode binds: the second loop cannot share it.
    let listeners = Listeners {
        team: TcpListener::bind("127.0.0.1:0").await.expect("bind team"),
        admin: TcpListener::bind("127.0.0.1:0").await.expect("bind admin"),
    };
    let gw = Running::spawn(config, listeners).expect("spawned");
    let err = gw.shutdown().await.expect_err("the start fails");
    assert!(err.contains("server.runtime") && err.contains("SO_REUSEPORT"), "{err}");
}

/// `check-config` of the shipped example file with `server.runtime` from
/// the environment.
fn check_runtime_from_env(value: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_permit-gateway"))
        .args(["check-config", "--no-secrets", "--config"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config/gateway.toml"))
        .env("PERMIT_GATEWAY_SERVER__RUNTIME", value)
        .output()
        .expect("check-config runs")
}

#[test]
fn server_runtime_comes_from_the_environment_and_an_unknown_one_is_refused_naming_the_key() {
    let bogus = check_runtime_from_env("bogus");
    let said = String::from_utf8_lossy(&bogus.stderr);
    assert!(!bogus.status.success(), "{said}");
    assert!(
        said.lines()
            .any(|l| l.contains("server.runtime") && l.contains("`multi_thread`") && l.contains("`per_core`")),
        "{said}"
    );
    let per_core = check_runtime_from_env("per_core");
    let printed = String::from_utf8_lossy(&per_core.stdout);
    assert!(
        per_core.status.success(),
        "{}",
        String::from_utf8_lossy(&per_core.stderr)
    );
    assert!(printed.contains("runtime = \"per_core\""), "{printed}");
}
