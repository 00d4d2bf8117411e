//! Monthly-metrics rows (issue 37), filed one by one: the answer of
//! `/v2/{counties,cities,addresses,jurisdictions}/{geo_id}/metrics/monthly`
//! is one row per month (per tag and property type), and a row is a
//! function of its geography, tag, property type and month alone — as long
//! as the window asked covered the whole month (`docs/vendor-api.md`: the
//! bounds are inclusive days, and a row aggregates the permits that started
//! inside them). So a row of a month a window covered whole answers any
//! later window of the same series, whatever its other months.
//!
//! A row is filed like a record (`records`): in every tier, under a key of
//! its own in the key space of its route (a purge of the route drops it),
//! with its answer time, and a TTL that is the route's for the current and
//! future months and `cache.past_month_ttl_secs` (when set) for months that
//! have ended. A month the upstream answered without a row is filed as an
//! absence (an empty body, 0 credits) for the same time. `proxy::monthly`
//! decides what to buy and assembles the answer.

use super::{Cache, Entry};
use crate::clock::now_ms;
use crate::route::Route;
use bytes::Bytes;
use chrono::{Datelike, NaiveDate};
use std::sync::Arc;
use std::time::Duration;

/// The routes whose answers are filed by month.
pub(crate) fn is_monthly(route: Route) -> bool {
    matches!(
        route,
        Route::AddressMetricsMonthly
            | Route::CountyMetricsMonthly
            | Route::CityMetricsMonthly
            | Route::JurisdictionMetricsMonthly
    )
}

/// One series: a geography (the canonical path holds its level and
/// `geo_id`), a tag and a property type (none for addresses). Rows of two
/// series never answer for each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Series {
    pub(crate) route: Route,
    pub(crate) path: Arc<str>,
    pub(crate) tag: String,
    pub(crate) property_type: Option<String>,
}

impl Series {
    /// The series' name: its route, geography, tag and property type.
    pub(crate) fn name(&self) -> String {
        let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        format!(
            "{} {} tag={}&property_type={}",
            self.route.as_str(),
            self.path,
            enc(&self.tag),
            self.property_type.as_deref().map_or_else(|| "-".to_string(), enc),
        )
    }

    /// The key of its row of `month` (any day of it).
    pub(crate) fn row_key(&self, month: NaiveDate) -> String {
        format!("mon {} {:04}-{:02}", self.name(), month.year(), month.month())
    }
}

/// The first day of `day`'s month.
pub(crate) fn month_of(day: NaiveDate) -> NaiveDate {
    day.with_day(1).unwrap_or(day)
}

/// The last day of `month`'s month.
pub(crate) fn month_end(month: NaiveDate) -> NaiveDate {
    next_month(month).pred_opt().unwrap_or(month)
}

/// The first day of the month after `month`'s.
pub(crate) fn next_month(month: NaiveDate) -> NaiveDate {
    let (y, m) = match month.month() {
        12 => (month.year() + 1, 1),
        m => (month.year(), m + 1),
    };
    NaiveDate::from_ymd_opt(y, m, 1).unwrap_or(NaiveDate::MAX)
}

/// The months `from..=to` touch, first days, in order.
pub(crate) fn months(from: NaiveDate, to: NaiveDate) -> Vec<NaiveDate> {
    let mut out = Vec::new();
    if from > to {
        return out;
    }
    let mut m = month_of(from);
    while m <= to && out.len() < 1200 {
        out.push(m);
        m = next_month(m);
    }
    out
}

impl Cache {
    /// Whether monthly metrics are filed by month (`cache.month_reuse`).
    pub(crate) fn month_reuse(&self) -> bool {
        self.month_reuse
    }

    /// The freshness of a row of `month`: `cache.past_month_ttl_secs` once
    /// the month has ended (before the current UTC month), when set; the
    /// route's otherwise.
    pub(crate) fn month_ttl(&self, route: Route, month: NaiveDate, today: NaiveDate) -> Option<Duration> {
        let route_ttl = self.ttl(route)?;
        match self.past_month_ttl {
            Some(past) if month_end(month) < month_of(today) => Some(past),
            _ => Some(route_ttl),
        }
    }

