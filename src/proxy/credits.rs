//! The credits of one upstream call, in the pipeline's `fetch`: [`reserve`]
//! the worst case, read what the upstream charged, [`settle`] it, or
//! [`release`] it when nothing was charged; the team's budget headers; and
//! the reconciliation of the org's spend seen upstream against the sum of
//! the team ledgers.
//!
//! The upstream's numbers are distrusted: a charge that does not parse as a
//! number (or is beyond any real bill) is replaced by the records counted in
//! the page, and a bill above the reservations (the worst case of the
//! call) is charged only up to them (`purchase::shares`): the rest is an
//! anomaly, counted, logged and left to the reconciliation of untracked
//! credits. Who pays which part of a call is the purchase's one rule.

use super::context::Job;
use crate::app::App;
use crate::auth::{Member, Team};
use crate::error::{GatewayError, Spent};
use crate::http_util::number_header;
use crate::ledger::{Budget, Reservation, ORG_ACCOUNT};
use crate::metrics::LedgerOp;
use crate::route;
use http::header::{HeaderMap, HeaderName};
use http::StatusCode;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

pub(super) const X_CREDITS_REQUEST: HeaderName = HeaderName::from_static("x-credits-request");
const X_CREDITS_LIMIT: HeaderName = HeaderName::from_static("x-credits-limit");
const X_CREDITS_REMAINING: HeaderName = HeaderName::from_static("x-credits-remaining");

/// The bill of an answer from its status, its `X-Credits-Request` and, when
/// that is missing or not a number, the records in its body. `body` is
/// `None` when the headers arrived but the body did not (cut, too large,
/// timed out): then only a head that carries its bill is billed (the
/// upstream bills every metered 200 in `X-Credits-Request`; a head without
/// it is the answer of a fault, not a bill). Who pays which part of it is
/// the purchase's rule (`purchase::shares`).
pub(super) fn bill(status: StatusCode, headers: &HeaderMap, body: Option<&[u8]>, metered: bool) -> u64 {
    if status != StatusCode::OK {
        return 0;
    }
    match (billed(headers), body) {
        (Some(n), _) => n,
        (None, _) if !metered => 0,
        (None, Some(body)) => crate::page::count_items(body),
        (None, None) => 0,
    }
}

/// Above this a bill is not a number the upstream can mean (a page holds at
/// most 100 records): it is treated like one that does not parse. Low
/// enough that no sum of such bills overflows, here or in Redis's 64-bit
/// integers.
const MAX_BILL: u64 = u32::MAX as u64;

/// The upstream's bill in `X-Credits-Request`, when it is a number.
pub(super) fn billed(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(X_CREDITS_REQUEST)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|n| *n <= MAX_BILL)
}

/// Holds the worst case of this call in every budget it counts against —
/// its app's (when the team names its apps), its team's, and the
/// company's — or refuses (402, naming the budget) before anything is
/// spent. `Ok(None)`: nothing to hold (the ledger is down and the operator
/// chose to fail open).
///
/// The team and app are the ones in the live table now, not the ones the
/// request was admitted as: a reserve may run up to `cache.coalesce_wait_ms`
/// after admission (a lease wait, a follower's retry), and a reload
/// meanwhile that lowered a limit binds it; one that removed the team or
/// the app's token refuses it as the upstream refuses an unknown key (401).
#[tracing::instrument(target = "permit_gateway::spans", name = "reserve", skip_all)]
pub(super) async fn reserve(app: &App, job: &Job) -> Result<Option<Reservation>, GatewayError> {
    let teams = app.teams.load();
    let Some(team) = teams.by_name(&job.team.name).cloned() else {
        return Err(GatewayError::InvalidCredential);
    };
    let Some(member) = team.member(&job.member.name).cloned() else {
        return Err(GatewayError::InvalidCredential);
    };
    drop(teams);
    let amount = route::credit_estimate(&job.target);
    let (mut budgets, mut whose): (Vec<Budget<'_>>, Vec<Spent>) =
        budgets_of(app, &team, Some(&member)).into_iter().unzip();
    // Free calls cannot overspend: they are recorded, never refused.
    if amount == 0 {
        for b in &mut budgets {
            b.limit = None;
        }
    }
    match app.ledger.reserve_all(&budgets, amount).await {
        Ok(Ok(r)) => Ok(Some(r)),
        Ok(Err(refusal)) => Err(GatewayError::QuotaExceeded {
            limit: refusal.limit,
            needed: amount,
            remaining: refusal.limit.saturating_sub(refusal.used),
            upgrade_url: app.config.quota.upgrade_url.clone(),
            budget: whose.swap_remove(refusal.budget),
        }),
        Err(e) => {
            app.metrics.ledger_error(LedgerOp::Reserve);
            tracing::error!(team = %team.name, error = %e, "ledger reserve failed");
            // A free call has nothing to budget; a metered one fails closed
            // unless the operator chose otherwise.
            if amount == 0 || app.config.quota.fail_open {
                Ok(None)
            } else {
                Err(GatewayError::Unavailable("Credit ledger unavailable"))
            }
        }
    }
}

/// The budgets a call of `member`, an app of `team`, is held in, narrowest
/// first (an app refused never holds its team's credits): its app's when
/// the team names its apps, its team's, the company's; each with whose it
/// is, for a 402. The limits are the live table's and config's.
pub(super) fn budgets_of<'a>(app: &'a App, team: &'a Team, member: Option<&'a Member>) -> Vec<(Budget<'a>, Spent)> {
    let mut budgets = Vec::with_capacity(3);
    if let Some((member, account)) = member.and_then(|m| Some((m, m.account.as_ref()?))) {
        let budget = Budget {
            account,
            limit: member.credit_limit,
        };
        budgets.push((budget, Spent::App(member.name.clone())));
    }
    let team_budget = Budget {
        account: &team.name,
        limit: team.credit_limit,
    };
    budgets.push((team_budget, Spent::Team));
    let org = Budget {
        account: ORG_ACCOUNT,
        limit: app.config.quota.org_credit_limit,
    };
    budgets.push((org, Spent::Org));
    budgets
}

