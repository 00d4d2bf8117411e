//! Indexes built once after generation: permit lists per area key (state,
//! ZIP, address, city, county, jurisdiction), each contractor's permits in
//! "grouped by address" order, and contractors' lifetime totals.

use super::*;

/// Area indexes, contractor permit lists and lifetime totals, after sorting.
pub fn build(d: &mut Dataset) {
    for (i, c) in d.counties.iter().enumerate() {
        d.geo.insert(c.geo_id.clone(), GeoRef::County(i));
    }
    for (i, c) in d.cities.iter().enumerate() {
        d.geo.insert(c.geo_id.clone(), GeoRef::City(i));
    }
    for (i, j) in d.jurisdictions.iter().enumerate() {
        d.geo.insert(j.geo_id.clone(), GeoRef::Jurisdiction(i));
    }
    for (i, a) in d.addresses.iter().enumerate() {
        d.geo.insert(a.geo_id.clone(), GeoRef::Address(i));
    }
    for (i, p) in d.permits.iter().enumerate() {
        let a = &d.addresses[p.address];
        let keys = [
            d.states[a.state].code.to_string(),
            d.zips[a.zip].code.clone(),
            a.geo_id.clone(),
            d.cities[a.city].geo_id.clone(),
            d.counties[a.county].geo_id.clone(),
            d.jurisdictions[a.jurisdiction].geo_id.clone(),
        ];
        for k in keys {
            d.by_area.entry(k).or_default().push(i);
        }
        if let Some(c) = p.contractor {
            d.contractors[c].permits.push(i);
        }
    }
    for ci in 0..d.contractors.len() {
        let mut list = std::mem::take(&mut d.contractors[ci].permits);
        list.sort_by(|x, y| {
            let (px, py) = (&d.permits[*x], &d.permits[*y]);
            (&d.addresses[px.address].geo_id, &px.id).cmp(&(&d.addresses[py.address].geo_id, &py.id))
        });
        d.contractors[ci].lifetime = lifetime(&d.permits, &list);
        d.contractors[ci].permits = list;
        d.contractor_by_id.insert(d.contractors[ci].id.clone(), ci);
    }
}

fn lifetime(permits: &[Permit], list: &[usize]) -> Lifetime {
    let ps = || list.iter().map(|i| &permits[*i]);
    let total_job_value: i64 = ps().filter_map(|p| p.job_value).sum();
    let durations: Vec<i64> = ps().filter_map(Permit::construction_duration).collect();
    let rates: Vec<i64> = ps().filter_map(|p| p.inspection_pass_rate).collect();
    let n = list.len() as i64;
    Lifetime {
        permit_count: n,
        total_job_value,
        avg_job_value: if n > 0 { total_job_value / n } else { 0 },
        avg_construction_duration: (!durations.is_empty())
            .then(|| (durations.iter().sum::<i64>() as f64 / durations.len() as f64).round() as i64),
        avg_inspection_pass_rate: (!rates.is_empty()).then(|| rates.iter().sum::<i64>() / rates.len() as i64),
    }
}
