//! Permit search, contractor search and a contractor's permits: the filters
//! of `docs/vendor-api.md`, "Search filters" (combined with AND), over the
//! precomputed area indexes, so a page only walks the permits of its area.

use crate::dataset::names::{PROPERTY_TYPES, STATUSES};
use crate::dataset::{Contractor, Dataset, Permit};
use crate::geo;
use crate::pagination::{self, total_count, Envelope, COUNT_CAP};
use crate::query::Query;
use crate::records::{ContractorOut, PermitOut, Tallies};
use crate::reply::{Answer, Outcome};
use chrono::{Datelike, NaiveDate};

/// Every filter of a permit or contractor search, parsed and validated.
#[derive(Default)]
pub struct Filters {
    from: Option<NaiveDate>,
    to: Option<NaiveDate>,
    pub area: String,
    tags_in: Vec<String>,
    tags_out: Vec<String>,
    has_contractor: Option<bool>,
    /// Lower-cased; matched as a substring of the description.
    text: Option<String>,
    statuses: Vec<String>,
    permit_min: [Option<i64>; 5],
    property_types: Vec<String>,
    property_min: [Option<i64>; 5],
    class_in: Vec<String>,
    class_out: Vec<String>,
    contractor_name: Option<String>,
    website: Option<String>,
    contractor_min: [Option<i64>; 3],
    license: Option<String>,
}

/// Splits a repeatable `-`-able list into (required, excluded).
fn split_signed(values: Vec<String>) -> (Vec<String>, Vec<String>) {
    let (out, inn): (Vec<String>, Vec<String>) = values.into_iter().partition(|v| v.starts_with('-'));
    (inn, out.into_iter().map(|v| v[1..].to_string()).collect())
}

/// Case-insensitive substring test without allocating (descriptions are ASCII).
fn contains_ci(hay: &str, needle_lc: &str) -> bool {
    let n = needle_lc.as_bytes();
    n.is_empty() || hay.as_bytes().windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}

fn at_least(v: Option<i64>, min: Option<i64>) -> bool {
    match min {
        None => true,
        Some(m) => v.is_some_and(|v| v >= m),
    }
}

impl Filters {
    /// Reads the filters in the upstream's parameter order (errors come out in it).
    pub fn parse(q: &mut Query, permit_search: bool) -> Filters {
        let mut f = Filters {
            from: q.required_date("permit_from"),
            to: q.required_date("permit_to"),
            area: geo::required_area(q, "geo_id").unwrap_or_default(),
            ..Filters::default()
        };
        (f.tags_in, f.tags_out) = split_signed(q.list("permit_tags", None, None));
        if permit_search {
            f.has_contractor = q.opt_bool("permit_has_contractor");
        }
        f.text = q.opt_str("permit_q", None, Some(50)).map(|s| s.to_lowercase());
        f.statuses = q.list("permit_status", Some(STATUSES), Some(4));
        f.permit_min = [
            q.opt_int("permit_min_approval_duration", None, None),
            q.opt_int("permit_min_construction_duration", None, None),
            q.opt_int("permit_min_inspection_pr", None, None),
            q.opt_int("permit_min_job_value", None, None),
            q.opt_int("permit_min_fees", None, None),
        ];
        f.property_types = q.list("property_type", Some(PROPERTY_TYPES), None);
        f.property_min = [
            q.opt_int("property_min_market_value", None, None),
            q.opt_int("property_min_building_area", None, None),
            q.opt_int("property_min_lot_size", None, None),
            q.opt_int("property_min_story_count", None, None),
            q.opt_int("property_min_unit_count", None, None),
        ];
        (f.class_in, f.class_out) = split_signed(q.list("contractor_classification_derived", None, None));
        f.contractor_name = q.opt_str("contractor_name", Some(3), None).map(|s| s.to_lowercase());
        f.website = q.opt_str("contractor_website", None, None).map(|s| s.to_lowercase());
        f.contractor_min = [
            q.opt_int("contractor_min_total_job_value", None, None),
            q.opt_int("contractor_min_total_permits_count", None, None),
            q.opt_int("contractor_min_inspection_pr", Some(0), Some(100)),
        ];
        f.license = q.opt_str("contractor_license", None, None).map(|s| s.to_lowercase());
        f
    }

    fn has_contractor_filters(&self) -> bool {
        !self.class_in.is_empty()
            || !self.class_out.is_empty()
            || self.contractor_name.is_some()
            || self.website.is_some()
            || self.license.is_some()
            || self.contractor_min.iter().any(Option::is_some)
    }

