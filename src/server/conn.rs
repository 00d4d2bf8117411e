//! One accepted connection, from accept to close: the deadlines hyper has
//! no knob for, around hyper-util's auto (HTTP/1.1 + HTTP/2) connection.
//!
//! - From accept, a complete request head within `header_read_timeout`
//!   (hyper's own header timer would start only once its HTTP/1 parser
//!   runs, after the auto builder has sniffed the first bytes for the
//!   HTTP/2 preface: a socket that sends nothing, or half a preface, would
//!   stay open for ever; and the TLS handshake comes before both). After
//!   the first request, the next head within `header_read_timeout` of the
//!   last answer's end (the keep-alive idle limit, and the slowloris guard
//!   of kept-alive connections): ours too, with hyper's timer off, which
//!   made, polled and dropped a timer per request.
//! - HTTP/2 with nothing in flight for `idle_timeout`: GOAWAY, then closed
//!   if it has not finished within `write_timeout`.
//! - A write that makes no progress for `write_timeout` fails the
//!   connection (tokio-io-timeout under TLS and hyper): a client that stops
//!   reading cannot hold its place. The same deadline covers answers that
//!   HTTP/2 flow control holds back (`body.rs`): when none of the
//!   connection's answers took a chunk for `write_timeout`, it is closed
//!   and their buffers freed.
//! - HTTP/2 streams opened while the listener's budget of buffered answer
//!   bytes is spent get a 503 with `Retry-After` before their handler runs
//!   (hyper offers no `REFUSED_STREAM` to a service; this is the nearest,
//!   and costs nothing): an anonymous one here, a team's once its token is
//!   checked (`ConnectionMark::team_seen`), each against its tenant's share
//!   (`overload.rs`).
//! - HTTP/2 control frames (PING, SETTINGS, WINDOW_UPDATE, RST_STREAM,
//!   PRIORITY) past an allowance that grows with the connection's requests
//!   and answer bytes: GOAWAY (ENHANCE_YOUR_CALM) and closed (`frames.rs`).
//! - The registry's orders (`conns/mod.rs`): drain on shutdown; close at once
//!   when the overload manager closes it (anonymous, stalled, silent) or
//!   the grace ran out; an evicted idle team connection gets
//!   `overload::EVICT_GRACE` to answer a head that raced the order.

use super::body::Outgoing;
use super::conns::{Conn, Order, Slot};
use super::frames::Metered;
use super::overload::{self, Occupant};
use super::ConnectionMark;
use crate::error::GatewayError;
use crate::http_util::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;

/// The per-connection deadlines (see the module doc).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub(super) header_read: Duration,
    pub(super) idle: Duration,
    pub(super) write: Duration,
}

