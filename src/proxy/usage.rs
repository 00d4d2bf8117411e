//! `GET /v2/usage` ([`usage`], a phase of the pipeline): the team's own
//! usage, answered by the gateway from its ledger in the upstream's usage
//! shape. Never forwarded and never cached: the upstream's answer would be
//! the whole org's.

use super::credits;
use crate::app::App;
use crate::auth::{Member, Team};
use crate::error::GatewayError;
use crate::http_util::{json_response, Body};
use crate::ledger::{date_of, TeamUsage};
use http::{Response, StatusCode};
use serde_json::json;

/// `GET /v2/usage` for one team, in the upstream's usage shape; for a team
/// that names its apps, the asking app's own spend and limit besides
/// (`app`). `is_over_limit` is the token's: true when the budget that binds
/// it (its app's, its team's or the company's, whichever has least left:
/// the one its `X-Credits-Remaining` tells, named in `budget`) has nothing
/// left, so a client that checks it before a metered call is not surprised
/// by a 402.
pub(super) async fn usage(app: &App, team: &Team, member: &Member) -> Result<Response<Body>, GatewayError> {
    let usage = read(app, team, &team.name).await?;
    let window = app.ledger.window();
    let team_over = team.credit_limit.is_some_and(|l| usage.used >= l);
    let binding = credits::binding(app, &team.name, Some(&member.name)).await;
    let over = team_over || binding.as_ref().is_some_and(|b| b.remaining == 0);
    let daily: Vec<_> = usage
        .daily
        .iter()
        .map(|(day, credits)| {
            json!({
                "date": date_of(*day).to_string(),
                "credits": credits,
                "expires": date_of(window.expires(*day)).to_string(),
            })
        })
        .collect();
    // When the team is over its limit: the day its oldest spend leaves the
    // window.
    let available_at = team_over
        .then(|| {
            usage
                .daily
                .first()
                .map(|(d, _)| date_of(window.expires(*d)).to_string())
        })
        .flatten();
    let mut body = json!({
        "credits_used": usage.used,
        "credit_limit": team.credit_limit,
        "is_over_limit": over,
        "available_at": available_at,
        "daily_usage": daily,
        "window": window.as_str(),
        "budget": binding.as_ref().map(|b| b.budget.as_str()),
    });
    if let Some(account) = &member.account {
        let used = read(app, team, account).await?;
        body["app"] = json!({
            "name": member.name,
            "credits_used": used.used,
            "credit_limit": member.credit_limit,
            "is_over_limit": member.credit_limit.is_some_and(|l| used.used >= l),
        });
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// The spend of `account` (the team's, or one of its apps'), or the 503 of
/// a ledger that cannot answer (counted and logged).
async fn read(app: &App, team: &Team, account: &str) -> Result<TeamUsage, GatewayError> {
    app.ledger.usage(account).await.map_err(|e| {
        app.metrics.ledger_error(crate::metrics::LedgerOp::Usage);
        tracing::error!(team = %team.name, account, error = %e, "ledger usage failed");
        GatewayError::Unavailable("Credit ledger unavailable")
    })
}
