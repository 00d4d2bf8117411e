//! The Redis ledger's settle marks (issue 19 follow-up): a settle counts
//! once however many marks are kept and whichever release wrote them, and
//! what a settle makes Redis do does not grow with the marks.

use crate::support::monitor::{Monitor, Ran};
use crate::support::redis::RedisServer;
use permit_gateway::clock::now_ms;
use permit_gateway::ledger::redis::{RedisLedger, FORGET_PER_SETTLE, WALK_PER_SETTLE};
use permit_gateway::ledger::{today, Reservation, Reserved, Window};
use permit_gateway::metrics::Metrics;
use permit_gateway::redis_backend::RedisBackend;
use permit_gateway::route::Route;
use redis::aio::MultiplexedConnection;
use std::sync::Arc;
use std::time::Duration;

const TEAM: &str = "alpha";
/// Marks are kept for twice this.
const LEASE: Duration = Duration::from_secs(60);

struct Ledger {
    redis: RedisServer,
    ledger: RedisLedger,
    conn: MultiplexedConnection,
}

async fn ledger() -> Ledger {
    let redis = RedisServer::start();
    let backend = RedisBackend::new(&redis.url(), Duration::from_secs(5), Arc::new(Metrics::new())).expect("backend");
    let ledger = RedisLedger::new(Arc::new(backend), "pgw:", Window::Rolling30d, LEASE);
    let conn = redis::Client::open(redis.url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    Ledger { redis, ledger, conn }
}

fn key(what: &str) -> String {
    format!("pgw:l:{{{TEAM}}}:{what}")
}

impl Ledger {
    async fn reserve(&self, amount: u64) -> Reservation {
        match self.ledger.reserve(TEAM, None, amount, today()).await.expect("reserve") {
            Reserved::Granted(r) => r,
            Reserved::Rejected { .. } => panic!("no limit, no refusal"),
        }
    }

    async fn settle(&self, r: Reservation, actual: u64) {
        let route = Route::PermitsSearch;
        self.ledger.settle(r, actual, route, today()).await.expect("settle");
    }

    async fn used(&self) -> u64 {
        self.ledger.usage(TEAM, today()).await.expect("usage").used
    }

    /// `n` marks ids `first..`, ended `age` ago: as this release writes
    /// them (hash and index), or as the previous one did (hash only).
    async fn seed(&self, first: u64, n: u64, age: Duration, indexed: bool) {
        let at = now_ms() - age.as_millis() as u64;
        let mut conn = self.conn.clone();
        for chunk in (first..first + n).collect::<Vec<_>>().chunks(1000) {
            let mut hset = redis::cmd("HSET");
            let mut zadd = redis::cmd("ZADD");
            hset.arg(key("settled"));
            zadd.arg(key("settled_at"));
            for id in chunk {
                hset.arg(id).arg(at);
                zadd.arg(at).arg(id);
            }
            let _: () = hset.query_async(&mut conn).await.expect("HSET");
            if indexed {
                let _: () = zadd.query_async(&mut conn).await.expect("ZADD");
            }
        }
    }

    /// (marks, index entries).
    async fn counts(&self) -> (u64, u64) {
        let mut conn = self.conn.clone();
        let marks: u64 = redis::cmd("HLEN")
            .arg(key("settled"))
            .query_async(&mut conn)
            .await
            .expect("HLEN");
        let index: u64 = redis::cmd("ZCARD")
            .arg(key("settled_at"))
            .query_async(&mut conn)
            .await
            .expect("ZCARD");
        (marks, index)
    }

    /// What one settle made Redis do inside the script.
    async fn settle_watched(&self, amount: u64) -> Vec<Ran> {
        let mut monitor = Monitor::start(&self.redis).await;
        let r = self.reserve(amount).await;
        self.settle(r, amount).await;
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("ECHO")
            .arg("settled")
            .query_async(&mut conn)
            .await
            .expect("ECHO");
        let ran = monitor.until_echo("settled").await;
        let first_settle = ran
            .iter()
            .position(|r| r.by_script && r.name == "HSETNX")
            .expect("the settle ran");
        ran[first_settle..].iter().filter(|r| r.by_script).cloned().collect()
    }
}

/// Same reservation ids as `r`: a retry of its settle.
fn again(r: &Reservation) -> Reservation {
    Reservation {
        id: r.id,
        team: r.team.clone(),
        amount: r.amount,
        settle_by: r.settle_by,
        linked: Vec::new(),
    }
}

#[tokio::test]
async fn a_settle_counts_once_among_many_marks_whichever_release_wrote_them() {
    let l = ledger().await;
    l.seed(1, 20_000, Duration::from_secs(1), true).await;
    l.seed(100_001, 500, Duration::from_secs(1), false).await;
    // A retry of a settle that already ran counts nothing.
    let r = l.reserve(5).await;
    let retry = again(&r);
    l.settle(r, 3).await;
    assert_eq!(l.used().await, 3);
    l.settle(retry, 3).await;
    assert_eq!(l.used().await, 3, "a retried settle counted twice");
    // A reservation that lapsed (its settle was late) becomes spend at its
    // full amount when the next reserve finds it; the late settle then
    // counts nothing.
    let lapsed = 424_242;
    let hold = format!("7:{}:{}", now_ms() - 1_000, today());
    let mut conn = l.conn.clone();
    let _: () = redis::cmd("HSET")
        .arg(key("held"))
        .arg(lapsed)
        .arg(hold)
        .query_async(&mut conn)
        .await
        .expect("HSET held");
    let next = l.reserve(1).await;
    assert_eq!(l.used().await, 3 + 7, "the lapsed reservation counts in full");
    let late = Reservation {
        id: lapsed,
        amount: 7,
        ..again(&next)
    };
    l.settle(late, 4).await;
    assert_eq!(l.used().await, 10, "a settle after the lapse counted");
    let indexed: Option<u64> = redis::cmd("ZSCORE")
        .arg(key("settled_at"))
        .arg(lapsed)
        .query_async(&mut conn)
        .await
        .expect("ZSCORE");
    assert!(
        indexed.is_some(),
        "the lapse's mark is indexed, so it is forgotten in time"
    );
    // A settle the previous release marked (a mark without an index entry)
    // counts nothing either.
    let marked_before = Reservation {
        id: 100_007,
        ..again(&next)
    };
    l.settle(marked_before, 9).await;
    assert_eq!(l.used().await, 10, "a settle marked by the previous release counted");
    l.settle(next, 1).await;
    assert_eq!(l.used().await, 11);
}

/// The script of the previous release read every mark (`HGETALL`) on each
/// settle. Now a settle runs the same commands with 10 marks as with 20,000,
/// and none of them reads the marks whole.
#[tokio::test]
async fn a_settle_makes_redis_do_the_same_with_ten_or_twenty_thousand_marks() {
    let l = ledger().await;
    l.seed(1, 10, Duration::from_secs(1), true).await;
    let few = l.settle_watched(2).await;
    l.seed(11, 20_000, Duration::from_secs(1), true).await;
    let many = l.settle_watched(2).await;
    let shape = |ran: &[Ran]| -> Vec<(String, String)> {
        ran.iter()
            .map(|r| (r.name.clone(), r.args.first().cloned().unwrap_or_default()))
            .collect()
    };
    assert_eq!(shape(&few), shape(&many), "what a settle does grew with the marks");
    let marks = [key("settled"), key("settled_at")];
    for r in many
        .iter()
        .filter(|r| r.args.first().is_some_and(|k| marks.contains(k)))
    {
        let bounded = match r.name.as_str() {
            "HSETNX" | "ZADD" | "HDEL" | "ZREM" | "HLEN" | "ZCARD" | "ZSCORE" => true,
            "ZRANGEBYSCORE" => r
                .args
                .ends_with(&["LIMIT".into(), "0".into(), FORGET_PER_SETTLE.to_string()]),
            "HSCAN" => r.args.ends_with(&["COUNT".into(), WALK_PER_SETTLE.to_string()]),
            _ => false,
        };
        assert!(bounded, "a settle read its marks whole: {r:?}");
    }
}

/// Marks past the window go a bounded number per settle, oldest first;
/// marks of the previous release are walked a few at a time, the live
/// ones indexed and the expired ones dropped, until none is left behind.
#[tokio::test]
async fn old_marks_are_forgotten_a_bounded_number_per_settle() {
    let l = ledger().await;
    let expired = LEASE * 3;
    l.seed(1, 200, expired, true).await;
    l.seed(1_001, 50, Duration::from_secs(1), true).await;
    let r = l.reserve(1).await;
    l.settle(r, 1).await;
    assert_eq!(
        l.counts().await,
        (250 + 1 - FORGET_PER_SETTLE, 250 + 1 - FORGET_PER_SETTLE),
        "one settle forgets at most {FORGET_PER_SETTLE} marks"
    );
    // The previous release's marks: 300 expired, 300 live, none indexed.
    l.seed(10_001, 300, expired, false).await;
    l.seed(20_001, 300, Duration::from_secs(1), false).await;
    let mut settles = 1;
    let live = loop {
        let r = l.reserve(1).await;
        l.settle(r, 1).await;
        settles += 1;
        let live = 50 + 300 + settles;
        if l.counts().await == (live, live) {
            break live;
        }
        assert!(
            settles < 100,
            "old marks still left after {settles} settles: {:?}",
            l.counts().await
        );
    };
    let mut conn = l.conn.clone();
    let oldest: Vec<(String, u64)> = redis::cmd("ZRANGE")
        .arg(key("settled_at"))
        .arg(0)
        .arg(0)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .expect("ZRANGE");
    assert!(
        oldest
            .iter()
            .all(|(_, at)| *at + 2 * LEASE.as_millis() as u64 >= now_ms()),
        "an expired mark was kept: {oldest:?}"
    );
    let walking: bool = redis::cmd("EXISTS")
        .arg(key("settled_scan"))
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert!(!walking, "the walk over unindexed marks ended ({live} marks)");
    assert_eq!(l.used().await, settles);
}
