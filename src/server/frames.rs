//! A budget of HTTP/2 control frames and of HPACK work per connection,
//! counted below hyper.
//!
//! hyper (h2) answers every PING, applies every SETTINGS and
//! WINDOW_UPDATE, skips every frame of an unknown type and decodes every
//! header block, with no limit on how many a peer sends: one connection
//! sending PINGs as fast as it can kept a core busy and was never closed
//! (measured: +6.1 s of CPU in 6 s); so did PING ACKs, unknown frame types
//! (+5.9 s, +5.3 s) and an HPACK bomb (+4.7 s, issue 60). Envoy and nginx
//! cap control frames; so does this, the way nginx does: the bytes a peer
//! sends are read through [`Metered`], which follows the HTTP/2 frame
//! headers (after the client preface; any other protocol passes through
//! untouched) and counts every frame that costs work and is not a HEADERS
//! frame opening a request or a DATA frame carrying bytes: PING, SETTINGS,
//! WINDOW_UPDATE, RST_STREAM, PRIORITY, GOAWAY, PUSH_PROMISE,
//! CONTINUATION, empty DATA, trailers, every unknown or extension type,
//! and PING and SETTINGS ACKs beyond the PINGs and SETTINGS the gateway
//! sent. They are counted against an allowance that grows with useful work
//! and with time: [`BASE`], plus [`PER_REQUEST`] per request, two per DATA
//! frame written (a client returning each frame's bytes at once sends a
//! WINDOW_UPDATE for its stream and one for the connection, whatever its
//! window: a 1 KiB window is served to the end), one per
//! [`BYTES_PER_CONTROL`] of answer written and one per second the
//! connection has been open (a client's keep-alive PINGs, at any sane
//! interval, never run out). Each header block is charged the work its
//! decoding costs (`hpack.rs`: bytes decoded, fields, dynamic-table inserts,
//! evictions and size updates) against a budget of its own: [`HPACK_BASE`]
//! plus [`HPACK_PER_REQUEST`] per request. Past either, the connection is
//! sent a GOAWAY with ENHANCE_YOUR_CALM (when the write side is between
//! frames) and closed, and the close is counted
//! (`gateway_overload_actions_total{pool="control_frames",action="close"}`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::hpack;

/// Control frames any connection may send before it has done anything.
pub(crate) const BASE: u64 = 200;
/// Control frames each request (HEADERS frame) adds to the allowance.
pub(crate) const PER_REQUEST: u64 = 20;
/// Answer bytes written per control frame added to the allowance.
pub(crate) const BYTES_PER_CONTROL: u64 = 4096;
/// HPACK work (`hpack.rs`) any connection may cost before it has done
/// anything, and what each request adds: an ordinary request's headers
/// cost 1 to 2 KiB of it, a header list at `server.max_header_bytes`'s
/// default (16 KiB) some 20 KiB.
pub(crate) const HPACK_BASE: u64 = 256 * 1024;
pub(crate) const HPACK_PER_REQUEST: u64 = 64 * 1024;

/// The HPACK work each request adds for a listener taking header lists of
/// `max_header_bytes` (`server.max_header_bytes`): [`HPACK_PER_REQUEST`],
/// or twice the limit where it is raised past 32 KiB.
pub(crate) fn hpack_per_request(max_header_bytes: usize) -> u64 {
    HPACK_PER_REQUEST.max((max_header_bytes as u64).saturating_mul(2))
}

/// A header block's bytes kept past this are dropped once it is charged:
/// a connection holds no more than an ordinary request's between blocks.
const BLOCK_KEPT: usize = 4096;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// GOAWAY, last stream 0 (no stream of this connection is promised an
/// answer past this point: the peer was abusive), ENHANCE_YOUR_CALM (0xb).
const GOAWAY_CALM: [u8; 17] = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0b];

/// A frame header: its type, flags, payload length and stream.
#[derive(Debug, Clone, Copy, Default)]
struct Head {
    kind: u8,
    flags: u8,
    len: usize,
    stream: u32,
}

