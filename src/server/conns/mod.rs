//! The open connections of one listener, and room made for newcomers: the
//! connection-slot pool of the overload manager (`overload.rs` decides who
//! goes; this file keeps the registry and carries the orders out).
//!
//! At `server.max_connections`, a newly accepted connection takes the place
//! of the one [`overload::victim`] picks (anonymous first, then stalled,
//! then teams over their share, then connections still in their first head,
//! then other teams' idle ones). The victim is told to go and the newcomer
//! is admitted at once: up to [`overload::spare`] connections may be on
//! their way out beyond the cap, so nobody waits on a peer that does not
//! answer its GOAWAY. When no connection may go (every one is busy
//! handling a team's request or sending an answer that moves, every team
//! within its share) a newcomer takes one of [`overload::reserve`]'s slots
//! beyond the cap: it may be a team that holds none yet. Only with those
//! taken too does a newcomer wait, in the kernel's accept queue.
//!
//! One peer address may hold `server.max_connections_per_peer` connections
//! (like nginx's `limit_conn`): beyond it, the newcomer takes the place of
//! that peer's own victim, or is refused when all of the peer's are busy,
//! so one address cannot fill the listener.
//!
//! Each connection's driver (`conn.rs`) obeys the [`Order`] sent to it here:
//! keep serving, drain (graceful shutdown), or close now.

use super::budget::Budget;
use super::overload::{self, Class, Occupant};
use crate::auth::Tenant;
use atomic_waker::AtomicWaker;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::Context;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// What a connection's driver is told to do. Ordered by strength: an order
/// only ever replaces a weaker one (Close overrides Evict, which overrides
/// Drain; nothing overrides Close), so the current order is one atomic
/// maximum ([`Conn::order`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(super) enum Order {
    Serve = 0,
    /// Finish what is in flight, take nothing new (shutdown).
    Drain,
    /// Make room: finish a request whose head arrived meanwhile, then close
    /// (within [`overload::EVICT_GRACE`]). A connection chosen while it had
    /// nothing in flight may have received a head since: cutting it would
    /// fail it.
    Evict,
    /// Drop the connection now (anonymous, stalled or silent and chosen to
    /// make room, or the shutdown grace ran out).
    Close,
}

impl Order {
    /// How a connection the manager picked is told to go: at once, or (a
    /// team's idle one, whose next head may be on its way) finishing that
    /// head.
    fn for_class(class: Class) -> Order {
        match class {
            Class::Anonymous | Class::Stalled | Class::Silent | Class::TeamOverShareBusy | Class::Unstarted => {
                Order::Close
            }
            Class::TeamOverShare | Class::TeamIdle => Order::Evict,
        }
    }
}

/// How often a newcomer that found no connection able to go looks again:
/// a connection becomes stalled with time, not with an event.
const RECHECK: Duration = Duration::from_millis(100);

/// The registry of one listener's connections, oldest first.
pub(super) struct Conns {
    /// `server.max_connections` (or the admin listener's cap): connections
    /// beyond it are made room for, up to [`overload::spare`] more leaving.
    max: usize,
    /// `server.max_connections_per_peer`: one address's share of `max`.
    max_per_peer: usize,
    /// The open connections by id (oldest first: the eviction tie-break)
    /// and the count per peer address. One lock: both change together.
    open: Mutex<Open>,
    /// The next connection's id.
    next_id: AtomicU64,
    /// The registry changed (a connection closed or went idle): woken with
    /// `notify_waiters`, waited on by the accept loop (room) and shutdown
    /// (all closed), each re-reading `open` after enabling its wait.
    changed: Arc<Notify>,
    /// Answer bytes this listener's HTTP/2 streams hold (`body.rs`).
    budget: Arc<Budget>,
    /// Counts what the manager did (`gateway_overload_actions_total`).
    actions: Actions,
}

/// The `gateway_overload_actions_total` children of one listener.
#[derive(Clone, Default)]
pub(crate) struct Actions {
    counter: Option<prometheus::IntCounterVec>,
    listener: &'static str,
}

impl Actions {
    pub(crate) fn new(counter: prometheus::IntCounterVec, listener: &'static str) -> Actions {
        Actions {
            counter: Some(counter),
            listener,
        }
    }

