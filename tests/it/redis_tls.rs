//! The gateway on a real TLS-only `redis-server` (no plaintext port), as on
//! a managed Redis with in-transit encryption: the cache (L2 and leases),
//! the Redis ledger and the shared upstream rate all over `rediss://`, with
//! a throw-away CA, with and without a client certificate, and with a Redis
//! 6 ACL user; a CA that did not sign the server's certificate, or a missing
//! client certificate, stops the start with an error naming the setting.

use crate::support::client::Client;
use crate::support::gateway::{try_start_config, Setup, ALPHA};
use crate::support::probe::readyz;
use crate::support::query::Query;
use crate::support::redis_tls::{RedisPki, TlsCluster, TlsRedis, Trust};
use crate::support::secrets;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::traffic::assert_ledger_matches;
use http::StatusCode;
use permit_gateway::Running;

/// An ACL password the logs, errors and rendered config must never show.
const ACL_PASSWORD: &str = "acl-pw-3c1e9b27d5f04a68";

async fn tls_redis(client_certs: bool, acl: bool) -> TlsRedis {
    tokio::task::spawn_blocking(move || {
        let mut redis = TlsRedis::start(client_certs);
        if acl {
            redis.acl_user("gateway", ACL_PASSWORD);
        }
        redis
    })
    .await
    .expect("TLS redis starts")
}

/// Cache, leases, ledger and shared rate on `url`, with `trust`'s TLS files.
fn on_tls(url: &str, trust: Trust) -> Setup {
    Setup::new().redis(url).with(move |c| {
        c.cache.redis_timeout_ms = 2000;
        trust.apply(c);
    })
}

/// The gateway's start, or its start-up error.
async fn try_start(setup: &Setup, sim: &Sim) -> Result<Running, String> {
    try_start_config(setup.config(sim)).await
}

