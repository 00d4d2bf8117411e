//! The open connections of one listener, and room made for newcomers.
//!
//! At `server.max_connections`, a newly accepted connection takes the place
//! of one with no request in flight: the oldest that never sent a complete
//! head, else the oldest idle keep-alive or stuck writing to a client that
//! stopped reading. Without
//! that, sockets that never send a byte would hold every place until their
//! deadline, then be replaced by the next wave, and a real client queued
//! behind them in the kernel's backlog would wait a deadline per wave. Only
//! when every connection has a request in flight does a newcomer wait.
//!
//! Each connection's driver (`conn.rs`) obeys the [`Order`] sent to it here:
//! keep serving, drain (graceful shutdown), or close now.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// What a connection's driver is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Serve,
    /// Finish what is in flight, take nothing new (shutdown).
    Drain,
    /// Drop the connection now (evicted, or the shutdown grace ran out).
    Close,
}

/// The registry of one listener's connections, oldest first.
pub struct Conns {
    max: usize,
    open: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    /// A connection closed or went idle: the accept loop may find room.
    changed: Arc<Notify>,
}

/// One connection's shared state: written by its request handlers, read by
/// its driver and by the registry when it looks for room.
pub struct Conn {
    id: u64,
    born: Instant,
    in_flight: AtomicUsize,
    started: AtomicBool,
    http2: AtomicBool,
    /// Milliseconds after `born` when the last request finished.
    idle_since_ms: AtomicU64,
    orders: watch::Sender<Order>,
    changed: Arc<Notify>,
}

/// A connection's place in the registry; dropping it frees the place.
pub struct Slot {
    conns: Arc<Conns>,
    conn: Arc<Conn>,
}

/// A request in flight on a connection, until dropped.
pub struct InFlight(Arc<Conn>);

