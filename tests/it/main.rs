//! The one integration-test binary: real gateway, simulator and redis-server.

mod support;

mod budget;
mod cache;
mod core;
mod core_process;
mod docs;
mod faults;
mod first_scrape;
mod harness;
mod hostile;
mod load;
mod observability;
mod rate;
mod sim;
