//! The file ledger: reserve, settle, release, restarts and lapses.

use super::*;
use crate::ledger::{Reservation, Reserved, Window, UNSETTLED};

fn ledger(dir: &Path) -> FileLedger {
    FileLedger::open_at(dir, Window::Rolling30d, Duration::from_secs(60), Clock::default()).expect("opens")
}

async fn granted(l: &FileLedger, limit: u64, amount: u64, today: u32) -> Reservation {
    match l.reserve("t", Some(limit), amount, today).await.expect("reserve") {
        Reserved::Granted(r) => r,
        other => panic!("not granted: {other:?}"),
    }
}

#[tokio::test]
async fn reserve_settle_release_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    {
        let l = ledger(dir.path());
        let a = granted(&l, 100, 60, today).await;
        assert_eq!(
            l.reserve("t", Some(100), 50, today).await.unwrap(),
            Reserved::Rejected { used: 60, limit: 100 }
        );
        l.settle(a, 10, Route::PermitsSearch, today).await.expect("settle");
        let b = granted(&l, 100, 90, today).await;
        l.release(b);
        assert_eq!(l.usage("t", today).used, 10);
        l.record_saved("t", Route::PermitsSearch, 5, today);
    }
    let l = ledger(dir.path());
    assert_eq!(
        l.usage("t", today).used,
        10,
        "spend survives a restart; a release is no spend"
    );
    assert_eq!(l.usage("t", today + 30).used, 0, "and leaves the rolling window");
    let rows = l.rows(today, today).await;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].spent, rows[0].saved), (10, 5));
}

#[tokio::test]
async fn a_reservation_left_by_a_dead_process_counts_as_spent_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    {
        let l = ledger(dir.path());
        let settled = granted(&l, 100, 30, today).await;
        l.settle(settled, 25, Route::PermitsSearch, today)
            .await
            .expect("settle");
        // Never settled: the process "dies" with it in flight.
        std::mem::forget(granted(&l, 100, 40, today).await);
    }
    let l = ledger(dir.path());
    assert_eq!(l.usage("t", today).used, 65, "25 settled + 40 worst case");
    let unsettled: u64 = l
        .rows(today, today)
        .await
        .iter()
        .filter(|r| r.route == UNSETTLED)
        .map(|r| r.spent)
        .sum();
    assert_eq!(unsettled, 40);
    drop(l);
    assert_eq!(
        ledger(dir.path()).usage("t", today).used,
        65,
        "converted once, not again"
    );
}

#[tokio::test]
async fn lapsed_reservations_count_as_spent_once() {
    let dir = tempfile::tempdir().unwrap();
    let l = FileLedger::open_at(dir.path(), Window::Rolling30d, Duration::ZERO, Clock::default()).expect("opens");
    let today = crate::ledger::today();
    let first = granted(&l, 10, 6, today).await;
    assert!(
        matches!(
            l.reserve("t", Some(10), 6, today).await.unwrap(),
            Reserved::Rejected { used: 6, .. }
        ),
        "the lapsed reservation is spent, not given back"
    );
    l.settle(first, 2, Route::PermitsSearch, today).await.expect("settle");
    assert_eq!(
        l.usage("t", today).used,
        6,
        "a settle after the lapse does not count twice"
    );
}

#[tokio::test]
async fn a_free_call_charged_after_all_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    {
        let l = ledger(dir.path());
        let free = granted(&l, 100, 0, today).await;
        l.settle(free, 3, Route::MetaRelease, today).await.expect("settle");
        assert_eq!(l.usage("t", today).used, 3);
    }
    assert_eq!(ledger(dir.path()).usage("t", today).used, 3, "on disk too");
}

#[tokio::test]
async fn lapsed_spend_is_booked_on_the_day_it_becomes_spend() {
    let dir = tempfile::tempdir().unwrap();
    let l = FileLedger::open_at(dir.path(), Window::CalendarMonth, Duration::ZERO, Clock::default()).expect("opens");
    // Reserved on the last day of a month, lapsed on the first of the next.
    let last = crate::ledger::day_of(chrono::NaiveDate::from_ymd_opt(2026, 11, 30).unwrap());
    let first = last + 1;
    let late = granted(&l, 100, 40, last).await;
    assert!(matches!(
        l.reserve("t", Some(100), 61, first).await.unwrap(),
        Reserved::Rejected { used: 40, .. }
    ));
    assert_eq!(l.usage("t", first).used, 40, "in the month it was spent in");
    assert_eq!(l.usage("t", last).used, 0, "not in the month that closed");
    // A settle after the lapse that charges more adds the excess, once.
    l.settle(late, 45, Route::PermitsSearch, first).await.expect("settle");
    assert_eq!(l.usage("t", first).used, 45);
    drop(l);
    let l = FileLedger::open_at(dir.path(), Window::CalendarMonth, Duration::ZERO, Clock::default()).expect("reopens");
    assert_eq!(l.usage("t", first).used, 45, "durable");
}

