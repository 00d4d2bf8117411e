//! Issue 60, points 1 and 2: every HTTP/2 frame that costs work is metered
//! (`server/frames.rs`), and the HPACK work of each connection has a budget
//! of its own (`server/hpack.rs`). Unsolicited PING ACKs, frames of an
//! unknown type and an HPACK bomb each kept a core busy on one connection
//! that was never closed; now each is sent GOAWAY (ENHANCE_YOUR_CALM) and
//! closed, and a client beside it is served. A client with a 1 KiB window
//! that returns each DATA frame's bytes at once (two WINDOW_UPDATEs a frame)
//! was closed after its first answer; now it is served to the end. The CPU
//! each flood costs is measured in bench/frame_floods.py.

use super::h2::{cpu_of, flood, frame, goaway_codes, PREFACE};
use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA};
use crate::support::probe::scrape;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited, SimConfig};
use http::StatusCode;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An HPACK integer with an `n`-bit prefix whose other bits are `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u8, mut value: usize) {
    let mask = (1usize << n) - 1;
    if value < mask {
        out.push(first | value as u8);
        return;
    }
    out.push(first | mask as u8);
    value -= mask;
    while value >= 128 {
        out.push(0x80 | (value & 0x7f) as u8);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A literal HPACK string (no Huffman).
fn hpack_string(out: &mut Vec<u8>, s: &[u8]) {
    hpack_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// `GET path` with the team's token (literals, nothing indexed).
fn get_block(path: &str, token: &str) -> Vec<u8> {
    // :method GET, :scheme http; :path and :authority with indexed names.
    let mut block = vec![0x82, 0x86];
    hpack_int(&mut block, 0, 4, 4);
    hpack_string(&mut block, path.as_bytes());
    hpack_int(&mut block, 0, 4, 1);
    hpack_string(&mut block, b"gateway");
    block.push(0);
    hpack_string(&mut block, b"x-api-key");
    hpack_string(&mut block, token.as_bytes());
    block
}

/// The HPACK bomb: a 4,000-byte header inserted into the decoder's table
/// once (`hello`), then header blocks of 16,000 one-byte references to it,
/// each a new stream (64 MB of headers a frame).
fn hpack_bomb() -> (Vec<u8>, Vec<u8>) {
    let mut insert = get_block("/v1/meta/release", "none");
    hpack_int(&mut insert, 0x40, 6, 0);
    hpack_string(&mut insert, b"x-bomb");
    hpack_string(&mut insert, &[b'b'; 4000]);
    let hello = frame(0x1, 0x5, 1, &insert);
    let refs = vec![0x80 | 62; 16_000];
    let batch: Vec<u8> = (0..4u32).flat_map(|i| frame(0x1, 0x5, 3 + 2 * i, &refs)).collect();
    (hello, batch)
}

/// A flood: its name, what it sends first, the batch it repeats, the frames
/// in a batch, and the GOAWAY codes that may close it.
struct Case<'a>(&'a str, &'a [u8], &'a [u8], u64, &'a [u32]);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_ack_unknown_frame_and_hpack_bomb_floods_are_each_closed_and_a_client_beside_is_served() {
    let sim = start_sim(unlimited()).await;
    let gw = ChildGateway::spawn(&Setup::new(), &sim.base_url(), sim.api_key());
    let alpha = Client::new(gw.base_url(), ALPHA.1);
    let warm = alpha.get(Query::meta_release()).await;
    assert_eq!(warm.status, StatusCode::OK);
    let ping_acks: Vec<u8> = (0..100u64).flat_map(|i| frame(0x6, 0x1, 0, &i.to_be_bytes())).collect();
    let unknown: Vec<u8> = (0..100u64).flat_map(|i| frame(0xfa, 0, 0, &i.to_be_bytes())).collect();
    let goaways: Vec<u8> = (0..100u32).flat_map(|_| frame(0x7, 0, 0, &[0; 8])).collect();
    let (bomb_hello, bomb) = hpack_bomb();
    // A GOAWAY ends the connection by itself (h2 goes away too, NO_ERROR):
    // the flood is closed either way.
    let floods = [
        Case("unsolicited PING ACKs", &[], &ping_acks, 100, &[0xb]),
        Case("frames of type 0xfa", &[], &unknown, 100, &[0xb]),
        Case("GOAWAYs", &[], &goaways, 100, &[0x0, 0xb]),
        Case("HPACK bomb", &bomb_hello, &bomb, 4, &[0xb]),
    ];
    let pid = gw.child.id();
    for Case(what, hello, batch, per_batch, codes) in floods {
        let before = cpu_of(pid);
        let f = flood(gw.addr, hello, batch, per_batch).await;
        let cpu = cpu_of(pid).saturating_sub(before);
        eprintln!(
            "{what}: closed after {:?}, {} frames written before the writer saw it, GOAWAY {:?}, gateway CPU {cpu:?}",
            f.took, f.sent, f.goaway
        );
        // Generous: the flood itself would go on for 10 s.
        assert!(f.took < Duration::from_secs(5), "{what}: closed after {:?}", f.took);
        assert!(
            f.goaway.iter().any(|c| codes.contains(c)),
            "{what}: GOAWAY {codes:?}, got {:?}",
            f.goaway
        );
        // Meanwhile (and after) another client is served.
        let r = alpha.get(Query::meta_release()).await;
        assert_eq!(r.status, StatusCode::OK, "{what}");
    }
    let m = scrape(&gw.admin_url()).await;
    let closes = m.sum(
        "gateway_overload_actions_total",
        &[("pool", "control_frames"), ("action", "close")],
    );
    assert!(closes >= 3.0, "each flood's close counted: {closes}");
    // The bomb's requests cost no upstream call: one warm-up, then hits.
    assert_eq!(sim.stats().requests_total, 1);
}

/// A client with `SETTINGS_INITIAL_WINDOW_SIZE` of `window` that returns
/// each DATA frame's bytes at once (a WINDOW_UPDATE for the stream and one
/// for the connection), fetching `path` `times` times one after the other
/// on one connection. Returns the answers' body sizes; an `Err` says how
/// the gateway ended it.
async fn small_window_client(addr: SocketAddr, window: u32, path: &str, times: u32) -> Result<Vec<usize>, String> {
    let mut s = TcpStream::connect(addr).await.expect("connects");
    let mut hello = PREFACE.to_vec();
    let w = window.to_be_bytes();
    hello.extend(frame(0x4, 0, 0, &[0, 4, w[0], w[1], w[2], w[3]]));
    s.write_all(&hello).await.expect("preface");
    let mut inbox: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut sizes = Vec::new();
    for i in 0..times {
        let stream = 1 + 2 * i;
        s.write_all(&frame(0x1, 0x5, stream, &get_block(path, ALPHA.1)))
            .await
            .map_err(|e| format!("answer {i}: request: {e}"))?;
        let mut body = 0usize;
        let mut status_ok = false;
        loop {
            // One complete frame from the inbox, reading more as needed.
            while inbox.len() < 9 || inbox.len() < 9 + frame_len(&inbox) {
                let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                    .await
                    .map_err(|_| format!("answer {i}: nothing for 10 s"))?
                    .map_err(|e| format!("answer {i}: {e}"))?;
                if n == 0 {
                    return Err(format!("answer {i}: closed, GOAWAY {:?}", goaway_codes(&inbox)));
                }
                inbox.extend_from_slice(&buf[..n]);
            }
            let len = frame_len(&inbox);
            let (kind, flags) = (inbox[3], inbox[4]);
            let on = u32::from_be_bytes([inbox[5], inbox[6], inbox[7], inbox[8]]) & 0x7fff_ffff;
            let payload = inbox[9..9 + len].to_vec();
            inbox.drain(..9 + len);
            let mut reply = Vec::new();
            match kind {
                // SETTINGS: acknowledged.
                0x4 if flags & 1 == 0 => reply.extend(frame(0x4, 1, 0, &[])),
                // PING: answered.
                0x6 if flags & 1 == 0 => reply.extend(frame(0x6, 1, 0, &payload)),
                0x7 => {
                    return Err(format!(
                        "answer {i}: GOAWAY {:?}",
                        goaway_codes(&frame(0x7, 0, 0, &payload))
                    ))
                }
                // :status 200 is the static table's index 8.
                0x1 if on == stream => status_ok = payload.first() == Some(&0x88),
                0x0 if on == stream => {
                    body += len;
                    if len > 0 {
                        let n = u32::try_from(len).expect("frame").to_be_bytes();
                        reply.extend(frame(0x8, 0, stream, &n));
                        reply.extend(frame(0x8, 0, 0, &n));
                    }
                }
                _ => {}
            }
            if !reply.is_empty() {
                s.write_all(&reply).await.map_err(|e| format!("answer {i}: {e}"))?;
            }
            if on == stream && (kind == 0x0 || kind == 0x1) && flags & 1 != 0 {
                break;
            }
        }
        if !status_ok {
            return Err(format!("answer {i}: not a 200"));
        }
        sizes.push(body);
    }
    Ok(sizes)
}

fn frame_len(b: &[u8]) -> usize {
    usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_a_one_kib_window_that_keeps_up_is_served_to_the_end() {
    let sim = start_sim(SimConfig {
        credit_limit: Some(100_000_000),
        ..unlimited()
    })
    .await;
    let gw = Setup::new().start(&sim).await;
    let base = format!("http://{}", gw.addr);
    // A page of 100 permits: the answer of about 128 KB, bought once.
    let page = Query::state_permits(&sim.samples()).size(100);
    let first = Client::new(&base, ALPHA.1).get(&page).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let size = first.body.len();
    let path = page.to_string();
    for window in [1024, 4096] {
        let sizes = small_window_client(gw.addr, window, &path, 100)
            .await
            .unwrap_or_else(|e| panic!("window {window}: {e}"));
        eprintln!("window {window}: 100 answers of {size} bytes served on one connection");
        assert!(sizes.iter().all(|s| *s == size), "window {window}: {sizes:?}");
    }
    assert!(
        size >= 100_000,
        "an answer of {size} bytes is too small to test anything"
    );
    assert_eq!(sim.stats().requests_total, 1, "one call, then hits");
}
