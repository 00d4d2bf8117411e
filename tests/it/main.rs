//! The one integration-test binary: real gateway, simulator and redis-server.

mod support;

mod admin;
mod budget;
mod cache;
mod cluster;
mod core;
mod core_process;
mod docs;
mod faults;
mod first_scrape;
mod front_door;
mod harness;
mod hostile;
mod load;
mod money;
mod observability;
mod pyshovels;
mod rate;
mod records;
mod routes;
mod sim;
mod vendor;
