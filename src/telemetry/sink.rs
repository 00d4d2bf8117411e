//! The log sink: every log line (access lines and `tracing` events) goes
//! into one bounded queue in memory, drained to stderr by one writer
//! thread. A request never waits on it: when stderr reads slower than
//! lines come, the queue fills and lines are dropped, in this order:
//!
//! 1. an anonymous access line (a request with no authenticated team) is
//!    dropped when the queue is full;
//! 2. a team's access line or an event takes the place of the oldest
//!    anonymous line queued;
//! 3. with none left, **the team holding the most lines of the queue loses
//!    its own oldest one**: a team's line takes the place of the oldest
//!    line of a team that holds more than it does, and is dropped itself
//!    when it is that team (an event evicts from the team holding the
//!    most, and is dropped only when the queue holds no team's line).
//!
//! So each team keeps its share of the queue: a team flooding hits while
//! stderr is slow loses its own lines, not another team's audit trail, and
//! a flood of token-less requests costs no team anything. Each drop counts
//! in `gateway_log_lines_dropped_total{kind}`, and a team's lines also in
//! `gateway_log_team_lines_dropped_total{team}` (see `metrics`): which team
//! is dropping.
//!
//! Lines keep the order they were queued in: each has a sequence number,
//! and the writer merges the two queues by it.

use crate::auth::Tenant;
use crate::metrics::{log_line_dropped, team_log_line_dropped, LogLine};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use tracing_subscriber::fmt::MakeWriter;

/// Lines the writer takes out per write: a bound on what it holds outside
/// the queue (lines no team line can evict) while stderr blocks.
const BATCH: usize = 256;

/// How long the writer, woken by an access line after a quiet spell, lets
/// more lines gather before it writes: the most an access line waits for
/// its write (an event is written at once).
/// Each gathering costs the writer two wake-ups, each a context switch off
/// a core that serves requests: at 2 ms, ~850 a second under a steady
/// load, 10 ms ~190 (pinned on one core: +8 % hits a second, BENCHMARKS.md
/// "Round three"); a queue of `log.queue_lines` (16,384) holds 10 ms of
/// lines at 1.6 M lines a second.
const LINGER: Duration = Duration::from_millis(10);

/// How long an exiting process waits for the queued lines to be written.
const FLUSH_AT_EXIT: Duration = Duration::from_secs(1);

/// A map keyed by [`Tenant`]s, which are hashes already: not hashed again.
type ByTenant<V> = HashMap<Tenant, V, std::hash::BuildHasherDefault<Identity>>;

/// The hasher of [`ByTenant`]: the key itself.
#[derive(Default)]
struct Identity(u64);

impl std::hash::Hasher for Identity {
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed with it; fold anything else.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The queue: lines not yet written, by who may lose them first.
struct Lines {
    /// Anonymous access lines, oldest first: the first to go.
    anonymous: VecDeque<(u64, Vec<u8>)>,
    /// Every other line (team access lines, events), oldest first, with
    /// its team (`None`: an event).
    kept: VecDeque<(u64, Option<Tenant>, Vec<u8>)>,
    /// Lines each team holds in `kept`, by its tenant.
    queued: ByTenant<usize>,
    /// The name of each tenant seen (the teams of the config: bounded).
    names: ByTenant<Box<str>>,
    /// Lines in `kept` that no team holds (events: start-up lines,
    /// warnings): while one is queued the writer does not linger.
    events: usize,
    /// The next line's sequence number (the order they are written in).
    next: u64,
    /// What the writer does: a push's wake-up (a futex syscall) is worth
    /// making only while it waits.
    writer: Writer,
    /// The process exits: write what is left and stop.
    closed: bool,
}

/// The writer thread's state, as pushes see it.
enum Writer {
    /// Sleeps until a line comes: any push wakes it.
    Idle,
    /// Lets access lines gather ([`LINGER`]): only an event wakes it, so
    /// that an event is written at once.
    Lingering,
    /// Writing, or about to take a batch: takes what is queued on its next
    /// round, unwoken.
    Busy,
}

impl Lines {
    fn len(&self) -> usize {
        self.anonymous.len() + self.kept.len()
    }

