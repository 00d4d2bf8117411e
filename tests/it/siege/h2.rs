//! Raw HTTP/2 frames, written and read by the flood tests, and what a
//! flood cost the gateway.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The client connection preface.
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One frame: the 9-byte head, then the payload.
pub(super) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("small frame").to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// The GOAWAY frames' error codes in what the server sent.
pub(super) fn goaway_codes(bytes: &[u8]) -> Vec<u32> {
    let mut codes = Vec::new();
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let len = usize::from(bytes[at]) << 16 | usize::from(bytes[at + 1]) << 8 | usize::from(bytes[at + 2]);
        if bytes[at + 3] == 0x7 && at + 9 + 8 <= bytes.len() {
            let p = &bytes[at + 9..];
            codes.push(u32::from_be_bytes([p[4], p[5], p[6], p[7]]));
        }
        at += 9 + len;
    }
    codes
}

/// What a flood did: how long until the gateway closed the connection,
/// the frames written until then, and the GOAWAY codes it was sent.
pub(super) struct Flood {
    pub(super) took: Duration,
    pub(super) sent: u64,
    pub(super) goaway: Vec<u32>,
}

/// Opens an h2c connection, writes `hello` after the preface and an empty
/// SETTINGS, then `batch` over and over for up to 10 s or until the gateway
/// closes the connection (`per_batch` frames a write).
pub(super) async fn flood(addr: SocketAddr, hello: &[u8], batch: &[u8], per_batch: u64) -> Flood {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).await.expect("connects");
    let mut first = PREFACE.to_vec();
    first.extend(frame(0x4, 0, 0, &[]));
    first.extend_from_slice(hello);
    s.write_all(&first).await.expect("preface");
    let (mut rd, mut wr) = s.into_split();
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = rd.read(&mut buf).await {
            got.extend_from_slice(&buf[..n]);
        }
        (got, Instant::now())
    });
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_secs(10) && !reader.is_finished() {
        if wr.write_all(batch).await.is_err() {
            break;
        }
        sent += per_batch;
    }
    let (got, closed) = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the gateway closes the connection")
        .expect("reader");
    Flood {
        took: closed - started,
        sent,
        goaway: goaway_codes(&got),
    }
}

/// CPU time (user + system) a process has used so far.
pub(super) fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    // Fields after the command (in parentheses, which may hold spaces).
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields[i].parse::<u64>().expect("ticks");
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    Duration::from_millis((ticks(11) + ticks(12)) * 1000 / clock_ticks())
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`).
fn clock_ticks() -> u64 {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("getconf");
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("CLK_TCK")
}
