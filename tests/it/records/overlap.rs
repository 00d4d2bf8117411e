//! Overlapping lookups buy each record once: lookups in flight
//! at once, in any order, with repeats, from two teams, on one replica or
//! several sharing Redis or a Redis Cluster, behind a slow upstream.

use super::{assert_same_as_upstream, direct, ids_of, lookup, permit_search};
use crate::support::client::Client;
use crate::support::gateway::{Setup, Team, ALPHA, BETA};
use crate::support::http::Reply;
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim};
use crate::support::traffic::{charged_for, charged_to, ledger_used};
use http::StatusCode;
use permit_gateway::config::QuotaStore;
use permit_gateway::Running;
use std::future::IntoFuture;

/// A team's lookup of ids by their place in `ids`, with a request id that
/// attributes the upstream's charge to the team.
struct Lookup {
    team: Team,
    at: Vec<usize>,
}

/// The overlapping lists: 0–9 and 5–14 and 14–10 reversed, with repeats and reorderings of shared ids from the other team.
fn lookups() -> Vec<Lookup> {
    let l = |team, at: Vec<usize>| Lookup { team, at };
    vec![
        l(ALPHA, (0..10).collect()),
        l(BETA, (5..15).collect()),
        l(ALPHA, (10..15).rev().collect()),
        l(BETA, vec![7, 2, 7, 13, 2]),
        l(ALPHA, vec![9, 8, 9, 5]),
        l(BETA, vec![1, 14, 0, 1]),
    ]
}

/// One answered lookup: the replica it went to, its team, its request id.
struct Answered {
    replica: usize,
    team: &'static str,
    request_id: String,
    path: Query,
    reply: Reply,
}

/// Every answer says what its own request cost, and every ledger holds
/// exactly that for its team's requests: on a shared (Redis) ledger every
/// replica reports the team's whole charge; with a ledger per replica each
/// holds the charge of the requests it answered. Compared team by team and
/// replica by replica, never summed, so that one replica's over-charge
/// cannot hide another's under-charge. Lookups of several requests may
/// share an upstream call (`upstream.batch_window_ms`), which carries one
/// of their request ids: what the upstream charged is then compared with
/// what all the answers say, and no answer says more than the records it
/// carries.
async fn assert_each_ledger_holds_its_charge(sim: &Sim, replicas: &[&Running], answered: &[Answered]) {
    let said = |a: &Answered| a.reply.header_u64("x-credits-request").expect("a credits header");
    for a in answered {
        assert!(
            said(a) <= ids_of(&a.reply).len() as u64,
            "{} ({}): charged {} for {} records",
            a.request_id,
            a.path,
            said(a),
            ids_of(&a.reply).len()
        );
    }
    let upstream: u64 = answered.iter().map(|a| charged_for(sim, &a.request_id)).sum();
    assert_eq!(
        answered.iter().map(said).sum::<u64>(),
        upstream,
        "the answers say, together, what the upstream charged for them"
    );
    let shared = replicas[0].app.config.quota.store == QuotaStore::Redis;
    for team in [ALPHA.0, BETA.0] {
        for (r, gw) in replicas.iter().enumerate() {
            let charged: u64 = answered
                .iter()
                .filter(|a| a.team == team && (shared || a.replica == r))
                .map(said)
                .sum();
            let ledger = ledger_used(&gw.admin_url(), team).await;
            assert_eq!(
                ledger, charged,
                "team {team}, replica {r} (shared ledger: {shared}): the ledger vs what its answers said"
            );
        }
    }
    assert_eq!(
        upstream,
        charged_to(sim, "alpha-") + charged_to(sim, "beta-"),
        "every charge came from one of these lookups"
    );
}