    /// Up to `BATCH` lines, oldest first across both queues.
    fn take_batch(&mut self, out: &mut Vec<Vec<u8>>) {
        while out.len() < BATCH {
            let from_anonymous = match (self.anonymous.front(), self.kept.front()) {
                (Some(a), Some(k)) => a.0 < k.0,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return,
            };
            let line = if from_anonymous {
                self.anonymous.pop_front().map(|(_, l)| l)
            } else {
                self.kept.pop_front().map(|(_, tenant, l)| {
                    match tenant {
                        Some(t) => self.release(t),
                        None => self.events -= 1,
                    }
                    l
                })
            };
            out.extend(line);
        }
    }

    /// One line of `tenant` left the queue.
    fn release(&mut self, tenant: Tenant) {
        if let Some(n) = self.queued.get_mut(&tenant) {
            *n -= 1;
            if *n == 0 {
                self.queued.remove(&tenant);
            }
        }
    }

    /// The team holding the most lines, and how many.
    fn hog(&self) -> Option<(Tenant, usize)> {
        self.queued.iter().max_by_key(|(_, n)| **n).map(|(t, n)| (*t, *n))
    }

    /// Removes `tenant`'s oldest line (counted as dropped for it).
    fn evict_oldest_of(&mut self, tenant: Tenant) {
        if let Some(at) = self.kept.iter().position(|(_, t, _)| *t == Some(tenant)) {
            self.kept.remove(at);
            self.release(tenant);
            self.dropped(tenant);
        }
    }

    /// Counts a line of `tenant` dropped.
    fn dropped(&self, tenant: Tenant) {
        log_line_dropped(LogLine::Team);
        if let Some(name) = self.names.get(&tenant) {
            team_log_line_dropped(name);
        }
    }
}

/// The shared end of the sink: cheap to clone, never blocks for long
/// (a push holds the lock for a `VecDeque` push).
#[derive(Clone)]
pub(crate) struct Sink {
    inner: Arc<Shared>,
}

struct Shared {
    lines: Mutex<Lines>,
    wake: Condvar,
    capacity: usize,
}

/// Ends the writer thread at exit, after it wrote what was queued (for at
/// most [`FLUSH_AT_EXIT`]: a stopped reader must not hold the exit).
pub(crate) struct Guard {
    sink: Sink,
    done: mpsc::Receiver<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.sink.lock().closed = true;
        self.sink.inner.wake.notify_one();
        let _ = self.done.recv_timeout(FLUSH_AT_EXIT);
    }
}

