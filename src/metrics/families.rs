//! The labelled metric families, by what they count: each group's names,
//! help texts, labels and buckets, registered by one function of at most
//! a screen. Every name is `gateway_<field name>`, so a field is found by
//! its metric's name. (The unlabelled gauges other modules set are
//! `Metrics`' own public fields, registered in `Metrics::new`.)

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use super::DiskDrop;

/// Ids per call of an id lookup route: 1 (a lone lookup) to the
/// upstream's 50.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0];

/// Buckets from a 100 µs cache hit to a 30 s upstream timeout.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

pub(super) fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    r.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

pub(super) fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

/// A gauge of fractional values (`build_info`'s 1.0, the open connections).
pub(super) fn float_gauge(r: &Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::new(name, help).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

pub(super) fn float_gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("unique metric");
    g
}

/// A histogram of seconds, over [`LATENCY_BUCKETS`].
pub(super) fn histogram(r: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    let h = HistogramVec::new(opts, labels).expect("valid histogram");
    r.register(Box::new(h.clone())).expect("unique metric");
    h
}

/// A histogram of seconds with no labels, over [`LATENCY_BUCKETS`].
pub(super) fn plain_histogram(r: &Registry, name: &str, help: &str) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
    let h = Histogram::with_opts(opts).expect("valid histogram");
    r.register(Box::new(h.clone())).expect("unique metric");
    h
}

/// What teams asked and how they were answered or refused.
pub(super) struct Requests {
    pub(super) requests_total: IntCounterVec,
    pub(super) request_duration_seconds: HistogramVec,
    pub(super) coalesced_requests_total: IntCounterVec,
    pub(super) rate_limited_total: IntCounterVec,
    pub(super) gate_refusals_total: IntCounterVec,
    pub(super) quota_rejections_total: IntCounterVec,
    /// Not in the contract table: the same 402s by the budget that refused
    /// (`team`, `app`, `org`): `quota_rejections_total` is a contract and
    /// keeps its one label.
    pub(super) budget_refusals_total: IntCounterVec,
    /// Requests with a token within 7 days of its `not_after`: by team and
    /// member (`app`, whose names come from the config; a series only for
    /// a member whose ending token is still used).
    pub(super) token_expiring_requests_total: IntCounterVec,
}

impl Requests {
    pub(super) fn register(r: &Registry) -> Requests {
        Requests {
            requests_total: counter(
                r,
                "gateway_requests_total",
                "Team requests answered.",
                &["team", "route", "status", "cache"],
            ),
            request_duration_seconds: histogram(
                r,
                "gateway_request_duration_seconds",
                "Time to answer a team request.",
                &["route", "cache"],
            ),
            coalesced_requests_total: counter(
                r,
                "gateway_coalesced_requests_total",
                "Requests answered by another request's upstream fetch.",
                &["route"],
            ),
            rate_limited_total: counter(
                r,
                "gateway_rate_limited_total",
                "Requests refused with 429.",
                &["team", "scope"],
            ),
            gate_refusals_total: counter(
                r,
                "gateway_gate_refusals_total",
                "Requests refused 429 for the upstream's rate, by reason: predicted (on arrival, the wait predicted for it passed its deadline), deadline (it waited until its deadline), upstream_429 (the upstream itself answered 429).",
                &["team", "reason"],
            ),
            quota_rejections_total: counter(
                r,
                "gateway_quota_rejections_total",
                "Requests refused with 402 by a team budget.",
                &["team"],
            ),
            budget_refusals_total: counter(
                r,
                "gateway_budget_refusals_total",
                "Requests refused with 402 by a budget, by the budget that refused: team, app (one of the team's apps) or org (quota.org_credit_limit).",
                &["team", "budget"],
            ),
            token_expiring_requests_total: counter(
                r,
                "gateway_token_expiring_requests_total",
                "Requests made with an app's token within 7 days of its not_after (a rotation not finished).",
                &["team", "app"],
            ),
        }
    }
}