impl Conns {
    pub fn new(max: usize) -> Arc<Conns> {
        Arc::new(Conns {
            max: max.max(1),
            open: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            changed: Arc::new(Notify::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        // The map stays consistent even if a holder panicked: plain inserts and removes.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection just accepted: a free one, or the place of
    /// the oldest connection with nothing in flight (told to close). Waits
    /// only while every open connection has a request in flight.
    pub async fn admit(self: &Arc<Self>) -> Slot {
        loop {
            {
                let mut open = self.lock();
                if open.len() < self.max {
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let conn = Arc::new(Conn::new(id, self.changed.clone()));
                    open.insert(id, conn.clone());
                    return Slot {
                        conns: self.clone(),
                        conn,
                    };
                }
                // One place per newcomer: while an evicted connection is
                // still on its way out, wait for it rather than evict more.
                let closing = open.values().any(|c| *c.orders.borrow() == Order::Close);
                // Those that never sent a head go first: under a flood of
                // silent sockets, idle keep-alive clients keep their place.
                let victim = open
                    .values()
                    .filter(|c| c.evictable())
                    .min_by_key(|c| (c.started(), c.id));
                if let Some(victim) = victim.filter(|_| !closing) {
                    tracing::debug!(connection = victim.id, "connection limit: closing an idle connection");
                    victim.order(Order::Close);
                }
            }
            // Woken when the victim's place is freed or another goes idle.
            self.changed.notified().await;
        }
    }

    /// Sends `order` to every open connection.
    pub fn order_all(&self, order: Order) {
        for conn in self.lock().values() {
            conn.order(order);
        }
    }

    /// Resolves once no connection is open.
    pub async fn all_closed(&self) {
        loop {
            if self.lock().is_empty() {
                return;
            }
            self.changed.notified().await;
        }
    }
}

impl Conn {
    fn new(id: u64, changed: Arc<Notify>) -> Conn {
        Conn {
            id,
            born: Instant::now(),
            in_flight: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            http2: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            orders: watch::channel(Order::Serve).0,
            changed,
        }
    }

    fn order(&self, order: Order) {
        // Close overrides Drain; nothing overrides Close.
        self.orders.send_if_modified(|current| {
            let stronger = matches!((*current, order), (Order::Serve, _) | (Order::Drain, Order::Close));
            if stronger {
                *current = order;
            }
            stronger
        });
    }

    pub fn orders(&self) -> watch::Receiver<Order> {
        self.orders.subscribe()
    }

    fn evictable(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0 && *self.orders.borrow() != Order::Close
    }

    /// Marks a request as started (its head arrived) until the guard drops.
    pub fn begin(self: &Arc<Self>, http2: bool) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.started.store(true, Ordering::Release);
        if http2 {
            self.http2.store(true, Ordering::Relaxed);
        }
        InFlight(self.clone())
    }

    /// Whether a complete request head has arrived yet.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    pub fn http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    /// How long nothing has been in flight; `None` while something is.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Some(self.born.elapsed().saturating_sub(since))
    }
}

impl Slot {
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.conn.id);
        self.conns.changed.notify_one();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.0;
        let now = u64::try_from(conn.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        conn.idle_since_ms.store(now, Ordering::Release);
        if conn.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            conn.changed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn at_the_limit_the_oldest_idle_connection_makes_room() {
        let conns = Conns::new(2);
        let first = conns.admit().await;
        let busy = conns.admit().await;
        let _request = first.conn().begin(false);
        let mut busy_orders = busy.conn().orders();
        let mut first_orders = first.conn().orders();
        let admitting = tokio::spawn({
            let conns = conns.clone();
            async move { conns.admit().await }
        });
        // `busy` has nothing in flight (despite its name): it is the idle one.
        busy_orders.changed().await.expect("ordered");
        assert_eq!(*busy_orders.borrow(), Order::Close);
        assert_eq!(*first_orders.borrow_and_update(), Order::Serve, "in flight: kept");
        drop(busy);
        let third = tokio::time::timeout(Duration::from_secs(5), admitting)
            .await
            .expect("admitted once the victim closed")
            .expect("task");
        assert_eq!(conns.lock().len(), 2);
        drop(third);
    }

    #[tokio::test]
    async fn connections_that_never_sent_a_head_are_evicted_before_idle_keep_alive_ones() {
        let conns = Conns::new(2);
        let kept_alive = conns.admit().await;
        drop(kept_alive.conn().begin(false));
        let silent = conns.admit().await;
        let admitting = tokio::spawn({
            let conns = conns.clone();
            async move { conns.admit().await }
        });
        let mut orders = silent.conn().orders();
        tokio::time::timeout(Duration::from_secs(5), orders.wait_for(|o| *o == Order::Close))
            .await
            .expect("the silent one evicted")
            .expect("sender alive");
        assert_eq!(
            *kept_alive.conn().orders().borrow(),
            Order::Serve,
            "older but it has served"
        );
        drop(silent);
        let _third = tokio::time::timeout(Duration::from_secs(5), admitting)
            .await
            .expect("admitted")
            .expect("task");
    }

    #[tokio::test]
    async fn a_newcomer_waits_while_every_connection_is_busy() {
        let conns = Conns::new(1);
        let only = conns.admit().await;
        let request = only.conn().begin(false);
        let refused = tokio::time::timeout(Duration::from_millis(100), conns.admit()).await;
        assert!(refused.is_err(), "admitted past the limit");
        assert_eq!(
            *only.conn().orders().borrow(),
            Order::Serve,
            "a busy connection is kept"
        );
        let waiting = tokio::spawn({
            let conns = conns.clone();
            async move { conns.admit().await }
        });
        // The request ends: now the connection is idle and gives its place.
        drop(request);
        let mut orders = only.conn().orders();
        tokio::time::timeout(Duration::from_secs(5), orders.wait_for(|o| *o == Order::Close))
            .await
            .expect("evicted once idle")
            .expect("sender alive");
        drop(only);
        let _admitted = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("admitted")
            .expect("task");
    }
}