    /// The held entry (row or absence) of each key, in order, alive (fresh
    /// or within the stale grace; the caller takes the fresh ones): memory,
    /// then the disk tier, then Redis, promoting what the lower tiers had.
    pub(crate) async fn held_rows(&self, route: Route, keys: &[String]) -> Vec<Option<Arc<Entry>>> {
        let now = now_ms();
        let alive = |e: &Arc<Entry>| !e.remaining_life(now, self.grace).is_zero();
        let mut held: Vec<Option<Arc<Entry>>> = Vec::with_capacity(keys.len());
        for key in keys {
            let found = match &self.memory {
                Some(memory) => memory.get(key.as_str()).await,
                None => None,
            };
            held.push(found.filter(alive));
        }
        if let Some(disk) = &self.disk {
            let wanted: Vec<usize> = (0..keys.len()).filter(|i| held[*i].is_none()).collect();
            if !wanted.is_empty() {
                let got = disk.get_many(wanted.iter().map(|i| keys[*i].clone()).collect()).await;
                for (i, entry) in wanted.into_iter().zip(got) {
                    if let Some(entry) = entry {
                        held[i] = Some(self.promote(&keys[i], entry).await);
                    }
                }
            }
        }
        if self.redis.is_some() {
            for (i, key) in keys.iter().enumerate() {
                if held[i].as_ref().is_some_and(|e| e.is_fresh(now)) {
                    continue;
                }
                let Some(entry) = self.lookup_redis(route, key, None).await else {
                    continue;
                };
                let newer = held[i].as_ref().is_none_or(|e| e.stored_at_ms < entry.stored_at_ms);
                if newer && !entry.remaining_life(now, self.grace).is_zero() {
                    held[i] = Some(self.promote(key, entry).await);
                }
            }
        }
        held
    }

    /// An entry a lower tier had, copied into memory.
    pub(super) async fn promote(&self, key: &str, entry: Entry) -> Arc<Entry> {
        let entry = Arc::new(entry);
        if let Some(memory) = &self.memory {
            memory.insert(Arc::from(key), entry.clone()).await;
        }
        entry
    }

    /// Files rows (or absences: an empty body) in every tier, each under its
    /// key, for what is left of its life.
    pub(crate) async fn file_rows(&self, rows: Vec<(String, Entry)>) {
        for (key, entry) in rows {
            let entry = Arc::new(entry);
            if entry.remaining_life(now_ms(), self.grace).is_zero() {
                continue;
            }
            self.put(&key, &entry, entry.clone()).await;
        }
    }

    /// A row's entry: its bytes (own copy), one credit (none for an
    /// absence), answered now, for `ttl`.
    pub(crate) fn row_entry(&self, route: Route, body: Bytes, ttl: Duration) -> Entry {
        let credits = u64::from(!body.is_empty());
        Entry {
            etag: http::HeaderValue::from_static(""),
            body: Bytes::copy_from_slice(&body),
            credits,
            stored_at_ms: now_ms(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            route,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn months_of_a_window_and_their_ends() {
        assert_eq!(
            months(d("2024-11-15"), d("2025-02-01")),
            [d("2024-11-01"), d("2024-12-01"), d("2025-01-01"), d("2025-02-01")]
        );
        assert_eq!(month_end(d("2024-02-01")), d("2024-02-29"));
        assert_eq!(month_end(d("2024-12-01")), d("2024-12-31"));
        assert!(months(d("2025-01-02"), d("2025-01-01")).is_empty());
    }

    #[test]
    fn series_keys_tell_tags_and_property_types_apart() {
        let s = Series {
            route: Route::CountyMetricsMonthly,
            path: Arc::from("/v2/counties/abc/metrics/monthly"),
            tag: "solar".into(),
            property_type: Some("vacant land".into()),
        };
        let k = s.row_key(d("2024-03-17"));
        assert_eq!(
            k,
            "mon county_metrics_monthly /v2/counties/abc/metrics/monthly tag=solar&property_type=vacant+land 2024-03"
        );
        let other = Series {
            tag: "all".into(),
            ..s.clone()
        };
        assert_ne!(other.row_key(d("2024-03-01")), k);
        let none = Series {
            property_type: None,
            ..s
        };
        assert!(none.row_key(d("2024-03-01")).contains("property_type=- "));
    }
}