/// Credits: what teams spent, saved and hold, and what did not add up.
pub(super) struct Credits {
    pub(super) credits_spent_total: IntCounterVec,
    pub(super) credits_saved_total: IntCounterVec,
    pub(super) team_credits_used: IntGaugeVec,
    pub(super) team_credit_limit: IntGaugeVec,
    /// Not in the contract table: metered calls answered 402 without asking
    /// the upstream, because the org is out of credits.
    pub(super) upstream_exhausted_total: IntCounterVec,
    /// Not in the contract table: upstream charges above the call's
    /// reservation (settled as charged, logged as anomalies).
    pub(super) credit_anomalies_total: IntCounterVec,
    /// Not in the contract table: the company's spend in its window (its
    /// ledger account, every team's metered calls) and its cap
    /// (`quota.org_credit_limit`; no series without one), at scrape time.
    pub(super) org_credits_used: IntGauge,
    pub(super) org_credit_limit: IntGaugeVec,
}

impl Credits {
    pub(super) fn register(r: &Registry) -> Credits {
        Credits {
            credits_spent_total: counter(
                r,
                "gateway_credits_spent_total",
                "Upstream credits charged to a team.",
                &["team", "route"],
            ),
            credits_saved_total: counter(
                r,
                "gateway_credits_saved_total",
                "Credits a cached or coalesced answer saved a team, by reason (cache, disk, window).",
                &["team", "route", "reason"],
            ),
            team_credits_used: gauge_vec(
                r,
                "gateway_team_credits_used",
                "Credits a team used in its current window.",
                &["team"],
            ),
            team_credit_limit: gauge_vec(
                r,
                "gateway_team_credit_limit",
                "A team's credit budget per window (absent: unlimited).",
                &["team"],
            ),
            upstream_exhausted_total: counter(
                r,
                "gateway_upstream_exhausted_total",
                "Metered calls refused with 402 while the org is out of upstream credits.",
                &["team"],
            ),
            credit_anomalies_total: counter(
                r,
                "gateway_credit_anomalies_total",
                "Upstream charges above the worst case reserved for the call (settled as charged).",
                &["team"],
            ),
            org_credits_used: gauge(
                r,
                "gateway_org_credits_used",
                "Credits every team together used in the current window, as the ledger's company account holds them.",
            ),
            org_credit_limit: gauge_vec(
                r,
                "gateway_org_credit_limit",
                "The company's cap on every team's spend per window, quota.org_credit_limit (absent: no cap).",
                &[],
            ),
        }
    }
}

/// The calls made to the upstream, by route.
pub(super) struct Upstream {
    pub(super) upstream_requests_total: IntCounterVec,
    pub(super) upstream_request_duration_seconds: HistogramVec,
    /// Not in the contract table: how often an upstream call was retried.
    pub(super) upstream_retries_total: IntCounterVec,
    /// Not in the contract table: ids per call of an id lookup route
    /// (`proxy::reuse::batch`: lookups of many requests share a call).
    pub(super) upstream_batch_ids: HistogramVec,
    /// Not in the contract table: upstream calls saved by batching (the
    /// buyers of a call, less the one call).
    pub(super) upstream_calls_saved_total: IntCounterVec,
    /// Not in the contract table: upstream calls withdrawn before they
    /// left (nobody waited; ids past their deadline), by why.
    pub(super) upstream_withdrawn_total: IntCounterVec,
    /// Not in the contract table: the gate's pressure per team, set at
    /// scrape time (calls waiting, the oldest wait, the predicted wait).
    pub(super) upstream_team_waiting: IntGaugeVec,
    pub(super) upstream_team_oldest_wait_seconds: GaugeVec,
    pub(super) upstream_team_predicted_wait_seconds: GaugeVec,
}