/// Serves one connection until it ends, is ordered closed, or a deadline
/// passes. Holding `slot` keeps its place in the registry.
/// `hpack_per_request`: the HPACK work each request adds to the
/// connection's budget (`frames::hpack_per_request`).
pub(super) async fn serve<H, F>(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    handler: H,
    slot: Slot,
    timeouts: Timeouts,
    hpack_per_request: u64,
) where
    H: Fn(Request<Incoming>, ConnectionMark) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let head_by = Instant::now() + timeouts.header_read;
    let conn = slot.conn().clone();
    let mut io = TimeoutStream::new(Early {
        inner: stream,
        conn: conn.clone(),
        first: FirstMessage::default(),
    });
    io.set_write_timeout(Some(timeouts.write));
    let io = Box::pin(io);
    let service = {
        let conn = conn.clone();
        service_fn(move |req: Request<Incoming>| {
            let http2 = req.version() == Version::HTTP_2;
            let in_flight = conn.begin(http2);
            // An anonymous HTTP/2 stream past anonymous peers' half of the
            // answer bytes is refused before anything runs; one that
            // carries a credential is the handler's to judge, once the
            // token says whose share it counts in.
            let refused = http2
                && conn.team().is_none()
                && !crate::auth::has_credential(req.headers())
                && !conn.may_answer_anonymous();
            // Boxed: the stream's task then keeps a pointer, not the whole
            // handler state, while an HTTP/2 client holds its answer back.
            let response = (!refused).then(|| Box::pin(handler(req, ConnectionMark(conn.clone()))));
            let conn = conn.clone();
            async move {
                let response = match response {
                    Some(response) => response.await,
                    None => GatewayError::AnswersBusy.into_response(),
                };
                let (parts, body) = response.into_parts();
                let body = Outgoing::new(body, &conn, in_flight, http2);
                Ok::<_, Infallible>(Response::from_parts(parts, body))
            }
        })
    };
    let flood = || slot.counter("control_frames", "close");
    match tls {
        None => {
            let io = Metered::new(io, flood(), hpack_per_request);
            let http = builder.serve_connection(TokioIo::new(io), service);
            drive(http, &conn, head_by, timeouts).await;
        }
        Some(acceptor) => {
            // The handshake is part of the time allowed for the first head,
            // and an evicted connection may still be in it.
            let stream = tokio::select! {
                done = tokio::time::timeout_at(head_by.into(), acceptor.accept(io)) => match done {
                    Ok(Ok(stream)) => stream,
                    _ => return,
                },
                () = told_to_leave(&conn) => return,
            };
            let stream = Metered::new(stream, flood(), hpack_per_request);
            let http = builder.serve_connection(TokioIo::new(stream), service);
            drive(http, &conn, head_by, timeouts).await;
        }
    }
    drop(slot);
}

/// The socket, its bytes counted until the first head arrives (below TLS:
/// a handshake that makes progress is told from a half-open one, see
/// `overload::Class::Silent`).
struct Early {
    inner: TcpStream,
    conn: Arc<Conn>,
    first: FirstMessage,
}

/// A TLS connection's progress while its ClientHello is incomplete: some
/// bytes came, none that count.
const SHORT: u64 = 1;

/// A TLS handshake record's first byte.
const TLS_HANDSHAKE: u8 = 0x16;
/// A ClientHello's handshake message type.
const CLIENT_HELLO: u8 = 0x01;

/// A connection's first message, followed to tell a handshake or head
/// that makes progress from one that only looks like it.
#[derive(Default)]
struct FirstMessage {
    /// The first 9 bytes read: a TLS record header and the handshake
    /// message's, or the start of a head.
    first: [u8; 9],
    /// Bytes read so far, until `done`.
    seen: u64,
    /// The first message came (or never will count): nothing more is looked at.
    done: bool,
}

impl FirstMessage {
    /// Follows `bytes`; the connection's progress when it changed. A plain
    /// connection progresses with every byte; a TLS one only once its
    /// ClientHello is complete, whatever part of it came. A ClientHello
    /// split over records (a message over 16 KiB, or a peer fragmenting
    /// on purpose) never counts: that connection makes progress with its
    /// first head.
    fn note(&mut self, bytes: &[u8]) -> Option<u64> {
        if self.done || bytes.is_empty() {
            return None;
        }
        let have = self.seen.min(9) as usize;
        for (slot, b) in self.first[have..].iter_mut().zip(bytes) {
            *slot = *b;
        }
        self.seen = self.seen.saturating_add(bytes.len() as u64);
        if self.first[0] != TLS_HANDSHAKE {
            self.done = self.seen >= overload::PROGRESS_BYTES;
            return Some(self.seen);
        }
        // Until the ClientHello is complete: bytes read, short of progress
        // (they go before a connection not read yet, `overload::Early`).
        if self.seen < 9 {
            return Some(SHORT);
        }
        let record = u64::from(u16::from_be_bytes([self.first[3], self.first[4]]));
        let hello = u64::from(u32::from_be_bytes([0, self.first[6], self.first[7], self.first[8]]));
        if self.first[5] != CLIENT_HELLO || 4 + hello > record {
            self.done = true;
            Some(SHORT)
        } else if self.seen >= 9 + hello {
            self.done = true;
            Some(overload::PROGRESS_BYTES)
        } else {
            Some(SHORT)
        }
    }
}