/// The reservation's amount, or the route's estimate when there is none:
/// the bound a charge is held against.
pub(super) fn reserved(job: &Job, reservation: Option<&Reservation>) -> u64 {
    reservation.map_or_else(|| route::credit_estimate(&job.target), |r| r.amount)
}

/// Gives the credits back: the upstream charged nothing.
pub(super) async fn release(app: &App, reservation: Option<Reservation>) {
    if let Some(r) = reservation {
        app.ledger.release(r).await;
    }
}

/// Turns the reservation into what the upstream charged. Runs in
/// the task that owns the call, so no client can cancel it halfway.
#[tracing::instrument(target = "permit_gateway::spans", name = "settle", skip_all)]
async fn settle(app: &App, job: &Job, reservation: Option<Reservation>, credits: u64) {
    let route = job.target.route;
    let team = &job.team.name;
    if credits > 0 {
        app.metrics.credits_spent(team, route, credits);
    }
    if let Some(r) = reservation {
        if let Err(e) = app.ledger.settle(r, credits, route).await {
            app.metrics.ledger_error(LedgerOp::Settle);
            tracing::error!(team = %team, credits, error = %e, "ledger settle failed: the reservation stays counted as spent");
        }
    }
    reconcile(app).await;
}

/// The longest a finished call's answer waits for its settle; the settle
/// goes on after it. Long enough that a healthy ledger (a Redis round trip,
/// a group commit) is done first, so the team's budget headers show it.
const SETTLE_WAIT: Duration = Duration::from_secs(1);

/// A settle running in a task of its own.
pub(super) type Settling = tokio::task::JoinHandle<()>;

/// [`settle`] in its own task: no call waits on it, no client cancels it.
pub(super) fn settle_beside(app: &Arc<App>, job: &Job, reservation: Option<Reservation>, credits: u64) -> Settling {
    let (task_app, job) = (app.clone(), job.clone());
    // In the request's span, so an exported `settle` is its child even when
    // it ends after the answer.
    app.detach(async move { settle(&task_app, &job, reservation, credits).await }.in_current_span())
}

/// Waits up to [`SETTLE_WAIT`] for a settle, then leaves it to finish.
pub(super) async fn settled_or_late(settling: Settling) {
    if tokio::time::timeout(SETTLE_WAIT, settling).await.is_err() {
        tracing::warn!("ledger settle still running: the answer goes out, the settle finishes behind it");
    }
}

/// The safety net no single anchor gives: the org's spend as the upstream
/// reports it (`X-Credits-Limit` − `X-Credits-Remaining`) minus the sum of
/// the team ledgers, exported as `gateway_untracked_credits`. Positive:
/// credits spent upstream that no team was charged (another client of the
/// key, a lost settle); negative: reservations counted as spent that the
/// upstream never charged (a crash). Both windows roll, so it is a trend.
/// Run after every settle: settles are bounded by the upstream rate, and
/// the ledgers answer `used` from memory (file) or a one-second cache (Redis).
async fn reconcile(app: &App) {
    let Some(org_spent) = app.org.spent() else { return };
    let mut teams_spent: u64 = 0;
    for team in app.teams.load().iter() {
        match app.ledger.used(&team.name).await {
            Ok(used) => teams_spent = teams_spent.saturating_add(used),
            // An incomplete sum would report phantom untracked credits.
            Err(_) => return,
        }
    }
    let untracked = i128::from(org_spent) - i128::from(teams_spent);
    let untracked = i64::try_from(untracked).unwrap_or(if untracked < 0 { i64::MIN } else { i64::MAX });
    app.metrics.untracked_credits.set(untracked);
}

