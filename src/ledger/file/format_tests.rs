//! The file ledger's format: a file of 0.1.0 is brought up, a release of
//! that format reads only the teams of a file this one wrote, and a newer
//! format is refused before anything is written.

use super::*;
use crate::ledger::{app_account, Budget, ORG_ACCOUNT};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

/// The tables as 0.1.0 declared them (df0013b, `ledger/file/disk.rs`): what
/// a release of format 1 reads.
const OLD_SPEND: TableDefinition<(&str, u32, &str), (u64, u64)> = TableDefinition::new("spend");
const OLD_HELD: TableDefinition<u64, (&str, u64, u32)> = TableDefinition::new("held");
const META: TableDefinition<&str, &str> = TableDefinition::new("meta");

fn ledger(dir: &Path) -> Result<FileLedger, String> {
    FileLedger::open_at(dir, Window::Rolling30d, Duration::from_secs(60), Clock::default())
}

/// Writes to `dir`'s `ledger.redb` as another release would, in one
/// transaction.
#[expect(
    clippy::disallowed_methods,
    reason = "a test writing the file as another release did"
)]
fn write_as_another_release(dir: &Path, f: impl FnOnce(&redb::WriteTransaction)) {
    let db = redb::Database::create(dir.join("ledger.redb")).expect("creates");
    let txn = db.begin_write().expect("writes");
    f(&txn);
    txn.commit().expect("commits");
}

/// What a release of format 1 reads: `spend`'s credits by account, and the
/// accounts of `held`.
fn as_a_format_1_release_reads(dir: &Path) -> (BTreeMap<String, u64>, Vec<String>) {
    let db = redb::Database::open(dir.join("ledger.redb")).expect("opens");
    let read = db.begin_read().expect("reads");
    let mut spend = BTreeMap::new();
    for item in read.open_table(OLD_SPEND).expect("spend").iter().expect("iter") {
        let (k, v) = item.expect("row");
        *spend.entry(k.value().0.to_string()).or_default() += v.value().0;
    }
    let held = read
        .open_table(OLD_HELD)
        .expect("held")
        .iter()
        .expect("iter")
        .map(|item| item.expect("row").1.value().0.to_string())
        .collect();
    (spend, held)
}

#[tokio::test]
async fn a_file_of_0_1_0_with_internal_accounts_is_brought_up_and_reads_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    let web = app_account("t", "web");
    write_as_another_release(dir.path(), |txn| {
        let mut spend = txn.open_table(OLD_SPEND).unwrap();
        spend.insert(("t", today, "permits_search"), (10, 2)).unwrap();
        spend.insert((ORG_ACCOUNT, today, "permits_search"), (10, 0)).unwrap();
        spend.insert((web.as_str(), today, "permits_search"), (4, 1)).unwrap();
        let mut held = txn.open_table(OLD_HELD).unwrap();
        held.insert(7, ("t", 5, today)).unwrap();
        held.insert(8, (ORG_ACCOUNT, 5, today)).unwrap();
    });
    let l = ledger(dir.path()).expect("a file of format 1 opens");
    // The holds a dead process left count, each in its own account.
    assert_eq!(l.usage("t", today).used, 15);
    assert_eq!(l.usage(ORG_ACCOUNT, today).used, 15);
    assert_eq!(l.usage(&web, today).used, 4);
    let rows = l.rows(today, today).await;
    assert_eq!(rows.iter().map(|r| r.saved).sum::<u64>(), 3, "{rows:?}");
    drop(l);
    let (spend, held) = as_a_format_1_release_reads(dir.path());
    assert_eq!(
        spend,
        BTreeMap::from([("t".to_string(), 15)]),
        "only the team is left where 0.1.0 reads"
    );
    assert!(held.is_empty(), "{held:?}");
    assert_eq!(
        ledger(dir.path()).expect("opens again").usage(ORG_ACCOUNT, today).used,
        15
    );
}

#[tokio::test]
async fn a_release_of_format_1_reads_only_the_teams_of_a_file_this_one_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    let web = app_account("t", "web");
    // Through `Ledger`, which settles a reservation's linked holds too.
    let l = crate::ledger::Ledger::File(ledger(dir.path()).expect("opens"));
    let budgets = [
        Budget {
            account: &web,
            limit: Some(100),
        },
        Budget {
            account: "t",
            limit: Some(100),
        },
        Budget {
            account: ORG_ACCOUNT,
            limit: None,
        },
    ];
    let settled = l.reserve_all(&budgets, 20).await.unwrap().expect("granted");
    l.settle(settled, 17, Route::PermitsSearch).await.expect("settle");
    // One call in flight when the process "dies".
    std::mem::forget(l.reserve_all(&budgets, 6).await.unwrap().expect("granted"));
    l.check().await.expect("every write committed");
    let image = tempfile::tempdir().unwrap();
    std::fs::copy(dir.path().join("ledger.redb"), image.path().join("ledger.redb")).unwrap();
    let (spend, held) = as_a_format_1_release_reads(image.path());
    assert_eq!(
        spend,
        BTreeMap::from([("t".to_string(), 17)]),
        "no internal account as a team"
    );
    assert_eq!(held, ["t"], "its recovery would count the team's hold only");
    let after = ledger(image.path()).expect("this release reads it back");
    for account in [web.as_str(), "t", ORG_ACCOUNT] {
        assert_eq!(after.usage(account, today).used, 23, "{account}");
    }
}

