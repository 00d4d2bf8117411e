//! The file ledger's one file, `ledger.redb`, damaged at rest: the gateway
//! that charged credits into it refuses to start on it, with a message
//! naming the file and what to do, and exits non-zero; it never reads a
//! damaged file as less spend. And the hold log of the releases before
//! issue 35 (`holds.log`), left beside it, stops the start until the
//! operator folds it with a clean stop of that release.

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, SMALL};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::traffic::charged_to;
use http::StatusCode;
use std::path::PathBuf;
use std::time::Duration;

/// A gateway that charged `SMALL` for three misses and was stopped cleanly
/// (SIGTERM): its setup, the ledger file and what it charged.
async fn charged_then_stopped(sim: &Sim) -> (Setup, PathBuf, u64) {
    let setup = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 1000);
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let small = Client::new(gw.base_url(), SMALL.1);
    let s = sim.samples();
    for i in 0..3 {
        small
            .get(Query::distinct(&s, i).size(6))
            .request_id(&format!("small-{i}"))
            .await
            .expect_status(StatusCode::OK);
    }
    let charged = charged_to(sim, "small-");
    assert_eq!(small.used().await, charged);
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(20)).success());
    let file = setup.data_dir().join("ledger").join("ledger.redb");
    assert!(file.is_file(), "{}", file.display());
    (setup, file, charged)
}

fn assert_refused_as_damaged(setup: &Setup, sim: &Sim, what: &str) {
    let (status, logs) = ChildGateway::refused(setup, &sim.base_url(), sim.api_key(), None);
    assert!(!status.success(), "{what}: exits non-zero ({status}): {logs}");
    for words in [
        "cannot start",
        "ledger.redb",
        "is damaged",
        "refusing to start",
        "restore",
        "backup",
    ] {
        assert!(logs.contains(words), "{what}: the message says {words:?}: {logs}");
    }
}

#[tokio::test]
async fn a_damaged_ledger_file_stops_the_start_with_what_to_do() {
    let sim = start_sim(unlimited()).await;
    let (setup, file, charged) = charged_then_stopped(&sim).await;
    let whole = std::fs::read(&file).expect("ledger");

    // Bytes flipped where the team's spend rows are: every page that
    // names the team (the live rows and the older copies beside them).
    let mut flipped = whole.clone();
    let name = SMALL.0.as_bytes();
    let places: Vec<usize> = (0..whole.len() - name.len())
        .filter(|i| &whole[*i..*i + name.len()] == name)
        .collect();
    assert!(!places.is_empty(), "the rows name the team");
    for at in &places {
        flipped[at + 1] ^= 0x20;
    }
    std::fs::write(&file, &flipped).expect("write");
    assert_refused_as_damaged(&setup, &sim, "bytes flipped in the rows");

    // One byte of redb's header: the commit slots it starts from.
    let mut header = whole.clone();
    for at in [72, 200] {
        header[at] ^= 0xff;
    }
    std::fs::write(&file, &header).expect("write");
    assert_refused_as_damaged(&setup, &sim, "the header's commit slots flipped");

    // Cut: a copy that stopped half way, or a disk that filled.
    std::fs::write(&file, &whole[..whole.len() / 2]).expect("write");
    assert_refused_as_damaged(&setup, &sim, "the file cut in half");
    assert_refused_as_damaged(&setup, &sim, "the same cut file, a second start");
    std::fs::write(&file, b"").expect("write");
    assert_refused_as_damaged(&setup, &sim, "the file cut to nothing");

    // The file as the clean stop left it: the spend is all there.
    std::fs::write(&file, &whole).expect("write");
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    assert_eq!(Client::new(gw.base_url(), SMALL.1).used().await, charged);
}

#[tokio::test]
async fn a_leftover_hold_log_stops_the_start_until_it_is_folded() {
    let sim = start_sim(unlimited()).await;
    let (setup, file, charged) = charged_then_stopped(&sim).await;
    let log = file.with_file_name("holds.log");
    // What the release before issue 35 leaves: a header and records.
    let mut old = b"PGHOLDS1".to_vec();
    old.resize(1 << 20, 0);
    std::fs::write(&log, &old).expect("write");
    let (status, logs) = ChildGateway::refused(&setup, &sim.base_url(), sim.api_key(), None);
    assert!(!status.success(), "exits non-zero ({status}): {logs}");
    for words in [
        "holds.log",
        "earlier permit-gateway release",
        "stop it cleanly",
        "SIGTERM",
        "then remove",
    ] {
        assert!(logs.contains(words), "the message says {words:?}: {logs}");
    }
    assert!(log.is_file(), "the old log is left for the operator");
    // The operator stopped that release cleanly (it folded the log), then
    // removed it.
    std::fs::remove_file(&log).expect("remove");
    let gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    assert_eq!(Client::new(gw.base_url(), SMALL.1).used().await, charged);
}
