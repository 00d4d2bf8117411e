//! Every metric name and label set (docs/design.md §3.5) lives here and nowhere else;
//! the dashboards use only these names.
//!
//! Labels come from bounded sets only: team names from config, route names,
//! HTTP status codes, cache states and tiers. Never a token, a raw path, a
//! query or an error text. So every labelled metric is private and recorded
//! through the typed methods in `record.rs`: a label cannot be misplaced or
//! mistyped, and adding a metric touches this module only. Gauges without
//! labels stay public fields.

mod children;
mod record;

use children::Children;
pub(crate) use record::DiskDrop;
pub(crate) use record::{LedgerOp, LogLine, RecordSource, Scope, UpstreamAnswer};
pub use record::{RedisOp, SavedReason, Tier};

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::sync::OnceLock;

/// Ids per call of an id lookup route: 1 (a lone lookup) to the
/// upstream's 50.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0];

/// Buckets from a 100 µs cache hit to a 30 s upstream timeout.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Not in the contract table: log lines the log sink dropped because
/// stderr read slower than they came (`telemetry::sink`). One per process,
/// like the sink: registered in every gateway's registry.
fn log_lines_dropped_total() -> &'static IntCounterVec {
    static DROPPED: OnceLock<IntCounterVec> = OnceLock::new();
    DROPPED.get_or_init(|| {
        let c = IntCounterVec::new(
            Opts::new(
                "gateway_log_lines_dropped_total",
                "Log lines dropped because the log queue was full, by kind (anonymous first).",
            ),
            &["kind"],
        )
        .expect("valid counter");
        for kind in LogLine::ALL {
            c.with_label_values(&[kind.as_str()]);
        }
        c
    })
}

/// Counts one line the log sink dropped.
pub(crate) fn log_line_dropped(kind: LogLine) {
    log_lines_dropped_total().with_label_values(&[kind.as_str()]).inc();
}

/// Not in the contract table: a team's access lines the log sink dropped,
/// by team (`telemetry::sink`: the team holding the most of the queue loses
/// its own first). One per process, like the sink; a series per team that
/// lost a line.
fn team_log_lines_dropped_total() -> &'static IntCounterVec {
    static DROPPED: OnceLock<IntCounterVec> = OnceLock::new();
    DROPPED.get_or_init(|| {
        IntCounterVec::new(
            Opts::new(
                "gateway_log_team_lines_dropped_total",
                "A team's access lines dropped because the log queue was full and the team held the most of it.",
            ),
            &["team"],
        )
        .expect("valid counter")
    })
}

/// Counts one of `team`'s access lines the log sink dropped.
pub(crate) fn team_log_line_dropped(team: &str) {
    team_log_lines_dropped_total().with_label_values(&[team]).inc();
}

