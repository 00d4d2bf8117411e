//! The open connections of one listener, and room made for newcomers.
//!
//! At `server.max_connections`, a newly accepted connection takes the place
//! of one with nothing in flight (no request being handled, no answer still
//! being sent: a download in progress is never cut). The victim is chosen
//! so that sending one head cannot aim eviction at teams ([`Conn::rank`]):
//! first connections that were answered without ever carrying a valid team
//! token, then those still reading their first head (oldest first), and only
//! then idle connections of teams: of the team holding the most connections,
//! longest idle first (a team that loops on many connections cannot push out
//! another's quiet keep-alive one). Without that, sockets
//! that never send a byte, or anonymous peers churning one free head each,
//! would push real clients out. Only when every connection has something in
//! flight does a newcomer wait.
//!
//! One peer address may hold `server.max_connections_per_peer` connections
//! (like nginx's `limit_conn`): beyond it, the newcomer takes the place of
//! that peer's own victim, or is refused when all of the peer's are busy,
//! so one address cannot fill the listener.
//!
//! Each connection's driver (`conn.rs`) obeys the [`Order`] sent to it here:
//! keep serving, drain (graceful shutdown), or close now.

use atomic_waker::AtomicWaker;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Context;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// What a connection's driver is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    Serve,
    /// Finish what is in flight, take nothing new (shutdown).
    Drain,
    /// Make room: finish a request whose head arrived meanwhile, then close
    /// (within the write timeout). A connection chosen while it had nothing
    /// in flight may have received a head since: cutting it would fail it.
    Evict,
    /// Drop the connection now (evicted, or the shutdown grace ran out).
    Close,
}

/// The registry of one listener's connections, oldest first.
pub(super) struct Conns {
    max: usize,
    max_per_peer: usize,
    open: Mutex<Open>,
    next_id: AtomicU64,
    /// A connection closed or went idle: the accept loop may find room.
    changed: Arc<Notify>,
}

#[derive(Default)]
struct Open {
    by_id: BTreeMap<u64, Arc<Conn>>,
    per_peer: HashMap<IpAddr, usize>,
}

/// One connection's shared state: written by its request handlers and
/// response bodies, read by its driver and by the registry when it looks
/// for room.
pub(crate) struct Conn {
    id: u64,
    peer: IpAddr,
    born: Instant,
    /// Requests being handled plus answers still being sent.
    in_flight: AtomicUsize,
    /// Answers still being sent (their bodies not finished).
    sending: AtomicUsize,
    started: AtomicBool,
    /// A request with a valid team token came on this connection.
    teamed: AtomicBool,
    /// Which team's (a hash of its name), once `teamed`.
    team: AtomicU64,
    http2: AtomicBool,
    /// Milliseconds after `born` when the last request finished.
    idle_since_ms: AtomicU64,
    /// Milliseconds after `born` when an answer last made progress.
    progress_ms: AtomicU64,
    orders: watch::Sender<Order>,
    changed: Arc<Notify>,
    /// Something for the driver to look at: a new order, or an answer
    /// started being sent (its stall deadline starts). Set, then `driver`
    /// woken; the driver registers, then takes it (`signalled`).
    signal: AtomicBool,
    driver: AtomicWaker,
}

/// A connection's place in the registry; dropping it frees the place.
pub(super) struct Slot {
    conns: Arc<Conns>,
    conn: Arc<Conn>,
}

/// A request in flight on a connection, until dropped.
pub(super) struct InFlight(Arc<Conn>);

/// An answer being sent on a connection, until dropped.
pub(super) struct Sending(Arc<Conn>);

impl Conns {
    pub(super) fn new(max: usize, max_per_peer: usize) -> Arc<Conns> {
        Arc::new(Conns {
            max: max.max(1),
            max_per_peer: max_per_peer.max(1),
            open: Mutex::new(Open::default()),
            next_id: AtomicU64::new(0),
            changed: Arc::new(Notify::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // The maps stay consistent even if a holder panicked: plain inserts and removes.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection just accepted from `peer`: a free one, or
    /// the place of the connection [`Conn::rank`] puts first (told to
    /// close). Waits only while every open connection has something in
    /// flight. `None`: the peer is at its own limit with every one of its
    /// connections busy; the newcomer is refused.
    pub(super) async fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        {
            let open = self.lock();
            if open.per_peer.get(&peer).copied().unwrap_or(0) >= self.max_per_peer {
                let victim = victim(open.by_id.values().filter(|c| c.peer == peer))?;
                tracing::debug!(
                    connection = victim.id,
                    "per-peer connection limit: closing an idle connection"
                );
                victim.order(Order::Evict);
            }
        }
        loop {
            {
                let mut open = self.lock();
                if open.by_id.len() < self.max {
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let conn = Arc::new(Conn::new(id, peer, self.changed.clone()));
                    open.by_id.insert(id, conn.clone());
                    *open.per_peer.entry(peer).or_default() += 1;
                    return Some(Slot {
                        conns: self.clone(),
                        conn,
                    });
                }
                // One place per newcomer: while an evicted connection is
                // still on its way out, wait for it rather than evict more.
                let closing = open.by_id.values().any(|c| c.leaving());
                if let Some(victim) = victim(open.by_id.values()).filter(|_| !closing) {
                    tracing::debug!(connection = victim.id, "connection limit: closing an idle connection");
                    victim.order(Order::Evict);
                }
            }
            // Woken when the victim's place is freed or another goes idle.
            self.changed.notified().await;
        }
    }

    /// Sends `order` to every open connection.
    pub(super) fn order_all(&self, order: Order) {
        for conn in self.lock().by_id.values() {
            conn.order(order);
        }
    }

    /// Resolves once no connection is open.
    pub(super) async fn all_closed(&self) {
        loop {
            if self.lock().by_id.is_empty() {
                return;
            }
            self.changed.notified().await;
        }
    }
}

/// The evictable connection that goes first, if any.
fn victim<'a>(conns: impl Iterator<Item = &'a Arc<Conn>> + Clone) -> Option<&'a Arc<Conn>> {
    let mut per_team: HashMap<u64, usize> = HashMap::new();
    for c in conns.clone().filter(|c| c.teamed.load(Ordering::Acquire)) {
        *per_team.entry(c.team.load(Ordering::Acquire)).or_default() += 1;
    }
    conns.filter(|c| c.evictable()).min_by_key(|c| c.rank(&per_team))
}

impl Conn {
    fn new(id: u64, peer: IpAddr, changed: Arc<Notify>) -> Conn {
        Conn {
            id,
            peer,
            born: Instant::now(),
            in_flight: AtomicUsize::new(0),
            sending: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            teamed: AtomicBool::new(false),
            team: AtomicU64::new(0),
            http2: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            progress_ms: AtomicU64::new(0),
            orders: watch::channel(Order::Serve).0,
            changed,
            signal: AtomicBool::new(false),
            driver: AtomicWaker::new(),
        }
    }

