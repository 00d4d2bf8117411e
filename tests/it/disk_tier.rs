//! The disk tier (issue 37): what the embedded default bought outlives the
//! process. Real gateway binaries, stopped with SIGTERM or killed with
//! SIGKILL and started again on the same config and data volume, against
//! the simulator, whose request counter says whether anything was bought
//! again.

use crate::records::ids_of;
use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA};
use crate::support::prometheus::Exposition;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::volume::SmallVolume;
use crate::support::wait::eventually;
use http::StatusCode;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A config file for `setup` (JSON logs, so `ChildGateway` reads its
/// addresses), written where two processes in turn can start from it.
pub(crate) fn config_file(dir: &Path, setup: &Setup, sim: &Sim) -> PathBuf {
    let path = dir.join("gateway.toml");
    let text = ChildGateway::file_text(setup, &sim.base_url(), sim.api_key());
    std::fs::write(&path, text).expect("write config");
    path
}

/// The disk tier's file by default: `cache.redb` beside the ledger.
fn cache_file(setup: &Setup) -> PathBuf {
    setup.data_dir().join("cache.redb")
}

async fn metrics(admin: &str) -> Exposition {
    crate::support::probe::scrape(admin).await
}

/// Until every write the disk tier accepted is durable (what a SIGKILL
/// would otherwise lose: up to a second of them) and it holds `entries`.
pub(crate) async fn durable(admin: &str, entries: f64) {
    eventually(
        "the disk tier's writes are durable",
        Duration::from_secs(30),
        || async {
            let m = metrics(admin).await;
            let pending = m.get("gateway_cache_disk_pending_writes", &[]).unwrap_or(-1.0);
            let held = m.get("gateway_cache_entries", &[("tier", "disk")]).unwrap_or(0.0);
            (pending == 0.0 && held >= entries)
                .then_some(())
                .ok_or(format!("pending {pending}, entries {held}"))
        },
    )
    .await;
}

fn upstream_requests(sim: &Sim) -> u64 {
    sim.stats().requests_total
}

async fn purge(admin: &str, route: &str) {
    Client::admin(admin)
        .post(format!("/admin/cache/purge?route={route}"))
        .await
        .expect_status(StatusCode::OK);
}

/// A page and an id lookup bought, the process ended by `signal`, a new
/// one started on the same file: both answered HIT at 0 credits, the
/// simulator asked nothing more, the savings counted under `disk`.
async fn bought_before_a_restart_is_kept(signal: &str) {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new();
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_file(dir.path(), &setup, &sim);
    let s = sim.samples();
    let page = Query::state_permits(&s).size(5);
    // Three ids the page does not hold: the lookup buys them.
    let wider = Client::upstream(&sim).get(Query::state_permits(&s).size(8)).await;
    let more: Vec<String> = ids_of(&wider)[5..].to_vec();

    let mut gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let first = alpha.get(&page).await.expect_status(StatusCode::OK);
    assert_eq!((first.x_cache(), first.credits_request()), (Some("MISS"), Some(5)));
    let bought = alpha
        .get(Query::permits_by_id(&more))
        .await
        .expect_status(StatusCode::OK);
    assert_eq!((bought.x_cache(), bought.credits_request()), (Some("MISS"), Some(3)));
    // The page, its five records and three more.
    durable(&gw.admin_url(), 9.0).await;
    gw.signal(signal);
    gw.wait_exit(Duration::from_secs(30));
    let asked = upstream_requests(&sim);

    let gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let again = alpha.get(&page).await.expect_status(StatusCode::OK);
    assert_eq!((again.x_cache(), again.credits_request()), (Some("HIT"), Some(0)));
    assert_eq!(again.body, first.body, "the very bytes bought");
    // Two records the page filed and the three the lookup bought.
    let ids: Vec<String> = ids_of(&first)[..2].iter().chain(&more).cloned().collect();
    let lookup = alpha
        .get(Query::permits_by_id(&ids))
        .await
        .expect_status(StatusCode::OK);
    assert_eq!((lookup.x_cache(), lookup.credits_request()), (Some("HIT"), Some(0)));
    assert_eq!(ids_of(&lookup), ids);
    assert_eq!(upstream_requests(&sim), asked, "nothing bought again after {signal}");
    let m = metrics(&gw.admin_url()).await;
    let saved = |route| {
        m.sum(
            "gateway_credits_saved_total",
            &[("team", ALPHA.0), ("route", route), ("reason", "disk")],
        )
    };
    assert_eq!(saved("permits_search"), 5.0);
    assert_eq!(saved("permits_by_id"), 5.0);
    assert!(m.sum("gateway_cache_hits_total", &[("tier", "disk")]) >= 1.0);
    // Once promoted, memory answers.
    let m_before = m.sum("gateway_cache_hits_total", &[("tier", "memory")]);
    assert_eq!(alpha.get(&page).await.x_cache(), Some("HIT"));
    let m = metrics(&gw.admin_url()).await;
    assert_eq!(m.sum("gateway_cache_hits_total", &[("tier", "memory")]), m_before + 1.0);
}

#[tokio::test]
async fn answers_and_records_bought_before_a_sigterm_are_hits_after_it() {
    bought_before_a_restart_is_kept("TERM").await;
}

#[tokio::test]
async fn answers_and_records_bought_before_a_sigkill_are_hits_after_it() {
    bought_before_a_restart_is_kept("KILL").await;
}

/// Every place `needle` sits in `file`, changed: redb copies pages on
/// write, so an old copy may sit in a freed page beside the live one.
fn damage(file: &Path, needle: &[u8]) -> usize {
    let mut bytes = std::fs::read(file).expect("read the cache file");
    let mut found = 0;
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(needle.len()).position(|w| w == needle) {
        let i = at + i;
        bytes[i + needle.len() / 2] ^= 0x20;
        found += 1;
        at = i + needle.len();
    }
    std::fs::write(file, bytes).expect("write the cache file");
    found
}

#[tokio::test]
async fn a_damaged_entry_is_refused_and_bought_again() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().with(|c| c.cache.record_reuse = false);
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_file(dir.path(), &setup, &sim);
    let page = Query::state_permits(&sim.samples()).size(4);

    let mut gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let first = alpha.get(&page).await.expect_status(StatusCode::OK);
    durable(&gw.admin_url(), 1.0).await;
    gw.signal("TERM");
    gw.wait_exit(Duration::from_secs(30));
    // One byte inside the body, wherever it was written.
    let middle = first.body.len() / 2;
    let found = damage(&cache_file(&setup), &first.body[middle - 32..middle + 32]);
    assert!(found >= 1, "the body is in the file");
    let asked = upstream_requests(&sim);

    let gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let again = alpha.get(&page).await.expect_status(StatusCode::OK);
    assert_eq!((again.x_cache(), again.credits_request()), (Some("MISS"), Some(4)));
    assert_eq!(again.json(), first.json(), "bought again, not served damaged");
    assert_eq!(upstream_requests(&sim), asked + 1);
    let m = metrics(&gw.admin_url()).await;
    assert!(m.sum("gateway_cache_disk_drops_total", &[("reason", "corrupt")]) >= 1.0);
    // Found by the value's checksum, or by the file's check at open.
    let log = gw.log_text();
    assert!(
        log.contains("failed its checksum") || log.contains("moved aside"),
        "a log line says so"
    );
}

