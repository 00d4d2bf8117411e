//! The one integration-test binary: real gateway, simulator and redis-server.

mod support;

mod harness;
mod sim;
