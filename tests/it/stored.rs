//! Stored formats and the file ledger's online backup (issue 59). Every
//! file and key set the gateway keeps records its format: a newer one
//! stops the start of a release that cannot read it, in one line naming
//! the release to run (the money: the Redis ledger, the settle journal),
//! or is left alone unused (the cache's disk tier: a cache never stops a
//! start). `GET /admin/ledger/backup` copies the file ledger while it
//! runs: restored, it holds what was spent when it was taken.

use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA, SMALL};
use crate::support::query::Query;
use crate::support::redis::RedisServer;
use crate::support::sim::{start_sim, unlimited, Sim};
use http::StatusCode;
use std::path::Path;
use std::time::Duration;

/// Records in the redb file `file`, table `table`, the format `format`
/// first written by `since`, as a later release would.
#[expect(
    clippy::disallowed_methods,
    reason = "the test writes the file as a later release would"
)]
fn record_format(file: &Path, table: &str, format: &str, since: &str) {
    let def: redb::TableDefinition<&str, &str> = redb::TableDefinition::new(table);
    let db = redb::Database::open(file).expect("opens");
    let txn = db.begin_write().expect("writes");
    {
        let mut t = txn.open_table(def).expect("table");
        t.insert("format", format).expect("insert");
        t.insert("since", since).expect("insert");
    }
    txn.commit().expect("commits");
}

/// The format `file` records in `table`.
fn recorded(file: &Path, table: &str) -> Option<String> {
    use redb::ReadableDatabase;
    let def: redb::TableDefinition<&str, &str> = redb::TableDefinition::new(table);
    let db = redb::Database::open(file).expect("opens");
    let read = db.begin_read().expect("reads");
    let t = read.open_table(def).ok()?;
    let format = t.get("format").expect("get")?.value().to_string();
    Some(format)
}

/// One miss of `team` (distinct by `i`), answered 200.
async fn miss(gw: &str, sim: &Sim, token: &str, i: u32) {
    Client::new(gw, token)
        .get(Query::distinct(&sim.samples(), i).size(5))
        .await
        .expect_status(StatusCode::OK);
}

/// The one log line that says `words`, and that it says `what` too.
fn one_line_saying(logs: &str, words: &str, what: &[&str]) {
    let said: Vec<&str> = logs.lines().filter(|l| l.contains(words)).collect();
    assert_eq!(said.len(), 1, "one line says {words:?}: {logs}");
    for w in what {
        assert!(said[0].contains(w), "the line says {w:?}: {}", said[0]);
    }
}

#[tokio::test]
async fn a_backup_taken_while_the_gateway_spends_restores_what_was_spent_when_it_was_taken() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 100_000);
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let small = Client::new(gw.base_url(), SMALL.1);
    for i in 0..3 {
        miss(&gw.base_url(), &sim, SMALL.1, i).await;
    }
    let spent_then = small.used().await;
    assert_eq!(spent_then, sim.stats().credits_total, "the ledger is the bill");
    assert!(spent_then > 0);
    let admin = Client::admin(gw.admin_url());
    let quiet = admin.get("/admin/ledger/backup").await.expect_status(StatusCode::OK);
    assert_eq!(quiet.header("content-type"), Some("application/octet-stream"));

    // Another taken while misses are being bought and settled.
    let busy = {
        let (base, s) = (gw.base_url(), sim.samples());
        tokio::spawn(async move {
            for i in 10..20 {
                Client::new(&base, SMALL.1)
                    .get(Query::distinct(&s, i).size(5))
                    .await
                    .expect_status(StatusCode::OK);
            }
        })
    };
    let during = admin.get("/admin/ledger/backup").await.expect_status(StatusCode::OK);
    busy.await.expect("the misses");
    let spent_after = small.used().await;
    assert_eq!(spent_after, sim.stats().credits_total, "the ledger is the bill");
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(20)).success());
    let left: Vec<String> = std::fs::read_dir(setup.data_dir().join("ledger"))
        .expect("the ledger's folder")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["ledger.redb"], "no copy is left beside the ledger");

    // Each backup restored on a new volume: the spend when it was taken.
    for (backup, low, high) in [(&quiet, spent_then, spent_then), (&during, spent_then, spent_after)] {
        let restored = Setup::new().teams(&[SMALL]).credit_limit(SMALL, 100_000);
        let dir = restored.data_dir().join("ledger");
        std::fs::create_dir_all(&dir).expect("folder");
        std::fs::write(dir.join("ledger.redb"), &backup.body).expect("restore");
        assert_eq!(
            recorded(&dir.join("ledger.redb"), "meta").as_deref(),
            Some("2"),
            "its format"
        );
        let gw = ChildGateway::spawn(&restored, &sim.base_url(), sim.api_key());
        let used = Client::new(gw.base_url(), SMALL.1).used().await;
        assert!(
            (low..=high).contains(&used),
            "restored: {used}, spent when taken between {low} and {high}"
        );
        gw.assert_logs_clean();
    }
}