#[tokio::test]
async fn a_purge_empties_the_disk_tier_before_and_after_a_restart() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new();
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_file(dir.path(), &setup, &sim);
    let s = sim.samples();
    let (a, b) = (Query::state_permits(&s).size(3), Query::state_permits(&s).size(6));

    let mut gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    alpha.get(&a).await.expect_status(StatusCode::OK);
    durable(&gw.admin_url(), 1.0).await;
    purge(&gw.admin_url(), "permits_search").await;
    // Memory and disk both emptied: bought again.
    let after = alpha.get(&a).await;
    assert_eq!((after.x_cache(), after.credits_request()), (Some("MISS"), Some(3)));
    alpha.get(&b).await.expect_status(StatusCode::OK);
    durable(&gw.admin_url(), 2.0).await;
    purge(&gw.admin_url(), "permits_search").await;
    gw.signal("TERM");
    gw.wait_exit(Duration::from_secs(30));

    let gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let again = alpha.get(&b).await;
    assert_eq!(
        (again.x_cache(), again.credits_request()),
        (Some("MISS"), Some(6)),
        "purged before the restart"
    );
    let m = metrics(&gw.admin_url()).await;
    assert_eq!(m.sum("gateway_cache_hits_total", &[("tier", "disk")]), 0.0);
    // The records its pages filed went with it.
    let ids = ids_of(&again);
    let lookup = alpha.get(Query::permits_by_id(&ids[..2])).await;
    assert_eq!(lookup.x_cache(), Some("HIT"), "filed again by the page just bought");
    assert_eq!(m.sum("gateway_credits_saved_total", &[("reason", "disk")]), 0.0);
}

