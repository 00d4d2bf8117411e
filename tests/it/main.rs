//! The one integration-test binary: real gateway, simulator and redis-server.

mod support;

mod cache;
mod core;
mod core_process;
mod docs;
mod harness;
mod sim;
