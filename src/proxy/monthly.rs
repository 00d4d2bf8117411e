//! Monthly metrics by the month (issue 37): a window of
//! `/v2/{counties,cities,addresses,jurisdictions}/{geo_id}/metrics/monthly`
//! whose months are partly held (rows filed by any earlier window of the
//! same geography, tag and property type: [`crate::cache::months`]) buys
//! only the missing months, in one upstream call for the smallest window
//! that covers them, and is answered whole, assembled in the upstream's
//! order (ascending months) and page shape
//! (`{"items":[…],"size":n,"next_cursor":null,"total_count":null}`). The
//! team pays for the rows bought; the rows held count in
//! `gateway_credits_saved_total{reason="window"}`.
//!
//! The `lookup_months` phase: runs after `lookup_ids`, before the page's
//! own `lookup`, when `cache.month_reuse` is on, for a request that names its window as
//! the upstream reads it (`metric_from`, `metric_to` as `YYYY-MM-DD`, `tag`,
//! `property_type` but on addresses, `size`, each once) and says neither
//! `no-cache` nor `max-age`; anything else (a cursor, another parameter) is
//! the page path's, as before.
//!
//! - A row answers only for a month its window covered whole: the bounds
//!   are days, and the row of a month cut by a bound counts only part of it.
//!   The cut months at a window's ends are always bought with it.
//! - The call for the missing months asks for `size` minus the rows held
//!   outside it. An answer with a cursor means the whole window has more
//!   rows than one page: its rows are filed, and the window is bought as a
//!   page, as before (`X-Cache: MISS`, the page the upstream answers, with
//!   its cursor); so is a window whose held rows alone fill the page.
//! - Nothing is filed from an answer that does not look like one page of
//!   this series (a row of another tag, property type or month, months out
//!   of order, billed other than one credit a row): the request is then
//!   answered as a page.
//! - Windows of one series buy in turns ([`SeriesTurns`] in this process,
//!   the series' lease across replicas): a window whose months overlap one
//!   being bought waits for it and buys only what is still missing.
//! - A window whose missing months the upstream answers 404 ("No ... metrics
//!   found": no row) is answered from the rows held; with none held, the
//!   404 is passed on.

use super::context::{Ask, CacheState, RequestContext};
use super::credits::{self, X_CREDITS_REQUEST};
use super::fetch::{self, Role};
use super::flight::Fetched;
use super::respond::{self, saved, saved_because};
use super::State;
use crate::app::App;