#[tokio::test]
async fn a_disk_too_small_for_an_answer_serves_from_memory() {
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().with(|c| c.cache.disk_max_bytes = 200).start(&sim).await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let page = Query::state_permits(&sim.samples()).size(3);
    assert_eq!(alpha.get(&page).await.x_cache(), Some("MISS"));
    let hit = alpha.get(&page).await.expect_status(StatusCode::OK);
    assert_eq!((hit.x_cache(), hit.credits_request()), (Some("HIT"), Some(0)));
    gw.app.cache.flush_disk().await;
    let m = metrics(&gw.admin_url()).await;
    assert!(m.sum("gateway_cache_disk_drops_total", &[("reason", "too_large")]) >= 1.0);
    assert_eq!(m.get("gateway_cache_disk_degraded", &[]), Some(0.0));
}

#[tokio::test]
async fn an_unwritable_disk_path_serves_from_memory() {
    let sim = start_sim(unlimited()).await;
    // Nothing can be created under /proc, not even by root.
    let gw = Setup::new()
        .with(|c| c.cache.disk_path = Some("/proc/permit-gateway-test/cache.redb".into()))
        .start(&sim)
        .await;
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let page = Query::state_permits(&sim.samples()).size(3);
    assert_eq!(alpha.get(&page).await.x_cache(), Some("MISS"));
    let hit = alpha.get(&page).await.expect_status(StatusCode::OK);
    assert_eq!((hit.x_cache(), hit.credits_request()), (Some("HIT"), Some(0)));
    let m = metrics(&gw.admin_url()).await;
    assert_eq!(m.get("gateway_cache_disk_degraded", &[]), Some(1.0));
}