impl Sink {
    /// A sink writing to `out` on a thread of its own.
    pub(crate) fn start<W: Write + Send + 'static>(out: W, capacity: usize) -> (Sink, Guard) {
        let sink = Sink {
            inner: Arc::new(Shared {
                lines: Mutex::new(Lines {
                    anonymous: VecDeque::new(),
                    kept: VecDeque::new(),
                    queued: ByTenant::default(),
                    names: ByTenant::default(),
                    events: 0,
                    next: 0,
                    writer: Writer::Busy,
                    closed: false,
                }),
                wake: Condvar::new(),
                capacity,
            }),
        };
        let (done_tx, done) = mpsc::channel();
        let writer = sink.clone();
        std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || {
                writer.drain(out);
                let _ = done_tx.send(());
            })
            .expect("the log writer thread starts");
        (sink.clone(), Guard { sink, done })
    }

    fn lock(&self) -> MutexGuard<'_, Lines> {
        // A panic while holding the lock leaves whole lines behind: usable.
        self.inner.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues one line (or drops one, see the module doc); never waits for
    /// the writer. `team`: a [`LogLine::Team`] line's team, by its tenant
    /// (`Team::tenant`, which counts its lines) and its name (the label of
    /// its dropped lines).
    pub(crate) fn push(&self, kind: LogLine, team: Option<(Tenant, &str)>, line: Vec<u8>) {
        let team = team.filter(|_| kind == LogLine::Team);
        let tenant = team.map(|(tenant, _)| tenant);
        let mut lines = self.lock();
        if let Some((t, name)) = team {
            lines.names.entry(t).or_insert_with(|| name.into());
        }
        if lines.len() >= self.inner.capacity {
            if kind == LogLine::Anonymous {
                drop(lines);
                log_line_dropped(kind);
                return;
            }
            if lines.anonymous.pop_front().is_some() {
                log_line_dropped(LogLine::Anonymous);
            } else {
                // The team holding the most loses its oldest line, unless
                // the newcomer's team holds as many: then it loses this one.
                let mine = tenant.and_then(|t| lines.queued.get(&t).copied()).unwrap_or(0);
                match lines.hog() {
                    Some((hog, most)) if most > mine || tenant.is_none() => lines.evict_oldest_of(hog),
                    _ => {
                        match tenant {
                            Some(t) => lines.dropped(t),
                            None => log_line_dropped(kind),
                        }
                        return;
                    }
                }
            }
        }
        let seq = lines.next;
        lines.next += 1;
        let mut event = false;
        match kind {
            LogLine::Anonymous => lines.anonymous.push_back((seq, line)),
            LogLine::Team | LogLine::Other => {
                match tenant {
                    Some(t) => *lines.queued.entry(t).or_insert(0) += 1,
                    None => {
                        lines.events += 1;
                        event = true;
                    }
                }
                lines.kept.push_back((seq, tenant, line));
            }
        }
        // An event also ends a linger under way (see `drain`); a writer
        // busy writing takes it on its next round, unwoken.
        let wake = match lines.writer {
            Writer::Idle => true,
            Writer::Lingering => event,
            Writer::Busy => false,
        };
        if wake {
            lines.writer = Writer::Busy;
        }
        drop(lines);
        if wake {
            self.inner.wake.notify_one();
        }
    }

    /// The writer thread: takes a batch, writes it with the lock released.
    fn drain<W: Write>(&self, mut out: W) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut bytes = Vec::with_capacity(64 * 1024);
        loop {
            {
                let mut lines = self.lock();
                let mut waited = false;
                while lines.len() == 0 && !lines.closed {
                    lines.writer = Writer::Idle;
                    waited = true;
                    lines = self.inner.wake.wait(lines).unwrap_or_else(|p| p.into_inner());
                }
                lines.writer = Writer::Busy;
                // Woken by the first line after a quiet spell: let the lines
                // behind it gather for [`LINGER`] (pushes make no wake-up
                // meanwhile), so that a steady trickle is one write per
                // batch, not a wake-up, a context switch and a write per
                // line (measured pinned on one core: 6 µs of CPU a request).
                // Only access lines wait: an event (a start-up line, a
                // warning) is written at once, with what is queued before it.
                if waited && !lines.closed && lines.len() < BATCH && lines.events == 0 {
                    lines.writer = Writer::Lingering;
                    lines = self
                        .inner
                        .wake
                        .wait_timeout(lines, LINGER)
                        .map_or_else(|p| p.into_inner().0, |(l, _)| l);
                    lines.writer = Writer::Busy;
                }
                if lines.len() == 0 {
                    return;
                }
                lines.take_batch(&mut batch);
            }
            bytes.clear();
            for line in batch.drain(..) {
                bytes.extend_from_slice(&line);
            }
            // A reader that went away (EPIPE) loses the lines; nothing to
            // report them to but the log itself.
            let _ = out.write_all(&bytes).and_then(|()| out.flush());
        }
    }

    /// The writer the `tracing` layer formats events into (kind `Other`).
    pub(crate) fn events(&self) -> Events {
        Events(self.clone())
    }
}

