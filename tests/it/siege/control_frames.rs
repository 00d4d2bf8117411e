//! Issue 50, point 4: HTTP/2 control frames cost CPU without limit. One
//! anonymous h2c connection sending PINGs as fast as it can kept a core busy
//! (+6.1 s of CPU in 6 s) and was never closed. Now each connection has an
//! allowance of control frames that grows with its useful work
//! (`server/frames.rs`): past it, GOAWAY (ENHANCE_YOUR_CALM) and closed.

use super::h2::{frame, goaway_codes};
use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA};
use crate::support::probe::scrape;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited};
use http::StatusCode;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// CPU time (user + system) a process has used so far.
fn cpu_of(pid: u32) -> Duration {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_is_sent_enhance_your_calm_and_closed_and_costs_little_cpu() {
    let sim = start_sim(unlimited()).await;
    let gw = ChildGateway::spawn(&Setup::new(), &sim.base_url(), sim.api_key());
    let pid = gw.child.id();
    let cpu_before = cpu_of(pid);
    let started = Instant::now();
    let mut s = TcpStream::connect(gw.addr).await.expect("connects");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(0x4, 0, 0, &[]));
    s.write_all(&hello).await.expect("preface");
    let (mut rd, mut wr) = s.into_split();
    let reader = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = rd.read(&mut buf).await {
            got.extend_from_slice(&buf[..n]);
        }
        got
    });
    // PINGs, 100 a write, for up to 6 s or until the gateway closes.
    let pings: Vec<u8> = (0..100u64).flat_map(|i| frame(0x6, 0, 0, &i.to_be_bytes())).collect();
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_secs(6) {
        if wr.write_all(&pings).await.is_err() {
            break;
        }
        sent += 100;
    }
    let got = tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the gateway closes the connection")
        .expect("reader");
    let took = started.elapsed();
    let cpu = cpu_of(pid).saturating_sub(cpu_before);
    eprintln!("PING flood: {sent} PINGs written before the close, {took:?}, gateway CPU {cpu:?}");
    assert!(
        took < Duration::from_secs(6),
        "closed before the flood's 6 s were up: {took:?}"
    );
    assert!(
        goaway_codes(&got).contains(&0xb),
        "GOAWAY ENHANCE_YOUR_CALM: {:?}",
        goaway_codes(&got)
    );
    assert!(cpu < Duration::from_millis(1500), "gateway CPU {cpu:?}");
    let m = scrape(&gw.admin_url()).await;
    let closes = m.sum(
        "gateway_overload_actions_total",
        &[("pool", "control_frames"), ("action", "close")],
    );
    assert!(closes >= 1.0, "counted: {closes}");
    // The gateway serves on.
    let r = Client::new(gw.base_url(), ALPHA.1).get(Query::meta_release()).await;
    assert_eq!(r.status, StatusCode::OK);
}
