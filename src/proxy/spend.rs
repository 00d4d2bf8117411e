//! Spending less than asked (issue 28), the two hooks of the request path:
//!
//! - [`derived`] (phase 7, after a miss of the request's own key): the
//!   answer held by a complete page of another size or by the counted
//!   first page ([`crate::cache::spend`]), served as a hit at 0 credits;
//! - [`clamp`] (before phase 8, teams with `clamp_to_budget = true`): a
//!   page the team's remaining credits cannot cover is asked of the
//!   upstream with `size` = what they can cover, so the team gets those
//!   records and the upstream's cursor instead of a 402. The reservation
//!   is that smaller worst case, so the budget guarantee is unchanged; a
//!   team left with less than one credit is refused (402) as before.

use super::context::{Ask, CacheState, RequestContext};
use super::respond;
use super::revalidate::{self, Use};
use crate::app::App;
use crate::cache::key;
use crate::clock::now_ms;
use crate::http_util::Body;
use crate::route::{self, Target};
use http::header::{HeaderName, HeaderValue};
use http::Response;

/// Says that the page was clamped, and what size was asked.
const X_GATEWAY_CLAMPED: HeaderName = HeaderName::from_static("x-gateway-clamped");

/// A fresh answer derived from another key's entry, or `None`. Stale held
/// answers are not used: an expired entry answers only its own key.
pub(super) async fn derived<B>(app: &App, ask: &Ask<'_, B>, ctx: &mut RequestContext) -> Option<Response<Body>> {
    let key = ask.key.as_deref()?;
    if ask.directives.no_cache {
        return None;
    }
    let (entry, tier, how) = app.cache.derived(&ask.target, key).await?;
    let now = now_ms();
    if revalidate::usable(&entry, &ask.directives, 0, now) != Use::Hit {
        return None;
    }
    tracing::debug!(request_id = %ctx.request_id, derivation = ?how, "answered from a held page");
    app.metrics.cache_hit(ask.target.route, tier);
    Some(respond::from_cache(
        app,
        &ask.team,
        &ask.target,
        &entry,
        CacheState::Hit,
        ask.req,
        ctx,
    ))
}

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
    if !team.clamp_to_budget || !ask.target.route.is_metered() {
        return None;
    }
    let limit = team.credit_limit?;
    let asked = route::page_size_asked(&ask.target)?;
    // Read fresh (not `used`'s one-second memo, which a peer replica's
    // spend may have outdated). A ledger that cannot answer: no clamp; the
    // reservation decides.
    let used = app.ledger.usage(&team.name).await.ok()?.used;
    let remaining = limit.saturating_sub(used);
    if remaining == 0 || remaining >= asked {
        return None;
    }
    let target = Target {
        query: Some(with_size(ask.target.query.as_deref().unwrap_or(""), remaining).into()),
        ..ask.target.clone()
    };
    let key = ask.key.as_ref().map(|_| key::cache_key(&target));
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
