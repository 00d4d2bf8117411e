//! A bounded load test: several teams at high concurrency, mixed hits,
//! misses, budget and rate rejections, for a dozen seconds. Zero 5xx, memory
//! that levels off, and a ledger equal to the upstream's charge per team.

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA, BETA, SMALL};
use crate::support::query::Query;
use crate::support::sim::{start_sim, SimConfig};
use crate::support::traffic::assert_ledger_matches;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WORKERS: u32 = 48;
const RUN_FOR: Duration = Duration::from_secs(12);

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_load_from_several_teams_has_no_5xx_bounded_memory_and_an_exact_ledger() {
    let sim = start_sim(SimConfig {
        requests_per_minute: 0,
        latency_ms: 3,
        latency_jitter_ms: 4,
        ..SimConfig::default()
    })
    .await;
    let setup = Setup::new()
        .teams(&[ALPHA, BETA, SMALL])
        .credit_limit(BETA, 300)
        .team(SMALL, |t| t.requests_per_minute = Some(600))
        .with(|c| c.cache.memory_max_bytes = 8388608)
        .log_level("info,access=warn");
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let base = gw.base_url();
    let pid = gw.child.id();
    let s = sim.samples();
    let hot: Arc<Vec<Query>> = Arc::new((0..40).map(|i| Query::distinct(&s, i).size(5)).collect());
    let fresh = Arc::new(AtomicU32::new(1_000));
    let statuses = Arc::new(Mutex::new(BTreeMap::<(&str, u16), u64>::new()));
    let deadline = Instant::now() + RUN_FOR;

    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        while Instant::now() < deadline {
            samples.push(rss_kib(pid));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        samples
    });
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (base, hot, fresh, statuses) = (base.clone(), hot.clone(), fresh.clone(), statuses.clone());
            let (big_state, permit_to) = (s.big_state.clone(), s.permit_to.clone());
            tokio::spawn(async move {
                let (name, token) = [ALPHA, BETA, SMALL][w as usize % 3];
                let client = Client::new(base, token);
                let mut n = 0u32;
                while Instant::now() < deadline {
                    n += 1;
                    let query = match n % 10 {
                        0..=5 => hot[(w + n) as usize % hot.len()].clone(),
                        6..=8 => {
                            let i = fresh.fetch_add(1, Ordering::Relaxed);
                            let from = chrono::NaiveDate::from_ymd_opt(2010, 1, 1).expect("date")
                                + chrono::Days::new(u64::from(i % 5000));
                            Query::permit_search(&big_state)
                                .window(from, &permit_to)
                                .size(1 + i / 5000)
                        }
                        _ => Query::meta_release(),
                    };
                    let r = client.get(query).request_id(&format!("{name}-{w}-{n}")).await;
                    *statuses
                        .lock()
                        .expect("lock")
                        .entry((name, r.status.as_u16()))
                        .or_default() += 1;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }
    let samples = sampler.await.expect("sampler");
    let statuses = statuses.lock().expect("lock").clone();

    let total: u64 = statuses.values().sum();
    assert!(total > 1_000, "too little load to mean anything: {statuses:?}");
    let of = |team: &str| -> Vec<u16> { statuses.keys().filter(|(t, _)| *t == team).map(|(_, s)| *s).collect() };
    assert_eq!(
        of("alpha"),
        vec![200],
        "the unlimited team is always served: {statuses:?}"
    );
    assert_eq!(
        of("beta"),
        vec![200, 402],
        "beta is served until its budget runs out: {statuses:?}"
    );
    assert_eq!(
        of("small"),
        vec![200, 429],
        "small is served within its rate: {statuses:?}"
    );

    // Memory levels off: the second half grows little over the first.
    let quarter = samples[samples.len() / 4];
    let peak = *samples.iter().max().expect("samples");
    let last = *samples.last().expect("samples");
    assert!(last < 300 * 1024, "RSS {last} KiB");
    assert!(
        peak <= quarter * 2 + 32 * 1024,
        "RSS kept growing: {quarter} KiB at a quarter, peak {peak} KiB"
    );

    assert_ledger_matches(&sim, &gw.admin_url(), &["alpha", "beta", "small"]).await;
    eprintln!("load: {total} requests {statuses:?}; RSS KiB quarter {quarter}, peak {peak}, last {last}");
}
