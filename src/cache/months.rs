//! Monthly-metrics rows, filed one by one: the answer of
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
//! absence (an empty body, 0 credits) for the same time. [`Window`] is
//! what a request asks; `proxy::reuse` decides what to buy and assembles
//! the answer.

use super::{key, Cache, Entry};
use crate::clock::now_ms;
use crate::redis_backend::keys;
use crate::route::{self, Route, Target};
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
        keys::row_key(&self.name(), month.year(), month.month())
    }
}

/// A monthly-metrics request that can be answered by the month: a window
/// named as the upstream reads it (`metric_from`, `metric_to` as
/// `YYYY-MM-DD`, `tag`, `property_type` but on addresses, `size`, each
/// once). Memoized with its request target (`proxy::parsed`).
#[derive(Debug, Clone)]
pub(crate) struct Window {
    pub(crate) series: Series,
    pub(crate) from: NaiveDate,
    pub(crate) to: NaiveDate,
    /// Rows per page asked (`size`, default 50).
    pub(crate) size: u64,
    /// The months `from..=to` touch, first days, in order.
    pub(crate) months: Vec<NaiveDate>,
    /// Each month's row key.
    pub(crate) keys: Vec<String>,
}

impl Window {
    /// The window `target` asks, or `None` for the page path (a cursor,
    /// another parameter, a repeated one, a bound that is not a day).
    pub(crate) fn of(target: &Target) -> Option<Window> {
        if !is_monthly(target.route) {
            return None;
        }
        let pairs = key::decode_pairs(target.query.as_deref()?)?;
        let address = target.route == Route::AddressMetricsMonthly;
        let (mut from, mut to, mut tag, mut property_type, mut size) = (None, None, None, None, None);
        for (name, value) in pairs {
            let slot = match &*name {
                "metric_from" => &mut from,
                "metric_to" => &mut to,
                "tag" => &mut tag,
                "property_type" if !address => &mut property_type,
                "size" => &mut size,
                _ => return None,
            };
            // Repeated: the upstream takes the last; not worth the doubt.
            if slot.replace(value.into_owned()).is_some() {
                return None;
            }
        }
        let date = |s: Option<String>| {
            s.filter(|s| s.len() == 10)
                .and_then(|s| NaiveDate::parse_from_str(&s, "%Y-%m-%d").ok())
        };
        let (from, to) = (date(from)?, date(to)?);
        if from > to || address == property_type.is_some() {
            return None;
        }
        let series = Series {
            route: target.route,
            path: target.path.clone(),
            tag: tag?,
            property_type,
        };
        let months = months(from, to);
        let keys = months.iter().map(|m| series.row_key(*m)).collect();
        Some(Window {
            series,
            from,
            to,
            size: route::page_size_asked(target)?,
            months,
            keys,
        })
    }

    /// Whether the window covers `month` whole: only then is its row the
    /// month's.
    pub(crate) fn whole(&self, month: NaiveDate) -> bool {
        self.from <= month && month_end(month) <= self.to
    }

    /// The target of the window `from..=to` of this series at `size`.
    pub(crate) fn target(&self, from: NaiveDate, to: NaiveDate, size: u64) -> Target {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("metric_from", &from.to_string());
        q.append_pair("metric_to", &to.to_string());
        if let Some(pt) = &self.series.property_type {
            q.append_pair("property_type", pt);
        }
        q.append_pair("tag", &self.series.tag);
        q.append_pair("size", &size.to_string());
        Target {
            route: self.series.route,
            path: self.series.path.clone(),
            query: Some(q.finish().into()),
        }
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
            release: self.release.stamp(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    fn window(route_path: &str, query: &str) -> Option<Window> {
        let uri: http::Uri = format!("{route_path}?{query}").parse().expect("uri");
        Window::of(&route::classify(&uri, 8192).expect("routes"))
    }

    #[test]
    fn only_a_window_named_as_the_upstream_reads_it_is_answered_by_the_month() {
        let county = "/v2/counties/g1/metrics/monthly";
        let ok = "metric_from=2024-01-01&metric_to=2024-12-31&property_type=all&tag=all";
        let w = window(county, ok).expect("a window");
        assert_eq!(
            (w.from.to_string(), w.to.to_string(), w.size, w.months.len()),
            ("2024-01-01".into(), "2024-12-31".into(), 50, 12)
        );
        assert_eq!(w.series.property_type.as_deref(), Some("all"));
        assert!(window(county, &format!("{ok}&size=12")).is_some_and(|w| w.size == 12));
        for bad in [
            format!("{ok}&cursor=abc"),
            format!("{ok}&tag=solar"),
            format!("{ok}&foo=1"),
            "metric_from=2024-01-01&metric_to=2024-12-31&tag=all".to_string(),
            "metric_from=2024-1-1&metric_to=2024-12-31&property_type=all&tag=all".to_string(),
            "metric_from=2024-12-31&metric_to=2024-01-01&property_type=all&tag=all".to_string(),
        ] {
            assert!(window(county, &bad).is_none(), "{bad}");
        }
        let address = "/v2/addresses/a1/metrics/monthly";
        assert!(window(address, "metric_from=2024-01-01&metric_to=2024-12-31&tag=all").is_some());
        assert!(window(address, ok).is_none(), "addresses take no property type");
        assert!(window("/v2/cities/c1/metrics/current", "property_type=all&tag=all").is_none());
    }

    #[test]
    fn a_window_covers_whole_months_only_and_asks_as_the_upstream_reads() {
        let w = window(
            "/v2/cities/c1/metrics/monthly",
            "metric_from=2024-01-15&metric_to=2024-03-31&property_type=vacant%20land&tag=all",
        )
        .expect("a window");
        assert!(!w.whole(d("2024-01-01")), "cut at the 15th");
        assert!(w.whole(d("2024-02-01")) && w.whole(d("2024-03-01")));
        assert_eq!(
            w.target(d("2024-02-01"), d("2024-03-31"), 7).query.as_deref(),
            Some("metric_from=2024-02-01&metric_to=2024-03-31&property_type=vacant+land&tag=all&size=7")
        );
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
