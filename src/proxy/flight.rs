//! In-process request coalescing: concurrent misses for one key share one
//! fetch. The first caller leads; the others follow and receive its outcome.
//! [`Fetched`] and [`Outcome`] are what a page's flight hands its followers
//! ([`super::State::flights`]); an id lookup's flights carry an
//! outcome per piece (`reuse::Buyers`, `reuse`).
//!
//! The leader handle is moved into the task that owns the fetch (see
//! [`super::fetch`]), not kept by a request: a client that hangs up cannot
//! end a flight early. A leader that still goes away without an outcome (its
//! task panicked) releases its followers, who then try again themselves.

use crate::error::GatewayError;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// What one fetch produced, shared with coalesced followers.
#[derive(Debug)]
pub struct Fetched {
    pub(crate) status: StatusCode,
    /// The upstream's headers (only the allow-listed ones reach a team).
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// Credits the upstream charged the leader's team for it (0 when it came
    /// from the cache).
    pub(crate) credits: u64,
    /// Its bill: the upstream's `X-Credits-Request` when that is a number,
    /// or, for an answer from the cache, what it cost when it was bought.
    /// What every reader of an answer's cost goes by (`reuse::learn`).
    pub(crate) bill: Option<u64>,
    /// What the answer is worth to a follower or a later hit: the charge,
    /// bounded by what was reserved (a larger charge is an anomaly that is
    /// settled, not trusted for the future).
    pub(crate) worth: u64,
    /// The answer came from a cache entry (another replica's fetch, or one
    /// stored after the previous flight ended), not from the upstream now.
    pub(crate) from_cache: bool,
    /// The body's ETag on a 200, hashed once for the leader, its followers
    /// and the cache entry alike.
    pub(crate) etag: Option<http::HeaderValue>,
}

/// A flight's result: the answer, or the error that ended it.
pub(crate) type Outcome = Result<Arc<Fetched>, GatewayError>;

pub struct Flights<T> {
    inflight: Arc<Mutex<HashMap<String, watch::Receiver<Option<T>>>>>,
}

impl<T> Default for Flights<T> {
    fn default() -> Self {
        Flights {
            inflight: Arc::default(),
        }
    }
}

pub enum Join<T> {
    /// Fetch, then [`Leader::complete`].
    Leader(Leader<T>),
    /// Wait with [`follow`].
    Follower(watch::Receiver<Option<T>>),
}

pub struct Leader<T> {
    key: String,
    /// Shared only weakly ([`Leader::watch`]): when the leader goes, the
    /// sender goes with it and the followers wake.
    tx: Arc<watch::Sender<Option<T>>>,
    inflight: Arc<Mutex<HashMap<String, watch::Receiver<Option<T>>>>>,
}

impl<T: Clone> Flights<T> {
    pub fn join(&self, key: &str) -> Join<T> {
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(rx) = map.get(key) {
            return Join::Follower(rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        map.insert(key.to_string(), rx);
        Join::Leader(Leader {
            key: key.to_string(),
            tx: Arc::new(tx),
            inflight: self.inflight.clone(),
        })
    }

    /// No flight left behind: every leader ended its flight.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }
}

impl<T> Leader<T> {
    /// A wait on this flight's outcome, for a leader that hands its work to
    /// a task and waits like its followers.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<T>> {
        self.tx.subscribe()
    }

    /// Requests waiting on this flight: its followers, and the leader's own
    /// wait when it [`subscribe`](Leader::subscribe)d. What a test watches
    /// to know a request has joined the flight.
    pub fn waiting(&self) -> usize {
        // One receiver is the flight table's, which each follower clones.
        self.tx.receiver_count().saturating_sub(1)
    }

    /// A look at whether any request still waits on this flight, for work
    /// done on its behalf elsewhere (an id waiting in a batch queue): it
    /// holds no part of the flight.
    pub(crate) fn watch(&self) -> Watch<T> {
        Watch(Arc::downgrade(&self.tx))
    }

    /// Hands the outcome to every follower and ends the flight.
    pub fn complete(self, outcome: T) {
        // Remove first: a caller arriving after this starts its own lookup,
        // which finds the entry just stored.
        self.remove();
        let _ = self.tx.send(Some(outcome));
    }

    fn remove(&self) {
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if map
            .get(&self.key)
            .is_some_and(|rx| rx.same_channel(&self.tx.subscribe()))
        {
            map.remove(&self.key);
        }
    }
}

impl<T> Drop for Leader<T> {
    fn drop(&mut self) {
        // Without an outcome the sender drops here and followers wake with
        // an error; either way the key is free again.
        self.remove();
    }
}

/// Whether a flight is still waited on ([`Leader::watch`]).
pub(crate) struct Watch<T>(std::sync::Weak<watch::Sender<Option<T>>>);

impl<T> Watch<T> {
    /// A request (the leader's own wait, or a follower) still waits: more
    /// receivers than the flight table's own.
    pub(crate) fn waited(&self) -> bool {
        self.0.upgrade().is_some_and(|tx| tx.receiver_count() > 1)
    }
}

/// A follower's wait: the leader's outcome, or `None` when the leader went
/// away without one.
pub(crate) async fn follow<T: Clone>(mut rx: watch::Receiver<Option<T>>) -> Option<T> {
    match rx.wait_for(Option::is_some).await {
        Ok(v) => v.clone(),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn followers_get_the_leaders_outcome() {
        let flights: Flights<u32> = Flights::default();
        let Join::Leader(leader) = flights.join("k") else {
            panic!("first is leader")
        };
        assert_eq!(leader.waiting(), 0);
        let Join::Follower(rx) = flights.join("k") else {
            panic!("second follows")
        };
        assert_eq!(leader.waiting(), 1, "the follower waits on the flight");
        let waiting = tokio::spawn(follow(rx));
        leader.complete(7);
        assert_eq!(waiting.await.unwrap(), Some(7));
        assert!(flights.is_empty());
        assert!(
            matches!(flights.join("k"), Join::Leader(_)),
            "a new flight after completion"
        );
    }

    #[tokio::test]
    async fn a_vanished_leader_releases_its_followers() {
        let flights: Flights<u32> = Flights::default();
        let leader = flights.join("k");
        let Join::Follower(rx) = flights.join("k") else {
            panic!("follows")
        };
        drop(leader);
        assert_eq!(follow(rx).await, None);
        assert!(flights.is_empty());
    }
}
