//! The one integration-test binary: real gateway, simulator and redis-server.

mod support;

mod admin;
mod apps;
mod binary;
mod budget;
mod cache;
mod cluster;
mod disk_tier;
mod docs;
mod faults;
mod first_scrape;
mod front_door;
mod gate;
mod harness;
mod hostile;
mod load;
mod log_sink;
mod money;
mod monthly;
mod observability;
mod operator;
mod per_core;
mod pyshovels;
mod rate;
mod records;
mod redis_pool;
mod redis_tls;
mod refusals;
mod request_surface;
mod routes;
mod sentinel;
mod siege;
mod spend;
mod trace_context;
mod vendor;