    pub fn matches(&self, d: &Dataset, p: &Permit) -> bool {
        self.from.is_none_or(|from| p.earliest >= from)
            && self.to.is_none_or(|to| p.latest <= to)
            && self.tags_in.iter().all(|t| p.tags.contains(&t.as_str()))
            && !self.tags_out.iter().any(|t| p.tags.contains(&t.as_str()))
            && self.has_contractor.is_none_or(|h| h == p.contractor.is_some())
            && (self.statuses.is_empty() || self.statuses.iter().any(|s| s == p.status))
            && self.text.as_deref().is_none_or(|t| contains_ci(&p.description, t))
            && self.permit_ok(p)
            && self.property_ok(d, p)
            && self.contractor_ok(p.contractor.map(|c| &d.contractors[c]))
    }

    fn permit_ok(&self, p: &Permit) -> bool {
        let [approval, construction, pass_rate, job_value, fees] = self.permit_min;
        at_least(p.approval_duration(), approval)
            && at_least(p.construction_duration(), construction)
            && at_least(p.inspection_pass_rate, pass_rate)
            && at_least(p.job_value, job_value)
            && at_least(p.fees, fees)
    }

    fn property_ok(&self, d: &Dataset, p: &Permit) -> bool {
        let pr = &d.addresses[p.address].property;
        let [market, area, lot, stories, units] = self.property_min;
        (self.property_types.is_empty() || self.property_types.iter().any(|t| t == pr.ptype))
            && at_least(pr.market_value, market)
            && at_least(pr.building_area, area)
            && at_least(pr.lot_size, lot)
            && at_least(pr.story_count, stories)
            && at_least(pr.unit_count, units)
    }

    fn contractor_ok(&self, c: Option<&Contractor>) -> bool {
        if !self.has_contractor_filters() {
            return true;
        }
        let Some(c) = c else { return false };
        let [job_value, permits, pass_rate] = self.contractor_min;
        let contains = |hay: &str, needle: &str| hay.to_lowercase().contains(needle);
        self.class_in
            .iter()
            .all(|x| c.classification_derived.contains(&x.as_str()))
            && !self
                .class_out
                .iter()
                .any(|x| c.classification_derived.contains(&x.as_str()))
            && self
                .contractor_name
                .as_deref()
                .is_none_or(|n| contains(&c.name, n) || contains(&c.business_name, n))
            && self.website.as_deref().is_none_or(|w| contains(&c.website, w))
            && self
                .license
                .as_deref()
                .is_none_or(|l| c.license.eq_ignore_ascii_case(l))
            && at_least(Some(c.lifetime.total_job_value), job_value)
            && at_least(Some(c.lifetime.permit_count), permits)
            && at_least(c.lifetime.avg_inspection_pass_rate, pass_rate)
    }
}

/// Paging parameters shared by the searches.
struct Paging {
    size: usize,
    after: Option<String>,
    want_count: bool,
}

fn paging(q: &mut Query) -> Paging {
    let after = q.cursor();
    let size = q.size();
    let include_count = q.opt_bool("include_count").unwrap_or(false);
    // The count is only honoured on a first page.
    let want_count = include_count && !q.has("cursor");
    Paging {
        size,
        after,
        want_count,
    }
}

/// `/v2/permits/search`: keyset pages in permit-ID order.
pub fn permits(d: &Dataset, q: &mut Query) -> Outcome {
    let f = Filters::parse(q, true);
    let pg = paging(q);
    q.finish()?;
    let list = d.area(&f.area);
    let start = pg
        .after
        .as_deref()
        .map_or(0, |a| list.partition_point(|i| d.permits[*i].id.as_str() <= a));
    let mut items: Vec<PermitOut> = Vec::with_capacity(pg.size);
    let (mut next, mut last_id) = (None, "");
    for p in list[start..].iter().map(|i| &d.permits[*i]) {
        if f.matches(d, p) {
            if items.len() == pg.size {
                next = Some(pagination::encode(last_id));
                break;
            }
            last_id = &p.id;
            items.push(PermitOut::new(d, p));
        }
    }
    let total = pg.want_count.then(|| {
        let n = list
            .iter()
            .filter(|i| f.matches(d, &d.permits[**i]))
            .take(COUNT_CAP + 1)
            .count();
        total_count(n)
    });
    let n = items.len();
    Ok(Answer::metered(&Envelope::new(items, next, total), n))
}

