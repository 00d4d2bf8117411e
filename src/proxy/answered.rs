//! How one request was answered: one [`Answered`] value, set where each
//! answer is made, read once for each thing that tells it — the `X-Cache`
//! header and the `cache` label of `gateway_requests_total`
//! ([`Answered::cache`], the contract's four values), the access line's
//! `answered` field ([`Answered::as_str`]), and why what it saved was saved
//! ([`Answered::saved_reason`]). pingora-cache's single reason value is
//! the model: no path decides "was this a hit?" on its own.

use crate::metrics::{SavedReason, Tier};
use crate::telemetry::access::Answer;

/// How the cache took part in an answer: the `X-Cache` header and the
/// `cache` metric label (a contract: these four values only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    Hit,
    Miss,
    Stale,
    Bypass,
}

impl CacheState {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheState::Hit => "hit",
            CacheState::Miss => "miss",
            CacheState::Stale => "stale",
            CacheState::Bypass => "bypass",
        }
    }

    /// The `X-Cache` header value.
    pub(super) fn header(self) -> &'static str {
        match self {
            CacheState::Hit => "HIT",
            CacheState::Miss => "MISS",
            CacheState::Stale => "STALE",
            CacheState::Bypass => "BYPASS",
        }
    }
}

/// How one request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// By the gateway alone, the cache not asked: refused before the
    /// lookup (a credential, a limit, a bad parameter), `/v2/usage`.
    Gateway,
    /// Its own page, fresh in a tier.
    Held(Tier),
    /// An expired copy: accepted by `max-stale`, served while one refresh
    /// runs (stale-while-revalidate), or standing in for a failed upstream.
    Stale,
    /// Another key's page covers it (`covered`).
    Covered,
    /// Every piece held (an id lookup's records, a window's months).
    Pieces,
    /// Pieces held and pieces this request's calls bought (alone or in a
    /// batch with other requests' ids).
    PiecesBought,
    /// Another request's call answered it (coalesced), or a peer stored it
    /// while it waited.
    Follower,
    /// Its own call.
    Bought,
    /// Its own call although a copy may be held: the client said
    /// `no-cache` (or bounded the age it accepts).
    Refetched,
    /// Its own call, for a page cut to the team's remaining credits.
    Clamped,
    /// The upstream's refusal (422) of this very query, kept from an
    /// earlier call: free, and no call; not a hit of any data.
    KeptRefusal,
    /// A budget refused it (402: the app's, the team's or the company's).
    BudgetRefused,
}

impl Answered {
    /// The `X-Cache` value and the `cache` metric label.
    pub fn cache(self) -> CacheState {
        match self {
            Answered::Held(_) | Answered::Covered | Answered::Pieces | Answered::Follower => CacheState::Hit,
            Answered::Stale => CacheState::Stale,
            Answered::Bought | Answered::PiecesBought | Answered::Clamped => CacheState::Miss,
            Answered::Gateway | Answered::Refetched | Answered::KeptRefusal | Answered::BudgetRefused => {
                CacheState::Bypass
            }
        }
    }

    /// The access line's `answered` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Answered::Gateway => "gateway",
            Answered::Held(Tier::Memory) => "held_memory",
            Answered::Held(Tier::Redis) => "held_redis",
            Answered::Held(Tier::Disk) => "held_disk",
            Answered::Stale => "stale",
            Answered::Covered => "covered",
            Answered::Pieces => "pieces",
            Answered::PiecesBought => "pieces_bought",
            Answered::Follower => "follower",
            Answered::Bought => "bought",
            Answered::Refetched => "refetched",
            Answered::Clamped => "clamped",
            Answered::KeptRefusal => "kept_refusal",
            Answered::BudgetRefused => "budget_refused",
        }
    }

    /// Its two fields of the access line, and their JSON in one piece
    /// (`hit","answered":"held_memory`): a static value each, so a line
    /// carries one pointer (a hit's line is the hot path).
    pub(crate) fn names(self) -> &'static Answer {
        macro_rules! answer {
            ($cache:literal, $answered:literal) => {
                &Answer {
                    cache: $cache,
                    answered: $answered,
                    json: concat!($cache, "\",\"answered\":\"", $answered),
                }
            };
        }
        match self {
            Answered::Gateway => answer!("bypass", "gateway"),
            Answered::Held(Tier::Memory) => answer!("hit", "held_memory"),
            Answered::Held(Tier::Redis) => answer!("hit", "held_redis"),
            Answered::Held(Tier::Disk) => answer!("hit", "held_disk"),
            Answered::Stale => answer!("stale", "stale"),
            Answered::Covered => answer!("hit", "covered"),
            Answered::Pieces => answer!("hit", "pieces"),
            Answered::PiecesBought => answer!("miss", "pieces_bought"),
            Answered::Follower => answer!("hit", "follower"),
            Answered::Bought => answer!("miss", "bought"),
            Answered::Refetched => answer!("bypass", "refetched"),
            Answered::Clamped => answer!("miss", "clamped"),
            Answered::KeptRefusal => answer!("bypass", "kept_refusal"),
            Answered::BudgetRefused => answer!("bypass", "budget_refused"),
        }
    }

    /// Every value, for the docs' table and its test.
    pub const ALL: [Answered; 14] = [
        Answered::Gateway,
        Answered::Held(Tier::Memory),
        Answered::Held(Tier::Redis),
        Answered::Held(Tier::Disk),
        Answered::Stale,
        Answered::Covered,
        Answered::Pieces,
        Answered::PiecesBought,
        Answered::Follower,
        Answered::Bought,
        Answered::Refetched,
        Answered::Clamped,
        Answered::KeptRefusal,
        Answered::BudgetRefused,
    ];

    /// Why a whole answer held for free counts as saved
    /// (`gateway_credits_saved_total{reason}`): a copy the disk tier had
    /// and memory did not is `disk`, every other held answer `cache`.
    /// (Pieces count piece by piece, by their kind's reason.)
    pub(super) fn saved_reason(self) -> SavedReason {
        match self {
            Answered::Held(tier) => SavedReason::of_tier(tier),
            _ => SavedReason::Cache,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_refusal_is_no_hit_and_every_value_has_its_own_name() {
        assert_eq!(Answered::KeptRefusal.cache(), CacheState::Bypass);
        let mut names: Vec<&str> = Answered::ALL.iter().map(|a| a.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Answered::ALL.len());
    }

    #[test]
    fn the_access_line_names_of_each_value_are_its_own() {
        for a in Answered::ALL {
            let names = a.names();
            assert_eq!((names.cache, names.answered), (a.cache().as_str(), a.as_str()));
            assert_eq!(
                names.json,
                format!("{}\",\"answered\":\"{}", names.cache, names.answered)
            );
        }
    }
}
