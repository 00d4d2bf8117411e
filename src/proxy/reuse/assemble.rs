//! The `assemble` step: the answer from the held pieces and what the buy
//! brought, in order, in the vendor's envelope (`crate::page`), answered
//! like a cached entry; STALE pieces stand in when the upstream failed.

use super::held::Held;
use super::kind::{Bought, Got, Kind};
use crate::app::App;
use crate::cache::records::is_absent;
use crate::cache::{Entry, Found, Tier};
use crate::error::GatewayError;
use crate::http_util::Body;
use crate::metrics::{RecordSource, SavedReason};
use crate::proxy::answered::Answered;
use crate::proxy::context::{Ask, RequestContext};
use crate::proxy::fetch::Role;
use crate::proxy::flight::Fetched;
use crate::proxy::respond::{self, saved, saved_because};
use http::{Response, StatusCode};
use std::sync::Arc;

type Answer = Result<Response<Body>, GatewayError>;

/// The answer from the held pieces and what was bought; `None` for the
/// page path.
pub(super) fn answer<B, K: Kind>(
    held: &Held,
    app: &App,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
    kind: &K,
    bought: Bought,
) -> Option<Answer> {
    let target = &ask.parsed.target;
    // Stale on failure: stale pieces for every missing one stand in.
    let covered = (0..held.fresh.len()).all(|i| held.fresh[i].is_some() || held.stale[i].is_some());
    if bought.upstream_failed() && covered {
        let merged: Vec<Option<Found>> = held
            .fresh
            .iter()
            .zip(&held.stale)
            .map(|(f, s)| f.clone().or_else(|| s.clone()))
            .collect();
        let pieces = Assembly::of_held(&merged);
        return Some(Ok(pieces.respond(app, ask, ctx, kind, Answered::Stale)));
    }
    let mut assembly = Assembly::of_held(&held.fresh);
    let mut refused: Option<(Arc<Fetched>, bool)> = None;
    for (i, outcome, paid) in bought.got {
        match outcome {
            Err(e) => return Some(Err(e.unbilled())),
            // An id the upstream refuses (422) refuses the whole request
            // with its position in the list: the page path asks again
            // with the request as sent (a 422 costs nothing).
            Ok(Got::Refused(f)) if f.status == StatusCode::UNPROCESSABLE_ENTITY => return None,
            Ok(Got::Refused(f)) => refused = refused.or(Some((f, paid))),
            Ok(Got::Unknown) if !kind.omits_unknown() => return None,
            Ok(Got::Unknown) => assembly.pieces[i] = None,
            Ok(Got::Held(e)) => assembly.bought(i, e, paid),
        }
    }
    if let Some((f, paid)) = refused {
        let role = if paid { Role::Leader } else { Role::Follower };
        return Some(respond::from_fetched(app, &ask.team, target, f, role, false, ctx));
    }
    if !kind.answers(assembly.count()) {
        return None;
    }
    let answered = if bought.called {
        Answered::PiecesBought
    } else {
        Answered::Pieces
    };
    Some(Ok(assembly.respond(app, ask, ctx, kind, answered)))
}

/// One piece of an answer being assembled.
#[derive(Clone)]
struct Piece {
    entry: Arc<Entry>,
    /// The tier that held it; `None`: bought for this request.
    tier: Option<Tier>,
    /// Bought by another request (or found in the cache by this one's
    /// call): credits this team did not spend.
    free: bool,
}

/// The pieces of an answer, in order.
struct Assembly {
    pieces: Vec<Option<Piece>>,
}

impl Assembly {
    fn of_held(held: &[Option<Found>]) -> Assembly {
        let pieces = held
            .iter()
            .map(|h| {
                h.as_ref().map(|(entry, tier)| Piece {
                    entry: entry.clone(),
                    tier: Some(*tier),
                    free: false,
                })
            })
            .collect();
        Assembly { pieces }
    }

    fn bought(&mut self, i: usize, entry: Arc<Entry>, paid: bool) {
        self.pieces[i] = Some(Piece {
            entry,
            tier: None,
            free: !paid,
        });
    }

    /// Pieces in the answer (absences are not).
    fn count(&self) -> usize {
        self.pieces.iter().flatten().filter(|p| !is_absent(&p.entry)).count()
    }

    /// The page as the upstream writes it, answered like a cached entry
    /// (ETag, 304, `Age` of the oldest held piece used); its metrics and
    /// what it saved.
    fn respond<B, K: Kind>(
        &self,
        app: &App,
        ask: &Ask<'_, B>,
        ctx: &mut RequestContext,
        kind: &K,
        answered: Answered,
    ) -> Response<Body> {
        self.tally(app, ask, kind);
        let used: Vec<&Piece> = self.pieces.iter().flatten().filter(|p| !is_absent(&p.entry)).collect();
        let body = crate::page::assemble(used.iter().map(|p| &p.entry.body[..]));
        let route = ask.parsed.target.route;
        let ttl = app.cache.ttl(route).unwrap_or_default();
        let mut page = Entry::new(body, ctx.credits, ttl, route);
        let oldest = used
            .iter()
            .filter(|p| p.tier.is_some())
            .map(|p| p.entry.stored_at_ms)
            .min();
        if let Some(oldest) = oldest {
            page.stored_at_ms = page.stored_at_ms.min(oldest);
        }
        // The oldest release of a held piece used (a piece bought now is
        // of the current one).
        ctx.release = used
            .iter()
            .filter(|p| p.tier.is_some())
            .map(|p| app.cache.release.of(&p.entry))
            .filter(|day| *day != 0)
            .min()
            .unwrap_or(0);
        ctx.answered = answered;
        respond::from_entry(&page, answered.cache(), ctx.conditional.then(|| ask.req.headers()))
    }

    /// Counts each piece by where it came from; the held ones and those
    /// another request bought are credits this team did not spend (those
    /// the disk tier had and memory did not under `reason="disk"`).
    fn tally<B, K: Kind>(&self, app: &App, ask: &Ask<'_, B>, kind: &K) {
        let (team, target) = (&ask.team, &ask.parsed.target);
        let (mut cached, mut absent, mut upstream) = (0, 0, 0);
        let (mut disk, mut held, mut free) = (0, 0, 0);
        for p in self.pieces.iter().flatten() {
            let credits = p.entry.credits;
            match p.tier {
                _ if is_absent(&p.entry) => absent += 1,
                Some(tier) => {
                    cached += 1;
                    if tier == Tier::Disk {
                        disk += credits;
                    } else {
                        held += credits;
                    }
                }
                None => {
                    upstream += 1;
                    if p.free {
                        free += credits;
                    }
                }
            }
        }
        let route = target.route;
        for (source, n) in [
            (RecordSource::Cache, cached),
            (RecordSource::Absent, absent),
            (RecordSource::Upstream, upstream),
        ] {
            app.metrics.cache_records(route, source, n);
        }
        let who = (&**team, Some(&*ask.member));
        saved_because(app, who, target, disk, SavedReason::Disk);
        saved_because(app, who, target, held, kind.reason());
        if free > 0 {
            app.metrics.coalesced(route);
            saved(app, who, target, free);
        }
    }
}