pub struct Metrics {
    registry: Registry,
    requests_total: IntCounterVec,
    request_duration_seconds: HistogramVec,
    upstream_requests_total: IntCounterVec,
    upstream_request_duration_seconds: HistogramVec,
    credits_spent_total: IntCounterVec,
    credits_saved_total: IntCounterVec,
    team_credits_used: IntGaugeVec,
    team_credit_limit: IntGaugeVec,
    pub(crate) upstream_credits_remaining: IntGauge,
    pub(crate) upstream_credit_limit: IntGauge,
    quota_rejections_total: IntCounterVec,
    /// Requests with a token within 7 days of its `not_after`: by team and
    /// app (app names come from the config; a series only for an app whose
    /// ending token is still used).
    token_expiring_requests_total: IntCounterVec,
    rate_limited_total: IntCounterVec,
    coalesced_requests_total: IntCounterVec,
    cache_entries: IntGaugeVec,
    cache_size_bytes: IntGaugeVec,
    backend_errors_total: IntCounterVec,
    pub(crate) upstream_queue_depth: IntGauge,
    build_info: GaugeVec,
    /// Not in the contract table: how often an upstream call was retried.
    upstream_retries_total: IntCounterVec,
    /// Not in the contract table: time a call waited for the upstream rate.
    pub(crate) upstream_queue_wait_seconds: Histogram,
    /// Not in the contract table: replicas the shared rate last counted,
    /// whose share this replica paces at when Redis fails (`scheduler`).
    pub(crate) upstream_rate_replicas: IntGauge,
    /// Not in the contract table: open team connections.
    pub open_connections: Gauge,
    /// Not in the contract table: metered calls answered 402 without asking
    /// the upstream, because the org is out of credits.
    upstream_exhausted_total: IntCounterVec,
    /// Not in the contract table: upstream charges above the call's
    /// reservation (settled as charged, logged as anomalies).
    credit_anomalies_total: IntCounterVec,
    /// Not in the contract table: the org's spend seen upstream minus the
    /// sum of the team ledgers (reconciliation).
    pub(crate) untracked_credits: IntGauge,
    /// Not in the contract table: ids of id lookups by where their answer
    /// came from (`cache::records`).
    cache_records_total: IntCounterVec,
    /// Not in the contract table: entries and writes the disk tier dropped
    /// (`cache::disk`), by reason.
    cache_disk_drops_total: IntCounterVec,
    /// Not in the contract table: 1 while the disk tier writes nothing
    /// (an unusable path, a failed commit), else 0.
    cache_disk_degraded: IntGauge,
    /// Not in the contract table: disk-tier writes not yet durable.
    cache_disk_pending_writes: IntGauge,
    /// Not in the contract table: ids per call of an id lookup route
    /// (`proxy::reuse::batch`: lookups of many requests share a call).
    upstream_batch_ids: HistogramVec,
    /// Not in the contract table: upstream calls saved by batching (the
    /// buyers of a call, less the one call).
    upstream_calls_saved_total: IntCounterVec,
    /// Not in the contract table: what the overload manager did
    /// (`server::overload`), by listener, pool and action.
    pub(crate) overload_actions_total: IntCounterVec,
    /// The hit path's children, resolved once (`children.rs`).
    children: Children,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

fn histogram(r: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    let h = HistogramVec::new(opts, labels).expect("valid histogram");
    r.register(Box::new(h.clone())).expect("unique metric");
    h
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let request_duration_seconds = histogram(
            &r,
            "gateway_request_duration_seconds",
            "Time to answer a team request.",
            &["route", "cache"],
        );
        // Not in the contract table: cache answers by the tier that had
        // them. Recorded through its children only (`children.rs`).
        let cache_hits_total = counter(
            &r,
            "gateway_cache_hits_total",
            "Cache lookups answered, by tier.",
            &["route", "tier"],
        );
        let children = Children::new(&request_duration_seconds, &cache_hits_total);
        let m = Metrics {
            children,
            requests_total: counter(
                &r,
                "gateway_requests_total",
                "Team requests answered.",
                &["team", "route", "status", "cache"],
            ),
            request_duration_seconds,
            upstream_requests_total: counter(
                &r,
                "gateway_upstream_requests_total",
                "Requests sent to the upstream, by its answer.",
                &["route", "status"],
            ),
            upstream_request_duration_seconds: histogram(
                &r,
                "gateway_upstream_request_duration_seconds",
                "Upstream call duration, retries included.",
                &["route"],
            ),
            credits_spent_total: counter(
                &r,
                "gateway_credits_spent_total",
                "Upstream credits charged to a team.",
                &["team", "route"],
            ),
            credits_saved_total: counter(
                &r,
                "gateway_credits_saved_total",
                "Credits a cached or coalesced answer saved a team, by reason (cache, disk, window).",
                &["team", "route", "reason"],
            ),
            team_credits_used: gauge_vec(
                &r,
                "gateway_team_credits_used",
                "Credits a team used in its current window.",
                &["team"],
            ),
            team_credit_limit: gauge_vec(
                &r,
                "gateway_team_credit_limit",
                "A team's credit budget per window (absent: unlimited).",
                &["team"],
            ),
            upstream_credits_remaining: gauge(
                &r,
                "gateway_upstream_credits_remaining",
                "The org's credits left, as the upstream last reported.",
            ),
            upstream_credit_limit: gauge(
                &r,
                "gateway_upstream_credit_limit",
                "The org's credit limit, as the upstream last reported.",
            ),
            quota_rejections_total: counter(
                &r,
                "gateway_quota_rejections_total",
                "Requests refused with 402 by a team budget.",
                &["team"],
            ),
            token_expiring_requests_total: counter(
                &r,
                "gateway_token_expiring_requests_total",
                "Requests made with an app's token within 7 days of its not_after (a rotation not finished).",
                &["team", "app"],
            ),
            rate_limited_total: counter(
                &r,
                "gateway_rate_limited_total",
                "Requests refused with 429.",
                &["team", "scope"],
            ),
            coalesced_requests_total: counter(
                &r,
                "gateway_coalesced_requests_total",
                "Requests answered by another request's upstream fetch.",
                &["route"],
            ),
            cache_entries: gauge_vec(&r, "gateway_cache_entries", "Entries in a cache tier.", &["tier"]),
            cache_size_bytes: gauge_vec(&r, "gateway_cache_size_bytes", "Bytes in a cache tier.", &["tier"]),
            backend_errors_total: counter(
                &r,
                "gateway_backend_errors_total",
                "Errors from Redis or the ledger.",
                &["backend", "op"],
            ),
            upstream_queue_depth: gauge(
                &r,
                "gateway_upstream_queue_depth",
                "Calls waiting for the shared upstream rate.",
            ),
            build_info: {
                let g = GaugeVec::new(
                    Opts::new("gateway_build_info", "Build of the running gateway."),
                    &["version"],
                )
                .expect("valid gauge");
                r.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            upstream_retries_total: counter(
                &r,
                "gateway_upstream_retries_total",
                "Upstream attempts repeated after a failure.",
                &["route"],
            ),
            upstream_queue_wait_seconds: {
                let opts = HistogramOpts::new(
                    "gateway_upstream_queue_wait_seconds",
                    "Time a call waited for the shared upstream rate.",
                )
                .buckets(LATENCY_BUCKETS.to_vec());
                let h = Histogram::with_opts(opts).expect("valid histogram");
                r.register(Box::new(h.clone())).expect("unique metric");
                h
            },
            upstream_rate_replicas: gauge(
                &r,
                "gateway_upstream_rate_replicas",
                "Replicas sharing the upstream rate, as the shared rate last counted them (0: never counted).",
            ),
            open_connections: {
                let g = Gauge::new("gateway_open_connections", "Open team connections.").expect("valid gauge");
                r.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            upstream_exhausted_total: counter(
                &r,
                "gateway_upstream_exhausted_total",
                "Metered calls refused with 402 while the org is out of upstream credits.",
                &["team"],
            ),
            credit_anomalies_total: counter(
                &r,
                "gateway_credit_anomalies_total",
                "Upstream charges above the worst case reserved for the call (settled as charged).",
                &["team"],
            ),
            untracked_credits: gauge(
                &r,
                "gateway_untracked_credits",
                "The org's credits spent as the upstream reports them, minus the sum of the team ledgers.",
            ),
            upstream_batch_ids: {
                let opts = HistogramOpts::new(
                    "gateway_upstream_batch_ids",
                    "Ids per upstream call of an id lookup route (lookups of several requests share a call).",
                )
                .buckets(BATCH_BUCKETS.to_vec());
                let h = HistogramVec::new(opts, &["route"]).expect("valid histogram");
                r.register(Box::new(h.clone())).expect("unique metric");
                h
            },
            upstream_calls_saved_total: counter(
                &r,
                "gateway_upstream_calls_saved_total",
                "Upstream calls saved by sending the ids of several requests in one call.",
                &["route"],
            ),
            cache_records_total: counter(
                &r,
                "gateway_cache_records_total",
                "Ids of id lookups, by source: a held record, a held absence, or the upstream.",
                &["route", "source"],
            ),
            cache_disk_drops_total: {
                let c = counter(
                    &r,
                    "gateway_cache_disk_drops_total",
                    "Entries or writes the disk tier dropped, by reason.",
                    &["reason"],
                );
                for why in DiskDrop::ALL {
                    c.with_label_values(&[why.as_str()]);
                }
                c
            },
            cache_disk_degraded: gauge(
                &r,
                "gateway_cache_disk_degraded",
                "1 while the disk tier writes nothing (unusable path, failed commit), else 0.",
            ),
            cache_disk_pending_writes: gauge(
                &r,
                "gateway_cache_disk_pending_writes",
                "Disk-tier writes accepted and not yet durable (queued, or committed without fsync).",
            ),
            overload_actions_total: counter(
                &r,
                "gateway_overload_actions_total",
                "What the overload manager did, by listener (team, admin), pool (connections, per_peer, descriptors, answer_bytes) and action (the class of connection closed, or refuse).",
                &["listener", "pool", "action"],
            ),
            registry: r,
        };
        m.build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1.0);
        // The same counter in every registry (a second gateway in one
        // process, in tests, shares the process's one log sink).
        let _ = m.registry.register(Box::new(log_lines_dropped_total().clone()));
        let _ = m.registry.register(Box::new(team_log_lines_dropped_total().clone()));
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            // A second gateway in one process (tests) shares the pid: tolerate it.
            let _ = m.registry.register(Box::new(pc));
        }
        m
    }

