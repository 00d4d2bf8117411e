//! Issue 50, point 4: HTTP/2 control frames cost CPU without limit. One
//! anonymous h2c connection sending PINGs as fast as it can kept a core busy
//! (+6.1 s of CPU in 6 s) and was never closed. Now each connection has an
//! allowance of control frames that grows with its useful work
//! (`server/frames.rs`): past it, GOAWAY (ENHANCE_YOUR_CALM) and closed.

use super::h2::{cpu_of, flood, frame};
use crate::support::client::Client;
use crate::support::gateway::{ChildGateway, Setup, ALPHA};
use crate::support::probe::scrape;
use crate::support::query::Query;
use crate::support::sim::{start_sim, unlimited};
use http::StatusCode;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_is_sent_enhance_your_calm_and_closed_and_costs_little_cpu() {
    let sim = start_sim(unlimited()).await;
    let gw = ChildGateway::spawn(&Setup::new(), &sim.base_url(), sim.api_key());
    let pid = gw.child.id();
    let cpu_before = cpu_of(pid);
    // PINGs, 100 a write, until the gateway closes (or 10 s).
    let pings: Vec<u8> = (0..100u64).flat_map(|i| frame(0x6, 0, 0, &i.to_be_bytes())).collect();
    let f = flood(gw.addr, &[], &pings, 100).await;
    let (sent, took) = (f.sent, f.took);
    let cpu = cpu_of(pid).saturating_sub(cpu_before);
    eprintln!("PING flood: {sent} PINGs written before the close, {took:?}, gateway CPU {cpu:?}");
    assert!(
        took < Duration::from_secs(6),
        "closed before the flood's 6 s were up: {took:?}"
    );
    assert!(f.goaway.contains(&0xb), "GOAWAY ENHANCE_YOUR_CALM: {:?}", f.goaway);
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