#[tokio::test]
async fn a_hold_left_by_a_crash_counts_on_the_day_of_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    {
        let l = ledger(dir.path());
        std::mem::forget(granted(&l, 100, 40, today - 1).await);
    }
    let l = ledger(dir.path());
    let rows = l.rows(today - 1, today).await;
    assert_eq!(
        rows.iter().map(|r| (r.day, r.spent)).collect::<Vec<_>>(),
        vec![(today, 40)],
        "booked on the restart's day, not the reservation's"
    );
}

fn unsettled(rows: &[crate::ledger::UsageRow]) -> u64 {
    rows.iter().filter(|r| r.route == UNSETTLED).map(|r| r.spent).sum()
}

#[tokio::test]
async fn a_crash_replays_the_hold_log_once() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    let l = ledger(dir.path());
    let settled = granted(&l, 100, 60, today).await;
    // Covered by its hold: rides the log without an fdatasync of its own.
    l.settle(settled, 10, Route::PermitsSearch, today)
        .await
        .expect("settle");
    std::mem::forget(granted(&l, 100, 40, today).await);
    let free = granted(&l, 100, 0, today).await;
    l.settle(free, 3, Route::MetaRelease, today).await.expect("settle");
    l.crash(false);
    let l = ledger(dir.path());
    assert_eq!(l.usage("t", today).used, 53, "10 settled + 40 held + 3 uncovered");
    assert_eq!(unsettled(&l.rows(today, today).await), 40);
    drop(l);
    let l = ledger(dir.path());
    assert_eq!(l.usage("t", today).used, 53, "replayed once, not again");
    l.crash(false);
    assert_eq!(
        ledger(dir.path()).usage("t", today).used,
        53,
        "an earlier generation's records left in the file do not count"
    );
}

#[tokio::test]
async fn a_torn_last_record_is_ignored_and_its_hold_counts() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    let l = ledger(dir.path());
    let r = granted(&l, 100, 40, today).await;
    l.settle(r, 10, Route::PermitsSearch, today).await.expect("settle");
    l.crash(false);
    // Tear the end's record: its last byte never reached the disk.
    let path = dir.path().join("holds.log");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.iter().rposition(|b| *b != 0).expect("records");
    bytes[last] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let l = ledger(dir.path());
    assert_eq!(
        l.usage("t", today).used,
        40,
        "the hold counts in full: over-, never under-charged"
    );
    assert_eq!(unsettled(&l.rows(today, today).await), 40);
}

#[tokio::test]
async fn a_crash_between_compaction_and_the_logs_restart_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    let l = ledger(dir.path());
    let r = granted(&l, 100, 40, today).await;
    l.settle(r, 10, Route::PermitsSearch, today).await.expect("settle");
    std::mem::forget(granted(&l, 100, 30, today).await);
    // redb holds the log's records; the log still holds them too.
    l.crash(true);
    let l = ledger(dir.path());
    assert_eq!(l.usage("t", today).used, 40, "10 settled + 30 held, once");
    let rows = l.rows(today, today).await;
    assert_eq!(rows.iter().map(|r| r.spent).sum::<u64>(), 40);
    assert_eq!(unsettled(&rows), 30);
}

#[tokio::test]
async fn a_flush_folds_the_log_into_redb() {
    let dir = tempfile::tempdir().unwrap();
    let today = crate::ledger::today();
    let l = ledger(dir.path());
    let r = granted(&l, 100, 40, today).await;
    l.settle(r, 10, Route::PermitsSearch, today).await.expect("settle");
    let open = granted(&l, 100, 20, today).await;
    assert_eq!(l.rows(today, today).await.iter().map(|r| r.spent).sum::<u64>(), 10);
    let after_flush = l.reserve("t", Some(100), 5, today).await.expect("reserve");
    l.settle(open, 20, Route::PermitsSearch, today).await.expect("settle");
    // The flush started a new generation: what follows it is in the log.
    l.crash(false);
    let l = ledger(dir.path());
    assert_eq!(l.usage("t", today).used, 35, "10 + 20 settled, 5 held");
    drop(after_flush);
}