/// What is told of the frames one direction carries.
trait Watch {
    /// A complete frame header.
    fn head(&mut self, head: &Head);
    /// Some of the current frame's payload.
    fn payload(&mut self, _head: &Head, _bytes: &[u8]) {}
    /// The current frame's last byte was seen.
    fn end(&mut self, _head: &Head) {}
}

/// Where a direction of the stream is in the HTTP/2 framing.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// Matching the client preface: this many bytes matched so far.
    Preface(usize),
    /// Not HTTP/2 (or the write side, before anything): nothing counted.
    Off,
    /// In frames: `have` bytes of the next header read into `header`, or
    /// `skip` payload bytes of the `current` frame left.
    Frames {
        header: [u8; 9],
        have: usize,
        skip: usize,
        current: Head,
    },
}

impl Framing {
    fn frames() -> Framing {
        Framing::Frames {
            header: [0; 9],
            have: 0,
            skip: 0,
            current: Head::default(),
        }
    }

    /// Follows `bytes`, telling `watch` of each frame.
    fn follow(&mut self, mut bytes: &[u8], watch: &mut impl Watch) {
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
                Framing::Frames {
                    header,
                    have,
                    skip,
                    current,
                } => {
                    if *skip > 0 {
                        let n = (*skip).min(bytes.len());
                        watch.payload(current, &bytes[..n]);
                        *skip -= n;
                        bytes = &bytes[n..];
                        if *skip == 0 {
                            watch.end(current);
                        }
                        continue;
                    }
                    let n = (9 - *have).min(bytes.len());
                    header[*have..*have + n].copy_from_slice(&bytes[..n]);
                    *have += n;
                    bytes = &bytes[n..];
                    if *have == 9 {
                        *current = Head {
                            kind: header[3],
                            flags: header[4],
                            len: usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]),
                            stream: u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff,
                        };
                        watch.head(current);
                        *have = 0;
                        *skip = current.len;
                        if *skip == 0 {
                            watch.end(current);
                        }
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

/// What a connection's peer sent and was sent, for its allowances.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Frames that cost work without being a request or request bytes.
    pub(crate) control: u64,
    /// HEADERS frames that opened a stream.
    pub(crate) requests: u64,
    /// Answer bytes written.
    pub(crate) written: u64,
    /// DATA frames with bytes written: each may take the client two
    /// WINDOW_UPDATEs (its stream's and the connection's).
    pub(crate) data_sent: u64,
    /// PINGs and SETTINGS the gateway sent (not ACKs): as many ACKs are
    /// answers, not control frames.
    pings_sent: u64,
    settings_sent: u64,
    ping_acks: u64,
    settings_acks: u64,
    /// The highest stream the client opened: a HEADERS frame on it or
    /// below is trailers (or bogus), not a request.
    last_stream: u32,
    /// HPACK work of the header blocks decoded so far (`hpack.rs`).
    pub(crate) hpack: u64,
    /// What each request adds to the HPACK budget ([`hpack_per_request`]).
    hpack_per_request: u64,
    table: hpack::Table,
    /// The header block being received (HEADERS, then CONTINUATIONs).
    block: Vec<u8>,
    /// The current HEADERS frame's payload (its padding and priority are
    /// taken off at its end).
    frame: Vec<u8>,
}

impl Tally {
    fn new(hpack_per_request: u64) -> Tally {
        Tally {
            hpack_per_request,
            ..Tally::default()
        }
    }

    /// The control frames allowed to a connection open `secs` seconds.
    fn allowance(&self, secs: u64) -> u64 {
        BASE.saturating_add(self.requests.saturating_mul(PER_REQUEST))
            .saturating_add(self.written / BYTES_PER_CONTROL)
            .saturating_add(self.data_sent.saturating_mul(2))
            .saturating_add(secs)
    }

    /// The HPACK work allowed to a connection.
    fn hpack_allowance(&self) -> u64 {
        HPACK_BASE.saturating_add(self.requests.saturating_mul(self.hpack_per_request))
    }

    fn over(&self, secs: u64) -> bool {
        self.control > self.allowance(secs) || self.hpack > self.hpack_allowance()
    }

