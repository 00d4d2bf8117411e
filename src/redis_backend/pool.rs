//! The connections of one [`super::RedisBackend`]: a few multiplexed
//! connections to the same target, each call on the next one.
//!
//! One multiplexed connection is one socket driven by one task: every
//! command of every core goes through it, and on a many-core machine the
//! Redis tier waited on it (measured: 5.2 of 8 cores busy, Redis at 0.7).
//! A few sockets let the runtime drive them on several cores at once. Each
//! connection keeps its own reconnecting (`ConnectionManager`, the cluster
//! client, the Sentinel look-up), so a dropped socket costs only the calls
//! that were on it, and those are retried where that is safe
//! (`call_reconnecting`).

use super::conn::Conn;
use std::cell::Cell;

thread_local! {
    /// Where this thread's next call goes. Per thread, not one shared atomic:
    /// a counter written by every call of every core is the cache line this
    /// pool is here to stop bouncing. Each worker walks the pool in turn, so
    /// the calls of one worker, and of all of them, spread evenly.
    static NEXT: Cell<usize> = const { Cell::new(0) };
}

pub(super) struct Pool {
    /// Never empty (`new`).
    conns: Box<[Conn]>,
}

impl Pool {
    /// `conns` must hold at least one connection.
    pub(super) fn new(conns: Vec<Conn>) -> Pool {
        assert!(!conns.is_empty(), "a Redis pool needs a connection");
        Pool { conns: conns.into() }
    }

    /// The connection for the next call.
    pub(super) fn next(&self) -> &Conn {
        let n = self.conns.len();
        if n == 1 {
            return &self.conns[0];
        }
        let i = NEXT.with(|next| {
            let i = next.get();
            next.set(i.wrapping_add(1));
            i
        });
        &self.conns[i % n]
    }

    /// The first connection: its kind is every connection's kind.
    pub(super) fn first(&self) -> &Conn {
        &self.conns[0]
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Conn> {
        self.conns.iter()
    }
}
