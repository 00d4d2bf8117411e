//! [`covered_answer`]: on a miss of the request's own key, the answer
//! another key's page covers — a complete page of another size, or the
//! counted first page (`cache::covered` proves which) — served as a
//! hit at 0 credits.

use super::answered::Answered;
use super::context::{Ask, RequestContext};
use super::respond;
use super::revalidate::{self, Use};
use crate::app::App;
use crate::clock::now_ms;
use crate::http_util::Body;
use http::Response;

/// A fresh answer another key's entry covers, or `None`. Stale covering
/// answers are not used: an expired entry answers only its own key.
pub(super) async fn covered_answer<B>(app: &App, ask: &Ask<'_, B>, ctx: &mut RequestContext) -> Option<Response<Body>> {
    let key = ask.parsed.key.as_deref()?;
    if ask.directives.no_cache {
        return None;
    }
    let (entry, tier, covered_by) = app.cache.covering(&ask.parsed.target, key).await?;
    if revalidate::usable(&entry, &ask.directives, 0, now_ms()) != Use::Hit {
        return None;
    }
    tracing::debug!(request_id = %ctx.request_id, covered_by = ?covered_by, "answered from a covering page");
    app.metrics.cache_hit(ask.parsed.target.route, tier);
    Some(respond::from_cache(
        app,
        &ask.team,
        &ask.parsed.target,
        &entry,
        Answered::Covered,
        ask.req,
        ctx,
    ))
}
