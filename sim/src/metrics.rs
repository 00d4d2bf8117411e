//! Area metrics: monthly rows and the current snapshot of an address, county,
//! city or jurisdiction, and a contractor's monthly rows, aggregated from the
//! dataset's permits on demand. Months come from each permit's start date;
//! permits without one are not counted. No area rows → a real 404
//! (`"No city metrics found."`), as upstream. Area metrics are metered (one
//! credit per row); contractor metrics are free.

use crate::dataset::names::PROPERTY_TYPES;
use crate::dataset::{Dataset, GeoRef, Permit};
use crate::pagination::{self, Envelope};
use crate::query::Query;
use crate::reply::{Answer, Outcome};
use chrono::{Datelike, NaiveDate};
use http::StatusCode;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Address,
    County,
    City,
    Jurisdiction,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Address => "address",
            Level::County => "county",
            Level::City => "city",
            Level::Jurisdiction => "jurisdiction",
        }
    }

    fn owns(self, r: GeoRef) -> bool {
        matches!(
            (self, r),
            (Level::Address, GeoRef::Address(_))
                | (Level::County, GeoRef::County(_))
                | (Level::City, GeoRef::City(_))
                | (Level::Jurisdiction, GeoRef::Jurisdiction(_))
        )
    }
}

/// Running sums for one row.
#[derive(Default)]
struct Agg {
    permits: u64,
    contractors: HashSet<usize>,
    construction: (i64, i64),
    approval: (i64, i64),
    job_value: i64,
    pass_rate: (i64, i64),
    active: u64,
    in_review: u64,
}

fn avg((sum, n): (i64, i64)) -> Option<i64> {
    (n > 0).then(|| sum / n)
}

impl Agg {
    fn add(&mut self, p: &Permit) {
        self.permits += 1;
        self.contractors.extend(p.contractor);
        let acc = |slot: &mut (i64, i64), v: Option<i64>| {
            if let Some(v) = v {
                slot.0 += v;
                slot.1 += 1;
            }
        };
        acc(&mut self.construction, p.construction_duration());
        acc(&mut self.approval, p.approval_duration());
        acc(&mut self.pass_rate, p.inspection_pass_rate);
        self.job_value += p.job_value.unwrap_or(0);
        self.active += u64::from(p.status == "active");
        self.in_review += u64::from(p.status == "in_review");
    }

    fn row(&self, geo_id: &str, tag: &str, property_type: Option<&str>) -> Value {
        let mut row = json!({
            "geo_id": geo_id, "tag": tag,
            "permit_count": self.permits, "contractor_count": self.contractors.len(),
            "avg_construction_duration": avg(self.construction),
            "avg_approval_duration": avg(self.approval),
            "total_job_value": self.job_value,
            "avg_inspection_pass_rate": avg(self.pass_rate),
        });
        if let Some(pt) = property_type {
            row["property_type"] = json!(pt);
        }
        row
    }
}

/// The permits of a geo ID of the right kind (an ID of another kind has none).
fn area_permits<'a>(
    d: &'a Dataset,
    level: Level,
    geo_id: &str,
    tag: &str,
    ptype: Option<&str>,
) -> impl Iterator<Item = &'a Permit> {
    let known = d.geo.get(geo_id).is_some_and(|r| level.owns(*r));
    let list = if known { d.area(geo_id) } else { &[] };
    let (tag, ptype) = (tag.to_string(), ptype.map(str::to_string));
    list.iter().map(|i| &d.permits[*i]).filter(move |p| {
        (tag == "all" || p.tags.contains(&tag.as_str()))
            && ptype
                .as_deref()
                .is_none_or(|t| t == "all" || d.addresses[p.address].property.ptype == t)
    })
}

fn property_types_and_all() -> Vec<&'static str> {
    let mut v = vec!["all"];
    v.extend_from_slice(PROPERTY_TYPES);
    v
}

fn no_rows(level: Level) -> Answer {
    Answer::detail(StatusCode::NOT_FOUND, &format!("No {} metrics found.", level.name()))
}

