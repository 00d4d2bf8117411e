//! IDs that exist in a dataset, so tests and scripts can build valid requests
//! without knowing the generator.

use super::names::DATA_STATES;
use super::Dataset;
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Samples {
    /// A small state (fast full scans).
    pub state: String,
    pub zip: String,
    /// `zip` in ZIP+4 form.
    pub zip4: String,
    pub county_geo_id: String,
    pub city_geo_id: String,
    pub jurisdiction_geo_id: String,
    pub address_geo_id: String,
    /// A busy contractor of `state` (more than one page at small sizes).
    pub contractor_id: String,
    pub tag: String,
    /// Bounds that include every permit of the dataset.
    pub permit_from: String,
    pub permit_to: String,
    /// A state with more than 10,000 permits.
    pub big_state: String,
    /// A decision of `state`.
    pub decision_id: String,
    /// An address of `state` with residents (a fifth of addresses have none).
    pub resident_address_geo_id: String,
}

impl Samples {
    pub fn from_dataset(d: &Dataset) -> Samples {
        let small = d.states.len() - 1;
        let contractor = d
            .contractors
            .iter()
            .filter(|c| d.addresses[c.address].state == small)
            .max_by_key(|c| (c.permits.len(), std::cmp::Reverse(c.id.clone())))
            .or_else(|| d.contractors.first())
            .expect("the dataset has contractors");
        // The address of the contractor's first permit: it has a contractor,
        // a city with metrics, and so on.
        let permit = &d.permits[contractor.permits[0]];
        let a = &d.addresses[permit.address];
        let zip = d.zips[a.zip].code.clone();
        let from = d.permits.iter().map(|p| p.earliest).min().unwrap_or(d.released_at);
        let to = d.permits.iter().map(|p| p.latest).max().unwrap_or(d.released_at);
        Samples {
            state: d.states[small].code.to_string(),
            zip4: format!("{zip}-0001"),
            zip,
            county_geo_id: d.counties[a.county].geo_id.clone(),
            city_geo_id: d.cities[a.city].geo_id.clone(),
            jurisdiction_geo_id: d.jurisdictions[a.jurisdiction].geo_id.clone(),
            address_geo_id: a.geo_id.clone(),
            contractor_id: contractor.id.clone(),
            tag: "solar".into(),
            permit_from: from.to_string(),
            permit_to: to.to_string(),
            big_state: DATA_STATES[0].0.to_string(),
            decision_id: d
                .decisions
                .iter()
                .find(|x| d.addresses[x.address].state == small)
                .or_else(|| d.decisions.first())
                .map(|x| x.id.clone())
                .unwrap_or_default(),
            resident_address_geo_id: d
                .addresses
                .iter()
                .find(|a| a.state == small && crate::people::has_residents(d, a))
                .map(|a| a.geo_id.clone())
                .unwrap_or_default(),
        }
    }
}