#[tokio::test]
async fn the_redis_ledger_is_not_backed_up_by_the_gateway() {
    let sim = start_sim(unlimited()).await;
    let redis = RedisServer::start();
    let gw = Setup::new().ledger_redis(&redis.url()).start(&sim).await;
    let r = Client::admin(gw.admin_url()).get("/admin/ledger/backup").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(r.text().contains("Redis's persistence"), "{}", r.text());
    let r = Client::admin(gw.admin_url()).get("/admin/ledger/backup?to=x").await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
}

#[tokio::test]
async fn a_disk_tier_of_a_newer_format_is_left_as_it_is_and_the_gateway_serves_from_memory() {
    let sim = start_sim(unlimited()).await;
    let setup = Setup::new();
    let file = setup.data_dir().join("cache.redb");
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    miss(&gw.base_url(), &sim, ALPHA.1, 1).await;
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(20)).success());
    assert_eq!(
        recorded(&file, "format").as_deref(),
        Some("1"),
        "recorded at its first start"
    );

    record_format(&file, "format", "3", "0.9.1");
    let calls = sim.stats().requests_total;
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    let again = Client::new(gw.base_url(), ALPHA.1)
        .get(Query::distinct(&sim.samples(), 1).size(5))
        .await
        .expect_status(StatusCode::OK);
    assert_eq!(again.x_cache(), Some("MISS"), "not read from the newer file");
    assert_eq!(sim.stats().requests_total, calls + 1);
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(20)).success());
    one_line_saying(
        &gw.log_text(),
        "disk tier format 3",
        &["cache.redb", "run permit-gateway 0.9.1 or later"],
    );
    assert_eq!(recorded(&file, "format").as_deref(), Some("3"), "left as it was");
}

#[tokio::test]
async fn a_settle_journal_or_a_redis_ledger_of_a_newer_format_stops_the_start_in_one_line() {
    let sim = start_sim(unlimited()).await;
    let redis = RedisServer::start();
    let setup = Setup::new().ledger_redis(&redis.url());
    let mut gw = ChildGateway::spawn(&setup, &sim.base_url(), sim.api_key());
    miss(&gw.base_url(), &sim, ALPHA.1, 1).await;
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(20)).success());
    let journal = setup.data_dir().join("settles.redb");
    assert_eq!(
        recorded(&journal, "format").as_deref(),
        Some("1"),
        "recorded at its first start"
    );
    let hget = |field: &str| -> Option<String> {
        let client = redis::Client::open(redis.url()).expect("url");
        let mut c = client.get_connection().expect("connects");
        redis::cmd("HGET")
            .arg("pgw:l:format")
            .arg(field)
            .query(&mut c)
            .expect("HGET")
    };
    assert_eq!(hget("format").as_deref(), Some("1"), "the Redis ledger's, recorded");

    record_format(&journal, "format", "2", "0.7.0");
    let (status, logs) = ChildGateway::refused(&setup, &sim.base_url(), sim.api_key(), None);
    assert!(!status.success(), "exits non-zero ({status}): {logs}");
    one_line_saying(
        &logs,
        "settle journal format 2",
        &["cannot start", "settles.redb", "run permit-gateway 0.7.0 or later"],
    );
    assert_eq!(recorded(&journal, "format").as_deref(), Some("2"), "left as it was");

    record_format(&journal, "format", "1", "0.1.0");
    {
        let client = redis::Client::open(redis.url()).expect("url");
        let mut c = client.get_connection().expect("connects");
        let _: () = redis::cmd("HSET")
            .arg("pgw:l:format")
            .arg("format")
            .arg("7")
            .arg("since")
            .arg("1.2.3")
            .query(&mut c)
            .expect("HSET");
    }
    let (status, logs) = ChildGateway::refused(&setup, &sim.base_url(), sim.api_key(), None);
    assert!(!status.success(), "exits non-zero ({status}): {logs}");
    one_line_saying(
        &logs,
        "ledger format 7",
        &["cannot start", "pgw:l:format", "run permit-gateway 1.2.3 or later"],
    );
    assert_eq!(hget("format").as_deref(), Some("7"), "left as it was");
}