use crate::cache::lease::{Acquired, Lease};
use crate::cache::months::{self, Series};
use crate::cache::{control, key, Entry};
use crate::clock::now_ms;
use crate::error::GatewayError;
use crate::http_util::{number_header, Body};
use crate::metrics::{RecordSource, SavedReason};
use crate::route::{self, Route, Target};
use bytes::{BufMut, Bytes, BytesMut};
use chrono::NaiveDate;
use http::{Method, Response, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

type Answer = Result<Response<Body>, GatewayError>;
type Held = Option<Arc<Entry>>;

/// A monthly-metrics request that can be answered by the month.
struct Window {
    series: Series,
    from: NaiveDate,
    to: NaiveDate,
    /// Rows per page asked (`size`, default 50).
    size: u64,
}

impl Window {
    /// The window `target` asks, or `None` for the page path.
    fn of(target: &Target) -> Option<Window> {
        if !months::is_monthly(target.route) {
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
                // A cursor or another parameter: as sent, the page path.
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
        Some(Window {
            series: Series {
                route: target.route,
                path: target.path.clone(),
                tag: tag?,
                property_type,
            },
            from,
            to,
            size: route::page_size_asked(target)?,
        })
    }

    /// Whether the window covers `month` whole: only then is its row the
    /// month's.
    fn whole(&self, month: NaiveDate) -> bool {
        self.from <= month && months::month_end(month) <= self.to
    }

    /// The query of the window `from..=to` of this series at `size`.
    fn query(&self, from: NaiveDate, to: NaiveDate, size: u64) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("metric_from", &from.to_string());
        q.append_pair("metric_to", &to.to_string());
        if let Some(pt) = &self.series.property_type {
            q.append_pair("property_type", pt);
        }
        q.append_pair("tag", &self.series.tag);
        q.append_pair("size", &size.to_string());
        q.finish()
    }
}

/// The `lookup_months` phase: the answer of a monthly-metrics window from
/// the rows held and one call for the missing months; `None` when this
/// request is the page path's.
pub(super) async fn lookup_months<B>(
    app: &Arc<App>,
    state: &State,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
) -> Option<Answer> {
    let (d, target) = (&ask.directives, &ask.parsed.target);
    if !months::is_monthly(target.route) || !app.cache.month_reuse() || d.no_cache || d.max_age.is_some() {
        return None;
    }
    app.cache.ttl(target.route)?;
    let w = Window::of(target)?;
    let all = months::months(w.from, w.to);
    let keys: Vec<String> = all.iter().map(|m| w.series.row_key(*m)).collect();
    let held = held_rows(app, &w, &all, &keys).await;
    if held.iter().all(Option::is_some) {
        return all_held(app, ask, ctx, &w, &held);
    }
    // Like only-if-cached, a HEAD never buys: the page path says so.
    if d.only_if_cached || ask.req.method() == Method::HEAD {
        return None;
    }
    // One window of a series buys at a time, in this process and across
    // replicas, and reads what is held again once its turn comes: two
    // windows that overlap, asked at once (a dashboard's panels), buy their
    // shared months once.
    let name = w.series.name();
    let _turn = state.series_turns.take(name.clone()).await;
    let lease = series_lease(app, &name).await;
    let answer = buy_missing(app, state, ask, ctx, &w, &all, &keys).await;
    if let Some(lease) = lease {
        lease.release().await;
    }
    answer
}

/// The missing months of `w` bought, with its turn at the series taken.
async fn buy_missing<B>(
    app: &Arc<App>,
    state: &State,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
    w: &Window,
    all: &[NaiveDate],
    keys: &[String],
) -> Option<Answer> {
    let target = &ask.parsed.target;
    let held = held_rows(app, w, all, keys).await;
    let missing: Vec<usize> = (0..all.len()).filter(|i| held[*i].is_none()).collect();
    let (Some(&first), Some(&last)) = (missing.first(), missing.last()) else {
        return all_held(app, ask, ctx, w, &held);
    };
    let outside = |i: usize| i < first || i > last;
    let kept: Vec<&Arc<Entry>> = held
        .iter()
        .enumerate()
        .filter(|(i, _)| outside(*i))
        .filter_map(|(_, h)| h.as_ref())
        .filter(|e| !e.body.is_empty())
        .collect();
    let kept_rows = kept.len() as u64;
    if kept_rows >= w.size {
        return None;
    }
    // The smallest window covering the missing months, cut to the asked one.
    let (sub_from, sub_to) = (w.from.max(all[first]), w.to.min(months::month_end(all[last])));
    let whole_window = first == 0 && last == all.len() - 1;
    let mut job = ask.job(&ctx.request_id);
    job.target = Target {
        route: target.route,
        path: target.path.clone(),
        query: Some(w.query(sub_from, sub_to, w.size - kept_rows).into()),
    };
    job.key = Some(key::cache_key(&job.target));
    let (outcome, role) = fetch::coalesce(app, &state.flights, job.clone()).await;
    let fetched = match outcome {
        Ok(f) => f,
        Err(e) => return Some(Err(e)),
    };
    let bought = Bought {
        charged: match role {
            Role::Leader if !fetched.from_cache => fetched.credits,
            _ => 0,
        },
        storable: !job.no_store && !fetched.from_cache && !control::forbids_storing(&fetched.headers),
        role,
    };
    let in_sub: Vec<NaiveDate> = all[first..=last].to_vec();
    if fetched.status == StatusCode::NOT_FOUND {
        // No row in the missing months.
        if bought.storable {
            file(app, w, &in_sub, &[], true).await;
        }
        if kept.is_empty() {
            return Some(respond::from_fetched(app, &ask.team, target, fetched, role, false, ctx));
        }
        return Some(Ok(assembled(
            app,
            ask,
            ctx,
            &held,
            (first, last),
            &[],
            &bought,
            &fetched,
        )));
    }
    if fetched.status != StatusCode::OK {
        return Some(respond::from_fetched(app, &ask.team, target, fetched, role, false, ctx));
    }
    let page = rows_of(w, &in_sub, &fetched);
    if let (Some(page), true) = (&page, bought.storable) {
        file(app, w, &in_sub, &page.rows, page.complete).await;
    }
    match page {
        // The window asked, bought as one page: the upstream's own answer.
        _ if whole_window => Some(respond::from_fetched(app, &ask.team, target, fetched, role, false, ctx)),
        Some(page) if page.complete => {
            let rows: Vec<Bytes> = page.rows.into_iter().map(|(_, b)| b).collect();
            let resp = assembled(app, ask, ctx, &held, (first, last), &rows, &bought, &fetched);
            Some(Ok(resp))
        }
        // More rows than a page, or an answer that is not this series':
        // the window is bought as a page, as before.
        _ => {
            if page.is_none() {
                tracing::warn!(
                    request_id = %ctx.request_id,
                    route = target.route.as_str(),
                    "upstream anomaly: a monthly-metrics answer that is not one page of its series; nothing filed, the window is bought as a page"
                );
            }
            None
        }
    }
}

/// The fresh rows held for the months `all` (their row `keys`) of `w`: a
/// row answers only for a month the window covers whole.
async fn held_rows(app: &App, w: &Window, all: &[NaiveDate], keys: &[String]) -> Vec<Held> {
    let now = now_ms();
    app.cache
        .held_rows(w.series.route, keys)
        .await
        .into_iter()
        .zip(all)
        .map(|(e, m)| e.filter(|e| w.whole(*m) && e.is_fresh(now)))
        .collect()
}

/// The series' lease across replicas (`cache::lease`, under a name no
/// cache key has): taken, or waited for until its holder releases it (its
/// rows then filed in Redis) or `cache.coalesce_wait_ms` passes. `None`
/// without Redis, when Redis does not answer, or after the wait: buy
/// without it rather than wait longer.
async fn series_lease(app: &App, name: &str) -> Option<Lease> {
    let key = format!("months {name}");
    let deadline = Instant::now() + Duration::from_millis(app.config.cache.coalesce_wait_ms);
    loop {
        match app.leases.acquire(&key).await {
            Acquired::Owned(lease) => return Some(lease),
            Acquired::Unavailable => return None,
            Acquired::Held => {
                let left = deadline.saturating_duration_since(Instant::now());
                if !app.leases.wait_released(&key, left).await {
                    return None;
                }
            }
        }
    }
}

/// Turns at buying a series' missing months, by series name: one window at
/// a time, so that the next one finds the rows the last one filed instead
/// of buying them again. Only the buying takes a turn; a window whose
/// months are all held never waits. Across replicas the turn is the
/// series' lease ([`series_lease`]).
#[derive(Default)]
pub(super) struct SeriesTurns(Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>);

impl SeriesTurns {
    /// Waits for `series`' turn; it lasts until the guard is dropped.
    async fn take(&self, series: String) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = {
            let mut turns = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            // Only series being bought have a live turn: the map stays small.
            turns.retain(|_, t| t.strong_count() > 0);
            match turns.get(&series).and_then(Weak::upgrade) {
                Some(turn) => turn,
                None => {
                    let turn = Arc::new(tokio::sync::Mutex::new(()));
                    turns.insert(series, Arc::downgrade(&turn));
                    turn
                }
            }
        };
        turn.lock_owned().await
    }
}

