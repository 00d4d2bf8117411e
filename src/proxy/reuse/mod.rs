//! Answers built from held pieces: the one engine behind id lookups
//! (records any earlier answer brought) and monthly-metrics windows (rows
//! of months any earlier window bought), and behind whatever answers from
//! held pieces next.
//!
//! ```text
//!  request ─► Pieces (memoized with the target: which pieces, their keys)
//!     │
//!  held       Cache::get_many: memory → disk → Redis, once for all keys
//!     │        ├─ all fresh ─────────────────────────────► assemble (HIT)
//!     │        └─ some missing (HEAD / only-if-cached: the page path says no)
//!  buy once   per_piece: a flight and a lease per piece, one call for the
//!     │                  pieces this request leads          (id lookups)
//!     │       turn:      one buyer per series at a time, held read again,
//!     │                  one call for the smallest cover    (monthly windows)
//!  file       learn: what the call says of each piece, filed when the
//!     │       answer is trustworthy (a page of these pieces, billed one
//!     │       credit each)
//!  assemble   held + bought, in order, in the vendor's envelope (`crate::page`);
//!             STALE pieces stand in when the upstream failed
//! ```
//!
//! A user of the engine is a [`Kind`]: which keys, which held entry may
//! stand for which piece, the call that buys some of them, and how to read
//! that call's answer (`kind.rs`). `ids.rs` and `window.rs` are the two; a
//! third way of answering from held pieces is one more such file.
//!
//! **What a piece cost, one rule.** Every answer a call brings carries its
//! bill (`Fetched::bill`: the upstream's `X-Credits-Request`, or what an
//! answer found in the cache cost when it was bought), so an answer from
//! the cache and one from the upstream are read alike. Every call this
//! request pays for adds its charge to the request's credits
//! (`RequestContext::charge`), and the answer's `X-Credits-Request` and
//! access line are that sum, whatever path the request ends on (a window
//! that buys its missing months and then falls back to a page pays both,
//! and says so). An answer whose bill is missing or is not one credit per
//! piece is charged as the page path charges it and answers this request,
//! but files nothing.

mod assemble;
mod batch;
mod held;
mod ids;
mod kind;
mod learn;
mod per_piece;
mod turn;
mod window;

use super::context::{Ask, Pieces, RequestContext};
use super::flight::{Flights, Outcome};
use crate::app::App;
use crate::error::GatewayError;
use crate::http_util::Body;
use held::Held;
use http::{Method, Response};
use kind::{Bought, Buying, Kind};
use std::sync::Arc;

type Answer = Result<Response<Body>, GatewayError>;

/// What the engine keeps between requests so that a piece is bought once:
/// the pieces being bought in this process, and whose turn it is to buy a
/// series. A field of the request path's `State`.
#[derive(Default)]
pub(crate) struct Buyers {
    /// Per-piece flights (`per_piece`).
    pieces: per_piece::PieceFlights,
    /// Ids waiting for a call, by route (`batch`).
    batches: batch::Batches,
    /// Turns at buying a series (`turn`).
    turns: turn::SeriesTurns,
}

/// The `lookup_pieces` phase: the answer of a request made of held pieces,
/// or `None` for the page path. `flights` are the pages' own: a window's
/// call is coalesced with any page request of the same key.
pub(super) async fn lookup_pieces<B>(
    app: &Arc<App>,
    buyers: &Buyers,
    flights: &Flights<Outcome>,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
) -> Option<Answer> {
    match ask.parsed.pieces.as_ref()? {
        Pieces::Ids(ids) => engine(app, buyers, flights, ask, ctx, ids).await,
        Pieces::Window(window) => engine(app, buyers, flights, ask, ctx, window).await,
    }
}

/// held → missing → buy once → file → assemble.
async fn engine<B, K: Kind>(
    app: &Arc<App>,
    buyers: &Buyers,
    flights: &Flights<Outcome>,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
    kind: &K,
) -> Option<Answer> {
    if ask.directives.no_cache {
        return None;
    }
    let mut held = Held::look(app, ask, kind).await;
    if held.complete() {
        return assemble::answer(&held, app, ask, ctx, kind, Bought::nothing());
    }
    // Like only-if-cached, a HEAD never buys: the page path says so.
    if ask.directives.only_if_cached || ask.req.method() == Method::HEAD {
        return None;
    }
    // The upstream refused this very request a moment ago: the page path
    // answers with its kept refusal, and no piece is bought for it.
    if ask
        .parsed
        .key
        .as_deref()
        .is_some_and(|k| app.cache.refusals.get(k).is_some())
    {
        return None;
    }
    let job = ask.job(&ctx.request_id);
    let (bought, charged) = match kind.buying() {
        Buying::PerPiece => {
            per_piece::gather(app, (&buyers.pieces, &buyers.batches), &job, kind, &held.missing()).await
        }
        Buying::Turn(name) => {
            let turn = turn::take(app, &buyers.turns, &name).await;
            // Read again in our turn: what the last buyer filed is held now.
            held = Held::look(app, ask, kind).await;
            let bought = if held.complete() {
                Some((Bought::nothing(), 0))
            } else {
                turn::buy(app, flights, job, kind, &held).await
            };
            turn.end().await;
            bought?
        }
    };
    // Before anything else: a request handed back to the page path has
    // still paid for this call.
    ctx.charge(charged);
    assemble::answer(&held, app, ask, ctx, kind, bought)
}