    pub(super) fn count(&self, pool: &str, action: &str) {
        if let Some(c) = &self.counter {
            c.with_label_values(&[self.listener, pool, action]).inc();
        }
    }
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
    /// Its key in the registry; the last tie-break of eviction.
    id: u64,
    /// Its tenant until a team token comes, and its per-peer count.
    peer: IpAddr,
    /// When it was accepted (the overload manager's age order; tokio's
    /// timers are the same clock).
    born: Instant,
    /// [`crate::clock::coarse_ms`] at `born`: the origin of the `_ms`
    /// clocks below, read on the coarse clock (several times a request).
    born_ms: u64,
    /// Requests being handled plus answers still being sent.
    in_flight: AtomicUsize,
    /// Answers still being sent (their bodies not finished).
    sending: AtomicUsize,
    /// A complete request head arrived: no longer a silent socket.
    started: AtomicBool,
    /// A request with a valid team token came on this connection.
    teamed: AtomicBool,
    /// Which team's, once `teamed`: its tenant (`auth::Tenant`).
    team: AtomicU64,
    /// Speaks HTTP/2 (answers counted in the budget, idle deadline ours).
    http2: AtomicBool,
    /// Milliseconds after `born_ms` when the last request finished.
    idle_since_ms: AtomicU64,
    /// Milliseconds after `born_ms` when an answer last made progress.
    progress_ms: AtomicU64,
    /// Answer bytes its HTTP/2 streams hold in `budget`.
    queued: AtomicUsize,
    /// Progress while no head had arrived, capped at
    /// [`overload::PROGRESS_BYTES`]: the bytes read from the socket, or on
    /// a TLS connection 0 until its ClientHello is complete (`conn::Early`).
    read_early: AtomicU64,
    /// The socket's last write found no room (the client is not reading
    /// what was sent): an HTTP/1.1 answer is still on its way out.
    flushing: AtomicBool,
    /// The listener's answer-bytes budget (checked before a stream is handled).
    budget: Arc<Budget>,
    /// The registry, for the slow paths that must see every connection
    /// (the answer bytes ran out). Weak: the registry holds this.
    registry: Weak<Conns>,
    /// The current [`Order`] (as `u8`): only ever raised ([`Conn::order`]).
    order: AtomicU8,
    /// The registry's [`Conns::changed`]: woken when this connection goes
    /// idle (the accept loop may find room).
    changed: Arc<Notify>,
    /// The driver's one signal: something to look at, a stronger order or
    /// an answer that started sending (its stall deadline starts). Set,
    /// then `driver` woken; the driver registers, then takes it
    /// ([`Conn::signalled`]) and re-reads the state itself.
    signal: AtomicBool,
    /// The driver task's waker (`conn.rs`).
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
    pub(super) fn new(max: usize, max_per_peer: usize, budget: Arc<Budget>, actions: Actions) -> Arc<Conns> {
        Arc::new(Conns {
            max: max.max(1),
            max_per_peer: max_per_peer.max(1),
            open: Mutex::new(Open::default()),
            next_id: AtomicU64::new(0),
            changed: Arc::new(Notify::new()),
            budget,
            actions,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // The maps stay consistent even if a holder panicked: plain inserts and removes.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection just accepted from `peer`: a free one, or
    /// one made by telling [`overload::victim`]'s pick to go (the newcomer
    /// does not wait for it to be gone). Waits only while no connection may
    /// go. `None`: the peer is at its own limit with every one of its
    /// connections busy; the newcomer is refused.
    pub(super) async fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        loop {
            // Enabled before the state is read: a change after the read wakes it.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut open = self.lock();
                let theirs = open.per_peer.get(&peer).copied().unwrap_or(0);
                if theirs >= self.max_per_peer {
                    let staying = open.by_id.values().filter(|c| c.peer == peer && !c.leaving()).count();
                    if staying >= self.max_per_peer {
                        let (victim, class) =
                            overload::victim(open.by_id.values().filter(|c| c.peer == peer), self.max_per_peer)?;
                        self.act(victim, class, "per_peer");
                    }
                }
                if let Some(slot) = self.place(&mut open, peer) {
                    return Some(slot);
                }
            }
            // Woken when a place is freed or a connection goes idle; a
            // connection stalls with time, hence the recheck.
            let _ = tokio::time::timeout(RECHECK, changed).await;
        }
    }

    /// A free place, made if need be; `None` while none can be made.
    fn place(self: &Arc<Self>, open: &mut Open, peer: IpAddr) -> Option<Slot> {
        let total = open.by_id.len();
        let staying = match total < self.max {
            true => total,
            false => open.by_id.values().filter(|c| !c.leaving()).count(),
        };
        if staying >= self.max {
            match overload::victim(open.by_id.values(), self.max) {
                Some((victim, class)) => self.act(victim, class, "connections"),
                // Every connection busy and every team within its share:
                // the newcomer may be a team that holds none (not yet a
                // tenant, so nobody is over a share it would have). It
                // takes a reserve slot; once its token is seen, the teams
                // holding the most are over their share and make room.
                None if staying < self.max + overload::reserve(self.max) => {}
                None => return None,
            }
        }
        if total >= self.max + overload::reserve(self.max) + overload::spare(self.max) {
            // Too many already on their way out: wait until one is gone.
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(id, peer, self));
        open.by_id.insert(id, conn.clone());
        *open.per_peer.entry(peer).or_default() += 1;
        Some(Slot {
            conns: self.clone(),
            conn,
        })
    }

    /// Tells `victim` to go, and counts it.
    fn act(&self, victim: &Conn, class: Class, pool: &str) {
        tracing::debug!(
            connection = victim.id,
            class = class.as_str(),
            pool,
            "making room: closing a connection"
        );
        victim.order(Order::for_class(class));
        self.actions.count(pool, class.as_str());
    }

    /// Room was short: closes any connection whose accept failed for want
    /// of descriptors would have gone first (EMFILE: the descriptor pool).
    pub(super) fn make_room(&self) {
        let open = self.lock();
        if let Some((victim, class)) = overload::victim(open.by_id.values(), self.max) {
            self.act(victim, class, "descriptors");
        }
    }

    /// Whether `team` may start an HTTP/2 answer now the listener's answer
    /// bytes are spent (its share not yet queued); when it may, the
    /// connections over theirs are told to close.
    fn team_may_answer(&self, team: u64) -> bool {
        let open = self.lock();
        if !overload::team_within_share(open.by_id.values(), team, self.budget.max()) {
            self.actions.count("answer_bytes", "refuse");
            return false;
        }
        self.relieve_locked(&open);
        true
    }

    /// Closes connections until the answer bytes queued fit the budget again.
    fn relieve(&self) {
        let open = self.lock();
        self.relieve_locked(&open);
    }

    fn relieve_locked(&self, open: &Open) {
        for victim in overload::relieve(open.by_id.values(), self.budget.used(), self.budget.max()) {
            tracing::debug!(
                connection = victim.id,
                queued = victim.queued(),
                "answer bytes spent: closing a connection"
            );
            victim.order(Order::Close);
            let class = match victim.team() {
                None => "anonymous",
                Some(_) => "stalled",
            };
            self.actions.count("answer_bytes", class);
        }
    }

    /// Counts an anonymous stream refused for answer bytes.
    pub(super) fn refused_anonymous(&self) {
        self.actions.count("answer_bytes", "refuse");
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
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.lock().by_id.is_empty() {
                return;
            }
            changed.await;
        }
    }
}

