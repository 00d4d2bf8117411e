//! [`clamp`] (teams with `clamp_to_budget = true`, before [`fetch`]): a page
//! the remaining credits (the least its team, its app and the company have
//! left, of those with a limit) cannot cover is asked of the upstream with
//! `size` = what they can cover, so the team gets those records and the
//! upstream's cursor instead of a 402. The reservation is that smaller
//! worst case, so the budget guarantee is unchanged; a team left with less
//! than one credit is refused (402) as before.
//!
//! [`fetch`]: fn@super::fetch

use super::context::Ask;
use super::credits;
use crate::app::App;
use crate::cache::key;
use crate::http_util::Body;
use crate::route::{self, Target};
use http::header::{HeaderName, HeaderValue};
use http::Response;

/// Says that the page was clamped, and what size was asked.
const X_GATEWAY_CLAMPED: HeaderName = HeaderName::from_static("x-gateway-clamped");

/// A request clamped to the team's remaining credits.
pub(super) struct Clamped {
    pub(super) target: Target,
    pub(super) key: Option<String>,
    /// The size the team asked for (the header's value).
    pub(super) asked: u64,
}

/// The clamped request, when the team opted in and its remaining credits
/// cover at least one record but not the page asked for.
pub(super) async fn clamp<B>(app: &App, ask: &Ask<'_, B>) -> Option<Clamped> {
    let team = &ask.team;
    if !team.clamp_to_budget || !ask.parsed.target.route.is_metered() {
        return None;
    }
    let asked = route::page_size_asked(&ask.parsed.target)?;
    // What every budget the call is held in can still cover: the team's,
    // its app's and the company's, whichever has a limit. Read fresh (not
    // `used`'s one-second memo, which a peer replica's spend may have
    // outdated). A ledger that cannot answer: no clamp; the reservation
    // decides.
    let mut remaining: Option<u64> = None;
    for (budget, _) in credits::budgets_of(app, team, Some(&ask.member)) {
        let Some(limit) = budget.limit else { continue };
        let left = limit.saturating_sub(app.ledger.usage(budget.account).await.ok()?.used);
        remaining = Some(remaining.map_or(left, |r| r.min(left)));
    }
    let remaining = remaining?;
    if remaining == 0 || remaining >= asked {
        return None;
    }
    let target = Target {
        query: Some(with_size(ask.parsed.target.query.as_deref().unwrap_or(""), remaining).into()),
        ..ask.parsed.target.clone()
    };
    let key = ask.parsed.key.as_ref().map(|_| key::cache_key(&target));
    Some(Clamped { target, key, asked })
}

/// Marks a successful answer to a clamped request.
pub(super) fn mark(resp: &mut Response<Body>, asked: u64) {
    if resp.status().is_success() {
        resp.headers_mut().insert(X_GATEWAY_CLAMPED, HeaderValue::from(asked));
    }
}

/// The query with every `size` replaced by one `size=n` (last, as the
/// upstream reads repeated scalars); the other parameters kept as sent.
fn with_size(query: &str, n: u64) -> String {
    let mut out: Vec<String> = query
        .split('&')
        .filter(|part| !part.is_empty())
        .filter(|part| {
            let name = part.split_once('=').map_or(*part, |(k, _)| k);
            key::decode_pairs(name).is_none_or(|p| p.first().is_none_or(|(k, _)| k != "size"))
        })
        .map(str::to_string)
        .collect();
    out.push(format!("size={n}"));
    out.join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_size_replaces_every_size_and_keeps_the_rest() {
        assert_eq!(with_size("geo_id=CA&size=100", 30), "geo_id=CA&size=30");
        assert_eq!(with_size("size=1&geo_id=CA&si%7Ae=7&size=9", 4), "geo_id=CA&size=4");
        assert_eq!(with_size("", 5), "size=5");
        assert_eq!(with_size("permit_q=a+b&sizes=3", 2), "permit_q=a+b&sizes=3&size=2");
    }
}
