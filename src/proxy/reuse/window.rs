//! Monthly-metrics windows as a [`Kind`]: a window of
//! `/v2/{counties,cities,addresses,jurisdictions}/{geo_id}/metrics/monthly`
//! answered month by month from the rows any earlier window of the same
//! series bought (`cache::months`), the missing months bought in one call
//! for the smallest window that covers them, one window of a series at a
//! time ([`Buying::Turn`]: two overlapping windows asked at once buy their
//! shared months once). The answer is the upstream's: ascending months, in
//! its page shape; the held rows count in
//! `gateway_credits_saved_total{reason="window"}`.
//!
//! - A row answers only for a month its window covered whole: the bounds
//!   are days, and the row of a month cut by a bound counts only part of
//!   it. The cut months at a window's ends are always bought with it, and
//!   never filed.
//! - The call asks for `size` minus the rows held outside it; a window
//!   whose held rows alone fill the page, or whose answer has a cursor
//!   (more rows than a page), is the page path's: the upstream's page and
//!   its cursor (after filing what the call brought, and paying for it).
//! - A window whose missing months the upstream answers 404 ("No ...
//!   metrics found": no row) is answered from the rows held; with none
//!   held, the 404 is passed on.

use super::kind::{Buying, Kind, Read};
use crate::cache::months::{month_end, month_of, Window};
use crate::cache::{Cache, Entry};
use crate::metrics::SavedReason;
use crate::page::{item_of, Page};
use crate::route::{Route, Target};
use bytes::Bytes;
use chrono::NaiveDate;
use http::StatusCode;
use serde::Deserialize;

impl Kind for Window {
    fn route(&self) -> Route {
        self.series.route
    }

    fn keys(&self) -> &[String] {
        &self.keys
    }

    fn holds(&self, i: usize) -> bool {
        self.whole(self.months[i])
    }

    fn reason(&self) -> SavedReason {
        SavedReason::Window
    }

    fn answers(&self, n: usize) -> bool {
        n > 0 && n as u64 <= self.size
    }

    fn omits_unknown(&self) -> bool {
        false
    }

    fn buying(&self) -> Buying {
        Buying::Turn(self.series.name())
    }

    fn call(&self, wanted: &[usize], kept: u64) -> Option<Target> {
        let (first, last) = (*wanted.first()?, *wanted.last()?);
        if kept >= self.size {
            return None;
        }
        let from = self.from.max(self.months[first]);
        let to = self.to.min(month_end(self.months[last]));
        Some(self.target(from, to, self.size - kept))
    }

    fn read(&self, wanted: &[usize], body: &Bytes, page: &Page<'_>) -> Option<Read> {
        #[derive(Deserialize)]
        struct Row {
            date: String,
            tag: Option<String>,
            property_type: Option<String>,
        }
        let mut pieces = vec![None; wanted.len()];
        let mut foreign = 0;
        let mut last: Option<NaiveDate> = None;
        for raw in &page.items {
            let row: Row = serde_json::from_str(raw.get()).ok()?;
            let day = NaiveDate::parse_from_str(&row.date, "%Y-%m-%d").ok()?;
            let month = month_of(day);
            // Months ascending, each once, on its first day: the upstream's
            // order, or not a page of this series at all.
            if day != month || last.is_some_and(|l| l >= month) {
                return None;
            }
            last = Some(month);
            let same_series = row.tag.as_deref() == Some(self.series.tag.as_str())
                && row.property_type.as_deref() == self.series.property_type.as_deref();
            match wanted.iter().position(|i| self.months[*i] == month) {
                Some(at) if same_series => pieces[at] = Some(item_of(body, raw)),
                _ => foreign += 1,
            }
        }
        Some(Read { pieces, foreign })
    }

    fn entry(&self, cache: &Cache, i: usize, body: Bytes) -> Entry {
        let route = self.series.route;
        let today = chrono::Utc::now().date_naive();
        let ttl = cache.month_ttl(route, self.months[i], today).unwrap_or_default();
        cache.row_entry(route, body, ttl)
    }

    fn none_found(&self, status: StatusCode) -> bool {
        status == StatusCode::NOT_FOUND
    }
}
