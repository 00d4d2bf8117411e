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
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    l.local_addr().expect("local addr").port()
}