/// Sort key of a contractor: most recent matching start date first, then ID.
fn contractor_key(latest: NaiveDate, id: &str) -> String {
    let ymd = latest.year() * 10_000 + latest.month() as i32 * 100 + latest.day() as i32;
    format!("{:08}|{id}", 99_999_999 - ymd)
}

/// Whether a permit lies in the area named by an index key.
fn in_area(d: &Dataset, p: &Permit, key: &str) -> bool {
    let a = &d.addresses[p.address];
    key == d.state_code(a.state)
        || key == d.zips[a.zip].code
        || key == a.geo_id
        || key == d.cities[a.city].geo_id
        || key == d.counties[a.county].geo_id
        || key == d.jurisdictions[a.jurisdiction].geo_id
}

/// `/v2/contractors/search`: contractors of the matching permits, with tallies
/// over those permits only.
pub fn contractors(d: &Dataset, q: &mut Query) -> Outcome {
    let f = Filters::parse(q, false);
    let tallies_on = q.opt_bool("include_tallies").unwrap_or(true);
    let pg = paging(q);
    q.finish()?;
    // First pass: only each contractor's latest matching start date (cheap);
    // tallies are computed below for the contractors of this page alone.
    let mut latest: Vec<Option<NaiveDate>> = vec![None; d.contractors.len()];
    for p in d.area(&f.area).iter().map(|i| &d.permits[*i]) {
        let Some(c) = p.contractor else { continue };
        if f.matches(d, p) {
            let date = p.start_date.unwrap_or(p.earliest);
            latest[c] = Some(latest[c].map_or(date, |l| l.max(date)));
        }
    }
    let mut all: Vec<(String, usize)> = latest
        .iter()
        .enumerate()
        .filter_map(|(c, date)| date.map(|dt| (contractor_key(dt, &d.contractors[c].id), c)))
        .collect();
    all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let total = pg.want_count.then(|| total_count(all.len()));
    let (page, next) = pagination::page(all, pg.after.as_deref(), pg.size);
    let items: Vec<ContractorOut> = page
        .into_iter()
        .map(|c| {
            let mut t = Tallies::default();
            if tallies_on {
                let mine = d.contractors[c].permits.iter().map(|i| &d.permits[*i]);
                mine.filter(|p| in_area(d, p, &f.area) && f.matches(d, p))
                    .for_each(|p| t.add(p));
            }
            ContractorOut::new(d, &d.contractors[c], t)
        })
        .collect();
    let n = items.len();
    Ok(Answer::metered(&Envelope::new(items, next, total), n))
}

/// `/v2/contractors/{id}/permits`: grouped by address; unknown ID → empty page.
pub fn contractor_permits(d: &Dataset, id: &str, q: &mut Query) -> Outcome {
    let pg = paging(q);
    q.finish()?;
    let list: &[usize] = d
        .contractor_by_id
        .get(id)
        .map_or(&[], |c| d.contractors[*c].permits.as_slice());
    let key = |i: usize| format!("{}|{}", d.addresses[d.permits[i].address].geo_id, d.permits[i].id);
    let start = pg
        .after
        .as_deref()
        .map_or(0, |a| list.partition_point(|i| key(*i).as_str() <= a));
    let end = (start + pg.size).min(list.len());
    let next = (end < list.len()).then(|| pagination::encode(&key(list[end - 1])));
    let items: Vec<PermitOut> = list[start..end]
        .iter()
        .map(|i| PermitOut::new(d, &d.permits[*i]))
        .collect();
    let total = pg.want_count.then(|| total_count(list.len()));
    let n = items.len();
    Ok(Answer::metered(&Envelope::new(items, next, total), n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Run with `cargo test --release -p permit-api-sim -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; meaningful only in release"]
    fn search_page_cost() {
        let d = Dataset::for_seed(42);
        let s = crate::Samples::from_dataset(&d);
        let qs = format!(
            "geo_id={}&permit_from={}&permit_to={}&size=50",
            s.big_state, s.permit_from, s.permit_to
        );
        let n = 2_000;
        let started = Instant::now();
        for _ in 0..n {
            let a = permits(&d, &mut Query::parse(Some(&qs)));
            assert!(a.is_ok());
        }
        println!("permit search page (50): {:?}/op", started.elapsed() / n);
        let started = Instant::now();
        for _ in 0..200 {
            let a = contractors(&d, &mut Query::parse(Some(&qs)));
            assert!(a.is_ok());
        }
        println!("contractor search over big state: {:?}/op", started.elapsed() / 200);
    }
}