/// Two replicas: each cold query reaches the upstream once (the second
/// replica answers from the Redis L2), the Redis ledger equals what the
/// upstream charged, the rate and ledger keys are in this Redis, and
/// `/readyz` reports both Redis users ok.
async fn exercise(redis: &TlsRedis, sim: &Sim, gws: &[Running]) {
    let s = sim.samples();
    let (one, two) = (
        Client::new(gws[0].base_url(), ALPHA.1),
        Client::new(gws[1].base_url(), ALPHA.1),
    );
    for i in 0..4u32 {
        let first = one
            .get(Query::distinct(&s, i).size(2))
            .request_id(&format!("alpha-{i}"))
            .await;
        assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    }
    for i in 0..4u32 {
        let second = two
            .get(Query::distinct(&s, i).size(2))
            .request_id(&format!("alpha-{i}b"))
            .await;
        assert_eq!(second.status, StatusCode::OK, "{}", second.text());
        assert_eq!(second.x_cache(), Some("HIT"), "L2 over TLS: {:?}", second.headers);
    }
    assert_eq!(sim.log().len(), 4, "one upstream call per cold query");
    assert_ledger_matches(sim, &gws[0].admin_url(), &["alpha"]).await;
    assert_ledger_matches(sim, &gws[1].admin_url(), &["alpha"]).await;
    let ready = readyz(&gws[1].admin_url()).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
    assert_eq!(ready.json()["checks"]["cache_redis"], "ok", "{}", ready.text());
    let keys = tokio::task::block_in_place(|| {
        [
            redis.keys("pgw:l:{alpha}:*"),
            redis.keys("pgw:{rate}:*"),
            redis.keys("pgw:c:*"),
        ]
    });
    assert!(!keys[0].is_empty(), "the ledger is in the TLS Redis: {keys:?}");
    assert!(!keys[1].is_empty(), "the shared rate is in the TLS Redis: {keys:?}");
    assert!(keys[2].len() >= 4, "the L2 cache is in the TLS Redis: {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_ledger_and_shared_rate_run_over_rediss_with_a_private_ca() {
    let redis = tls_redis(false, false).await;
    let sim = start_sim(unlimited()).await;
    let setup = on_tls(&redis.url(""), redis.trust(false));
    let gws = [setup.start(&sim).await, setup.start(&sim).await];
    exercise(&redis, &sim, &gws).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_and_an_acl_user_over_rediss() {
    secrets::register(ACL_PASSWORD);
    let redis = tls_redis(true, true).await;
    let sim = start_sim(unlimited()).await;
    let url = redis.url(&format!("gateway:{ACL_PASSWORD}"));

    // Redis asks for a client certificate the config does not give.
    let without = on_tls(&url, redis.trust(false));
    let e = try_start(&without, &sim)
        .await
        .err()
        .expect("refused without a client certificate");
    assert!(
        e.contains("cache.redis_url") && e.contains("redis.tls_cert_file"),
        "names the settings: {e}"
    );
    secrets::assert_clean(&e, "the start-up error");

    let setup = on_tls(&url, redis.trust(true));
    let rendered = setup.config(&sim).redacted_toml();
    assert!(rendered.contains("tls_cert_file"), "{rendered}");
    secrets::assert_clean(&rendered, "check-config's output");
    let gws = [setup.start(&sim).await, setup.start(&sim).await];
    exercise(&redis, &sim, &gws).await;
    // The login was the ACL user's: `default` is off.
    let clients: String = tokio::task::block_in_place(|| redis.query(redis::cmd("CLIENT").arg("LIST")));
    assert!(clients.contains("user=gateway"), "{clients}");
    assert!(!clients.contains("user=default"), "{clients}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_stops_the_start_naming_the_setting() {
    let redis = tls_redis(false, false).await;
    let sim = start_sim(unlimited()).await;
    let other = RedisPki::new();

    let wrong = on_tls(&redis.url(""), Trust::ca(other.path("ca.pem")));
    let e = try_start(&wrong, &sim)
        .await
        .err()
        .expect("refused with a CA that did not sign");
    eprintln!("wrong CA: {e}");
    assert!(
        e.contains("cache.redis_url") && e.contains("redis.tls_ca_file") && e.contains("not trusted"),
        "{e}"
    );

    // No CA at all: the public roots do not know a private CA either.
    let public = on_tls(&redis.url(""), Trust::default());
    let e = try_start(&public, &sim)
        .await
        .err()
        .expect("refused with the public roots");
    assert!(e.contains("set redis.tls_ca_file"), "{e}");

    // A CA file that is not PEM is a configuration error, named.
    let bad = other.path("not-a-ca.pem");
    std::fs::write(&bad, "not a certificate").expect("write");
    let setup = on_tls(&redis.url(""), Trust::ca(bad));
    let text = setup.toml(&sim.base_url(), sim.api_key());
    let e = permit_gateway::config::Config::load(permit_gateway::config::Source::Text(&text)).expect_err("refused");
    assert!(e.to_string().contains("redis.tls_ca_file"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_cluster_over_rediss_cluster() {
    let cluster = tokio::task::spawn_blocking(TlsCluster::start)
        .await
        .expect("TLS cluster up");
    let sim = start_sim(unlimited()).await;
    let setup = on_tls(&cluster.url(), Trust::ca(cluster.pki.path("ca.pem")));
    let gws = [setup.start(&sim).await, setup.start(&sim).await];
    // Spread over every primary: each query's key hashes to its own slot.
    let s = sim.samples();
    let (one, two) = (
        Client::new(gws[0].base_url(), ALPHA.1),
        Client::new(gws[1].base_url(), ALPHA.1),
    );
    for i in 0..6u32 {
        let r = one
            .get(Query::distinct(&s, i).size(2))
            .request_id(&format!("alpha-{i}"))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    for i in 0..6u32 {
        let r = two
            .get(Query::distinct(&s, i).size(2))
            .request_id(&format!("alpha-{i}b"))
            .await;
        assert_eq!(r.x_cache(), Some("HIT"), "L2 on the TLS cluster: {:?}", r.headers);
    }
    assert_eq!(sim.log().len(), 6, "one upstream call per cold query");
    assert_ledger_matches(&sim, &gws[1].admin_url(), &["alpha"]).await;
    let ready = readyz(&gws[0].admin_url()).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
    assert_eq!(ready.json()["checks"]["cache_redis"], "ok", "{}", ready.text());
}
