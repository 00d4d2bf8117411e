//! The ledger's chargeback export, `/admin/usage.csv` (served by the admin
//! listener): credits spent and saved per team, day, route and app.
//!
//! Its columns are a contract with every pipeline that reads it, by name or
//! by position: the columns of the first release (`team,date,route,
//! credits_spent,credits_saved`) keep their place, and a new column only
//! ever goes at the end (`app`, issue 59: put second, it made an old
//! reader's fourth column the route). A team of one token has one row per
//! day and route, as before apps; a team that names its apps has one per
//! app, whose spend sums to the team's.
//!
//! Only teams and their apps are listed: the company's account and any
//! other internal one ([`Account::Internal`]) hold spend the teams' rows
//! already count.

use super::{date_of, Account, UsageRow};
use std::collections::BTreeMap;

/// The header line: the first release's five columns, then `app`.
pub(crate) const USAGE_CSV_HEADER: &str = "team,date,route,credits_spent,credits_saved,app";

/// The CSV of `rows` (the ledger's, every account's), header first. The
/// spend a team's own account holds beyond its apps' (spend from before
/// the team named its apps, or a team of one token) is its app
/// `default_app`'s.
pub(crate) fn usage_csv(rows: Vec<UsageRow>, default_app: &str) -> String {
    let mut csv = String::from(USAGE_CSV_HEADER);
    csv.push('\n');
    for r in by_app(rows, default_app) {
        csv.push_str(&format!(
            "{},{},{},{},{},{}\n",
            r.team,
            date_of(r.day),
            r.route,
            r.spent,
            r.saved,
            r.app
        ));
    }
    csv
}

/// One row of usage.csv: a team's app's spend and savings on a day and route.
#[derive(Debug, PartialEq, Eq)]
struct AppRow {
    team: String,
    app: String,
    day: u32,
    route: String,
    spent: u64,
    saved: u64,
}

/// Spend and savings summed per key.
type Sums<K> = BTreeMap<K, (u64, u64)>;

/// The ledger's rows by team and app: each app account's (`team/app`)
/// under its app; what the team's own row holds beyond its apps' under
/// `default_app`; internal accounts left out. Sorted by team, day, route
/// and app.
fn by_app(rows: Vec<UsageRow>, default_app: &str) -> Vec<AppRow> {
    let mut teams: Sums<(String, u32, String)> = BTreeMap::new();
    let mut apps: Sums<(String, u32, String, String)> = BTreeMap::new();
    for r in rows {
        let e = match Account::of(&r.team) {
            Account::Team(team) => teams.entry((team.to_string(), r.day, r.route)).or_default(),
            Account::Member { team, member } => apps
                .entry((team.to_string(), r.day, r.route, member.to_string()))
                .or_default(),
            Account::Internal => continue,
        };
        *e = (e.0 + r.spent, e.1 + r.saved);
    }
    let mut out = Vec::new();
    for ((team, day, route), (spent, saved)) in teams {
        let mine: Vec<_> = apps
            .range((team.clone(), day, route.clone(), String::new())..)
            .take_while(|((t, d, r, _), _)| *t == team && *d == day && *r == route)
            .map(|((_, _, _, app), figures)| (app.clone(), *figures))
            .collect();
        let (apps_spent, apps_saved) = mine.iter().fold((0, 0), |(s, v), (_, f)| (s + f.0, v + f.1));
        let mut rest = Some((spent.saturating_sub(apps_spent), saved.saturating_sub(apps_saved)))
            .filter(|(s, v)| *s > 0 || *v > 0);
        let row = |app: String, (spent, saved): (u64, u64)| AppRow {
            team: team.clone(),
            app,
            day,
            route: route.clone(),
            spent,
            saved,
        };
        let mut rows: Vec<AppRow> = mine
            .into_iter()
            .map(|(app, (mut spent, mut saved))| {
                if app == default_app {
                    if let Some((s, v)) = rest.take() {
                        (spent, saved) = (spent + s, saved + v);
                    }
                }
                row(app, (spent, saved))
            })
            .collect();
        if let Some(figures) = rest {
            rows.push(row(default_app.to_string(), figures));
        }
        rows.sort_by(|a, b| a.app.cmp(&b.app));
        out.extend(rows);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{app_account, day_of, ORG_ACCOUNT};

    fn row(team: &str, route: &str, spent: u64, saved: u64) -> UsageRow {
        let day = day_of(chrono::NaiveDate::from_ymd_opt(2026, 12, 7).expect("a date"));
        UsageRow {
            team: team.to_string(),
            day,
            route: route.to_string(),
            spent,
            saved,
        }
    }

    #[test]
    fn the_first_five_columns_are_the_first_releases_and_app_comes_last() {
        let csv = usage_csv(vec![row("beta", "counties", 5, 2)], "default");
        assert_eq!(
            csv,
            "team,date,route,credits_spent,credits_saved,app\nbeta,2026-12-07,counties,5,2,default\n"
        );
    }

    #[test]
    fn internal_accounts_are_never_listed_and_apps_sum_to_their_team() {
        let rows = vec![
            row("alpha", "counties", 15, 4),
            row(&app_account("alpha", "web"), "counties", 6, 1),
            row(&app_account("alpha", "batch"), "counties", 6, 0),
            row("beta", "counties", 5, 0),
            // The company's account: the same spend again, never a team's.
            row(ORG_ACCOUNT, "counties", 20, 5),
            // A name no team can have (an account of a later release).
            row("*later", "counties", 99, 0),
            row("alpha/web/x", "counties", 99, 0),
        ];
        let csv = usage_csv(rows, "default");
        let lines: Vec<&str> = csv.lines().skip(1).collect();
        assert_eq!(
            lines,
            [
                "alpha,2026-12-07,counties,6,0,batch",
                "alpha,2026-12-07,counties,3,3,default",
                "alpha,2026-12-07,counties,6,1,web",
                "beta,2026-12-07,counties,5,0,default",
            ]
        );
        // An old reader: column 4 summed per team is each team's spend.
        let mut spent: BTreeMap<&str, u64> = BTreeMap::new();
        for line in &lines {
            let cells: Vec<&str> = line.split(',').collect();
            *spent.entry(cells[0]).or_default() += cells[3].parse::<u64>().expect("a number");
        }
        assert_eq!(spent, BTreeMap::from([("alpha", 15), ("beta", 5)]));
    }
}