/// A gateway with a few answers on disk, stopped: the file to damage.
async fn a_filled_file(sim: &Sim, config: &Path, setup: &Setup) -> Vec<Query> {
    let s = sim.samples();
    let pages: Vec<Query> = (2..8).map(|n| Query::state_permits(&s).size(n)).collect();
    let mut gw = ChildGateway::spawn_file(config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    for page in &pages {
        alpha.get(page).await.expect_status(StatusCode::OK);
    }
    durable(&gw.admin_url(), pages.len() as f64).await;
    gw.signal("TERM");
    gw.wait_exit(Duration::from_secs(30));
    assert!(cache_file(setup).exists());
    pages
}

/// Starts on the damaged file: every answer 200 and the upstream's own
/// (bought again where the file cannot say), no panic in the log, damage
/// that reached live pages moved aside or counted (`must_notice`); and the
/// next start serves again.
async fn serves_despite(sim: &Sim, config: &Path, setup: &Setup, pages: &[Query], must_notice: bool) {
    let gw = ChildGateway::spawn_file(config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    for page in pages {
        let r = alpha.get(page).await.expect_status(StatusCode::OK);
        assert_eq!(r.json(), Client::upstream(sim).get(page).await.json(), "{page}");
    }
    let aside = cache_file(setup).with_extension("redb.corrupt").exists();
    let counted = metrics(&gw.admin_url())
        .await
        .sum("gateway_cache_disk_drops_total", &[("reason", "corrupt")]);
    assert!(
        !must_notice || aside || counted >= 1.0,
        "the damage is moved aside or counted"
    );
    durable(&gw.admin_url(), 0.0).await;
    let log = gw.log_text();
    assert!(!log.contains("panicked"), "no panic in the log: {log}");
    drop(gw);
    let asked = upstream_requests(sim);
    let gw = ChildGateway::spawn_file(config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    for page in pages {
        alpha.get(page).await.expect_status(StatusCode::OK);
    }
    assert!(!gw.log_text().contains("panicked"));
    assert!(upstream_requests(sim) <= asked + pages.len() as u64);
}

#[tokio::test]
async fn a_disk_file_cut_in_half_never_stops_a_start_or_a_request() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new();
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_file(dir.path(), &setup, &sim);
    let pages = a_filled_file(&sim, &config, &setup).await;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(cache_file(&setup))
        .expect("open");
    let len = file.metadata().expect("len").len();
    file.set_len(len / 2).expect("cut");
    drop(file);
    serves_despite(&sim, &config, &setup, &pages, true).await;
}

#[tokio::test]
async fn a_disk_file_scribbled_on_never_stops_a_start_or_a_request() {
    use rand::{Rng, SeedableRng};
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new();
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_file(dir.path(), &setup, &sim);
    let pages = a_filled_file(&sim, &config, &setup).await;
    let path = cache_file(&setup);
    let mut bytes = std::fs::read(&path).expect("read");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let half = bytes.len() / 2;
    for _ in 0..8 {
        let at = rng.random_range(half..bytes.len().saturating_sub(4096).max(half + 1));
        let end = (at + 4096).min(bytes.len());
        rng.fill(&mut bytes[at..end]);
    }
    std::fs::write(&path, bytes).expect("scribble");
    // Blocks that hit no live page change nothing: nothing to notice then.
    serves_despite(&sim, &config, &setup, &pages, false).await;
}

#[tokio::test]
async fn a_file_that_is_no_database_is_moved_aside() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new();
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_file(dir.path(), &setup, &sim);
    std::fs::create_dir_all(setup.data_dir()).expect("data dir");
    std::fs::write(cache_file(&setup), b"not a redb database").expect("garbage");
    let gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    alpha
        .get(Query::state_permits(&sim.samples()).size(2))
        .await
        .expect_status(StatusCode::OK);
    assert!(
        cache_file(&setup).with_extension("redb.corrupt").exists(),
        "kept for inspection"
    );
    durable(&gw.admin_url(), 1.0).await;
    let m = metrics(&gw.admin_url()).await;
    assert_eq!(
        m.get("gateway_cache_disk_degraded", &[]),
        Some(0.0),
        "a fresh file serves"
    );
}

#[tokio::test]
async fn a_purge_answered_then_a_sigkill_never_brings_the_answer_back() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new();
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_file(dir.path(), &setup, &sim);
    let page = Query::state_permits(&sim.samples()).size(3);
    let mut gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    alpha.get(&page).await.expect_status(StatusCode::OK);
    durable(&gw.admin_url(), 1.0).await;
    // The purge's 200, then at once a SIGKILL: no later durable commit.
    purge(&gw.admin_url(), "permits_search").await;
    gw.signal("KILL");
    gw.wait_exit(Duration::from_secs(30));
    let gw = ChildGateway::spawn_file(&config, None);
    let again = Client::new(gw.base_url(), ALPHA.1).get(&page).await;
    assert_eq!(
        (again.x_cache(), again.credits_request()),
        (Some("MISS"), Some(3)),
        "the purged answer is bought again, not served from disk"
    );
}

#[tokio::test]
async fn the_disk_tier_leaves_the_ledger_its_room_and_no_metered_call_is_refused() {
    let sim = start_sim(unlimited()).await;
    // A reserve larger than any volume: the tier is always at it, as it
    // would be on a volume the misses filled.
    let setup = Setup::new().with(|c| c.cache.disk_reserve_bytes = u64::MAX / 2);
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_file(dir.path(), &setup, &sim);
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_permit-gateway"))
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .expect("check-config runs");
    let warned = String::from_utf8_lossy(&checked.stderr).to_string();
    assert!(
        warned.contains("cache.disk_max_bytes") && warned.contains("reserve"),
        "{warned}"
    );
    let gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let s = sim.samples();
    for n in 1..=6 {
        let r = alpha
            .get(Query::state_permits(&s).size(n))
            .request_id(&format!("alpha-{n}"))
            .await;
        assert_eq!(
            (r.status, r.credits_request()),
            (StatusCode::OK, Some(n)),
            "a metered miss is bought"
        );
    }
    crate::support::traffic::assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    eventually(
        "the writes are dropped for the reserve",
        Duration::from_secs(10),
        || async {
            let m = metrics(&gw.admin_url()).await;
            let dropped = m.sum("gateway_cache_disk_drops_total", &[("reason", "reserve")]);
            (dropped >= 6.0).then_some(()).ok_or(format!("dropped {dropped}"))
        },
    )
    .await;
    let m = metrics(&gw.admin_url()).await;
    assert_eq!(
        m.get("gateway_cache_entries", &[("tier", "disk")]),
        Some(0.0),
        "nothing written"
    );
    assert!(gw.log_text().contains("disk_reserve_bytes"), "the start-up says so");
}

