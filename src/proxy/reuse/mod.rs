//! Answers built from held pieces: the one engine behind id lookups
//! (records any earlier answer brought) and monthly-metrics windows (rows
//! of months any earlier window bought), and behind whatever answers from
//! held pieces next.
//!
//! ```text
//!  request ─► Pieces (memoized with the target: which pieces, their keys)
//!     │
//!  1. held     Cache::get_many: memory → disk → Redis, once for all keys
//!     │        ├─ all fresh ───────────────────────────────► 4. assemble (HIT)
//!     │        └─ some missing (HEAD / only-if-cached: the page path says no)
//!  2. buy once per_piece: a flight and a lease per piece, one call for the
//!     │                   pieces this request leads           (id lookups)
//!     │        turn:      one buyer per series at a time, held read again,
//!     │                   one call for the smallest cover     (monthly windows)
//!  3. file     learn: what the call says of each piece, filed when the
//!     │        answer is trustworthy (a page of these pieces, billed one
//!     │        credit each)
//!  4. assemble held + bought, in order, in the vendor's envelope (`crate::page`);
//!              STALE pieces stand in when the upstream failed
//! ```
//!
//! A user of the engine is a [`Kind`]: which keys, which held entry may
//! stand for which piece, the call that buys some of them, and how to read
//! that call's answer. `ids.rs` and `window.rs` are the two; a third way
//! of answering from held pieces is one more such file.
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

mod ids;
mod learn;
mod per_piece;
mod turn;
mod window;

pub(super) use per_piece::PieceFlights;
pub(super) use turn::Turns;

use super::context::{Ask, CacheState, Pieces, RequestContext};
use super::fetch::{self, Role};
use super::flight::Fetched;
use super::respond::{self, saved, saved_because};
use super::state::State;
use crate::app::App;
use crate::cache::records::is_absent;
use crate::cache::{Cache, Entry, Found, Tier};
use crate::clock::now_ms;
use crate::error::GatewayError;
use crate::http_util::Body;
use crate::metrics::{RecordSource, SavedReason};
use crate::page::Page;
use crate::route::{Route, Target};
use bytes::Bytes;
use http::{Method, Response, StatusCode};
use std::sync::Arc;

type Answer = Result<Response<Body>, GatewayError>;

/// One way of answering from held pieces.
pub(super) trait Kind: Clone + Send + Sync + 'static {
    /// The route whose key space holds the pieces (their L2 keys; a purge
    /// of it drops them).
    fn route(&self) -> Route;
    /// Each piece's cache key, in the answer's order.
    fn keys(&self) -> &[String];
    /// Whether a held entry may stand for piece `i`; also whether what a
    /// call brings for it is filed.
    fn holds(&self, i: usize) -> bool;
    /// Why the held pieces an answer uses count as saved.
    fn reason(&self) -> SavedReason;
    /// Whether `n` pieces, nothing following, are the upstream's answer
    /// (a window with no row is its 404; one past `size` a page with a
    /// cursor).
    fn answers(&self, n: usize) -> bool;
    /// Whether pieces an answer cannot vouch for may be left out of it (an
    /// id lookup omits ids the upstream does not return), or the request
    /// must go to the page path instead (a window cannot skip a month).
    fn omits_unknown(&self) -> bool;
    /// How its missing pieces are bought.
    fn buying(&self) -> Buying;
    /// The one call that buys the pieces `wanted`, `kept` other pieces
    /// answering beside them; `None` when no such call can (the page path
    /// then answers).
    fn call(&self, wanted: &[usize], kept: u64) -> Option<Target>;
    /// Each of `wanted`'s piece in `page` (an answer to `call(wanted)`, read
    /// from `body`), and the count of items that are none of them; `None`
    /// when the answer is not a page of these pieces.
    fn read(&self, wanted: &[usize], body: &Bytes, page: &Page<'_>) -> Option<Read>;
    /// The entry for piece `i` bought now (`body` empty: its absence).
    fn entry(&self, cache: &Cache, i: usize, body: Bytes) -> Entry;
    /// Whether an answer of `status` says that none of the pieces asked
    /// exist (the monthly routes' 404 "No ... metrics found").
    fn none_found(&self, status: StatusCode) -> bool;
}

/// How a kind's missing pieces are bought once however requests overlap.
pub(super) enum Buying {
    /// Each piece its own flight in process and its own lease across
    /// replicas; one call for all the pieces a request leads.
    PerPiece,
    /// One buyer at a time per name (in process and across replicas), who
    /// reads what is held again once its turn comes.
    Turn(String),
}

/// A call's answer, piece by piece.
pub(super) struct Read {
    /// Each wanted piece's bytes, when the answer has it.
    pieces: Vec<Option<Bytes>>,
    /// Items of the answer that are none of the wanted pieces.
    foreign: usize,
}

/// What a buy learned about one piece it bought or waited for.
#[derive(Debug, Clone)]
pub(super) enum Got {
    /// Its entry, or its absence (an empty body).
    Held(Arc<Entry>),
    /// The answer that was to bring it cannot vouch for it: not filed.
    Unknown,
    /// The upstream answered the call that was to buy it with an error
    /// status (402, 404, 422): that answer stands for it.
    Refused(Arc<Fetched>),
}

/// A piece's outcome: what its buy learned, or the error that ended it.
pub(super) type PieceOutcome = Result<Got, GatewayError>;

