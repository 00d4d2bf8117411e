//! What a batch's call asks, decided as it leaves: the ids of its buyers
//! that the cache tiers hold by now (a search, a page, another replica's
//! call brought them while they waited) are answered from there and not
//! asked; a buyer whose ids are all held leaves the call with its credits
//! released; the call asks the rest, as one list.

use super::queue::{Buyer, Share};
use crate::app::App;
use crate::cache::records::IdList;
use crate::cache::Entry;
use crate::proxy::reuse::kind::{Got, PieceOutcome};
use std::sync::Arc;

/// Where one of a buyer's ids is answered from.
#[derive(Clone)]
pub(super) enum Source {
    /// Its place in the call's list.
    Asked(usize),
    /// The cache tiers, which hold it now.
    Held(Arc<Entry>),
}

impl Source {
    /// Its place in the call's list, when the call asks it.
    pub(super) fn asked(&self) -> Option<usize> {
        match self {
            Source::Asked(at) => Some(*at),
            Source::Held(_) => None,
        }
    }

    /// Its outcome, from the call's (`got`, by place in its list).
    pub(super) fn outcome(&self, got: &[PieceOutcome]) -> PieceOutcome {
        match self {
            Source::Asked(at) => got[*at].clone(),
            Source::Held(entry) => Ok(Got::Held(entry.clone())),
        }
    }
}

/// What each buyer's ids are held as now, in one look at the tiers for
/// all (`None`: still missing). A buyer with `max-age` (a `no_cache` job)
/// takes nothing held, as at its own look.
async fn held(app: &App, buyers: &[Buyer]) -> Vec<Vec<Option<Arc<Entry>>>> {
    let route = buyers[0].stake.job.target.route;
    let looked = |b: &&Buyer| !b.stake.job.no_cache;
    let keys: Vec<String> = buyers
        .iter()
        .filter(looked)
        .flat_map(|b| b.order.wanted.iter().map(|i| b.order.list.keys[*i].clone()))
        .collect();
    let now = crate::clock::now_ms();
    let mut found = if keys.is_empty() {
        Vec::new()
    } else {
        app.cache.get_many(route, &keys).await
    }
    .into_iter()
    .map(|f| f.map(|(e, _)| e).filter(|e| e.is_fresh(now)));
    buyers
        .iter()
        .map(|b| {
            let n = b.order.wanted.len();
            if looked(&b) {
                found.by_ref().take(n).collect()
            } else {
                vec![None; n]
            }
        })
        .collect()
}

/// The call's buyers, each with where its ids are answered from, and the
/// call's list; buyers whose ids are all held are answered now, charged
/// nothing. `None` when no buyer is left to call for.
pub(super) async fn leaving(app: &App, buyers: Vec<Buyer>) -> Option<(Vec<Buyer>, Vec<Vec<Source>>, IdList)> {
    let first = &buyers.first()?.order.list;
    let mut list = IdList {
        resource: first.resource,
        path: first.path.clone(),
        ids: Vec::new(),
        keys: Vec::new(),
    };
    let held = held(app, &buyers).await;
    let (mut calling, mut at) = (Vec::new(), Vec::new());
    for (b, held) in buyers.into_iter().zip(held) {
        if held.iter().all(Option::is_some) {
            let got = held.into_iter().flatten().map(|e| Ok(Got::Held(e))).collect();
            b.stake.release(app).await;
            let _ = b.order.done.send(Share { got, charged: 0 });
            continue;
        }
        let sources = b
            .order
            .wanted
            .iter()
            .zip(held)
            .map(|(i, held)| match held {
                Some(entry) => Source::Held(entry),
                None => {
                    list.ids.push(b.order.list.ids[*i].clone());
                    list.keys.push(b.order.list.keys[*i].clone());
                    Source::Asked(list.ids.len() - 1)
                }
            })
            .collect();
        at.push(sources);
        calling.push(b);
    }
    (!calling.is_empty()).then_some((calling, at, list))
}