/// The ledger and the disk tier on one small volume (a 32 MiB tmpfs):
/// distinct 100-record misses fill it until the tier stops at its reserve
/// (8 MiB here), and then go on: every metered call is bought and answered
/// 200, the ledger equals the bill, the volume keeps its reserve. Before
/// the reserve: 28 × 200 then 42 × 503 ("ledger commit failed: No space
/// left on device").
#[tokio::test]
async fn on_a_small_volume_the_cache_stops_at_its_reserve_and_no_metered_call_is_refused() {
    const RESERVE: u64 = 8 << 20;
    let Some(volume) = SmallVolume::mount(32 << 20) else {
        return;
    };
    let sim = start_sim(unlimited()).await;
    let ledger = volume.path().join("ledger");
    let setup = Setup::new().with(move |c| {
        c.quota.path = ledger.clone();
        c.cache.disk_reserve_bytes = RESERVE;
        c.cache.memory_max_bytes = 8 << 20;
    });
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_file(dir.path(), &setup, &sim);
    let gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let s = sim.samples();
    let reserve_reached = || async {
        let m = metrics(&gw.admin_url()).await;
        m.sum("gateway_cache_disk_drops_total", &[("reason", "reserve")]) > 0.0
    };
    let (mut misses, mut after) = (0u32, 0u32);
    while after < 20 {
        assert!(
            misses < 2000,
            "the reserve was never reached: {} bytes free",
            volume.free()
        );
        let r = alpha
            .get(Query::distinct(&s, misses).size(100))
            .request_id(&format!("alpha-{misses}"))
            .await;
        assert_eq!(r.status, StatusCode::OK, "miss {misses}: {}", r.text());
        misses += 1;
        if after > 0 || reserve_reached().await {
            after += 1;
        }
    }
    crate::support::traffic::assert_ledger_matches(&sim, &gw.admin_url(), &["alpha"]).await;
    let free = volume.free();
    eprintln!(
        "a 32 MiB volume: {misses} misses answered 200, {after} of them after the tier reached its reserve; {free} bytes free"
    );
    assert!(free >= RESERVE / 2, "the ledger's room is kept: {free} bytes free");
}

/// A purge on a volume filled to the last block: the disk tier cannot
/// commit it, so it moves its file aside (or commits it in pages it
/// already had); either way the answer is 200 and says which, and after a
/// SIGKILL and a restart (room made again) the purged answer is bought
/// again, never served from disk. Before: answered 200, logged, and undone
/// by the restart.
#[tokio::test]
async fn a_purge_on_a_full_volume_is_not_undone_by_a_restart() {
    let Some(volume) = SmallVolume::mount(16 << 20) else {
        return;
    };
    let sim = start_sim(unlimited()).await;
    let ledger = volume.path().join("ledger");
    let setup = Setup::new().with(move |c| {
        c.quota.path = ledger.clone();
        c.cache.disk_reserve_bytes = 0;
    });
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_file(dir.path(), &setup, &sim);
    let page = Query::state_permits(&sim.samples()).size(3);
    let mut gw = ChildGateway::spawn_file(&config, None);
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    alpha.get(&page).await.expect_status(StatusCode::OK);
    durable(&gw.admin_url(), 1.0).await;
    let filler = volume.fill();
    let purged = Client::admin(gw.admin_url())
        .post("/admin/cache/purge?route=permits_search")
        .await;
    assert_eq!(purged.status, StatusCode::OK, "{}", purged.text());
    let disk = purged.json()["disk"].as_str().map(str::to_string);
    assert!(
        matches!(disk.as_deref(), Some("moved_aside" | "purged")),
        "{}",
        purged.text()
    );
    eprintln!("a purge on a full volume: the disk tier answered {disk:?}");
    gw.signal("KILL");
    gw.wait_exit(Duration::from_secs(30));
    std::fs::remove_file(filler).expect("room again");
    let gw = ChildGateway::spawn_file(&config, None);
    let again = Client::new(gw.base_url(), ALPHA.1).get(&page).await;
    assert_eq!(
        (again.x_cache(), again.credits_request()),
        (Some("MISS"), Some(3)),
        "the purged answer is bought again, not served from disk"
    );
}
