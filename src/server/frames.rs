//! A budget of HTTP/2 control frames per connection, counted below hyper.
//!
//! hyper (h2) answers every PING, applies every SETTINGS and
//! WINDOW_UPDATE and has no limit on how many a peer sends: one connection
//! sending PINGs as fast as it can keeps a core busy and is never closed
//! (measured: +6.1 s of CPU in 6 s; four such moved another team's
//! cached-hit p50 from 0.7 to 9.2 ms). Envoy and nginx cap control frames;
//! so does this, the way nginx does: the bytes a peer sends are read
//! through [`Metered`], which follows the HTTP/2 frame headers (after the
//! client preface; any other protocol passes through untouched) and
//! counts PING, SETTINGS (not their ACKs), WINDOW_UPDATE, RST_STREAM and
//! PRIORITY frames against an allowance that grows with useful work and
//! with time: [`BASE`], plus [`PER_REQUEST`] per request (a HEADERS frame),
//! one per [`BYTES_PER_CONTROL`] of answer written (a client's
//! WINDOW_UPDATEs keep pace with what it receives) and one per second the
//! connection has been open (a client's keep-alive PINGs, at any sane
//! interval, never run out). Past the allowance the connection is sent
//! a GOAWAY with ENHANCE_YOUR_CALM (when the write side is between frames)
//! and closed, and the close is counted
//! (`gateway_overload_actions_total{pool="control_frames",action="close"}`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Control frames any connection may send before it has done anything.
pub(crate) const BASE: u64 = 200;
/// Control frames each request (HEADERS frame) adds to the allowance.
pub(crate) const PER_REQUEST: u64 = 20;
/// Answer bytes written per control frame added to the allowance.
pub(crate) const BYTES_PER_CONTROL: u64 = 4096;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// GOAWAY, last stream 0 (no stream of this connection is promised an
/// answer past this point: the peer was abusive), ENHANCE_YOUR_CALM (0xb).
const GOAWAY_CALM: [u8; 17] = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0b];

/// Where a direction of the stream is in the HTTP/2 framing.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// Matching the client preface: this many bytes matched so far.
    Preface(usize),
    /// Not HTTP/2 (or the write side, before anything): nothing counted.
    Off,
    /// In frames: `have` bytes of the next header read into `header`, or
    /// `skip` payload bytes of the current frame left.
    Frames { header: [u8; 9], have: usize, skip: usize },
}

impl Framing {
    fn frames() -> Framing {
        Framing::Frames {
            header: [0; 9],
            have: 0,
            skip: 0,
        }
    }

    /// Follows `bytes`; calls `frame(type, flags)` at each complete header.
    fn follow(&mut self, mut bytes: &[u8], mut frame: impl FnMut(u8, u8)) {
        while !bytes.is_empty() {
            match self {
                Framing::Off => return,
                Framing::Preface(matched) => {
                    let n = (PREFACE.len() - *matched).min(bytes.len());
                    if bytes[..n] != PREFACE[*matched..*matched + n] {
                        *self = Framing::Off;
                        return;
                    }
                    *matched += n;
                    bytes = &bytes[n..];
                    if *matched == PREFACE.len() {
                        *self = Framing::frames();
                    }
                }
                Framing::Frames { header, have, skip } => {
                    if *skip > 0 {
                        let n = (*skip).min(bytes.len());
                        *skip -= n;
                        bytes = &bytes[n..];
                        continue;
                    }
                    let n = (9 - *have).min(bytes.len());
                    header[*have..*have + n].copy_from_slice(&bytes[..n]);
                    *have += n;
                    bytes = &bytes[n..];
                    if *have == 9 {
                        let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
                        frame(header[3], header[4]);
                        *have = 0;
                        *skip = len;
                    }
                }
            }
        }
    }

    /// Between two frames (nothing of a frame written but not finished).
    fn at_boundary(&self) -> bool {
        matches!(self, Framing::Frames { have: 0, skip: 0, .. })
    }
}

/// What a connection's peer sent and was sent, for its allowance.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    pub(crate) control: u64,
    pub(crate) requests: u64,
    pub(crate) written: u64,
}

impl Tally {
    /// The control frames allowed to a connection open `secs` seconds.
    fn allowance(&self, secs: u64) -> u64 {
        BASE.saturating_add(self.requests.saturating_mul(PER_REQUEST))
            .saturating_add(self.written / BYTES_PER_CONTROL)
            .saturating_add(secs)
    }

    fn over(&self, secs: u64) -> bool {
        self.control > self.allowance(secs)
    }
}

/// A connection's stream, its HTTP/2 control frames counted (module doc).
pub(crate) struct Metered<S> {
    inner: S,
    read: Framing,
    write: Framing,
    tally: Tally,
    /// When the connection was opened: its allowance grows with its age.
    opened: std::time::Instant,
    /// Control frames counted when the allowance was last looked at: it
    /// is looked at again only when a read brought more.
    seen: u64,
    /// Called once when the allowance is passed (counts the close).
    on_close: Option<Box<dyn FnOnce() + Send>>,
    /// Past the allowance: every read fails from then on.
    closed: bool,
}

