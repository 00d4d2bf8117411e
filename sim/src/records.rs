//! The JSON shapes of permits and contractors, as borrowed views over the
//! dataset so a page serializes straight to bytes without copying records.
//! Field order follows the upstream's OpenAPI; absent values are `null`.

use crate::dataset::{Address, Contractor, Dataset, Permit};
use chrono::NaiveDate;
use serde::Serialize;
use std::collections::BTreeMap;

/// The vendor's address object (`AddressesRead` in a permit,
/// `AddressesEmbedded` with `address_id` in a contractor), in its field order.
#[derive(Serialize)]
pub struct AddressOut<'a> {
    pub street_no: &'a str,
    pub street: &'a str,
    pub city: &'a str,
    pub county: &'a str,
    pub zip_code: &'a str,
    pub zip_code_ext: String,
    pub state: &'a str,
    pub jurisdiction: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address_id: Option<&'a str>,
    pub latlng: [f64; 2],
}

impl<'a> AddressOut<'a> {
    pub fn new(d: &'a Dataset, a: &'a Address, with_id: bool) -> Self {
        AddressOut {
            street_no: &a.street_no,
            street: a.street,
            city: &d.cities[a.city].name,
            county: &d.counties[a.county].name,
            zip_code: &d.zips[a.zip].code,
            zip_code_ext: a.zip_code_ext(),
            state: d.state_code(a.state),
            jurisdiction: &d.jurisdictions[a.jurisdiction].name,
            address_id: with_id.then_some(a.geo_id.as_str()),
            latlng: a.latlng,
        }
    }
}

#[derive(Serialize)]
pub struct GeoIds<'a> {
    pub address_id: &'a str,
    pub city_id: &'a str,
    pub county_id: &'a str,
    pub jurisdiction_id: &'a str,
}

#[derive(Serialize)]
pub struct PermitOut<'a> {
    property_census_tract: &'a str,
    property_congressional_district: &'a str,
    property_type: &'a str,
    property_type_detail: &'a str,
    property_legal_owner: &'a str,
    property_owner_type: &'a str,
    property_lot_size: Option<i64>,
    property_building_area: Option<i64>,
    property_story_count: Option<i64>,
    property_unit_count: Option<i64>,
    property_year_built: Option<i64>,
    property_assess_market_value: Option<i64>,
    id: &'a str,
    number: &'a str,
    description: &'a str,
    description_derived: Option<&'a str>,
    jurisdiction: &'a str,
    job_value: Option<i64>,
    #[serde(rename = "type")]
    ptype: &'a str,
    subtype: &'a str,
    fees: Option<i64>,
    status: &'a str,
    file_date: Option<NaiveDate>,
    issue_date: Option<NaiveDate>,
    final_date: Option<NaiveDate>,
    start_date: Option<NaiveDate>,
    end_date: Option<NaiveDate>,
    total_duration: Option<i64>,
    construction_duration: Option<i64>,
    approval_duration: Option<i64>,
    inspection_pass_rate: Option<i64>,
    contractor_id: Option<&'a str>,
    tags: &'a [&'static str],
    address: AddressOut<'a>,
    geo_ids: GeoIds<'a>,
}