/// The budget that binds a member now: of its app's (when its team names
/// its apps), its team's and the company's, the one with least left —
/// what `X-Credits-Limit` / `X-Credits-Remaining` and `/v2/usage`'s
/// `is_over_limit` tell. Remaining = limit − spent − held (the holds of
/// calls in flight are budget nobody can spend, as a reserve counts them).
/// `None`: no budget limits it (an unlimited team, no company cap), or the
/// ledger cannot answer (counted). The limits are the ones in force now (a
/// reload during the request counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Binding {
    pub(super) limit: u64,
    pub(super) remaining: u64,
    pub(super) budget: Spent,
}

/// [`Binding`] of `member` (by name) of `team` (by name), in the live
/// table: of the budgets a call of the member is held in ([`budgets_of`]),
/// the one with a limit and least left.
pub(super) async fn binding(app: &App, team: &str, member: Option<&str>) -> Option<Binding> {
    let (team, member) = {
        let teams = app.teams.load();
        let team = teams.by_name(team)?.clone();
        let member = member.and_then(|m| team.member(m).cloned());
        (team, member)
    };
    let mut binding: Option<Binding> = None;
    for (budget, spent) in budgets_of(app, &team, member.as_deref()) {
        let Some(limit) = budget.limit else { continue };
        let Ok(committed) = app.ledger.committed(budget.account).await else {
            app.metrics.ledger_error(LedgerOp::Usage);
            return None;
        };
        let remaining = limit.saturating_sub(committed);
        if binding.as_ref().is_none_or(|b| remaining < b.remaining) {
            binding = Some(Binding {
                limit,
                remaining,
                budget: spent,
            });
        }
    }
    binding
}

/// `X-Credits-Limit` and `X-Credits-Remaining` of the budget that binds
/// ([`binding`]); left out when none does or the ledger cannot answer.
pub(super) async fn budget_headers(app: &App, team: &Team, member: Option<&Member>, headers: &mut HeaderMap) {
    // The common case, one team budget and nothing else: the team's header
    // formatted once per config, one ledger read.
    let alone = app.config.quota.org_credit_limit.is_none()
        && member.is_none_or(|m| m.account.is_none() || m.credit_limit.is_none());
    if alone {
        let limit_header = {
            let teams = app.teams.load();
            let Some(t) = teams.by_name(&team.name) else { return };
            match (t.credit_limit, &t.limit_header) {
                (Some(limit), Some(header)) => Some((limit, header.clone())),
                _ => None,
            }
        };
        let Some((limit, header)) = limit_header else { return };
        let Ok(committed) = app.ledger.committed(&team.name).await else {
            app.metrics.ledger_error(LedgerOp::Usage);
            return;
        };
        headers.insert(X_CREDITS_LIMIT, header);
        headers.insert(X_CREDITS_REMAINING, number_header(limit.saturating_sub(committed)));
        return;
    }
    if let Some(b) = binding(app, &team.name, member.map(|m| m.name.as_str())).await {
        set_budget_headers(headers, b.limit, b.remaining);
    }
}

/// Writes the two budget headers.
pub(super) fn set_budget_headers(headers: &mut HeaderMap, limit: u64, remaining: u64) {
    headers.insert(X_CREDITS_LIMIT, number_header(limit));
    headers.insert(X_CREDITS_REMAINING, number_header(remaining));
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(credits: Option<&'static str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(c) = credits {
            h.insert(X_CREDITS_REQUEST, HeaderValue::from_static(c));
        }
        h
    }

    const PAGE: &[u8] = br#"{"items":[{},{},{}],"size":3}"#;

    #[test]
    fn the_bill_comes_from_the_header_else_from_the_records() {
        let ok = StatusCode::OK;
        assert_eq!(bill(ok, &headers(Some("7")), Some(PAGE), true), 7);
        for absurd in [
            "abc",
            "-5",
            "99999999999999999999",
            "18446744073709551615",
            "4294967296",
            "",
        ] {
            assert_eq!(bill(ok, &headers(Some(absurd)), Some(PAGE), true), 3, "{absurd}");
        }
        assert_eq!(bill(ok, &headers(None), Some(PAGE), true), 3, "missing: count");
        assert_eq!(bill(ok, &headers(None), Some(PAGE), false), 0, "free endpoints");
        let refused = bill(StatusCode::UNPROCESSABLE_ENTITY, &headers(Some("7")), Some(PAGE), true);
        assert_eq!(refused, 0);
    }

    #[test]
    fn a_bill_above_any_reservation_is_read_as_billed() {
        // What of it is charged is the purchase's rule (`purchase::shares`:
        // up to the reservations, the rest untracked).
        let b = bill(StatusCode::OK, &headers(Some("5000000")), Some(PAGE), true);
        assert_eq!(b, 5_000_000);
    }

    #[test]
    fn a_head_without_its_body_is_billed_what_it_says() {
        let ok = StatusCode::OK;
        assert_eq!(bill(ok, &headers(Some("40")), None, true), 40);
        assert_eq!(bill(ok, &headers(None), None, true), 0);
    }
}