/// Fires every lookup at once, round-robin over the replicas, behind a
/// 600 ms upstream, then asserts: each answer is the upstream's own, the
/// upstream charged exactly the 15 distinct records, and every ledger
/// holds what the upstream charged its team
/// ([`assert_each_ledger_holds_its_charge`]).
async fn buys_each_record_once(sim: &Sim, replicas: &[&Running]) {
    let ids = ids_of(&direct(sim, &permit_search(sim, 15)).await);
    assert_eq!(ids.len(), 15);
    sim.set_faults(Faults {
        kind: FaultKind::Latency,
        latency_ms: Some(600),
        ..Faults::default()
    });
    let tasks: Vec<_> = lookups()
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let asked: Vec<&str> = l.at.iter().map(|a| ids[*a].as_str()).collect();
            let path = lookup("permits", &asked);
            let replica = i % replicas.len();
            let (team, token) = l.team;
            let request_id = format!("{team}-overlap-{i}");
            let call = Client::new(replicas[replica].base_url(), token)
                .get(&path)
                .request_id(&request_id);
            tokio::spawn(async move {
                let reply = call.await;
                Answered {
                    replica,
                    team,
                    request_id,
                    path,
                    reply,
                }
            })
        })
        .collect();
    let mut answered = Vec::new();
    for t in tasks {
        answered.push(t.await.expect("lookup task"));
    }
    sim.clear_faults();
    for a in &answered {
        assert_eq!(a.reply.status, StatusCode::OK, "{}: {}", a.path, a.reply.text());
        assert_same_as_upstream(sim, &a.path, &a.reply).await;
    }
    let (alpha, beta) = (charged_to(sim, "alpha-"), charged_to(sim, "beta-"));
    assert_eq!(alpha + beta, 15, "15 distinct records, each bought once");
    assert_each_ledger_holds_its_charge(sim, replicas, &answered).await;
}