/// The `MakeWriter` of the `tracing` fmt layer: each event, formatted into
/// one buffer, is queued as one line when the writer is dropped.
pub(crate) struct Events(Sink);

pub(crate) struct EventWriter<'a> {
    sink: &'a Sink,
    buf: Vec<u8>,
}

impl<'a> MakeWriter<'a> for Events {
    type Writer = EventWriter<'a>;

    fn make_writer(&'a self) -> EventWriter<'a> {
        EventWriter {
            sink: &self.0,
            buf: Vec::new(),
        }
    }
}

impl Write for EventWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter<'_> {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.sink.push(LogLine::Other, None, std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that holds every write until `open` is sent, like a reader
    /// that stopped reading.
    struct Blocking {
        open: mpsc::Receiver<()>,
        out: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Blocking {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            let _ = self.open.recv();
            self.out.lock().expect("lock").extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(s: &str) -> Vec<u8> {
        format!("{s}\n").into_bytes()
    }

    /// The team `name`, as an access line hands it over.
    fn team(name: &str) -> Option<(Tenant, &str)> {
        Some((crate::auth::tenant_of(name), name))
    }

    #[test]
    fn a_full_queue_drops_anonymous_lines_before_team_lines_and_keeps_order() {
        let (open_tx, open) = mpsc::channel();
        let out = Arc::new(Mutex::new(Vec::new()));
        let (sink, guard) = Sink::start(Blocking { open, out: out.clone() }, 4);
        // The writer takes the first line and blocks on it; wait until it
        // has, so the queue below is what stays.
        sink.push(LogLine::Team, team("t"), line("first"));
        while sink.lock().len() > 0 {
            std::thread::yield_now();
        }
        for i in 0..4 {
            sink.push(LogLine::Anonymous, None, line(&format!("a{i}")));
        }
        sink.push(LogLine::Anonymous, None, line("a-dropped"));
        sink.push(LogLine::Team, team("t"), line("t0"));
        sink.push(LogLine::Other, None, line("e0"));
        sink.push(LogLine::Team, team("t"), line("t1"));
        sink.push(LogLine::Team, team("t"), line("t2"));
        // Full of kept lines now: the next team line is the one dropped.
        sink.push(LogLine::Team, team("t"), line("t-dropped"));
        for _ in 0..8 {
            let _ = open_tx.send(());
        }
        drop(open_tx);
        drop(guard);
        let written = String::from_utf8(out.lock().expect("lock").clone()).expect("utf8");
        assert_eq!(written, "first\nt0\ne0\nt1\nt2\n");
    }

    #[test]
    fn a_team_past_its_share_loses_its_own_lines_not_another_teams() {
        let (open_tx, open) = mpsc::channel();
        let out = Arc::new(Mutex::new(Vec::new()));
        let (sink, guard) = Sink::start(Blocking { open, out: out.clone() }, 4);
        sink.push(LogLine::Other, None, line("first"));
        while sink.lock().len() > 0 {
            std::thread::yield_now();
        }
        for i in 0..4 {
            sink.push(LogLine::Team, team("alpha"), line(&format!("a{i}")));
        }
        // Beta's lines take the places of alpha's oldest ...
        sink.push(LogLine::Team, team("beta"), line("b0"));
        sink.push(LogLine::Team, team("beta"), line("b1"));
        // ... and with two each, alpha's next ones are its own loss.
        sink.push(LogLine::Team, team("alpha"), line("a-dropped"));
        sink.push(LogLine::Team, team("alpha"), line("a-dropped-too"));
        assert_eq!(sink.lock().queued.values().copied().collect::<Vec<_>>(), [2, 2]);
        for _ in 0..8 {
            let _ = open_tx.send(());
        }
        drop(open_tx);
        drop(guard);
        let written = String::from_utf8(out.lock().expect("lock").clone()).expect("utf8");
        assert_eq!(written, "first\na2\na3\nb0\nb1\n");
    }
}
