//! Test harness shared by every integration test: real servers on port 0.
//!
//! - `client`: the test client: a team (or the upstream) at a base URL,
//!   sending `query` values and asserting statuses.
//! - `query`: the typed path and query of a `/v2` request.
//! - `http`: the one-request transport under `client`: status, headers, body.
//! - `conn`: one client's own HTTP/1.1 connection, for tests of connections.
//! - `sim`: the upstream simulator started in-process on 127.0.0.1:0.
//! - `redis`: a real `redis-server` child in a temp dir, killed on drop.
//! - `monitor`: Redis MONITOR, to see what a call made Redis do.
//! - `redis_cluster`: a real 3 + 3 node Redis Cluster, killed on drop.
//! - `redis_tls`: a real TLS-only `redis-server` with a throw-away CA.
//! - `redis_sentinel`: a primary, a replica and three Sentinels.
//! - `gateway`: the real gateway, in-process or as a child process.
//! - `tls`: a throwaway CA and leaf certificate.
//! - `flight`: a key's in-process flight led by the test, to hold a request in flight.
//! - `threads`: this process's threads (an in-process gateway's per-core loops).
//! - `wait`: `eventually`, polling a condition with a deadline.
//! - `alloc`: a counting allocator (bytes each thread keeps allocated).
#![allow(dead_code)]

// A global allocator is `unsafe impl GlobalAlloc` by definition.
#[allow(unsafe_code)]
pub mod alloc;
pub mod client;
pub mod conn;
pub mod flight;
pub mod gateway;
pub mod http;
pub mod monitor;
pub mod probe;
pub mod prometheus;
pub mod query;
pub mod redis;
pub mod redis_cluster;
pub mod redis_proc;
pub mod redis_sentinel;
pub mod redis_tls;
pub mod relay;
pub mod secrets;
pub mod sim;
pub mod stall_relay;
pub mod threads;
pub mod tls;
pub mod traffic;
pub mod volume;
pub mod wait;

/// A loopback port free now, for a child process that must be told its
/// port (it is released again before the child binds it).
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`,
/// 32768–60999 by default), never from it: a port of that range, released,
/// can be handed to any outgoing connection before the child binds it, and
/// a client that retries a port nobody listens on yet (a gateway started
/// before its Redis) can connect to itself on it (TCP self-connect),
/// holding the port: `redis-server` then failed to start, once a few CI
/// runs. Each port is handed out once per test run (a counter, from an
/// offset of this process's id), and checked free by binding it.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if ephemeral_from <= LOW + 1_000 {
        // No room below the range: the kernel's pick.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        return l.local_addr().expect("local addr").port();
    }
    let span = ephemeral_from - LOW;
    let offset = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = LOW + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(port).expect("below the ephemeral range");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port below {ephemeral_from}");
}
