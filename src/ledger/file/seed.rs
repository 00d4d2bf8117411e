//! The company's account made whole at start (`ledger::seed_since`): when
//! it holds no spend since the first day either window can reach, it is
//! given the teams' own spend of those days, route by route, in one
//! durable transaction before the writer thread starts (so before any
//! call is held in it). The file has one writer, so no other process can
//! seed it twice; once seeded, the account holds spend and the next start
//! leaves it as it is.

use super::disk::{begin, in_team_tables, ACCOUNT_SPEND, SPEND};
use crate::ledger::ORG_ACCOUNT;
use redb::{Database, ReadableTable};
use std::collections::BTreeMap;

/// Seeds the company's account from the teams' spend of the days from
/// `since` to `today` when it has none of its own then. Answers the
/// credits seeded; `None` when it had spend of its own (nothing written).
pub(super) fn seed_org(db: &Database, since: u32, today: u32) -> Result<Option<u64>, redb::Error> {
    let days = since..=today;
    let txn = begin(db, true)?;
    let rows = {
        let mut org = txn.open_table(ACCOUNT_SPEND)?;
        if has_own(&org, &days)? {
            None
        } else {
            let teams = team_spend(&txn.open_table(SPEND)?, &days)?;
            let mut seeded = 0u64;
            for ((day, route), spent) in &teams {
                let key = (ORG_ACCOUNT, *day, route.as_str());
                let (s, v) = org.get(key)?.map_or((0, 0), |v| v.value());
                org.insert(key, (s.saturating_add(*spent), v))?;
                seeded = seeded.saturating_add(*spent);
            }
            Some(seeded)
        }
    };
    // Nothing to write: no commit (and no fsync) at every start.
    match rows {
        Some(seeded) if seeded > 0 => txn.commit()?,
        _ => txn.abort()?,
    }
    Ok(rows)
}

/// A row of the spend tables.
type Spend<'t> = redb::Table<'t, (&'static str, u32, &'static str), (u64, u64)>;

/// Whether the company's account holds spend of one of `days`.
fn has_own(org: &Spend<'_>, days: &std::ops::RangeInclusive<u32>) -> Result<bool, redb::Error> {
    for item in org.iter()? {
        let (k, v) = item?;
        let (account, day, _) = k.value();
        if account == ORG_ACCOUNT && days.contains(&day) && v.value().0 > 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// (day, route) → the teams' spend of `days`: the rows the company's
/// account would hold had it existed then.
fn team_spend(
    spend: &Spend<'_>,
    days: &std::ops::RangeInclusive<u32>,
) -> Result<BTreeMap<(u32, String), u64>, redb::Error> {
    let mut teams: BTreeMap<(u32, String), u64> = BTreeMap::new();
    for item in spend.iter()? {
        let (k, v) = item?;
        let (account, day, route) = k.value();
        let spent = v.value().0;
        if in_team_tables(account) && days.contains(&day) && spent > 0 {
            let sum = teams.entry((day, route.to_string())).or_insert(0);
            *sum = sum.saturating_add(spent);
        }
    }
    Ok(teams)
}