    /// The Prometheus text exposition of everything registered.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The contract's label values (docs/design.md §3.5) that are known before any
/// request, so every family can be exported at 0 from the first scrape.
pub mod labels {
    use super::{LedgerOp, RedisOp, Scope, Tier};

    /// `cache`: every [`crate::proxy::CacheState`].
    pub const CACHE_STATES: [&str; 4] = super::record::CACHE_STATES;
    /// `tier`: every [`Tier`].
    pub const TIERS: [&str; 3] = [Tier::Memory.as_str(), Tier::Redis.as_str(), Tier::Disk.as_str()];
    /// `reason` of `gateway_credits_saved_total`: every [`super::SavedReason`].
    pub const SAVED_REASONS: [&str; 3] = [
        super::SavedReason::Cache.as_str(),
        super::SavedReason::Disk.as_str(),
        super::SavedReason::Window.as_str(),
    ];
    /// `scope` of `gateway_rate_limited_total`: every [`Scope`].
    pub(super) const SCOPES: [&str; 2] = [Scope::Team.as_str(), Scope::Upstream.as_str()];
    /// `op` of `gateway_backend_errors_total{backend="ledger"}`: every [`LedgerOp`].
    pub(super) const LEDGER_OPS: [&str; 3] = [
        LedgerOp::Reserve.as_str(),
        LedgerOp::Settle.as_str(),
        LedgerOp::Usage.as_str(),
    ];
    /// `op` of `gateway_backend_errors_total{backend="redis"}`: every [`RedisOp`].
    pub const REDIS_OPS: [&str; RedisOp::ALL.len()] = {
        let mut ops = [""; RedisOp::ALL.len()];
        let mut i = 0;
        while i < ops.len() {
            ops[i] = RedisOp::ALL[i].as_str();
            i += 1;
        }
        ops
    };
    /// The status a zero child is created with: the label is an open set,
    /// and one child is enough for the family and for `rate()` to start at 0.
    pub(super) const STATUS_OK: &str = "200";
}

impl Metrics {
    /// Creates, at 0, the children of every label set known from config:
    /// teams × routes × cache states, backends × ops, tiers, scopes. Without
    /// them a family is missing until its first event, dashboards show "No
    /// data" and the first increment is invisible to `rate()`. Bounded by
    /// the config; called at start-up and on reload (new teams get theirs).
    /// Each app's `gateway_token_expiring_requests_total` at 0 (team × app:
    /// bounded by the config, one series per token), so its alert rule sees
    /// the first increment.
    pub(crate) fn preset_apps<'a>(&self, apps: impl IntoIterator<Item = (&'a str, &'a str)>) {
        for (team, app) in apps {
            self.token_expiring_requests_total.with_label_values(&[team, app]);
        }
    }

