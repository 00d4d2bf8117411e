//! The log sink: every log line (access lines and `tracing` events) goes
//! into one bounded queue in memory, drained to stderr by one writer
//! thread. A request never waits on it: when stderr reads slower than
//! lines come, the queue fills and lines are dropped, in this order:
//!
//! 1. an anonymous access line (a request with no authenticated team) is
//!    dropped when the queue is full;
//! 2. a team's access line or an event takes the place of the oldest
//!    anonymous line queued, and is dropped itself only when none is left.
//!
//! So a team's lines are lost only after every anonymous one, and a flood
//! of token-less requests cannot cost a team its audit trail. Each drop
//! counts in `gateway_log_lines_dropped_total{kind}` (see `metrics`).
//!
//! Lines keep the order they were queued in: each has a sequence number,
//! and the writer merges the two queues by it.

use crate::metrics::{log_line_dropped, LogLine};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use tracing_subscriber::fmt::MakeWriter;

/// Lines the writer takes out per write: a bound on what it holds outside
/// the queue (lines no team line can evict) while stderr blocks.
const BATCH: usize = 256;

/// How long an exiting process waits for the queued lines to be written.
const FLUSH_AT_EXIT: Duration = Duration::from_secs(1);

/// The queue: lines not yet written, by who may lose them first.
struct Lines {
    /// Anonymous access lines, oldest first: the first to go.
    anonymous: VecDeque<(u64, Vec<u8>)>,
    /// Every other line (team access lines, events), oldest first.
    kept: VecDeque<(u64, Vec<u8>)>,
    /// The next line's sequence number (the order they are written in).
    next: u64,
    /// The writer sleeps on the condvar: only then is a push's wake-up (a
    /// futex syscall) worth making.
    writer_idle: bool,
    /// The process exits: write what is left and stop.
    closed: bool,
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
                self.anonymous.pop_front()
            } else {
                self.kept.pop_front()
            };
            out.extend(line.map(|(_, l)| l));
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
                    next: 0,
                    writer_idle: false,
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
    /// the writer.
    pub(crate) fn push(&self, kind: LogLine, line: Vec<u8>) {
        let mut lines = self.lock();
        if lines.len() >= self.inner.capacity {
            let evicted = match kind {
                LogLine::Anonymous => false,
                LogLine::Team | LogLine::Other => lines.anonymous.pop_front().is_some(),
            };
            if !evicted {
                drop(lines);
                log_line_dropped(kind);
                return;
            }
            log_line_dropped(LogLine::Anonymous);
        }
        let seq = lines.next;
        lines.next += 1;
        match kind {
            LogLine::Anonymous => lines.anonymous.push_back((seq, line)),
            LogLine::Team | LogLine::Other => lines.kept.push_back((seq, line)),
        }
        let wake = std::mem::take(&mut lines.writer_idle);
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
                while lines.len() == 0 && !lines.closed {
                    lines.writer_idle = true;
                    lines = self.inner.wake.wait(lines).unwrap_or_else(|p| p.into_inner());
                }
                lines.writer_idle = false;
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
            self.sink.push(LogLine::Other, std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that holds every write until `open` is sent, like a reader
    /// that stopped reading.
    struct Held {
        open: mpsc::Receiver<()>,
        out: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Held {
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

    #[test]
    fn a_full_queue_drops_anonymous_lines_before_team_lines_and_keeps_order() {
        let (open_tx, open) = mpsc::channel();
        let out = Arc::new(Mutex::new(Vec::new()));
        let (sink, guard) = Sink::start(Held { open, out: out.clone() }, 4);
        // The writer takes the first line and blocks on it; wait until it
        // has, so the queue below is what stays.
        sink.push(LogLine::Team, line("first"));
        while sink.lock().len() > 0 {
            std::thread::yield_now();
        }
        for i in 0..4 {
            sink.push(LogLine::Anonymous, line(&format!("a{i}")));
        }
        sink.push(LogLine::Anonymous, line("a-dropped"));
        sink.push(LogLine::Team, line("t0"));
        sink.push(LogLine::Other, line("e0"));
        sink.push(LogLine::Team, line("t1"));
        sink.push(LogLine::Team, line("t2"));
        // Full of kept lines now: the next team line is the one dropped.
        sink.push(LogLine::Team, line("t-dropped"));
        for _ in 0..8 {
            let _ = open_tx.send(());
        }
        drop(open_tx);
        drop(guard);
        let written = String::from_utf8(out.lock().expect("lock").clone()).expect("utf8");
        assert_eq!(written, "first\nt0\ne0\nt1\nt2\n");
    }
}
