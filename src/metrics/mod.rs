//! Every metric name and label set (docs/design.md §3.5) lives in this
//! module and nowhere else: the labelled families by what they count in
//! `families.rs`, the gateway's unlabelled gauges and the log sink's
//! process-wide counters here. The dashboards use only these names.
//!
//! Labels come from bounded sets only: team names from config, route names,
//! HTTP status codes, cache states and tiers. Never a token, a raw path, a
//! query or an error text. So every labelled metric is private and recorded
//! through the typed methods in `record.rs`: a label cannot be misplaced or
//! mistyped, and adding a metric touches this module only. Gauges without
//! labels stay public fields.

mod children;
mod families;
mod record;

use children::Children;
use families::{counter, float_gauge, float_gauge_vec, gauge, plain_histogram, Cache, Credits, Requests, Upstream};
pub(crate) use record::DiskDrop;
pub(crate) use record::{LedgerOp, LogLine, RecordSource, Scope, UpstreamAnswer};
pub use record::{RedisOp, SavedReason, Tier};

use prometheus::{Encoder, Gauge, GaugeVec, Histogram, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};
use std::sync::OnceLock;

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

/// Registers in `registry` what is the process's, not one gateway's: the
/// log sink's counters and, on Linux, the process collector.
fn register_process_wide(registry: &Registry) {
    // The same counter in every registry (a second gateway in one
    // process, in tests, shares the process's one log sink).
    let _ = registry.register(Box::new(log_lines_dropped_total().clone()));
    let _ = registry.register(Box::new(team_log_lines_dropped_total().clone()));
    #[cfg(target_os = "linux")]
    {
        let pc = prometheus::process_collector::ProcessCollector::for_self();
        // A second gateway in one process (tests) shares the pid: tolerate it.
        let _ = registry.register(Box::new(pc));
    }
}