    fn order(&self, order: Order) {
        // Close overrides Evict, which overrides Drain; nothing overrides Close.
        if self.orders.send_if_modified(|current| {
            let stronger = matches!(
                (*current, order),
                (Order::Serve, _) | (Order::Drain, Order::Evict | Order::Close) | (Order::Evict, Order::Close)
            );
            if stronger {
                *current = order;
            }
            stronger
        }) {
            self.signal();
        }
    }

    fn signal(&self) {
        self.signal.store(true, Ordering::Release);
        self.driver.wake();
    }

    /// Whether the driver has something to look at since it last asked;
    /// `cx` is woken when it next has.
    pub(super) fn signalled(&self, cx: &mut Context<'_>) -> bool {
        self.driver.register(cx.waker());
        self.signal.swap(false, Ordering::AcqRel)
    }

    pub(super) fn orders(&self) -> watch::Receiver<Order> {
        self.orders.subscribe()
    }

    fn evictable(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0 && !self.leaving()
    }

    /// Told to close, or to make room.
    fn leaving(&self) -> bool {
        matches!(*self.orders.borrow(), Order::Evict | Order::Close)
    }

    /// Eviction order, lowest first: answered without a team token, then
    /// still reading the first head (its deadline closes it anyway), then
    /// a team's, the team with the most connections first; within each,
    /// the one quiet the longest (or oldest).
    fn rank(&self, per_team: &HashMap<u64, usize>) -> (u8, std::cmp::Reverse<usize>, Instant, u64) {
        let teamed = self.teamed.load(Ordering::Acquire);
        let class = match (teamed, self.started()) {
            (false, true) => 0,
            (false, false) => 1,
            (true, _) => 2,
        };
        let team_conns = match teamed {
            true => per_team.get(&self.team.load(Ordering::Acquire)).copied().unwrap_or(0),
            false => 0,
        };
        let quiet_since = self.born + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        (class, std::cmp::Reverse(team_conns), quiet_since, self.id)
    }

    /// A request with a valid token of `team` came on this connection.
    pub(super) fn mark_teamed(&self, team: &str) {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        team.hash(&mut h);
        self.team.store(h.finish(), Ordering::Release);
        self.teamed.store(true, Ordering::Release);
    }

    /// Marks a request as started (its head arrived) until the guard drops.
    pub(super) fn begin(self: &Arc<Self>, http2: bool) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.started.store(true, Ordering::Release);
        if http2 {
            self.http2.store(true, Ordering::Relaxed);
        }
        InFlight(self.clone())
    }

    /// Marks an answer as being sent until the guard drops.
    pub(super) fn sending(self: &Arc<Self>) -> Sending {
        self.progressed();
        if self.sending.fetch_add(1, Ordering::AcqRel) == 0 {
            self.signal();
        }
        Sending(self.clone())
    }

    /// An answer on this connection made progress (a chunk was taken).
    fn progressed(&self) {
        self.progress_ms.store(self.now_ms(), Ordering::Release);
    }

    /// How long answers have been waiting to be sent without progress;
    /// `None` while none is being sent.
    pub(super) fn stalled_for(&self) -> Option<Duration> {
        if self.sending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let since = Duration::from_millis(self.progress_ms.load(Ordering::Acquire));
        Some(self.born.elapsed().saturating_sub(since))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether a complete request head has arrived yet.
    pub(super) fn started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    pub(super) fn http2(&self) -> bool {
        self.http2.load(Ordering::Relaxed)
    }

    /// How long nothing has been in flight; `None` while something is.
    pub(super) fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Some(self.born.elapsed().saturating_sub(since))
    }
}

impl Slot {
    pub(super) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut open = self.conns.lock();
            open.by_id.remove(&self.conn.id);
            if let Some(n) = open.per_peer.get_mut(&self.conn.peer) {
                *n -= 1;
                if *n == 0 {
                    open.per_peer.remove(&self.conn.peer);
                }
            }
        }
        self.conns.changed.notify_one();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.0;
        conn.idle_since_ms.store(conn.now_ms(), Ordering::Release);
        if conn.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            conn.changed.notify_one();
        }
    }
}

impl Sending {
    /// The answer made progress: the client took a chunk.
    pub(super) fn progressed(&self) {
        self.0.progressed();
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.progressed();
        self.0.sending.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests;