/// What the call for the missing months cost this request, and what of it
/// may be filed.
struct Bought {
    /// What this team pays (0 for a follower or an answer from the cache).
    charged: u64,
    storable: bool,
    role: Role,
}

/// Every month held: the rows, at 0 credits. `None` when the upstream
/// would answer otherwise than one page (no row at all: its 404; more rows
/// than `size`: a cursor).
fn all_held<B>(app: &App, ask: &Ask<'_, B>, ctx: &mut RequestContext, w: &Window, held: &[Held]) -> Option<Answer> {
    let rows: Vec<&Arc<Entry>> = held.iter().flatten().filter(|e| !e.body.is_empty()).collect();
    if rows.is_empty() || rows.len() as u64 > w.size {
        return None;
    }
    let route = ask.parsed.target.route;
    let absent = held.len() - rows.len();
    app.metrics.cache_records(route, RecordSource::Cache, rows.len() as u64);
    app.metrics.cache_records(route, RecordSource::Absent, absent as u64);
    let worth = rows.iter().map(|e| e.credits).sum();
    saved_because(app, &ask.team, &ask.parsed.target, worth, SavedReason::Window);
    let oldest = rows.iter().map(|e| e.stored_at_ms).min();
    let bodies: Vec<&[u8]> = rows.iter().map(|e| &e.body[..]).collect();
    Some(Ok(respond_page(app, ask, ctx, &bodies, oldest, 0, CacheState::Hit)))
}