#[tokio::test]
async fn a_file_of_a_newer_format_is_refused_in_one_line_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    drop(ledger(dir.path()).expect("opens"));
    write_as_another_release(dir.path(), |txn| {
        let mut meta = txn.open_table(META).unwrap();
        meta.insert("format", "3").unwrap();
        meta.insert("since", "0.9.0").unwrap();
        let mut spend = txn.open_table(OLD_SPEND).unwrap();
        spend.insert(("t", today, "permits_search"), (10, 0)).unwrap();
        spend.insert((ORG_ACCOUNT, today, "permits_search"), (10, 0)).unwrap();
    });
    let err = ledger(dir.path()).err().expect("refused");
    assert!(
        err.contains("ledger format 3") && err.contains("run permit-gateway 0.9.0 or later") && !err.contains('\n'),
        "{err}"
    );
    let (spend, _) = as_a_format_1_release_reads(dir.path());
    assert_eq!(spend.get(ORG_ACCOUNT), Some(&10), "nothing moved");
    let db = redb::Database::open(dir.path().join("ledger.redb")).expect("opens");
    let read = db.begin_read().unwrap();
    assert_eq!(
        read.open_table(META).unwrap().get("format").unwrap().unwrap().value(),
        "3"
    );
}

/// Issue 59: a file the releases before the company's account wrote
/// (teams only) gives that account the teams' spend already in the window
/// at the first start, once; spend before the window stays out.
#[tokio::test]
async fn the_company_account_starts_from_the_teams_spend_in_the_window_once() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    write_as_another_release(dir.path(), |txn| {
        let mut spend = txn.open_table(OLD_SPEND).unwrap();
        spend.insert(("a", today, "permits_search"), (10, 0)).unwrap();
        spend.insert(("a", today - 3, "counties"), (5, 0)).unwrap();
        spend.insert(("a", today - 40, "counties"), (7, 0)).unwrap();
        spend.insert(("b", today, "permits_search"), (20, 4)).unwrap();
        // A hold a dead 0.1.0 left: spend of today once recovered.
        txn.open_table(OLD_HELD).unwrap().insert(9, ("b", 5, today)).unwrap();
    });
    let l = crate::ledger::Ledger::File(ledger(dir.path()).expect("opens"));
    assert_eq!(l.usage(ORG_ACCOUNT).await.unwrap().used, 40, "10 + 5 + 20 + 5");
    assert_eq!(l.usage("a").await.unwrap().used, 15);
    let budgets = [
        Budget {
            account: "a",
            limit: None,
        },
        Budget {
            account: ORG_ACCOUNT,
            limit: Some(45),
        },
    ];
    let refused = l.reserve_all(&budgets, 6).await.unwrap();
    assert_eq!(
        refused.map(|_| ()).map_err(|r| (r.budget, r.used)),
        Err((1, 40)),
        "the cap counts the spend before the upgrade"
    );
    let r = l.reserve_all(&budgets, 3).await.unwrap().expect("3 fit");
    l.settle(r, 3, crate::route::Route::Counties).await.unwrap();
    drop(l);
    let again = ledger(dir.path()).expect("opens again");
    assert_eq!(again.usage(ORG_ACCOUNT, today).used, 43, "seeded once, not again");
    let rows = again.rows(today - 40, today).await;
    let org_rows: u64 = rows.iter().filter(|r| r.team == ORG_ACCOUNT).map(|r| r.spent).sum();
    assert_eq!(org_rows, 43, "route by route: {rows:?}");
}

/// A company account that already holds spend in the window is left as
/// it is: its spend is its own.
#[tokio::test]
async fn a_company_account_with_spend_of_its_own_is_not_seeded() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    write_as_another_release(dir.path(), |txn| {
        let mut spend = txn.open_table(OLD_SPEND).unwrap();
        spend.insert(("a", today, "permits_search"), (10, 0)).unwrap();
        spend
            .insert((ORG_ACCOUNT, today - 1, "permits_search"), (3, 0))
            .unwrap();
    });
    let l = ledger(dir.path()).expect("opens");
    assert_eq!(l.usage(ORG_ACCOUNT, today).used, 3);
}
