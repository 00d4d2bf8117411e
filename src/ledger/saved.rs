//! Credits saved by cache hits, tallied in memory and written in the
//! background. A hit must not pay for bookkeeping: writing each one (a
//! channel send and a transaction) cost a quarter of the hit path's CPU.
//! Saved credits are chargeback detail, not budget, so losing the last few
//! seconds of them in a crash is acceptable; spend is never tallied here.

use super::UsageRow;
use crate::route::Route;
use std::collections::HashMap;
use std::sync::Mutex;

/// How often the tally is written out.
pub(super) const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// team → (day, route) → credits saved, not yet written (foldhash: two
/// lookups on every hit).
type Pending = HashMap<String, HashMap<(u32, Route), u64, Fold>, Fold>;
type Fold = foldhash::fast::RandomState;

#[derive(Default)]
pub(super) struct SavedTally {
    pending: Mutex<Pending>,
}

impl SavedTally {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a hit's savings; allocates only for a team's first hit of a flush.
    pub(super) fn add(&self, team: &str, day: u32, route: Route, credits: u64) {
        let mut pending = self.lock();
        match pending.get_mut(team) {
            Some(per_team) => *per_team.entry((day, route)).or_insert(0) += credits,
            None => {
                let mut per_team = HashMap::default();
                per_team.insert((day, route), credits);
                pending.insert(team.to_string(), per_team);
            }
        }
    }

    /// Everything pending, emptied: (team, day, route, credits).
    pub(super) fn take(&self) -> Vec<(String, u32, Route, u64)> {
        let pending = std::mem::take(&mut *self.lock());
        pending
            .into_iter()
            .flat_map(|(team, m)| {
                m.into_iter()
                    .map(move |((day, route), c)| (team.clone(), day, route, c))
            })
            .collect()
    }

    /// Puts back what could not be written, to try again next time.
    pub(super) fn restore(&self, rows: Vec<(String, u32, Route, u64)>) {
        for (team, day, route, credits) in rows {
            self.add(&team, day, route, credits);
        }
    }

    /// Adds what is pending to report rows (the CSV is never behind).
    pub(super) fn merge_into(&self, rows: &mut Vec<UsageRow>, from: u32, to: u32) {
        for (team, per_team) in self.lock().iter() {
            for ((day, route), credits) in per_team {
                if !(from..=to).contains(day) {
                    continue;
                }
                let route = route.as_str();
                match rows
                    .iter_mut()
                    .find(|r| r.team == *team && r.day == *day && r.route == route)
                {
                    Some(r) => r.saved += credits,
                    None => rows.push(UsageRow {
                        team: team.clone(),
                        day: *day,
                        route: route.to_string(),
                        spent: 0,
                        saved: *credits,
                    }),
                }
            }
        }
        rows.sort_by(|a, b| (&a.team, a.day, &a.route).cmp(&(&b.team, b.day, &b.route)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_sum_take_and_restore() {
        let t = SavedTally::default();
        t.add("a", 1, Route::PermitsSearch, 3);
        t.add("a", 1, Route::PermitsSearch, 4);
        t.add("b", 2, Route::Counties, 1);
        let mut rows = vec![UsageRow {
            team: "a".into(),
            day: 1,
            route: "permits_search".into(),
            spent: 9,
            saved: 1,
        }];
        t.merge_into(&mut rows, 0, 10);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].spent, rows[0].saved), (9, 8));
        let mut taken = t.take();
        taken.sort();
        assert_eq!(
            taken,
            vec![
                ("a".into(), 1, Route::PermitsSearch, 7),
                ("b".into(), 2, Route::Counties, 1)
            ]
        );
        assert!(t.take().is_empty());
        t.restore(taken);
        assert_eq!(t.take().len(), 2);
    }
}
