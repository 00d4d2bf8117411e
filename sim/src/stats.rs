//! What the simulator served: counters per path and status, credits, and a
//! bounded log of every `/v2` request, so tests can assert exactly what
//! reached the upstream (and attribute spend by `X-Request-Id`).

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// Oldest entries are dropped beyond this, so long benchmarks stay bounded.
pub const LOG_CAP: usize = 200_000;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stats {
    pub requests_total: u64,
    pub by_path: BTreeMap<String, u64>,
    pub by_status: BTreeMap<u16, u64>,
    pub credits_total: u64,
    pub credits_window_used: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogEntry {
    pub seq: u64,
    pub path: String,
    pub query: String,
    /// The status sent; 0 when the connection was reset or hung (no answer).
    pub status: u16,
    pub credits: u64,
    /// The `X-Request-Id` request header as received.
    pub request_id: Option<String>,
    pub api_key_ok: bool,
    /// The W3C `traceparent` and `tracestate` request headers as received:
    /// a trace followed from the app through the gateway must reach here.
    #[serde(default)]
    pub traceparent: Option<String>,
    #[serde(default)]
    pub tracestate: Option<String>,
}

#[derive(Default)]
pub struct StatsBook {
    requests_total: u64,
    by_path: BTreeMap<String, u64>,
    by_status: BTreeMap<u16, u64>,
    credits_total: u64,
    log: VecDeque<LogEntry>,
}

impl StatsBook {
    pub fn record(&mut self, mut entry: LogEntry) {
        self.requests_total += 1;
        *self.by_path.entry(entry.path.clone()).or_default() += 1;
        *self.by_status.entry(entry.status).or_default() += 1;
        self.credits_total += entry.credits;
        entry.seq = self.requests_total;
        if self.log.len() == LOG_CAP {
            self.log.pop_front();
        }
        self.log.push_back(entry);
    }

    pub fn snapshot(&self, credits_window_used: u64) -> Stats {
        Stats {
            requests_total: self.requests_total,
            by_path: self.by_path.clone(),
            by_status: self.by_status.clone(),
            credits_total: self.credits_total,
            credits_window_used,
        }
    }

    pub fn log(&self) -> Vec<LogEntry> {
        self.log.iter().cloned().collect()
    }
}
