//! The synthetic world the simulator serves: geography, properties, permits,
//! contractors and decisions, generated from a seed and never changed
//! afterwards (employees and residents are derived per request, `people`).
//!
//! Everything a request needs is precomputed here (permit lists per geo ID,
//! per contractor, lifetime totals) so a search page touches only the
//! permits of its area instead of the whole table. A dataset is immutable and
//! shared per seed across every `Sim` of the process.

pub mod decisions;
mod gen;
mod index;
pub mod names;
pub mod samples;

use chrono::NaiveDate;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Clone)]
pub struct State {
    pub code: &'static str,
    pub name: &'static str,
}

#[derive(Clone)]
pub struct County {
    pub geo_id: String,
    pub name: String,
    pub state: usize,
    pub cities: Vec<usize>,
    pub jurisdictions: Vec<usize>,
    pub zips: Vec<usize>,
}

#[derive(Clone)]
pub struct City {
    pub geo_id: String,
    pub name: String,
    pub state: usize,
    pub county: usize,
    pub jurisdiction: usize,
    pub zips: Vec<usize>,
}

#[derive(Clone)]
pub struct Jurisdiction {
    pub geo_id: String,
    pub name: String,
    pub state: usize,
    pub county: usize,
    pub cities: Vec<usize>,
}

#[derive(Clone)]
pub struct Zip {
    pub code: String,
    pub state: usize,
    pub city: usize,
}

/// What the property record says about the parcel at an address; permits at
/// the same address share it, as they would upstream.
#[derive(Clone)]
pub struct Property {
    pub census_tract: String,
    pub congressional_district: String,
    pub ptype: &'static str,
    pub detail: &'static str,
    pub legal_owner: String,
    pub owner_type: &'static str,
    pub lot_size: Option<i64>,
    pub building_area: Option<i64>,
    pub story_count: Option<i64>,
    pub unit_count: Option<i64>,
    pub year_built: Option<i64>,
    pub market_value: Option<i64>,
}

#[derive(Clone)]
pub struct Address {
    pub geo_id: String,
    pub street_no: String,
    pub street: &'static str,
    pub zip: usize,
    pub city: usize,
    pub county: usize,
    pub jurisdiction: usize,
    pub state: usize,
    pub latlng: [f64; 2],
    pub property: Property,
}

impl Address {
    /// The ZIP+4 extension, derived from the geo ID (FNV-1a) so it is stable
    /// without drawing from the generator's stream (which would reshuffle
    /// every record generated after it).
    pub fn zip_code_ext(&self) -> String {
        let h = self.geo_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        format!("{:04}", h % 10_000)
    }
}

#[derive(Clone)]
pub struct Permit {
    pub id: String,
    pub number: String,
    pub description: String,
    pub description_derived: Option<String>,
    pub ptype: &'static str,
    pub subtype: &'static str,
    pub status: &'static str,
    pub job_value: Option<i64>,
    pub fees: Option<i64>,
    pub file_date: Option<NaiveDate>,
    pub issue_date: Option<NaiveDate>,
    pub final_date: Option<NaiveDate>,
    pub start_date: Option<NaiveDate>,
    pub end_date: Option<NaiveDate>,
    pub inspection_pass_rate: Option<i64>,
    pub contractor: Option<usize>,
    pub tags: Vec<&'static str>,
    pub address: usize,
    /// Earliest of file/issue/start: what `permit_from` compares against.
    pub earliest: NaiveDate,
    /// Latest of file/issue/end: what `permit_to` compares against.
    pub latest: NaiveDate,
}

impl Permit {
    pub fn approval_duration(&self) -> Option<i64> {
        Some((self.issue_date? - self.file_date?).num_days())
    }
    pub fn construction_duration(&self) -> Option<i64> {
        Some((self.end_date? - self.start_date?).num_days())
    }
    pub fn total_duration(&self) -> Option<i64> {
        Some((self.end_date? - self.file_date?).num_days())
    }
}