impl<'a> PermitOut<'a> {
    pub fn new(d: &'a Dataset, p: &'a Permit) -> Self {
        let a = &d.addresses[p.address];
        let pr = &a.property;
        PermitOut {
            property_census_tract: &pr.census_tract,
            property_congressional_district: &pr.congressional_district,
            property_type: pr.ptype,
            property_type_detail: pr.detail,
            property_legal_owner: &pr.legal_owner,
            property_owner_type: pr.owner_type,
            property_lot_size: pr.lot_size,
            property_building_area: pr.building_area,
            property_story_count: pr.story_count,
            property_unit_count: pr.unit_count,
            property_year_built: pr.year_built,
            property_assess_market_value: pr.market_value,
            id: &p.id,
            number: &p.number,
            description: &p.description,
            description_derived: p.description_derived.as_deref(),
            jurisdiction: &d.jurisdictions[a.jurisdiction].name,
            job_value: p.job_value,
            ptype: p.ptype,
            subtype: p.subtype,
            fees: p.fees,
            status: p.status,
            file_date: p.file_date,
            issue_date: p.issue_date,
            final_date: p.final_date,
            start_date: p.start_date,
            end_date: p.end_date,
            total_duration: p.total_duration(),
            construction_duration: p.construction_duration(),
            approval_duration: p.approval_duration(),
            inspection_pass_rate: p.inspection_pass_rate,
            contractor_id: p.contractor.map(|c| d.contractors[c].id.as_str()),
            tags: &p.tags,
            address: AddressOut::new(d, a, false),
            geo_ids: GeoIds {
                address_id: &a.geo_id,
                city_id: &d.cities[a.city].geo_id,
                county_id: &d.counties[a.county].geo_id,
                jurisdiction_id: &d.jurisdictions[a.jurisdiction].geo_id,
            },
        }
    }
}

/// Status and tag counts over the permits that matched the search.
#[derive(Default, Serialize)]
pub struct Tallies {
    pub status_tally: BTreeMap<&'static str, u64>,
    pub tag_tally: BTreeMap<&'static str, u64>,
}

impl Tallies {
    pub fn add(&mut self, p: &Permit) {
        *self.status_tally.entry(p.status).or_default() += 1;
        for t in &p.tags {
            *self.tag_tally.entry(t).or_default() += 1;
        }
    }
}

#[derive(Serialize)]
pub struct ContractorOut<'a> {
    id: &'a str,
    license: &'a str,
    name: &'a str,
    business_name: &'a str,
    business_type: &'a str,
    classification: &'a str,
    classification_derived: &'a [&'static str],
    license_issue_date: NaiveDate,
    license_exp_date: NaiveDate,
    license_inact_date: Option<NaiveDate>,
    license_act_date: NaiveDate,
    primary_phone: &'a str,
    primary_email: &'a str,
    phone: &'a str,
    email: &'a str,
    website: &'a str,
    dba: Option<&'a str>,
    sic: &'a str,
    naics: &'a str,
    linkedin_url: Option<&'a str>,
    revenue: &'a str,
    employee_count: &'a str,
    primary_industry: &'a str,
    review_count: i64,
    rating: f64,
    #[serde(flatten)]
    tallies: Tallies,
    permit_count: i64,
    avg_job_value: i64,
    total_job_value: i64,
    avg_construction_duration: Option<i64>,
    avg_inspection_pass_rate: Option<i64>,
    first_seen_date: Option<NaiveDate>,
    address: AddressOut<'a>,
}

impl<'a> ContractorOut<'a> {
    pub fn new(d: &'a Dataset, c: &'a Contractor, tallies: Tallies) -> Self {
        let first = |s: &'a str| s.split(", ").next().unwrap_or(s);
        ContractorOut {
            id: &c.id,
            license: &c.license,
            name: &c.name,
            business_name: &c.business_name,
            business_type: c.business_type,
            classification: c.classification,
            classification_derived: &c.classification_derived,
            license_issue_date: c.license_issue_date,
            license_exp_date: c.license_exp_date,
            license_inact_date: None,
            license_act_date: c.license_issue_date,
            primary_phone: first(&c.phone),
            primary_email: first(&c.email),
            phone: &c.phone,
            email: &c.email,
            website: &c.website,
            dba: c.dba.as_deref(),
            sic: c.sic,
            naics: c.naics,
            linkedin_url: None,
            revenue: c.revenue,
            employee_count: c.employee_count,
            primary_industry: c.primary_industry,
            review_count: c.review_count,
            rating: c.rating,
            tallies,
            permit_count: c.lifetime.permit_count,
            avg_job_value: c.lifetime.avg_job_value,
            total_job_value: c.lifetime.total_job_value,
            avg_construction_duration: c.lifetime.avg_construction_duration,
            avg_inspection_pass_rate: c.lifetime.avg_inspection_pass_rate,
            first_seen_date: Some(c.license_issue_date),
            address: AddressOut::new(d, &d.addresses[c.address], true),
        }
    }
}