/// The window from the rows held before and after the missing months and
/// the rows bought for them, in month order.
#[allow(clippy::too_many_arguments)]
fn assembled<B>(
    app: &App,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
    held: &[Held],
    (first, last): (usize, usize),
    bought_rows: &[Bytes],
    bought: &Bought,
    fetched: &Fetched,
) -> Response<Body> {
    let route = ask.parsed.target.route;
    let row = |h: &Held| h.as_ref().filter(|e| !e.body.is_empty()).cloned();
    let before: Vec<Arc<Entry>> = held[..first].iter().filter_map(row).collect();
    let after: Vec<Arc<Entry>> = held[last + 1..].iter().filter_map(row).collect();
    let mut bodies: Vec<&[u8]> = before.iter().map(|e| &e.body[..]).collect();
    bodies.extend(bought_rows.iter().map(|b| &b[..]));
    bodies.extend(after.iter().map(|e| &e.body[..]));
    let kept: Vec<&Arc<Entry>> = before.iter().chain(&after).collect();
    let absent = held[..first].iter().chain(&held[last + 1..]).flatten().count() - kept.len();
    app.metrics.cache_records(route, RecordSource::Cache, kept.len() as u64);
    app.metrics.cache_records(route, RecordSource::Absent, absent as u64);
    app.metrics
        .cache_records(route, RecordSource::Upstream, bought_rows.len() as u64);
    let worth = kept.iter().map(|e| e.credits).sum();
    saved_because(app, &ask.team, &ask.parsed.target, worth, SavedReason::Window);
    // Another request's call (a follower) or an answer stored meanwhile.
    if bought.role == Role::Follower || fetched.from_cache {
        app.metrics.coalesced(route);
        saved(app, &ask.team, &ask.parsed.target, fetched.worth);
    }
    let state = if bought.role == Role::Leader && !fetched.from_cache {
        CacheState::Miss
    } else {
        CacheState::Hit
    };
    let oldest = kept.iter().map(|e| e.stored_at_ms).min();
    respond_page(app, ask, ctx, &bodies, oldest, bought.charged, state)
}

/// The page of `rows` as the upstream writes it, answered like a cached
/// entry (ETag, 304, `Age` of the oldest row held), with what this team paid.
fn respond_page<B>(
    app: &App,
    ask: &Ask<'_, B>,
    ctx: &mut RequestContext,
    rows: &[&[u8]],
    oldest: Option<u64>,
    charged: u64,
    state: CacheState,
) -> Response<Body> {
    let route = ask.parsed.target.route;
    let ttl = app.cache.ttl(route).unwrap_or_default();
    let mut page = Entry::new(envelope(rows), charged, ttl, route);
    if let Some(oldest) = oldest {
        page.stored_at_ms = page.stored_at_ms.min(oldest);
    }
    ctx.cache = state;
    ctx.credits = charged;
    let mut resp = respond::from_entry(&page, state, ask.req.headers());
    resp.headers_mut().insert(X_CREDITS_REQUEST, number_header(charged));
    resp
}