impl Upstream {
    pub(super) fn register(r: &Registry) -> Upstream {
        Upstream {
            upstream_requests_total: counter(
                r,
                "gateway_upstream_requests_total",
                "Requests sent to the upstream, by its answer.",
                &["route", "status"],
            ),
            upstream_request_duration_seconds: histogram(
                r,
                "gateway_upstream_request_duration_seconds",
                "Upstream call duration, retries included.",
                &["route"],
            ),
            upstream_retries_total: counter(
                r,
                "gateway_upstream_retries_total",
                "Upstream attempts repeated after a failure.",
                &["route"],
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
                r,
                "gateway_upstream_calls_saved_total",
                "Upstream calls saved by sending the ids of several requests in one call.",
                &["route"],
            ),
            upstream_withdrawn_total: counter(
                r,
                "gateway_upstream_withdrawn_total",
                "Upstream calls withdrawn before they left: abandoned (no client waits for them any more: a miss whose client hung up while it waited, ids nobody needs in a batch queue) or deadline (ids refused 429 when their wait in a batch queue reached upstream.max_queue_wait_secs).",
                &["route", "reason"],
            ),
            upstream_team_waiting: gauge_vec(
                r,
                "gateway_upstream_team_waiting",
                "Calls of a team waiting for their turn at the upstream rate (a batch of id lookups waits as one call per team with ids in it).",
                &["team"],
            ),
            upstream_team_oldest_wait_seconds: float_gauge_vec(
                r,
                "gateway_upstream_team_oldest_wait_seconds",
                "How long the oldest of a team's calls waiting at the upstream rate has waited (0: none waits).",
                &["team"],
            ),
            upstream_team_predicted_wait_seconds: float_gauge_vec(
                r,
                "gateway_upstream_team_predicted_wait_seconds",
                "The wait at the upstream rate a new call of the team would meet now: past upstream.max_queue_wait_secs (or a client's Prefer: wait) it is refused at once.",
                &["team"],
            ),
        }
    }
}

/// The cache tiers: what they hold, and what the disk tier dropped.
/// (Hits by tier are the hit path's children: `children.rs`.)
pub(super) struct Cache {
    pub(super) cache_entries: IntGaugeVec,
    pub(super) cache_size_bytes: IntGaugeVec,
    /// Not in the contract table: ids of id lookups by where their answer
    /// came from (`cache::records`).
    pub(super) cache_records_total: IntCounterVec,
    /// Not in the contract table: entries and writes the disk tier dropped
    /// (`cache::disk`), by reason.
    pub(super) cache_disk_drops_total: IntCounterVec,
    /// Not in the contract table: 1 while the disk tier writes nothing
    /// (an unusable path, a failed commit), else 0.
    pub(super) cache_disk_degraded: IntGauge,
    /// Not in the contract table: disk-tier writes not yet durable.
    pub(super) cache_disk_pending_writes: IntGauge,
    /// Not in the contract table: the data release (`cache::release`).
    pub(super) data_release_timestamp_seconds: IntGauge,
    pub(super) data_release_last_read_timestamp_seconds: IntGauge,
    pub(super) data_release_readable: IntGauge,
    pub(super) release_refreshes_total: IntCounterVec,
}

impl Cache {
    pub(super) fn register(r: &Registry) -> Cache {
        Cache {
            cache_entries: gauge_vec(r, "gateway_cache_entries", "Entries in a cache tier.", &["tier"]),
            cache_size_bytes: gauge_vec(r, "gateway_cache_size_bytes", "Bytes in a cache tier.", &["tier"]),
            cache_records_total: counter(
                r,
                "gateway_cache_records_total",
                "Ids of id lookups, by source: a held record, a held absence, or the upstream.",
                &["route", "source"],
            ),
            cache_disk_drops_total: {
                let c = counter(
                    r,
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
                r,
                "gateway_cache_disk_degraded",
                "1 while the disk tier writes nothing (unusable path, failed commit), else 0.",
            ),
            cache_disk_pending_writes: gauge(
                r,
                "gateway_cache_disk_pending_writes",
                "Disk-tier writes accepted and not yet durable (queued, or committed without fsync).",
            ),
            data_release_timestamp_seconds: gauge(
                r,
                "gateway_data_release_timestamp_seconds",
                "The vendor's current data release (its date, Unix seconds of midnight UTC); 0 until read.",
            ),
            data_release_last_read_timestamp_seconds: gauge(
                r,
                "gateway_data_release_last_read_timestamp_seconds",
                "When the data release was last read successfully (Unix seconds); 0: never.",
            ),
            data_release_readable: gauge(
                r,
                "gateway_data_release_readable",
                "1 while the last read of the data release succeeded, else 0 (route TTLs rule).",
            ),
            release_refreshes_total: {
                let c = counter(
                    r,
                    "gateway_release_refreshes_total",
                    "Answers bought again because a newer data release outdated the one held, by route.",
                    &["route"],
                );
                for route in crate::route::Route::ALL {
                    c.with_label_values(&[route.as_str()]);
                }
                c
            },
        }
    }
}