    pub fn preset<'a>(&self, teams: impl IntoIterator<Item = &'a str>, redis: bool) {
        use crate::route::Route;
        use labels::*;
        let routes = Route::ALL.map(Route::as_str);
        for route in routes {
            self.upstream_requests_total.with_label_values(&[route, STATUS_OK]);
            self.upstream_request_duration_seconds.with_label_values(&[route]);
            self.coalesced_requests_total.with_label_values(&[route]);
            self.upstream_retries_total.with_label_values(&[route]);
        }
        for route in routes.iter().filter(|r| r.ends_with("_by_id")) {
            self.upstream_batch_ids.with_label_values(&[route]);
            self.upstream_calls_saved_total.with_label_values(&[route]);
        }
        // Durations and hits by route × cache state × tier exist since
        // `new`; each team's 200s by route × cache state and its saved
        // credits by route are created here, as the hit path's children.
        let teams: Vec<&str> = teams.into_iter().collect();
        self.children
            .set_teams(teams.iter().copied(), &self.requests_total, &self.credits_saved_total);
        for team in teams {
            for route in routes {
                self.credits_spent_total.with_label_values(&[team, route]);
            }
            for scope in SCOPES {
                self.rate_limited_total.with_label_values(&[team, scope]);
            }
            self.quota_rejections_total.with_label_values(&[team]);
            self.upstream_exhausted_total.with_label_values(&[team]);
        }
        for op in LEDGER_OPS {
            self.backend_errors_total.with_label_values(&["ledger", op]);
        }
        // The disk tier's gauges are set at the first scrape, when it is on.
        let tiers: &[&str] = if redis { &TIERS[..2] } else { &TIERS[..1] };
        for tier in tiers {
            self.cache_entries.with_label_values(&[tier]);
            self.cache_size_bytes.with_label_values(&[tier]);
        }
        if redis {
            for op in REDIS_OPS {
                self.backend_errors_total.with_label_values(&["redis", op]);
            }
        }
    }
}