impl Conn {
    fn new(id: u64, peer: IpAddr, conns: &Arc<Conns>) -> Conn {
        Conn {
            id,
            peer,
            born: Instant::now(),
            born_ms: crate::clock::coarse_ms(),
            in_flight: AtomicUsize::new(0),
            sending: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            teamed: AtomicBool::new(false),
            team: AtomicU64::new(0),
            http2: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            progress_ms: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
            read_early: AtomicU64::new(0),
            flushing: AtomicBool::new(false),
            budget: conns.budget.clone(),
            registry: Arc::downgrade(conns),
            order: AtomicU8::new(Order::Serve as u8),
            changed: conns.changed.clone(),
            signal: AtomicBool::new(false),
            driver: AtomicWaker::new(),
        }
    }

    /// Raises the connection's order to `order` (a weaker one is kept as
    /// it is) and, when it rose, signals the driver.
    fn order(&self, order: Order) {
        if self.order.fetch_max(order as u8, Ordering::AcqRel) < order as u8 {
            self.signal();
        }
    }

    /// The order the driver is to obey now.
    pub(super) fn current_order(&self) -> Order {
        match self.order.load(Ordering::Acquire) {
            0 => Order::Serve,
            1 => Order::Drain,
            2 => Order::Evict,
            _ => Order::Close,
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

    /// A request with a valid token of the team of `tenant` came on this
    /// connection.
    pub(super) fn mark_teamed(&self, tenant: Tenant) {
        self.team.store(tenant, Ordering::Release);
        self.teamed.store(true, Ordering::Release);
    }

    /// Whether a stream of this connection's team may be answered: always,
    /// but for HTTP/2 while the listener's answer bytes are spent and the
    /// team already holds its share (then nothing is bought for it).
    pub(super) fn may_answer(&self) -> bool {
        if !self.http2() || self.budget.has_room() {
            return true;
        }
        match (self.team(), self.registry.upgrade()) {
            (Some(team), Some(conns)) => conns.team_may_answer(team),
            _ => true,
        }
    }

    /// Whether an anonymous HTTP/2 stream may be answered: while anonymous
    /// peers hold less than half the listener's answer bytes.
    pub(super) fn may_answer_anonymous(&self) -> bool {
        if self.budget.anonymous_has_room() {
            return true;
        }
        if let Some(conns) = self.registry.upgrade() {
            conns.refused_anonymous();
        }
        false
    }

    /// Counts `n` more answer bytes queued on this connection; past the
    /// listener's budget, the manager closes the connections holding the
    /// most over their share.
    pub(super) fn hold(&self, n: usize) {
        self.queued.fetch_add(n, Ordering::AcqRel);
        if !self.budget.take(n) {
            if let Some(conns) = self.registry.upgrade() {
                conns.relieve();
            }
        }
    }

    /// Gives back `n` answer bytes queued on this connection.
    pub(super) fn release(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::AcqRel);
        self.budget.give(n);
    }

    /// The connection's progress before its first head is `progress`
    /// (`conn::Early`); kept until a head arrives.
    pub(super) fn read_to(&self, progress: u64) {
        if !self.started.load(Ordering::Relaxed) {
            self.read_early
                .fetch_max(progress.min(overload::PROGRESS_BYTES), Ordering::Relaxed);
        }
    }

    /// The socket took a write (`false`) or had no room for it (`true`).
    pub(super) fn wrote(&self, blocked: bool) {
        // Read first: a store per write would make the line bounce between
        // the cores that write and the one that looks.
        if self.flushing.load(Ordering::Relaxed) != blocked {
            self.flushing.store(blocked, Ordering::Relaxed);
        }
    }

    /// An answer's bytes still wait for room in the socket.
    pub(super) fn flushing(&self) -> bool {
        self.flushing.load(Ordering::Relaxed)
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

    /// Marks an answer as being sent until the guard drops. On HTTP/2 the
    /// driver is told, to arm the answer's stall deadline (flow control can
    /// hold an answer back with no write pending). An HTTP/1.1 answer
    /// stalls only in a write, which the write deadline watches
    /// (`tokio-io-timeout`), and the driver's timer is never further than
    /// `write_timeout` once a request started: no wake-up of the
    /// connection's task per answer (it cost a whole extra poll of it).
    pub(super) fn sending(self: &Arc<Self>) -> Sending {
        self.progressed();
        if self.sending.fetch_add(1, Ordering::AcqRel) == 0 && self.http2() {
            self.signal();
        }
        Sending(self.clone())
    }

    /// An answer on this connection made progress (a chunk was taken).
    fn progressed(&self) {
        self.progress_ms.store(self.now_ms(), Ordering::Release);
    }

    fn now_ms(&self) -> u64 {
        crate::clock::coarse_ms().saturating_sub(self.born_ms)
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
        Some(Duration::from_millis(self.now_ms()).saturating_sub(since))
    }
}

impl Occupant for Conn {
    fn id(&self) -> u64 {
        self.id
    }

    fn born(&self) -> Instant {
        self.born
    }

    fn leaving(&self) -> bool {
        self.current_order() >= Order::Evict
    }

    fn team(&self) -> Option<u64> {
        self.teamed
            .load(Ordering::Acquire)
            .then(|| self.team.load(Ordering::Acquire))
    }

    fn started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    fn peer(&self) -> IpAddr {
        self.peer
    }

    fn read_early(&self) -> u64 {
        self.read_early.load(Ordering::Relaxed)
    }

    fn handling(&self) -> usize {
        self.in_flight
            .load(Ordering::Acquire)
            .saturating_sub(self.sending.load(Ordering::Acquire))
    }

    fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    fn stalled_for(&self) -> Option<Duration> {
        if self.sending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let since = Duration::from_millis(self.progress_ms.load(Ordering::Acquire));
        Some(Duration::from_millis(self.now_ms()).saturating_sub(since))
    }

    fn quiet_since(&self) -> Instant {
        self.born + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire))
    }
}

impl Slot {
    pub(super) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// Counts, when called, one action of the overload manager's on this
    /// connection (`gateway_overload_actions_total{pool,action}`).
    pub(super) fn counter(&self, pool: &'static str, action: &'static str) -> impl FnOnce() + Send + 'static {
        let conns = self.conns.clone();
        move || conns.actions.count(pool, action)
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
        self.conns.changed.notify_waiters();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.0;
        conn.idle_since_ms.store(conn.now_ms(), Ordering::Release);
        if conn.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            conn.changed.notify_waiters();
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
