//! The company's account made whole (`ledger::seed_since`) on the Redis
//! ledger, once for every replica: before a replica first reads the
//! company's account or holds a call in it, it sums the teams' own spend
//! of the days since `seed_since` (the teams of its config) and hands the
//! sums to [`SEED`], which writes them only if the account is not seeded
//! yet (its `seeded` key) and holds no spend of its own then.
//!
//! Why that is enough with several replicas: the script runs atomically in
//! the account's one slot, and the first run of it, seeding or not, sets
//! `seeded`, so every later run (another replica's, a restart's) changes
//! nothing. And no replica writes the company's spend before its own run
//! has answered (a reserve in the account waits for it), so the first run
//! finds no spend of this release in the account: the sums it is given
//! are all it lacks. `seeded` expires after a rolling window: by then the
//! spend it guarded has left the window, and a start that finds the
//! account without spend of its own in the window (a release that does
//! not keep it ran all that time) seeds it again.

use super::RedisLedger;
use crate::ledger::{seed_since, LedgerError, ORG_ACCOUNT, ROLLING_DAYS};
use crate::metrics::RedisOp;
use crate::redis_backend::keys::LedgerKey;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// KEYS: the company's days, routes, seeded. ARGV: the first day seeded,
/// today, `seeded`'s expiry (ms), the number of days n, then n pairs day,
/// credits, then pairs route field ("day|route|s"), credits.
/// Returns the credits seeded, or -1: seeded before, or spend of its own.
pub(super) const SEED: &str = r#"
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
local since = tonumber(ARGV[1])
local own = redis.call('HGETALL', KEYS[1])
for i = 1, #own, 2 do
  local day, credits = tonumber(own[i]), tonumber(own[i + 1])
  if day ~= nil and credits ~= nil and day >= since and credits > 0 then
    redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
    return -1
  end
end
local n = tonumber(ARGV[4])
local seeded = 0
for i = 5, 4 + 2 * n, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  seeded = seeded + tonumber(ARGV[i + 1])
end
for i = 5 + 2 * n, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
return seeded
"#;

/// How long `seeded` lasts: a rolling window and a day.
const SEEDED_FOR_MS: u64 = (ROLLING_DAYS as u64 + 1) * 86_400_000;

/// One replica's part in the seed.
pub(super) struct OrgSeed {
    /// The teams whose spend the company's account is seeded from: the
    /// config's at start.
    teams: Vec<String>,
    /// This replica's run of [`SEED`] has answered.
    done: AtomicBool,
    /// One run at a time; whoever reads or holds in the company's account
    /// meanwhile waits for it.
    turn: tokio::sync::Mutex<()>,
}

impl OrgSeed {
    pub(super) fn new(teams: Vec<String>) -> OrgSeed {
        OrgSeed {
            teams,
            done: AtomicBool::new(false),
            turn: tokio::sync::Mutex::new(()),
        }
    }
}

/// A team's `days` (day → credits) and `routes` (field → credits).
type TeamHashes = (Vec<(u32, u64)>, Vec<(String, u64)>);

/// The teams' spend since a day: per day, and per chargeback field.
#[derive(Default)]
struct Sums {
    days: BTreeMap<u32, u64>,
    routes: BTreeMap<String, u64>,
}

impl RedisLedger {
    /// Answers once the company's account is whole (at once after this
    /// replica's first run of [`SEED`]); for any other account at once.
    /// An error (Redis down) leaves the run to the next caller.
    pub(super) async fn org_whole(&self, account: &str, today: u32) -> Result<(), LedgerError> {
        if account != ORG_ACCOUNT || self.org_seed.done.load(Ordering::Acquire) {
            return Ok(());
        }
        let _turn = self.org_seed.turn.lock().await;
        if self.org_seed.done.load(Ordering::Acquire) {
            return Ok(());
        }
        let since = seed_since(today);
        let sums = self.team_sums(since, today).await?;
        let mut inv = self.seed.prepare_invoke();
        for k in [LedgerKey::Days, LedgerKey::Routes, LedgerKey::Seeded] {
            inv.key(self.keys.ledger(ORG_ACCOUNT, k));
        }
        inv.arg(since).arg(today).arg(SEEDED_FOR_MS).arg(sums.days.len());
        for (day, credits) in &sums.days {
            inv.arg(day).arg(credits);
        }
        for (field, credits) in &sums.routes {
            inv.arg(field).arg(credits);
        }
        let inv = &inv;
        let seeded: i64 = self
            .redis
            .call_reconnecting(
                RedisOp::LedgerReserve,
                |mut c| async move { inv.invoke_async(&mut c).await },
            )
            .await
            .map_err(|e| LedgerError(format!("ledger seed: {e}")))?;
        if seeded > 0 {
            tracing::info!(
                credits = seeded,
                "the company's account (quota.org_credit_limit) starts from the teams' spend already in the window"
            );
        }
        self.recent_lock().remove(ORG_ACCOUNT);
        self.org_seed.done.store(true, Ordering::Release);
        Ok(())
    }

    /// Every configured team's spend of the days from `since` to `today`.
    async fn team_sums(&self, since: u32, today: u32) -> Result<Sums, LedgerError> {
        let mut sums = Sums::default();
        let days = since..=today;
        for team in &self.org_seed.teams {
            let (spent, fields): TeamHashes = self
                .team_hashes(team, [LedgerKey::Days, LedgerKey::Routes], "ledger seed")
                .await?;
            for (day, credits) in spent.into_iter().filter(|(d, c)| days.contains(d) && *c > 0) {
                *sums.days.entry(day).or_insert(0) += credits;
            }
            for (field, credits) in fields {
                let mut parts = field.split('|');
                let (Some(day), Some(_route), Some("s")) = (parts.next(), parts.next(), parts.next()) else {
                    continue;
                };
                if day.parse::<u32>().is_ok_and(|d| days.contains(&d)) && credits > 0 {
                    *sums.routes.entry(field).or_insert(0) += credits;
                }
            }
        }
        Ok(sums)
    }
}