#[derive(Clone)]
pub struct Contractor {
    pub id: String,
    pub license: String,
    pub name: String,
    pub business_name: String,
    pub dba: Option<String>,
    pub business_type: &'static str,
    pub classification: &'static str,
    pub classification_derived: Vec<&'static str>,
    pub license_issue_date: NaiveDate,
    pub license_exp_date: NaiveDate,
    pub phone: String,
    pub email: String,
    pub website: String,
    pub sic: &'static str,
    pub naics: &'static str,
    pub revenue: &'static str,
    pub employee_count: &'static str,
    pub primary_industry: &'static str,
    pub review_count: i64,
    pub rating: f64,
    pub address: usize,
    /// This contractor's permits, ordered by (address geo ID, permit ID):
    /// the "grouped by address" order of `/contractors/{id}/permits`.
    pub permits: Vec<usize>,
    pub lifetime: Lifetime,
}

/// Lifetime totals: not scoped to any search filter.
#[derive(Clone, Default)]
pub struct Lifetime {
    pub permit_count: i64,
    pub total_job_value: i64,
    pub avg_job_value: i64,
    pub avg_construction_duration: Option<i64>,
    pub avg_inspection_pass_rate: Option<i64>,
}

/// A geo ID resolved to the record it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GeoRef {
    County(usize),
    City(usize),
    Jurisdiction(usize),
    Address(usize),
}

#[derive(Clone)]
pub struct Dataset {
    pub seed: u64,
    pub states: Vec<State>,
    pub counties: Vec<County>,
    pub cities: Vec<City>,
    pub jurisdictions: Vec<Jurisdiction>,
    pub zips: Vec<Zip>,
    pub addresses: Vec<Address>,
    /// Sorted by permit ID, which is also the search result order.
    pub permits: Vec<Permit>,
    pub contractors: Vec<Contractor>,
    /// Permit positions per area key (state code, ZIP, or geo ID), ascending.
    pub by_area: HashMap<String, Vec<usize>>,
    pub geo: HashMap<String, GeoRef>,
    pub contractor_by_id: HashMap<String, usize>,
    /// Sorted by decision ID (generated after, and apart from, the permits).
    pub decisions: Vec<decisions::Decision>,
    pub released_at: NaiveDate,
}

impl Dataset {
    /// The shared dataset for `seed`, generated on first use.
    pub fn for_seed(seed: u64) -> Arc<Dataset> {
        static CACHE: OnceLock<Mutex<HashMap<u64, Arc<Dataset>>>> = OnceLock::new();
        let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
        // Holding the lock while generating makes parallel tests with the same
        // seed wait for one generation instead of each doing it.
        let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(seed).or_insert_with(|| Arc::new(gen::generate(seed))).clone()
    }

    /// Permit positions in an area; empty for a well-formed but unknown area.
    pub fn area(&self, key: &str) -> &[usize] {
        self.by_area.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn state_code(&self, state: usize) -> &'static str {
        self.states[state].code
    }

    /// The next data release, `days` after this one: the vendor revised
    /// every permit's job value by one dollar (a permit without one gets
    /// `1`), so every record and every monthly row with a permit in it
    /// changes, deterministically (`POST /_sim/release`).
    pub fn published(&self, days: u32) -> Dataset {
        let mut next = self.clone();
        next.released_at = self.released_at + chrono::Days::new(u64::from(days));
        for p in &mut next.permits {
            p.job_value = Some(p.job_value.map_or(1, |v| v + 1));
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_gives_the_same_dataset() {
        let a = gen::generate(7);
        let b = gen::generate(7);
        assert_eq!(a.permits.len(), b.permits.len());
        for (x, y) in a.permits.iter().zip(&b.permits).step_by(97) {
            assert_eq!(x.id, y.id);
            assert_eq!(x.description, y.description);
            assert_eq!(x.contractor, y.contractor);
        }
        assert_eq!(a.counties[0].geo_id, b.counties[0].geo_id);
    }

    #[test]
    fn different_seeds_differ_and_big_state_is_big() {
        let a = gen::generate(1);
        let b = gen::generate(2);
        assert_ne!(a.permits[0].id, b.permits[0].id);
        assert!(a.area("CA").len() > 10_000);
        let ids: std::collections::HashSet<_> = a.permits.iter().map(|p| &p.id).collect();
        assert_eq!(ids.len(), a.permits.len(), "permit ids are unique");
    }

    #[test]
    fn geo_ids_are_11_char_base64url() {
        let d = gen::generate(42);
        for c in &d.cities {
            assert_eq!(c.geo_id.len(), 11);
            assert!(c
                .geo_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        }
    }
}