impl tokio::io::AsyncRead for Early {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if let Some(progress) = self.first.note(&buf.filled()[before..]) {
                self.conn.read_to(progress);
            }
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Early {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        self.conn.wrote(polled.is_pending());
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.conn.wrote(polled.is_pending());
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What woke the driver.
enum Event<E> {
    /// The connection ended.
    Ended(Result<(), E>),
    /// A new order, or an answer started being sent.
    Signal,
    /// The next deadline to look at came.
    Check,
}

/// Polls the HTTP connection while watching its deadlines and orders.
/// Returning drops it, which closes the socket.
///
/// One `poll_fn` over three things: the connection, the connection's one
/// signal ([`Conn::signalled`]: a stronger order, or an answer that started
/// sending) and the timer of the next deadline. Each wake re-reads the
/// state (the order, the clocks) rather than receiving it; a `select!`
/// over channels cost ~1.5k instructions a request.
async fn drive<C>(http: C, conn: &Conn, head_by: Instant, t: Timeouts)
where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    tokio::pin!(http);
    // Set once an idle HTTP/2 connection was sent GOAWAY: when it must be gone.
    let mut gone_by: Option<Instant> = None;
    let mut draining = false;
    // One timer for the connection's life, moved only to an earlier
    // deadline: a later one is looked at when the timer comes (and finds
    // nothing due yet). A busy connection's deadlines move on with every
    // request; a new timer each time cost a registration in tokio's wheel
    // and its removal per request.
    let check = tokio::time::sleep_until(head_by.into());
    tokio::pin!(check);
    loop {
        // Read, not received: an order given before the first poll counts too.
        match conn.current_order() {
            Order::Serve => {}
            Order::Drain => drain(http.as_mut(), &mut draining),
            // Graceful: an idle connection closes at once, one whose head
            // just arrived answers it first (bounded; nobody waits on it).
            Order::Evict if gone_by.is_none() => {
                gone_by = Some(Instant::now() + overload::EVICT_GRACE.min(t.write));
                drain(http.as_mut(), &mut draining);
            }
            Order::Evict => {}
            Order::Close => return,
        }
        let next = next_check(conn, head_by, gone_by, t);
        if check.is_elapsed() || next < check.deadline().into_std() {
            check.as_mut().reset(next.into());
        }
        let event = std::future::poll_fn(|cx| {
            if let Poll::Ready(result) = http.as_mut().poll(cx) {
                return Poll::Ready(Event::Ended(result));
            }
            if conn.signalled(cx) {
                return Poll::Ready(Event::Signal);
            }
            check.as_mut().poll(cx).map(|()| Event::Check)
        })
        .await;
        match event {
            Event::Ended(result) => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            // The orders are read at the top; an answer that started
            // sending moves the next check (its stall deadline).
            Event::Signal => {}
            Event::Check => {
                let now = Instant::now();
                if !conn.started() && now >= head_by {
                    tracing::debug!("no request head in time: closing");
                    return;
                }
                if next_head_late(conn, t) {
                    tracing::debug!("no next request head in time: closing");
                    return;
                }
                if gone_by.is_some_and(|by| now >= by) {
                    return;
                }
                if conn.stalled_for().is_some_and(|d| d >= t.write) {
                    tracing::debug!("answers made no progress in time: closing");
                    return;
                }
                let idle = conn.http2() && conn.idle_for().is_some_and(|d| d >= t.idle);
                if idle && gone_by.is_none() {
                    gone_by = Some(now + t.write);
                    drain(http.as_mut(), &mut draining);
                }
            }
        }
    }
}

/// Starts the connection's graceful shutdown, once.
fn drain<C: GracefulConnection>(http: Pin<&mut C>, draining: &mut bool) {
    if !std::mem::replace(draining, true) {
        http.graceful_shutdown();
    }
}

/// When the driver next has a deadline to look at.
fn next_check(conn: &Conn, head_by: Instant, gone_by: Option<Instant>, t: Timeouts) -> Instant {
    let other = other_check(conn, head_by, gone_by, t);
    match conn.stalled_for() {
        Some(stalled) => other.min(Instant::now() + t.write.saturating_sub(stalled)),
        // An answer may start and stall meanwhile: look again within the deadline.
        None if conn.started() => other.min(Instant::now() + t.write),
        None => other,
    }
}

fn other_check(conn: &Conn, head_by: Instant, gone_by: Option<Instant>, t: Timeouts) -> Instant {
    match (conn.started(), gone_by) {
        (false, Some(by)) => return by.min(head_by),
        (false, None) => return head_by,
        (true, Some(by)) => return by,
        (true, None) => {}
    }
    let now = Instant::now();
    match (conn.http2(), conn.idle_for()) {
        (true, Some(idle)) => now + t.idle.saturating_sub(idle),
        // The end of a request is not signalled here: look again soon.
        (true, None) => now + t.idle.min(Duration::from_secs(1)),
        // HTTP/1.1 after its first head: the next head's deadline.
        (false, Some(idle)) => now + t.header_read.saturating_sub(idle),
        // A request in flight: its head's deadline starts at its end at
        // the soonest.
        (false, None) => now + t.header_read,
    }
}

/// HTTP/1.1 after its first head: the next head did not come within
/// `header_read_timeout` of the last answer's end (or was still arriving:
/// a slowloris on a kept-alive connection), and no answer is still
/// leaving the socket (a slow reader is the write deadline's). hyper's own
/// header timer is off (`server::builder`): it made, polled and dropped a
/// timer per request.
fn next_head_late(conn: &Conn, t: Timeouts) -> bool {
    !conn.http2() && conn.started() && !conn.flushing() && conn.idle_for().is_some_and(|idle| idle >= t.header_read)
}

/// Resolves when the connection is ordered closed or evicted (during the
/// TLS handshake, before `drive` runs).
async fn told_to_leave(conn: &Conn) {
    std::future::poll_fn(|cx| {
        // Registered before the order is read: an order after the read wakes it.
        let _ = conn.signalled(cx);
        match conn.leaving() {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(chunks: &[&[u8]]) -> u64 {
        let mut m = FirstMessage::default();
        chunks.iter().filter_map(|c| m.note(c)).max().unwrap_or(0)
    }

    #[test]
    fn a_tls_connection_progresses_once_its_client_hello_is_complete() {
        // A record of 40 bytes holding a ClientHello of 36.
        let mut hello = vec![0x16, 3, 1, 0, 40, 1, 0, 0, 36];
        hello.extend([7u8; 36]);
        assert_eq!(progress(&[&hello]), overload::PROGRESS_BYTES);
        assert_eq!(
            progress(&[&hello[..3], &hello[3..20], &hello[20..]]),
            overload::PROGRESS_BYTES
        );
        // Its first 44 bytes of 45, the record header alone, a record
        // shorter than the message it starts (fragmented on purpose).
        assert_eq!(progress(&[&hello[..44]]), SHORT);
        assert_eq!(progress(&[&hello[..5]]), SHORT);
        let mut split = hello.clone();
        split[4] = 10;
        assert_eq!(progress(&[&split]), SHORT);
        // Nothing read: nothing shown.
        assert_eq!(progress(&[b""]), 0);
        // What rustls sends first (a TLS 1.3 ClientHello with its key shares).
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let mut client = rustls::ClientConnection::new(Arc::new(config), name).expect("client");
        let mut sent = Vec::new();
        client.write_tls(&mut sent).expect("hello");
        assert_eq!(progress(&[&sent]), overload::PROGRESS_BYTES, "{} bytes", sent.len());
        assert_eq!(progress(&[&sent[..sent.len() - 1]]), SHORT);
        // A plain head: every byte counts.
        assert_eq!(progress(&[b"GET / HTTP/1.1\r\n"]), 16);
    }
}