/// Every family of one gateway, in one registry (a second gateway in one
/// process, in tests, has its own).
pub struct Metrics {
    registry: Registry,
    requests: Requests,
    credits: Credits,
    upstream: Upstream,
    cache: Cache,
    backend_errors_total: IntCounterVec,
    build_info: GaugeVec,
    pub(crate) upstream_credits_remaining: IntGauge,
    pub(crate) upstream_credit_limit: IntGauge,
    pub(crate) upstream_queue_depth: IntGauge,
    /// Not in the contract table: time a call waited for the upstream rate.
    pub(crate) upstream_queue_wait_seconds: Histogram,
    /// Not in the contract table: replicas the shared rate last counted,
    /// whose share this replica paces at when Redis fails (`scheduler`).
    pub(crate) upstream_rate_replicas: IntGauge,
    /// Not in the contract table: open team connections.
    pub open_connections: Gauge,
    /// Not in the contract table: the org's spend seen upstream minus the
    /// sum of the team ledgers (reconciliation).
    pub(crate) untracked_credits: IntGauge,
    /// Not in the contract table: what the overload manager did
    /// (`server::overload`), by listener, pool and action. Labelled, but
    /// handed whole to the server, which records through it.
    pub(crate) overload_actions_total: IntCounterVec,
    /// The hit path's children, resolved once (`children.rs`).
    children: Children,
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let requests = Requests::register(&r);
        // Not in the contract table: cache answers by the tier that had
        // them. Recorded through its children only (`children.rs`).
        let cache_hits_total = counter(
            &r,
            "gateway_cache_hits_total",
            "Cache lookups answered, by tier.",
            &["route", "tier"],
        );
        let children = Children::new(&requests.request_duration_seconds, &cache_hits_total);
        let m = Metrics {
            children,
            requests,
            credits: Credits::register(&r),
            upstream: Upstream::register(&r),
            cache: Cache::register(&r),
            backend_errors_total: counter(
                &r,
                "gateway_backend_errors_total",
                "Errors from Redis or the ledger.",
                &["backend", "op"],
            ),
            build_info: float_gauge_vec(
                &r,
                "gateway_build_info",
                "Build of the running gateway: its release and git commit.",
                &["version", "commit"],
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
            upstream_queue_depth: gauge(
                &r,
                "gateway_upstream_queue_depth",
                "Calls waiting for the shared upstream rate.",
            ),
            upstream_queue_wait_seconds: plain_histogram(
                &r,
                "gateway_upstream_queue_wait_seconds",
                "Time a call waited for the shared upstream rate.",
            ),
            upstream_rate_replicas: gauge(
                &r,
                "gateway_upstream_rate_replicas",
                "Replicas sharing the upstream rate, as the shared rate last counted them (0: never counted).",
            ),
            open_connections: float_gauge(&r, "gateway_open_connections", "Open team connections."),
            untracked_credits: gauge(
                &r,
                "gateway_untracked_credits",
                "The org's credits spent as the upstream reports them, minus the sum of the team ledgers.",
            ),
            overload_actions_total: counter(
                &r,
                "gateway_overload_actions_total",
                "What the overload manager did, by listener (team, admin), pool (connections, per_peer, descriptors, answer_bytes) and action (the class of connection closed, or refuse).",
                &["listener", "pool", "action"],
            ),
            registry: r,
        };
        m.build_info
            .with_label_values(&[crate::VERSION, crate::COMMIT])
            .set(1.0);
        register_process_wide(&m.registry);
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
    pub const SAVED_REASONS: [&str; 4] = [
        super::SavedReason::Cache.as_str(),
        super::SavedReason::Disk.as_str(),
        super::SavedReason::Window.as_str(),
        super::SavedReason::Release.as_str(),
    ];
    /// `scope` of `gateway_rate_limited_total`: every [`Scope`].
    pub(super) const SCOPES: [&str; 2] = [Scope::Team.as_str(), Scope::Upstream.as_str()];
    /// `reason` of `gateway_gate_refusals_total`: every [`GateRefusal`].
    pub(super) const GATE_REFUSALS: [crate::error::GateRefusal; 3] = [
        crate::error::GateRefusal::Predicted,
        crate::error::GateRefusal::Deadline,
        crate::error::GateRefusal::Upstream,
    ];
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
    /// `budget` of `gateway_budget_refusals_total`: every budget a 402
    /// names.
    pub(super) const BUDGETS: [crate::error::Spent; 3] = [
        crate::error::Spent::Team,
        crate::error::Spent::App(String::new()),
        crate::error::Spent::Org,
    ];
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
            self.requests
                .token_expiring_requests_total
                .with_label_values(&[team, app]);
        }
    }

    pub fn preset<'a>(&self, teams: impl IntoIterator<Item = &'a str>, redis: bool) {
        use crate::route::Route;
        use labels::*;
        let routes = Route::ALL.map(Route::as_str);
        for route in routes {
            self.upstream
                .upstream_requests_total
                .with_label_values(&[route, STATUS_OK]);
            self.upstream
                .upstream_request_duration_seconds
                .with_label_values(&[route]);
            self.requests.coalesced_requests_total.with_label_values(&[route]);
            self.upstream.upstream_retries_total.with_label_values(&[route]);
        }
        for route in routes.iter().filter(|r| r.ends_with("_by_id")) {
            self.upstream.upstream_batch_ids.with_label_values(&[route]);
            self.upstream.upstream_calls_saved_total.with_label_values(&[route]);
            for reason in ["abandoned", "deadline"] {
                self.upstream
                    .upstream_withdrawn_total
                    .with_label_values(&[route, reason]);
            }
        }
        // Durations and hits by route × cache state × tier exist since
        // `new`; each team's 200s by route × cache state and its saved
        // credits by route are created here, as the hit path's children.
        let teams: Vec<&str> = teams.into_iter().collect();
        self.children.set_teams(
            teams.iter().copied(),
            &self.requests.requests_total,
            &self.credits.credits_saved_total,
        );
        for team in teams {
            for route in routes {
                self.credits.credits_spent_total.with_label_values(&[team, route]);
            }
            for scope in SCOPES {
                self.requests.rate_limited_total.with_label_values(&[team, scope]);
            }
            for reason in GATE_REFUSALS {
                self.requests
                    .gate_refusals_total
                    .with_label_values(&[team, reason.as_str()]);
            }
            self.requests.quota_rejections_total.with_label_values(&[team]);
            for budget in BUDGETS {
                self.requests
                    .budget_refusals_total
                    .with_label_values(&[team, budget.as_str()]);
            }
            self.credits.upstream_exhausted_total.with_label_values(&[team]);
        }
        for op in LEDGER_OPS {
            self.backend_errors_total.with_label_values(&["ledger", op]);
        }
        // The disk tier's gauges are set at the first scrape, when it is on.
        let tiers: &[&str] = if redis { &TIERS[..2] } else { &TIERS[..1] };
        for tier in tiers {
            self.cache.cache_entries.with_label_values(&[tier]);
            self.cache.cache_size_bytes.with_label_values(&[tier]);
        }
        if redis {
            for op in REDIS_OPS {
                self.backend_errors_total.with_label_values(&["redis", op]);
            }
        }
    }
}
