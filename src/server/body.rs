//! Answers on their way out: what keeps a connection busy while it sends,
//! and what bounds the memory HTTP/2 clients can make the gateway hold.
//!
//! hyper's HTTP/2 server takes a response body's next frame only once the
//! client's flow-control window gives the stream room, and hands h2 the
//! whole frame, which h2 keeps until the window opens. A client that never
//! opens its window (`SETTINGS_INITIAL_WINDOW_SIZE = 0`) thus holds every
//! answer in memory for as long as it keeps the connection. So an HTTP/2
//! answer is sent in [`CHUNK`]-sized frames (at most one chunk per stream
//! sits in h2), and the bytes not yet taken, plus the chunk last taken,
//! count on their connection and in one [`Budget`](super::budget::Budget) per listener. Past
//! `server.http2_max_buffered_bytes` the overload manager (`overload.rs`)
//! refuses new streams of the tenants holding their share, before their
//! handler runs, and closes the connections holding the most stalled bytes.
//! The connection's driver closes a connection whose answers took no chunk
//! for `server.write_timeout_secs`, which frees them.

use super::conns::{Conn, InFlight, Sending};
use crate::http_util::Body;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// The frame size HTTP/2 answers are cut into: h2's default maximum frame
/// size, so cutting costs no extra frames.
const CHUNK: usize = crate::config::HTTP2_CHUNK_BYTES;

/// The piece HTTP/1.1 answers are handed to hyper in: its write buffer's
/// size, so that it asks for the next one only once the client took most of
/// the last, and a big answer to a slow but steady reader shows progress
/// (else the stall deadline would cut a download that is moving).
const HTTP1_CHUNK: usize = 64 * 1024;

/// A response body that keeps its connection busy (never evicted, its
/// stalls seen by the driver) until the client has taken the last frame.
pub(super) struct Outgoing {
    rest: Bytes,
    /// The largest frame handed out at once.
    chunk: usize,
    /// HTTP/2: the connection `counted` bytes are queued on (and, through it,
    /// the listener's budget).
    holder: Option<Arc<Conn>>,
    counted: usize,
    /// Held until the body ends: the request and the answer in flight.
    guards: Option<(InFlight, Sending)>,
}

impl Outgoing {
    /// Wraps `body`; for HTTP/2 (`counted`), its bytes are queued on the
    /// connection, in the listener's budget. Never refused: an answer that
    /// reached this point may have been bought.
    pub(super) fn new(body: Body, conn: &Arc<Conn>, in_flight: InFlight, counted: bool) -> Outgoing {
        let rest = bytes_of(body);
        let mut out = Outgoing::uncounted(rest, conn, in_flight);
        if counted {
            out.counted = out.rest.len();
            conn.hold(out.counted);
            out.chunk = CHUNK;
            out.holder = Some(conn.clone());
        }
        out
    }

    /// Wraps `body` without counting it (HTTP/1.1, small refusals).
    pub(super) fn uncounted(rest: Bytes, conn: &Arc<Conn>, in_flight: InFlight) -> Outgoing {
        let guards = (!rest.is_empty()).then(|| (in_flight, conn.sending()));
        Outgoing {
            rest,
            chunk: HTTP1_CHUNK,
            holder: None,
            counted: 0,
            guards,
        }
    }

    /// Gives back what was counted beyond `keep` bytes.
    fn count_down_to(&mut self, keep: usize) {
        if let Some(conn) = &self.holder {
            conn.release(self.counted.saturating_sub(keep));
        }
        self.counted = self.counted.min(keep);
    }
}

/// The bytes of a `Full` body, taken out at once (it is always ready).
pub(super) fn bytes_of(mut body: Body) -> Bytes {
    let mut cx = Context::from_waker(Waker::noop());
    match hyper::body::Body::poll_frame(Pin::new(&mut body), &mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}

impl hyper::body::Body for Outgoing {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some((_, sending)) = &self.guards {
            sending.progressed();
        }
        if self.rest.is_empty() {
            // The client took the last chunk (h2 asked for more room only
            // once it was sent): the connection is free again.
            self.count_down_to(0);
            self.guards = None;
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(self.chunk);
        let chunk = self.rest.split_to(n);
        // The chunk now sits in h2 until the window takes it: still counted.
        let keep = self.rest.len() + n;
        self.count_down_to(keep);
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        // Not at the last chunk: hyper asks again once it was written (or
        // had room), which is when the answer is really sent.
        self.guards.is_none() && self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        self.count_down_to(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::overload::Occupant;
    use hyper::body::Body as _;

    #[test]
    fn the_budget_counts_what_is_held_until_the_client_takes_it() {
        let budget = super::super::budget::Budget::new(3 * CHUNK);
        let conns = super::super::conns::Conns::new(4, 4, budget.clone(), Default::default());
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let slot = rt
            .block_on(conns.admit(std::net::Ipv4Addr::LOCALHOST.into()))
            .expect("admitted");
        let conn = slot.conn();
        let body = |n: usize| Body::new(Bytes::from(vec![b'x'; n]));
        let mut two = Outgoing::new(body(2 * CHUNK), conn, conn.begin(true), true);
        assert_eq!(budget.used(), 2 * CHUNK);
        assert_eq!(conn.queued(), 2 * CHUNK);
        assert!(budget.has_room());
        let over = Outgoing::new(body(2 * CHUNK), conn, conn.begin(true), true);
        assert_eq!(budget.used(), 4 * CHUNK, "a bought answer is counted, never refused");
        assert!(!budget.has_room());
        drop(over);
        let mut cx = Context::from_waker(Waker::noop());
        let mut taken = 0;
        while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut two).poll_frame(&mut cx) {
            let n = frame.into_data().expect("data").len();
            assert!(n <= CHUNK);
            taken += n;
            // What is left plus the chunk just handed to h2.
            assert_eq!(budget.used(), 2 * CHUNK - taken + n);
        }
        assert_eq!(taken, 2 * CHUNK);
        assert_eq!(budget.used(), 0);
        assert_eq!(conn.queued(), 0);
        assert!(two.is_end_stream());
        assert!(conn.stalled_for().is_none(), "sent: the connection is not sending");
        let queued = Outgoing::new(body(CHUNK), conn, conn.begin(true), true);
        assert!(conn.stalled_for().is_some());
        drop(queued);
        assert_eq!(budget.used(), 0, "a dropped stream gives its bytes back");
    }
}
