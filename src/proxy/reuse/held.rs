//! The `held` step: what the tiers hold of a request's pieces, read once
//! for all of them through the tier chain (`Cache::get_many`).

use super::kind::Kind;
use crate::app::App;
use crate::cache::{Entry, Found};
use crate::clock::now_ms;
use crate::proxy::context::Ask;

/// What the tiers hold of a request's pieces.
pub(super) struct Held {
    /// Fresh (and young enough for the client's `max-age`): answers.
    pub(super) fresh: Vec<Option<Found>>,
    /// Within the stale grace: stands in only when the upstream fails.
    pub(super) stale: Vec<Option<Found>>,
}

impl Held {
    pub(super) async fn look<B, K: Kind>(app: &App, ask: &Ask<'_, B>, kind: &K) -> Held {
        let now = now_ms();
        let max_age = ask.directives.max_age;
        let young = |e: &Entry| max_age.is_none_or(|max| e.age(now).as_secs() <= max);
        let found = app.cache.get_many(kind.route(), kind.keys()).await;
        let (fresh, stale) = found
            .into_iter()
            .enumerate()
            .map(|(i, f)| match f {
                Some(_) if !kind.holds(i) => (None, None),
                Some(f) if f.0.is_fresh(now) && young(&f.0) => (Some(f), None),
                other => (None, other),
            })
            .unzip();
        Held { fresh, stale }
    }

    /// Every piece held fresh: nothing to buy.
    pub(super) fn complete(&self) -> bool {
        self.fresh.iter().all(Option::is_some)
    }

    pub(super) fn missing(&self) -> Vec<usize> {
        (0..self.fresh.len()).filter(|i| self.fresh[*i].is_none()).collect()
    }
}