/// `{"items":[…],"size":n,"next_cursor":null,"total_count":null}`: the
/// upstream's page envelope (`docs/vendor-api.md`), the rows as sent.
fn envelope(rows: &[&[u8]]) -> Bytes {
    let mut out = BytesMut::with_capacity(rows.iter().map(|r| r.len() + 1).sum::<usize>() + 64);
    out.put_slice(b"{\"items\":[");
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(row);
    }
    out.put_slice(format!("],\"size\":{},\"next_cursor\":null,\"total_count\":null}}", rows.len()).as_bytes());
    out.freeze()
}

/// The rows of an answer for `months`, each with its month, as sent.
struct Page {
    rows: Vec<(NaiveDate, Bytes)>,
    /// No cursor: every row of the window asked is here.
    complete: bool,
}

/// The rows of an answer, when it is one page of this series: every row of
/// its tag and property type, of one of `months`, months ascending, each
/// once; billed one credit a row. `None` otherwise (nothing is filed).
fn rows_of(w: &Window, months: &[NaiveDate], fetched: &Fetched) -> Option<Page> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        items: Vec<&'a RawValue>,
        size: Option<u64>,
        #[serde(default)]
        next_cursor: Option<String>,
    }
    #[derive(Deserialize)]
    struct Row {
        date: String,
        tag: Option<String>,
        property_type: Option<String>,
    }
    let page: Envelope<'_> = serde_json::from_slice(&fetched.body).ok()?;
    let n = page.items.len() as u64;
    if page.size != Some(n) || credits::billed(&fetched.headers) != Some(n) {
        return None;
    }
    let mut rows: Vec<(NaiveDate, Bytes)> = Vec::with_capacity(page.items.len());
    for raw in page.items {
        let row: Row = serde_json::from_str(raw.get()).ok()?;
        let day = NaiveDate::parse_from_str(&row.date, "%Y-%m-%d").ok()?;
        let month = months::month_of(day);
        let ascending = rows.last().is_none_or(|(m, _)| *m < month);
        let same_series = row.tag.as_deref() == Some(w.series.tag.as_str())
            && row.property_type.as_deref() == w.series.property_type.as_deref();
        if day != month || !months.contains(&month) || !ascending || !same_series {
            return None;
        }
        rows.push((month, fetched.body.slice_ref(raw.get().as_bytes())));
    }
    Some(Page {
        rows,
        complete: page.next_cursor.is_none(),
    })
}

/// Files the rows of the months the window covers whole, and an absence for
/// each such month without a row. Of a page with a cursor (`complete`
/// false), the months after its last row are unknown, not absent: left out.
async fn file(app: &App, w: &Window, months: &[NaiveDate], rows: &[(NaiveDate, Bytes)], complete: bool) {
    let route = w.series.route;
    let today = chrono::Utc::now().date_naive();
    let last_row = rows.last().map(|(m, _)| *m);
    let filed = months
        .iter()
        .filter(|m| w.whole(**m))
        .filter(|m| complete || last_row.is_some_and(|l| **m <= l))
        .filter_map(|m| {
            let ttl = app.cache.month_ttl(route, *m, today)?;
            let body = rows
                .iter()
                .find(|(got, _)| got == m)
                .map_or_else(Bytes::new, |(_, body)| body.clone());
            Some((w.series.row_key(*m), app.cache.row_entry(route, body, ttl)))
        })
        .collect();
    app.cache.file_rows(filed).await;
}

#[cfg(test)]
mod tests {
    use super::*;

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
            (w.from.to_string(), w.to.to_string(), w.size),
            ("2024-01-01".into(), "2024-12-31".into(), 50)
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
        let d = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
        assert!(!w.whole(d("2024-01-01")), "cut at the 15th");
        assert!(w.whole(d("2024-02-01")) && w.whole(d("2024-03-01")));
        assert_eq!(
            w.query(d("2024-02-01"), d("2024-03-31"), 7),
            "metric_from=2024-02-01&metric_to=2024-03-31&property_type=vacant+land&tag=all&size=7"
        );
        assert_eq!(
            &envelope(&[b"{\"a\":1}", b"{\"b\":2}"])[..],
            br#"{"items":[{"a":1},{"b":2}],"size":2,"next_cursor":null,"total_count":null}"#
        );
    }
}