/// What the buy step brought.
struct Bought {
    /// Each piece it bought or waited for: its index, outcome, and whether
    /// this request paid for it.
    got: Vec<(usize, PieceOutcome, bool)>,
    /// Whether this request's own calls reached the upstream.
    called: bool,
}

/// The answer of a request made of held pieces, or `None` for the page path.
pub(super) async fn answer<B>(
    app: &Arc<App>,
    state: &State,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
) -> Option<Answer> {
    match ask.parsed.pieces.as_ref()? {
        Pieces::Ids(ids) => engine(app, state, ask, ctx, ids).await,
        Pieces::Window(window) => engine(app, state, ask, ctx, window).await,
    }
}

/// held → missing → buy once → file → assemble.
async fn engine<B, K: Kind>(
    app: &Arc<App>,
    state: &State,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
    kind: &K,
) -> Option<Answer> {
    if ask.directives.no_cache {
        return None;
    }
    let mut held = Held::look(app, ask, kind).await;
    if held.missing().is_empty() {
        return held.answer(app, ask, ctx, kind, None);
    }
    // Like only-if-cached, a HEAD never buys: the page path says so.
    if ask.directives.only_if_cached || ask.req.method() == Method::HEAD {
        return None;
    }
    let job = ask.job(&ctx.request_id);
    let bought = match kind.buying() {
        Buying::PerPiece => per_piece::gather(app, &state.piece_flights, &job, kind, &held.missing()).await,
        Buying::Turn(name) => {
            let turn = turn::take(app, &state.turns, &name).await;
            // Read again in our turn: what the last buyer filed is held now.
            held = Held::look(app, ask, kind).await;
            let bought = if held.missing().is_empty() {
                Some((Bought::nothing(), 0))
            } else {
                turn::buy(app, &state.flights, job, kind, &held).await
            };
            turn.end().await;
            bought?
        }
    };
    let (bought, charged) = bought;
    ctx.charge(charged);
    held.answer(app, ask, ctx, kind, Some(bought))
}

impl Bought {
    fn nothing() -> Bought {
        Bought {
            got: Vec::new(),
            called: false,
        }
    }

    /// The upstream failed for some piece (`fetch::upstream_failed`, the
    /// one rule on every path).
    fn upstream_failed(&self) -> bool {
        self.got.iter().any(|(_, o, _)| match o {
            Ok(Got::Refused(f)) => fetch::upstream_failed(&Ok(f.clone())),
            Ok(_) => false,
            Err(e) => e.upstream_failed(),
        })
    }
}

/// What the tiers hold of a request's pieces.
struct Held {
    /// Fresh (and young enough for the client's `max-age`): answers.
    fresh: Vec<Option<Found>>,
    /// Within the stale grace: stands in only when the upstream fails.
    stale: Vec<Option<Found>>,
}

impl Held {
    async fn look<B, K: Kind>(app: &App, ask: &Ask<'_, B>, kind: &K) -> Held {
        let now = now_ms();
        let max_age = ask.directives.max_age;
        let young = |e: &Entry| max_age.is_none_or(|max| e.age(now).as_secs() <= max);
        let found = app.cache.get_many(kind.route(), kind.keys()).await;
        let (fresh, stale) = found
            .into_iter()
            .enumerate()
            .map(|(i, f)| match f {
                Some(f) if !kind.holds(i) => {
                    drop(f);
                    (None, None)
                }
                Some(f) if f.0.is_fresh(now) && young(&f.0) => (Some(f), None),
                other => (None, other),
            })
            .unzip();
        Held { fresh, stale }
    }

    fn missing(&self) -> Vec<usize> {
        (0..self.fresh.len()).filter(|i| self.fresh[*i].is_none()).collect()
    }

    /// The answer from the held pieces and what was bought; `None` for the
    /// page path.
    fn answer<B, K: Kind>(
        &self,
        app: &App,
        ask: &Ask<'_, B>,
        ctx: &mut RequestContext,
        kind: &K,
        bought: Option<Bought>,
    ) -> Option<Answer> {
        let bought = bought.unwrap_or_else(Bought::nothing);
        let target = &ask.parsed.target;
        // Stale on failure: stale pieces for every missing one stand in.
        let covered = (0..self.fresh.len()).all(|i| self.fresh[i].is_some() || self.stale[i].is_some());
        if bought.upstream_failed() && covered {
            let merged: Vec<Option<Found>> = self
                .fresh
                .iter()
                .zip(&self.stale)
                .map(|(f, s)| f.clone().or_else(|| s.clone()))
                .collect();
            let pieces = Assembly::of_held(&merged);
            return Some(Ok(pieces.respond(app, ask, ctx, kind, CacheState::Stale)));
        }
        let mut assembly = Assembly::of_held(&self.fresh);
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
        let state = if bought.called {
            CacheState::Miss
        } else {
            CacheState::Hit
        };
        Some(Ok(assembly.respond(app, ask, ctx, kind, state)))
    }
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
        state: CacheState,
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
        ctx.cache = state;
        respond::from_entry(&page, state, ask.req.headers())
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
        saved_because(app, team, target, disk, SavedReason::Disk);
        saved_because(app, team, target, held, kind.reason());
        if free > 0 {
            app.metrics.coalesced(route);
            saved(app, team, target, free);
        }
    }
}
