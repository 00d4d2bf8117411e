//! Crashes of the file ledger's process: between the upstream's charge and
//! the settle (case 6), under concurrent misses, and inside a commit.

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA, BETA, SMALL};
use crate::support::query::Query;
use crate::support::sim::fault;
use crate::support::sim::{start_sim, unlimited, FaultKind, Faults, Sim, SimConfig};
use crate::support::traffic::{charged_to, distinct_search};
use crate::support::wait::eventually;
use http::StatusCode;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Case 6: SIGKILL while the upstream streams three answers it already
/// billed. Their charges are settled from the billed heads before the
/// bodies (and the reservations were written before the calls, so one
/// killed before its head counts as spent at restart): afterwards the
/// ledger holds at least the charge, never above the limit.
#[tokio::test]
async fn sigkill_between_charge_and_settle_counts_the_calls_as_spent() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 100);
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    // The upstream charges at once, then trickles the body for 20 s.
    sim.set_faults(Faults {
        delay_ms: Some(20_000),
        ..fault(FaultKind::SlowBody)
    });
    let small = Client::new(gw.base_url(), SMALL.1);
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let id = format!("small-{i}");
            small.get(distinct_search(&sim, i, 30)).request_id(&id).spawn()
        })
        .collect();
    eventually("three calls charged upstream", Duration::from_secs(10), || async {
        charged_to(&sim, "small-") == 90
    })
    .await;
    gw.signal("KILL");
    gw.wait_exit(Duration::from_secs(10));
    for c in calls {
        c.abort();
    }
    sim.clear_faults();
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let small = Client::new(gw.base_url(), SMALL.1);
    let spent = small.used().await;
    assert_eq!(spent, 90, "every charged call counts (the upstream charged 90)");
    let over = small.get(distinct_search(&sim, 5, 20)).request_id("small-5").await;
    assert_eq!(over.status, StatusCode::PAYMENT_REQUIRED, "90 + 20 > 100");
    let last = small.get(distinct_search(&sim, 6, 10)).request_id("small-6").await;
    assert_eq!(last.status, StatusCode::OK);
    assert_eq!(small.used().await, 100, "exactly the limit, never above");
    assert_eq!(charged_to(&sim, "small-"), 100);
}

/// Keeps `workers` misses in flight, each a distinct search of `size`
/// records with a request id under `prefix`, until the gateway dies (a
/// request then fails and its task ends). Answers how many were sent.
fn keep_missing(
    gw: &ChildGateway,
    sim: &Sim,
    prefix: &str,
    token: &str,
    first: u32,
    workers: u32,
    size: u32,
) -> (Arc<AtomicU32>, Vec<tokio::task::JoinHandle<()>>) {
    let sent = Arc::new(AtomicU32::new(0));
    let s = sim.samples();
    let client = Client::new(gw.base_url(), token);
    let tasks = (0..workers)
        .map(|w| {
            let (sent, s, client, prefix) = (sent.clone(), s.clone(), client.clone(), prefix.to_string());
            tokio::spawn(async move {
                for k in 0.. {
                    let i = first + w * 200 + k;
                    sent.fetch_add(1, Ordering::SeqCst);
                    let call = client
                        .get(Query::distinct(&s, i).size(size))
                        .request_id(&format!("{prefix}{i}"));
                    // A request the kill cuts panics its own task, not this loop's.
                    if tokio::spawn(call.into_future()).await.is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    (sent, tasks)
}

/// SIGKILL while misses of two teams run concurrently (the writer thread
/// group-commits their holds and settles): after the restart every team's
/// ledger holds at least what the upstream charged it, and at most what
/// its calls reserved (a hold left open counts in full, once).
#[tokio::test]
async fn sigkill_under_concurrent_misses_keeps_every_charge() {
    let sim = start_sim(SimConfig {
        latency_ms: 5,
        latency_jitter_ms: 20,
        ..unlimited()
    })
    .await;
    let setup = Setup::new()
        .teams(&[ALPHA, BETA])
        .credit_limit(ALPHA, 100_000)
        .credit_limit(BETA, 100_000);
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let (alpha_sent, alpha) = keep_missing(&gw, &sim, "alpha-", ALPHA.1, 0, 6, 7);
    let (beta_sent, beta) = keep_missing(&gw, &sim, "beta-", BETA.1, 1400, 6, 5);
    eventually("both teams charged upstream", Duration::from_secs(20), || async {
        charged_to(&sim, "alpha-") >= 100 && charged_to(&sim, "beta-") >= 100
    })
    .await;
    gw.signal("KILL");
    gw.wait_exit(Duration::from_secs(10));
    for t in alpha.into_iter().chain(beta) {
        let _ = t.await;
    }
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    for (name, token, sent, size) in [("alpha-", ALPHA.1, alpha_sent, 7), ("beta-", BETA.1, beta_sent, 5)] {
        let used = Client::new(gw.base_url(), token).used().await;
        let charged = charged_to(&sim, name);
        let reserved = u64::from(sent.load(Ordering::SeqCst)) * size;
        assert!(
            (charged..=reserved).contains(&used),
            "{name}: the ledger ({used}) holds at least the charge ({charged}), at most the reservations ({reserved})"
        );
    }
    // The ledger goes on exactly: one more call adds what it was charged.
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let before = alpha.used().await;
    let r = alpha
        .get(Query::distinct(&sim.samples(), 2900).size(3))
        .request_id("alpha-after")
        .await
        .expect_status(StatusCode::OK);
    assert_eq!(r.x_cache(), Some("MISS"));
    assert_eq!(alpha.used().await, before + charged_to(&sim, "alpha-after"));
}

/// Kills that land inside the writer's commits: misses keep the writer
/// committing back to back (the upstream answers at once), and the process
/// is SIGKILLed at a different moment in each of several rounds. Every
/// restart opens the ledger (a crash is never taken for a damaged file:
/// commits are two-phase) and no round loses a charge.
#[tokio::test]
async fn a_kill_during_a_commit_never_loses_a_charge_nor_stops_the_restart() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 1_000_000);
    let mut sent_total = 0u64;
    for round in 0..6u32 {
        let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
        let (sent, tasks) = keep_missing(&gw, &sim, "small-", SMALL.1, round * 2000 % 2800, 4, 2);
        let charged_before = charged_to(&sim, "small-");
        eventually("misses are being charged", Duration::from_secs(20), || async {
            charged_to(&sim, "small-") >= charged_before + 10
        })
        .await;
        // A different point of the commit cycle each round.
        tokio::time::sleep(Duration::from_millis(u64::from(round) * 37 % 100)).await;
        gw.signal("KILL");
        gw.wait_exit(Duration::from_secs(10));
        for t in tasks {
            let _ = t.await;
        }
        sent_total += u64::from(sent.load(Ordering::SeqCst));
    }
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let used = Client::new(gw.base_url(), SMALL.1).used().await;
    let charged = charged_to(&sim, "small-");
    assert!(
        (charged..=sent_total * 2).contains(&used),
        "the ledger ({used}) holds at least the charge ({charged}) and at most the reservations ({})",
        sent_total * 2
    );
    assert!(!gw.log_text().contains("is damaged"), "a crash is not a damaged file");
}