impl<S> Metered<S> {
    pub(crate) fn new(inner: S, on_close: impl FnOnce() + Send + 'static) -> Metered<S> {
        Metered {
            inner,
            read: Framing::Preface(0),
            write: Framing::Off,
            tally: Tally::default(),
            opened: std::time::Instant::now(),
            seen: 0,
            on_close: Some(Box::new(on_close)),
            closed: false,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Metered<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.closed {
            return Poll::Ready(Err(calm()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let was_preface = matches!(this.read, Framing::Preface(_));
            let tally = &mut this.tally;
            this.read.follow(&buf.filled()[before..], |kind, flags| match kind {
                // HEADERS: a request (or its trailers): useful work.
                0x1 => tally.requests += 1,
                // PRIORITY, RST_STREAM, WINDOW_UPDATE; PING and SETTINGS
                // but their ACKs (answers to ours).
                0x2 | 0x3 | 0x8 => tally.control += 1,
                0x4 | 0x6 if flags & 0x1 == 0 => tally.control += 1,
                _ => {}
            });
            if was_preface && matches!(this.read, Framing::Frames { .. }) {
                // The server's side starts with its SETTINGS frame.
                this.write = Framing::frames();
            }
            let more = this.tally.control > this.seen;
            this.seen = this.tally.control;
            if more && this.tally.over(this.opened.elapsed().as_secs()) {
                this.closed = true;
                if let Some(count) = this.on_close.take() {
                    count();
                }
                tracing::debug!(
                    control = this.tally.control,
                    requests = this.tally.requests,
                    "HTTP/2 control frames past the allowance: GOAWAY and close"
                );
                if this.write.at_boundary() {
                    // Best effort, never waited for: the close is what counts.
                    let _ = Pin::new(&mut this.inner).poll_write(cx, &GOAWAY_CALM);
                    let _ = Pin::new(&mut this.inner).poll_flush(cx);
                }
                return Poll::Ready(Err(calm()));
            }
        }
        polled
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = polled {
            this.tally.written = this.tally.written.saturating_add(n as u64);
            this.write.follow(&data[..n], |_, _| {});
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            this.tally.written = this.tally.written.saturating_add(n as u64);
            let mut left = n;
            for b in bufs {
                if left == 0 {
                    break;
                }
                let take = left.min(b.len());
                this.write.follow(&b[..take], |_, _| {});
                left -= take;
            }
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn calm() -> io::Error {
    io::Error::other("HTTP/2 control frames past the connection's allowance")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, len: usize) -> Vec<u8> {
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags, 0, 0, 0, 1];
        f.extend(std::iter::repeat_n(0u8, len));
        f
    }

    fn tally_of(chunks: &[Vec<u8>], split: usize) -> (Tally, bool) {
        let mut framing = Framing::Preface(0);
        let mut t = Tally::default();
        let bytes: Vec<u8> = chunks.concat();
        for piece in bytes.chunks(split) {
            framing.follow(piece, |kind, flags| match kind {
                0x1 => t.requests += 1,
                0x2 | 0x3 | 0x8 => t.control += 1,
                0x4 | 0x6 if flags & 1 == 0 => t.control += 1,
                _ => {}
            });
        }
        (t, matches!(framing, Framing::Off))
    }

    #[test]
    fn frames_are_counted_however_the_bytes_are_split() {
        let mut chunks = vec![PREFACE.to_vec(), frame(0x4, 0, 12), frame(0x4, 1, 0)];
        for _ in 0..3 {
            chunks.push(frame(0x1, 0x4, 40));
            chunks.push(frame(0x0, 0x1, 20_000));
        }
        for _ in 0..5 {
            chunks.push(frame(0x6, 0, 8));
            chunks.push(frame(0x6, 1, 8));
        }
        chunks.push(frame(0x8, 0, 4));
        for split in [1, 7, 9, 24, 1000, 1 << 20] {
            let (t, off) = tally_of(&chunks, split);
            assert!(!off, "split {split}");
            // SETTINGS + 5 PINGs + 1 WINDOW_UPDATE; ACKs are not counted.
            assert_eq!((t.control, t.requests), (7, 3), "split {split}");
        }
    }

    #[test]
    fn http1_passes_untouched_and_a_ping_flood_is_over_the_allowance() {
        let (t, off) = tally_of(&[b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()], 5);
        assert!(off);
        assert_eq!(t.control, 0);
        let mut flood = vec![PREFACE.to_vec()];
        flood.extend((0..=BASE).map(|_| frame(0x6, 0, 8)));
        let (t, _) = tally_of(&flood, 4096);
        assert!(t.over(0), "{} PINGs and nothing else", t.control);
        assert!(!t.over(60), "a PING a second for a minute is keep-alive, not a flood");
        let mut busy = vec![PREFACE.to_vec()];
        for _ in 0..100 {
            busy.push(frame(0x1, 0x4, 30));
            busy.extend((0..PER_REQUEST).map(|_| frame(0x8, 0, 4)));
        }
        let (t, _) = tally_of(&busy, 4096);
        assert!(!t.over(0), "window updates in step with requests are not a flood");
    }
}