/// `/v2/{addresses,counties,cities}/{geo_id}/metrics/monthly`.
pub fn monthly(d: &Dataset, level: Level, geo_id: &str, q: &mut Query) -> Outcome {
    let from = q.required_date("metric_from");
    let to = q.required_date("metric_to");
    let ptype = match level {
        Level::Address => None,
        _ => q.required_enum("property_type", &property_types_and_all()),
    };
    let tag = q.required_str("tag").unwrap_or_default();
    let size = q.size();
    let after = q.cursor();
    q.finish()?;
    let (from, to) = (from.unwrap_or(NaiveDate::MIN), to.unwrap_or(NaiveDate::MAX));
    let mut months: BTreeMap<NaiveDate, Agg> = BTreeMap::new();
    for p in area_permits(d, level, geo_id, &tag, ptype.as_deref()) {
        let Some(start) = p.start_date.filter(|s| *s >= from && *s <= to) else {
            continue;
        };
        let month = start.with_day(1).unwrap_or(start);
        months.entry(month).or_default().add(p);
    }
    if months.is_empty() {
        return Err(no_rows(level));
    }
    let all: Vec<(String, Value)> = months
        .iter()
        .map(|(m, agg)| {
            let mut row = agg.row(geo_id, &tag, ptype.as_deref());
            row["date"] = json!(m.to_string());
            (m.to_string(), row)
        })
        .collect();
    let (items, next) = pagination::page(all, after.as_deref(), size);
    let n = items.len();
    Ok(Answer::metered(&Envelope::new(items, next, None), n))
}

/// `/v2/{addresses,counties,cities,jurisdictions}/{geo_id}/metrics/current`:
/// one row over all the area's permits (addresses take no property type).
pub fn current(d: &Dataset, level: Level, geo_id: &str, q: &mut Query) -> Outcome {
    let ptype = match level {
        Level::Address => None,
        _ => q.required_enum("property_type", &property_types_and_all()),
    };
    let tag = q.required_str("tag").unwrap_or_default();
    let size = q.size();
    let after = q.cursor();
    q.finish()?;
    let mut agg = Agg::default();
    for p in area_permits(d, level, geo_id, &tag, ptype.as_deref()) {
        agg.add(p);
    }
    if agg.permits == 0 {
        return Err(no_rows(level));
    }
    let mut row = agg.row(geo_id, &tag, ptype.as_deref());
    row["permit_active_count"] = json!(agg.active);
    row["permit_in_review_count"] = json!(agg.in_review);
    let (items, next) = pagination::page(vec![(geo_id.to_string(), row)], after.as_deref(), size);
    let n = items.len();
    Ok(Answer::metered(&Envelope::new(items, next, None), n))
}

/// `/v2/contractors/{id}/metrics`: the contractor's permits by start month
/// (free, like upstream); an unknown contractor is a 404.
pub fn contractor(d: &Dataset, id: &str, q: &mut Query) -> Outcome {
    let from = q.required_date("metric_from");
    let to = q.required_date("metric_to");
    let ptype = q.required_enum("property_type", &property_types_and_all());
    let tag = q.required_str("tag").unwrap_or_default();
    let size = q.size();
    let after = q.cursor();
    q.finish()?;
    let Some(c) = d.contractor_by_id.get(id).map(|c| &d.contractors[*c]) else {
        return Err(Answer::detail(StatusCode::NOT_FOUND, "Contractor not found"));
    };
    let (from, to) = (from.unwrap_or(NaiveDate::MIN), to.unwrap_or(NaiveDate::MAX));
    let ptype = ptype.unwrap_or_default();
    let mut months: BTreeMap<NaiveDate, Agg> = BTreeMap::new();
    for p in c.permits.iter().map(|i| &d.permits[*i]) {
        let kind_ok = ptype == "all" || d.addresses[p.address].property.ptype == ptype;
        let tag_ok = tag == "all" || p.tags.contains(&tag.as_str());
        let Some(start) = p.start_date.filter(|s| *s >= from && *s <= to && kind_ok && tag_ok) else {
            continue;
        };
        months.entry(start.with_day(1).unwrap_or(start)).or_default().add(p);
    }
    let all: Vec<(String, Value)> = months
        .iter()
        .map(|(m, agg)| {
            let row = json!({
                "property_type": ptype, "date": m.to_string(), "tag": tag,
                "permit_count": agg.permits,
                "avg_job_value": agg.job_value.checked_div(agg.permits as i64),
                "total_job_value": agg.job_value,
                "avg_construction_duration": avg(agg.construction),
                "avg_inspection_pass_rate": avg(agg.pass_rate),
            });
            (m.to_string(), row)
        })
        .collect();
    let (items, next) = pagination::page(all, after.as_deref(), size);
    Ok(Answer::ok(&Envelope::new(items, next, None)))
}
