//! The file ledger's one file, `ledger.redb`, damaged at rest: the gateway
//! that charged credits into it refuses to start on it, with a message
//! naming the file and what to do, and exits non-zero; it never reads a
//! damaged file as less spend. And the hold log of the releases before
//! issue 35 (`holds.log`), left beside it, stops the start until the
//! operator folds it with a clean stop of that release. A file this release
//! wrote shows a release of the format before (0.1.0) only the teams'
//! spend, and a file of a newer format stops the start in one line
//! naming the release to run (issue 59).

use crate::support::client::Client;
use crate::support::gateway::{app_token, ChildGateway, Setup, ALPHA, BETA, SMALL, WEB};
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, Sim};
use crate::support::traffic::charged_to;
use http::StatusCode;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

/// The spend table as 0.1.0 declared it (df0013b): what a release of
/// ledger format 1 reads as its teams' spend.
const SPEND_OF_0_1_0: redb::TableDefinition<(&str, u32, &str), (u64, u64)> = redb::TableDefinition::new("spend");

/// What a release of format 1 reads of `file`: credits spent by account.
fn as_0_1_0_reads(file: &Path) -> BTreeMap<String, u64> {
    use redb::{ReadableDatabase, ReadableTable};
    let db = redb::Database::open(file).expect("opens");
    let read = db.begin_read().expect("reads");
    let mut spent = BTreeMap::new();
    for item in read.open_table(SPEND_OF_0_1_0).expect("spend").iter().expect("iter") {
        let (k, v) = item.expect("row");
        *spent.entry(k.value().0.to_string()).or_default() += v.value().0;
    }
    spent
}

/// Records in `file` the format `format`, first written by `since`, as a
/// later release would.
#[expect(
    clippy::disallowed_methods,
    reason = "the test writes the file as a later release would"
)]
fn record_format(file: &Path, format: &str, since: &str) {
    let meta: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("meta");
    let db = redb::Database::open(file).expect("opens");
    let txn = db.begin_write().expect("writes");
    {
        let mut table = txn.open_table(meta).expect("meta");
        table.insert("format", format).expect("insert");
        table.insert("since", since).expect("insert");
    }
    txn.commit().expect("commits");
}

#[tokio::test]
async fn a_ledger_of_this_release_shows_an_older_one_only_teams_and_a_newer_format_stops_the_start() {
    let sim = start_sim(unlimited()).await;
    // Spend in every kind of account: a team's, an app's, the company's.
    let setup = Setup::new()
        .team(ALPHA, |t| t.tokens = vec![app_token(WEB)])
        .with(|c| c.quota.org_credit_limit = Some(1000));
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let s = sim.samples();
    for (i, (team, token)) in [(ALPHA, WEB), (ALPHA, ALPHA), (BETA, BETA)].into_iter().enumerate() {
        Client::new(gw.base_url(), token.1)
            .get(Query::distinct(&s, i as u32).size(4 + i as u32))
            .request_id(&format!("{}-{i}", team.0))
            .await
            .expect_status(StatusCode::OK);
    }
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(20)).success());
    let file = setup.data_dir().join("ledger").join("ledger.redb");
    let billed = BTreeMap::from([
        (ALPHA.0.to_string(), charged_to(&sim, "alpha-")),
        (BETA.0.to_string(), charged_to(&sim, "beta-")),
    ]);
    assert_eq!(
        as_0_1_0_reads(&file),
        billed,
        "0.1.0 on this file: its teams and their spend, no `*org` or `alpha/web`"
    );
    record_format(&file, "99", "9.9.9");
    let (status, logs) = ChildGateway::refused(&setup, &sim.base_url(), sim.api_key(), None);
    assert!(!status.success(), "exits non-zero ({status}): {logs}");
    let said: Vec<&str> = logs.lines().filter(|l| l.contains("ledger format")).collect();
    assert_eq!(said.len(), 1, "one line: {logs}");
    for words in [
        "cannot start",
        "ledger.redb",
        "ledger format 99",
        "run permit-gateway 9.9.9 or later",
    ] {
        assert!(said[0].contains(words), "the line says {words:?}: {logs}");
    }
    assert_eq!(as_0_1_0_reads(&file), billed, "the refused start wrote nothing");
}