    /// The most of one header block kept to be estimated: twice the
    /// header list a request may have, at least 64 KiB (`hpack_per_request`).
    fn block_max(&self) -> usize {
        usize::try_from(self.hpack_per_request).unwrap_or(usize::MAX)
    }

    /// A header block's fragment: kept until its END_HEADERS, then charged.
    fn fragment(&mut self, bytes: &[u8]) {
        if self.block.len() + bytes.len() > self.block_max() {
            // Past any header list the gateway takes: charged by the byte,
            // never kept (h2 refuses the block).
            self.hpack = self.hpack.saturating_add(bytes.len() as u64 * hpack::PER_FIELD);
        } else {
            self.block.extend_from_slice(bytes);
        }
    }

    fn block_done(&mut self) {
        let work = self.table.work(&self.block);
        self.hpack = self.hpack.saturating_add(work);
        self.block.clear();
        if self.block.capacity() > BLOCK_KEPT {
            self.block = Vec::new();
        }
    }
}

/// The client's frames: what each costs.
impl Watch for Tally {
    fn head(&mut self, h: &Head) {
        let ack = h.flags & 0x1 != 0;
        match h.kind {
            // DATA with bytes is the request's body: useful work.
            0x0 if h.len > 0 => {}
            // HEADERS opening a stream: a request.
            0x1 if h.stream % 2 == 1 && h.stream > self.last_stream => {
                self.requests += 1;
                self.last_stream = h.stream;
            }
            0x4 if ack => {
                self.settings_acks += 1;
                // One more than counted: the gateway's first SETTINGS may
                // be written before the preface is read.
                if self.settings_acks > self.settings_sent + 1 {
                    self.control += 1;
                }
            }
            0x6 if ack => {
                self.ping_acks += 1;
                if self.ping_acks > self.pings_sent {
                    self.control += 1;
                }
            }
            // Empty DATA, trailers, PRIORITY, RST_STREAM, SETTINGS,
            // PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION and
            // every unknown or extension type.
            _ => self.control += 1,
        }
    }

    fn payload(&mut self, h: &Head, bytes: &[u8]) {
        match h.kind {
            // A HEADERS frame is at most 16 KiB (h2's SETTINGS_MAX_FRAME_SIZE).
            0x1 if self.frame.len() + bytes.len() <= self.block_max() => self.frame.extend_from_slice(bytes),
            0x1 => self.hpack = self.hpack.saturating_add(bytes.len() as u64 * hpack::PER_FIELD),
            0x9 => self.fragment(bytes),
            _ => {}
        }
    }

    fn end(&mut self, h: &Head) {
        match h.kind {
            0x1 => {
                let mut frame = std::mem::take(&mut self.frame);
                self.block.clear();
                // PADDED (0x8): a length byte first, the padding last;
                // PRIORITY (0x20): five bytes before the block.
                let padded = h.flags & 0x8 != 0;
                let pad = if padded {
                    frame.first().map_or(0, |p| usize::from(*p))
                } else {
                    0
                };
                let start = (usize::from(padded) + if h.flags & 0x20 != 0 { 5 } else { 0 }).min(frame.len());
                let stop = frame.len().saturating_sub(pad).max(start);
                self.fragment(&frame[start..stop]);
                if frame.capacity() <= BLOCK_KEPT {
                    frame.clear();
                    self.frame = frame;
                }
            }
            0x9 => {}
            _ => return,
        }
        if h.flags & 0x4 != 0 {
            self.block_done();
        }
    }
}

/// The gateway's frames, counted for what they entitle the client to.
struct Sent<'a>(&'a mut Tally);

impl Watch for Sent<'_> {
    fn head(&mut self, h: &Head) {
        let ack = h.flags & 0x1 != 0;
        match h.kind {
            0x0 if h.len > 0 => self.0.data_sent += 1,
            0x4 if !ack => self.0.settings_sent += 1,
            0x6 if !ack => self.0.pings_sent += 1,
            _ => {}
        }
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
    /// Control frames and HPACK work counted when the allowances were
    /// last looked at: they are looked at again only when a read brought more.
    seen: u64,
    /// Called once when the allowance is passed (counts the close).
    on_close: Option<Box<dyn FnOnce() + Send>>,
    /// Past the allowance: every read fails from then on.
    closed: bool,
}

