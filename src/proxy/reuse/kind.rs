//! What the engine asks of each way of answering from held pieces
//! ([`Kind`]), and what it learns of each piece it buys ([`Got`]).

use crate::cache::records::IdList;
use crate::cache::{Cache, Entry};
use crate::error::GatewayError;
use crate::metrics::SavedReason;
use crate::page::Page;
use crate::proxy::fetch;
use crate::proxy::flight::Fetched;
use crate::route::{Route, Target};
use bytes::Bytes;
use http::StatusCode;
use std::sync::Arc;

/// One way of answering from held pieces.
pub(crate) trait Kind: Clone + Send + Sync + 'static {
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
    /// The id list this is, when its pieces are ids that a call of several
    /// requests can carry together (`batch`).
    fn ids(&self) -> Option<&IdList> {
        None
    }
}

/// How a kind's missing pieces are bought once however requests overlap.
pub(crate) enum Buying {
    /// Each piece its own flight in process and its own lease across
    /// replicas; one call for all the pieces a request leads.
    PerPiece,
    /// One buyer at a time per name (in process and across replicas), who
    /// reads what is held again once its turn comes.
    Turn(String),
}

/// A call's answer, piece by piece.
pub(crate) struct Read {
    /// Each wanted piece's bytes, when the answer has it.
    pub(super) pieces: Vec<Option<Bytes>>,
    /// Items of the answer that are none of the wanted pieces.
    pub(super) foreign: usize,
}

/// What a buy learned about one piece it bought or waited for.
#[derive(Debug, Clone)]
pub(crate) enum Got {
    /// Its entry, or its absence (an empty body).
    Held(Arc<Entry>),
    /// The answer that was to bring it cannot vouch for it: not filed.
    Unknown,
    /// The upstream answered the call that was to buy it with an error
    /// status (402, 404, 422): that answer stands for it.
    Refused(Arc<Fetched>),
}

/// A piece's outcome: what its buy learned, or the error that ended it.
pub(crate) type PieceOutcome = Result<Got, GatewayError>;

/// What the buy step brought.
pub(super) struct Bought {
    /// Each piece it bought or waited for: its index, outcome, and whether
    /// this request paid for it.
    pub(super) got: Vec<(usize, PieceOutcome, bool)>,
    /// Whether this request's own calls reached the upstream.
    pub(super) called: bool,
}

impl Bought {
    pub(super) fn nothing() -> Bought {
        Bought {
            got: Vec::new(),
            called: false,
        }
    }

    /// The upstream failed for some piece (`fetch::upstream_failed`, the
    /// one rule on every path).
    pub(super) fn upstream_failed(&self) -> bool {
        self.got.iter().any(|(_, o, _)| match o {
            Ok(Got::Refused(f)) => fetch::upstream_failed(&Ok(f.clone())),
            Ok(_) => false,
            Err(e) => e.upstream_failed(),
        })
    }
}
