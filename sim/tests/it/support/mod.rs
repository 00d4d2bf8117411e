//! What the simulator's tests share: a small HTTP client and the simulator
//! started on 127.0.0.1:0. The gateway's suite (`tests/it/support/`) has its
//! own, larger harness; nothing here needs the gateway.

pub mod http;
pub mod sim;