/// Replicas sharing a Redis: its cache tier and per-id leases, and, with
/// `shared_ledger`, its ledger (as production runs replicas); else each
/// replica keeps a file ledger of its own.
fn on_redis(redis: &RedisServer, shared_ledger: bool) -> Setup {
    match shared_ledger {
        true => Setup::new().redis(&redis.url()),
        false => Setup::new().cache_redis(&redis.url()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_lookups_in_one_process_buy_each_record_once() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    buys_each_record_once(&sim, &[&gw]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_lookups_across_replicas_on_redis_buy_each_record_once() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let (one, two) = (
        on_redis(&redis, false).start(&sim).await,
        on_redis(&redis, false).start(&sim).await,
    );
    buys_each_record_once(&sim, &[&one, &two]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_lookups_across_replicas_sharing_a_redis_ledger_buy_each_record_once() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let (one, two) = (
        on_redis(&redis, true).start(&sim).await,
        on_redis(&redis, true).start(&sim).await,
    );
    buys_each_record_once(&sim, &[&one, &two]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_lookups_across_replicas_on_a_redis_cluster_buy_each_record_once() {
    use crate::support::redis_cluster::RedisCluster;
    let cluster = RedisCluster::start_async().await;
    let sim = start_sim(unlimited()).await;
    let setup = || Setup::new().cache_redis(&cluster.url());
    let (one, two) = (setup().start(&sim).await, setup().start(&sim).await);
    buys_each_record_once(&sim, &[&one, &two]).await;
}

/// Contractors, decisions and properties meet on their shared ids too: two
/// teams' overlapping lookups at once (alpha's on the first replica,
/// beta's on the last), each record bought once, every answer and ledger
/// holding what the upstream charged.
async fn every_resource_buys_each_record_once(sim: &Sim, replicas: &[&Running]) {
    let s = sim.samples();
    let searches = [
        ("contractors", Query::state_contractors(&s).size(6)),
        (
            "decisions",
            Query::decision_search(&s.state, "2020-01-01", "2026-12-31").size(6),
        ),
        ("properties", Query::property_search(&s.zip).size(6)),
    ];
    let mut answered = Vec::new();
    for (resource, search) in searches {
        let ids = ids_of(&direct(sim, &search).await);
        assert!(ids.len() >= 5, "{resource}: {ids:?}");
        let (alpha_before, beta_before) = (charged_to(sim, "alpha-"), charged_to(sim, "beta-"));
        sim.set_faults(Faults {
            kind: FaultKind::Latency,
            latency_ms: Some(400),
            ..Faults::default()
        });
        let first: Vec<&str> = ids[..4].iter().map(String::as_str).collect();
        let second: Vec<&str> = ids[1..5].iter().rev().map(String::as_str).collect();
        let (a, b) = (lookup(resource, &first), lookup(resource, &second));
        let last = replicas.len() - 1;
        let (ida, idb) = (format!("alpha-{resource}"), format!("beta-{resource}"));
        let (ra, rb) = tokio::join!(
            Client::new(replicas[0].base_url(), ALPHA.1)
                .get(&a)
                .request_id(&ida)
                .into_future(),
            Client::new(replicas[last].base_url(), BETA.1)
                .get(&b)
                .request_id(&idb)
                .into_future(),
        );
        sim.clear_faults();
        assert_same_as_upstream(sim, &a, &ra).await;
        assert_same_as_upstream(sim, &b, &rb).await;
        let charged = charged_to(sim, "alpha-") + charged_to(sim, "beta-") - alpha_before - beta_before;
        assert_eq!(charged, 5, "{resource}: five distinct records");
        let answer = |replica, team, request_id, path, reply| Answered {
            replica,
            team,
            request_id,
            path,
            reply,
        };
        answered.push(answer(0, ALPHA.0, ida, a, ra));
        answered.push(answer(last, BETA.0, idb, b, rb));
    }
    assert_each_ledger_holds_its_charge(sim, replicas, &answered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_lookups_of_every_resource_buy_each_record_once() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    every_resource_buys_each_record_once(&sim, &[&gw]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_lookups_of_every_resource_across_replicas_on_redis_buy_each_record_once() {
    let redis = RedisServer::start();
    let sim = start_sim(unlimited()).await;
    let (one, two) = (
        on_redis(&redis, true).start(&sim).await,
        on_redis(&redis, true).start(&sim).await,
    );
    every_resource_buys_each_record_once(&sim, &[&one, &two]).await;
}

/// A client that hangs up while its lookup buys leaves nothing half done:
/// the buy runs on, files its records and ends its flights, so the other
/// team's overlapping lookup waits for it and the retry is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_whose_client_hangs_up_still_buys_its_ids_once() {
    use std::time::Duration;
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let ids = ids_of(&direct(&sim, &permit_search(&sim, 4)).await);
    sim.set_faults(Faults {
        kind: FaultKind::Latency,
        latency_ms: Some(800),
        ..Faults::default()
    });
    let first = lookup("permits", &[&ids[0], &ids[1], &ids[2]]);
    let second = lookup("permits", &[&ids[3], &ids[2], &ids[1]]);
    let ask = |query: &Query, (team, token): Team, n: u32| {
        let request_id = format!("{team}-hangup-{n}");
        Client::new(gw.base_url(), token)
            .get(query)
            .request_id(&request_id)
            .into_future()
    };
    let hung_up = tokio::time::timeout(Duration::from_millis(300), ask(&first, ALPHA, 1)).await;
    assert!(hung_up.is_err(), "the client hung up before the answer");
    let other = ask(&second, BETA, 2).await;
    sim.clear_faults();
    assert_eq!(other.status, StatusCode::OK, "{}", other.text());
    assert_eq!(other.header_u64("x-credits-request"), Some(1), "only its own new id");
    let retry = ask(&first, ALPHA, 3).await;
    assert_eq!(retry.header("x-cache"), Some("HIT"), "{}", retry.text());
    assert_eq!(charged_to(&sim, "alpha-"), 3);
    assert_eq!(charged_to(&sim, "beta-"), 1);
    for team in ["alpha", "beta"] {
        let ledger = ledger_used(&gw.admin_url(), team).await;
        assert_eq!(ledger, charged_to(&sim, &format!("{team}-")), "team {team}");
    }
}