impl<S> Metered<S> {
    /// `hpack_per_request`: what each request adds to the HPACK budget
    /// ([`hpack_per_request`]).
    pub(crate) fn new(inner: S, on_close: impl FnOnce() + Send + 'static, hpack_per_request: u64) -> Metered<S> {
        Metered {
            inner,
            read: Framing::Preface(0),
            write: Framing::Off,
            tally: Tally::new(hpack_per_request),
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
            this.read.follow(&buf.filled()[before..], &mut this.tally);
            if was_preface && matches!(this.read, Framing::Frames { .. }) {
                // The server's side starts with its SETTINGS frame.
                this.write = Framing::frames();
            }
            let cost = this.tally.control.saturating_add(this.tally.hpack);
            let more = cost > this.seen;
            this.seen = cost;
            if more && this.tally.over(this.opened.elapsed().as_secs()) {
                this.closed = true;
                if let Some(count) = this.on_close.take() {
                    count();
                }
                tracing::debug!(
                    control = this.tally.control,
                    hpack = this.tally.hpack,
                    requests = this.tally.requests,
                    "HTTP/2 control frames or HPACK work past the allowance: GOAWAY and close"
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
            this.write.follow(&data[..n], &mut Sent(&mut this.tally));
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
                this.write.follow(&b[..take], &mut Sent(&mut this.tally));
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
    io::Error::other("HTTP/2 control frames or HPACK work past the connection's allowance")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(kind: u8, flags: u8, stream: u32, len: usize) -> Vec<u8> {
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend(std::iter::repeat_n(0x82u8, len));
        f
    }

    fn frame(kind: u8, flags: u8, len: usize) -> Vec<u8> {
        on(kind, flags, 0, len)
    }

    fn tally_of(chunks: &[Vec<u8>], split: usize) -> (Tally, bool) {
        let mut framing = Framing::Preface(0);
        let mut t = Tally::new(HPACK_PER_REQUEST);
        let bytes: Vec<u8> = chunks.concat();
        for piece in bytes.chunks(split) {
            framing.follow(piece, &mut t);
        }
        (t, matches!(framing, Framing::Off))
    }

    #[test]
    fn frames_are_counted_however_the_bytes_are_split() {
        let mut chunks = vec![PREFACE.to_vec(), frame(0x4, 0, 12), frame(0x4, 1, 0)];
        for i in 0..3 {
            // A request (END_HEADERS, 40 × `:method GET`), its body, an empty
            // DATA ending it, and trailers.
            chunks.push(on(0x1, 0x4, 2 * i + 1, 40));
            chunks.push(on(0x0, 0x0, 2 * i + 1, 20_000));
            chunks.push(on(0x0, 0x1, 2 * i + 1, 0));
            chunks.push(on(0x1, 0x5, 2 * i + 1, 1));
        }
        for _ in 0..5 {
            chunks.push(frame(0x6, 0, 8));
            chunks.push(frame(0x6, 1, 8));
        }
        chunks.push(frame(0x8, 0, 4));
        chunks.push(frame(0x7, 0, 8));
        chunks.push(frame(0xfa, 0, 3));
        chunks.push(on(0x9, 0x4, 1, 2));
        for split in [1, 7, 9, 24, 1000, 1 << 20] {
            let (t, off) = tally_of(&chunks, split);
            assert!(!off, "split {split}");
            // SETTINGS, 3 empty DATA, 3 trailers, 5 PINGs and 5 unsolicited
            // PING ACKs, WINDOW_UPDATE, GOAWAY, 0xfa, CONTINUATION; the
            // SETTINGS ACK answers the gateway's SETTINGS.
            assert_eq!((t.control, t.requests), (21, 3), "split {split}");
            // 42 + 1 + 2 fields of 5 decoded bytes each.
            assert_eq!(
                t.hpack,
                3 * 41 * (hpack::PER_FIELD + 10) + 2 * (hpack::PER_FIELD + 10),
                "split {split}"
            );
        }
    }

    #[test]
    fn acks_answering_the_gateways_pings_and_padding_are_not_charged() {
        let mut t = Tally::new(HPACK_PER_REQUEST);
        let mut sent = Framing::frames();
        sent.follow(&[frame(0x6, 0, 8), frame(0x6, 0, 8)].concat(), &mut Sent(&mut t));
        let mut read = Framing::frames();
        read.follow(&[frame(0x6, 1, 8), frame(0x6, 1, 8)].concat(), &mut t);
        assert_eq!(t.control, 0);
        read.follow(&frame(0x6, 1, 8), &mut t);
        assert_eq!(t.control, 1);
        // PADDED and PRIORITY: pad length 3, 5 priority bytes, 2 fields, 3
        // bytes of padding (which would decode as fields if read).
        let mut padded = vec![
            0,
            0,
            11,
            0x1,
            0x4 | 0x8 | 0x20,
            0,
            0,
            0,
            1,
            3,
            0,
            0,
            0,
            0,
            0,
            0x82,
            0x82,
        ];
        padded.extend([0x82, 0x82, 0x82]);
        read.follow(&padded, &mut t);
        assert_eq!((t.requests, t.hpack), (1, 2 * (hpack::PER_FIELD + 10)));
    }

    #[test]
    fn a_small_window_kept_up_with_is_served() {
        // A 1 KiB window, returned at once: two WINDOW_UPDATEs per DATA
        // frame, 128 answers of 128 KiB on one connection.
        let mut t = Tally::new(HPACK_PER_REQUEST);
        let mut sent = Framing::frames();
        let mut read = Framing::frames();
        for i in 0..128 {
            read.follow(&on(0x1, 0x5, 2 * i + 1, 20), &mut t);
            for _ in 0..128 {
                sent.follow(&on(0x0, 0, 2 * i + 1, 1024), &mut Sent(&mut t));
                read.follow(&[frame(0x8, 0, 4), on(0x8, 0, 2 * i + 1, 4)].concat(), &mut t);
                t.written += 1033;
                assert!(!t.over(0), "answer {i}: {} control frames", t.control);
            }
        }
    }

    #[test]
    fn the_hpack_budget_follows_a_raised_header_limit() {
        assert_eq!(hpack_per_request(16 * 1024), HPACK_PER_REQUEST);
        assert_eq!(hpack_per_request(1 << 20), 2 << 20);
    }

    #[test]
    fn http1_passes_untouched_and_floods_are_over_the_allowance() {
        let (t, off) = tally_of(&[b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()], 5);
        assert!(off);
        assert_eq!(t.control, 0);
        for (kind, flags) in [(0x6, 0), (0x6, 1), (0xfa, 0), (0x7, 0), (0x0, 1)] {
            let mut flood = vec![PREFACE.to_vec()];
            flood.extend((0..=BASE).map(|_| on(kind, flags, 1, if kind == 0 { 0 } else { 8 })));
            let (t, _) = tally_of(&flood, 4096);
            assert!(t.over(0), "{} frames of type {kind:#x}", t.control);
            assert!(!t.over(60), "one a second for a minute is keep-alive, not a flood");
        }
        let mut busy = vec![PREFACE.to_vec()];
        for i in 0..100 {
            busy.push(on(0x1, 0x4, 2 * i + 1, 30));
            busy.extend((0..PER_REQUEST).map(|_| frame(0x8, 0, 4)));
        }
        let (t, _) = tally_of(&busy, 4096);
        assert!(!t.over(0), "window updates in step with requests are not a flood");
        // A header block of 16,000 static references: no request's headers.
        let (t, _) = tally_of(&[PREFACE.to_vec(), on(0x1, 0x4, 1, 16_000)], 4096);
        assert!(t.over(0), "HPACK work {}", t.hpack);
    }
}
