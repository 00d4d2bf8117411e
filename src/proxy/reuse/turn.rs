//! [`Buying::Turn`](super::kind::Buying): one buyer at a time per name (a
//! monthly series), in this process ([`SeriesTurns`]) and across replicas (the
//! name's lease), so that the next buyer reads what the last one filed
//! instead of buying it again; then one call for the smallest cover of the
//! pieces still missing, coalesced on its page key like any page.
//!
//! Only buying takes a turn: a request whose pieces are all held never
//! waits. Without Redis, when Redis does not answer, or after
//! `cache.coalesce_wait_ms`, a replica buys without the lease rather than
//! wait longer.

use super::held::Held;
use super::kind::{Bought, Kind};
use super::learn::learn;
use crate::app::App;
use crate::cache::key;
use crate::cache::lease::{Acquired, Lease};
use crate::cache::records::is_absent;
use crate::proxy::context::Job;
use crate::proxy::fetch::{self, Role};
use crate::proxy::flight::{Flights, Outcome};
use crate::redis_backend::keys;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// Turns at buying a series, by name: a live turn per name being bought, so the map stays small.
#[derive(Default)]
pub(crate) struct SeriesTurns(Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>);

/// A turn held: in this process and, when Redis gave it, across replicas.
pub(super) struct SeriesTurn {
    _local: tokio::sync::OwnedMutexGuard<()>,
    lease: Option<Lease>,
}

impl SeriesTurn {
    /// Ends the turn: the lease released, then the next buyer here goes.
    pub(super) async fn end(self) {
        if let Some(lease) = self.lease {
            lease.release().await;
        }
    }
}

/// Waits for `name`'s turn, here and across replicas.
pub(super) async fn take(app: &App, turns: &SeriesTurns, name: &str) -> SeriesTurn {
    let local = {
        let mut map = turns.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, t| t.strong_count() > 0);
        match map.get(name).and_then(Weak::upgrade) {
            Some(turn) => turn,
            None => {
                let turn = Arc::new(tokio::sync::Mutex::new(()));
                map.insert(name.to_string(), Arc::downgrade(&turn));
                turn
            }
        }
    };
    let local = local.lock_owned().await;
    SeriesTurn {
        _local: local,
        lease: lease(app, &keys::series_key(name)).await,
    }
}

/// The name's lease across replicas: taken, or waited for until its holder
/// releases it (its pieces then filed in Redis) or `cache.coalesce_wait_ms`
/// passes. `None` without Redis, when Redis does not answer, or after the
/// wait.
async fn lease(app: &App, key: &str) -> Option<Lease> {
    let deadline = Instant::now() + Duration::from_millis(app.config.cache.coalesce_wait_ms);
    loop {
        match app.leases.acquire(key).await {
            Acquired::Owned(lease) => return Some(lease),
            Acquired::Unavailable => return None,
            Acquired::Taken => {
                let left = deadline.saturating_duration_since(Instant::now());
                if !app.leases.wait_released(key, left).await {
                    return None;
                }
            }
        }
    }
}

/// One call for the smallest run of pieces that covers every missing one
/// (the held pieces inside it are bought again with it), coalesced on the
/// call's page key; `None` when no call can (the page path answers).
pub(super) async fn buy<K: Kind>(
    app: &Arc<App>,
    flights: &Flights<Outcome>,
    mut job: Job,
    kind: &K,
    held: &Held,
) -> Option<(Bought, u64)> {
    let missing = held.missing();
    let (first, last) = (*missing.first()?, *missing.last()?);
    let wanted: Vec<usize> = (first..=last).collect();
    let kept = (0..held.fresh.len())
        .filter(|i| *i < first || *i > last)
        .filter(|i| held.fresh[*i].as_ref().is_some_and(|(e, _)| !is_absent(e)))
        .count() as u64;
    job.target = kind.call(&wanted, kept)?;
    job.key = Some(key::cache_key(&job.target));
    let (outcome, role) = fetch::coalesce(app, flights, job.clone()).await;
    let paid = role == Role::Leader && outcome.as_ref().is_ok_and(|f| !f.from_cache);
    let charged = fetch::charged(&outcome, role);
    let called = role == Role::Leader && outcome.as_ref().map_or(true, |f| !f.from_cache);
    let got = learn(app, kind, &wanted, &job, outcome).await;
    let got = wanted.into_iter().zip(got).map(|(i, o)| (i, o, paid)).collect();
    Some((Bought { got, called }, charged))
}
