//! Zoning and land-use decisions, generated after the permits from their own
//! stream (seed-derived), so adding them left every permit, contractor and
//! geo ID of a seed unchanged. Each decision sits at a dataset address, so
//! its geo IDs resolve like any other record's.

use super::gen::ymd;
use super::Dataset;
use chrono::{Days, NaiveDate};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub const ASSET_CLASSES: &[&str] = &["Residential", "Commercial", "Mixed-Use", "Industrial"];
/// (category, subcategories).
pub const CATEGORIES: &[(&str, &[&str])] = &[
    ("Rezoning", &["Upzoning", "Downzoning", "Map Amendment"]),
    ("Variance", &["Setback", "Height", "Parking"]),
    ("Site Plan", &["Major Site Plan", "Minor Site Plan"]),
    ("Subdivision", &["Preliminary Plat", "Final Plat"]),
];
const ZONES: &[&str] = &["R-1", "R-2", "R-3", "C-1", "C-2", "MU-1", "I-1"];
const USES: &[&str] = &["single family", "multi family", "retail", "office", "light industrial"];
/// Decisions per 100 permits of a state.
const PER_HUNDRED_PERMITS: usize = 2;

#[derive(Clone)]
pub struct Decision {
    pub id: String,
    pub address: usize,
    pub title: String,
    pub date: NaiveDate,
    pub description: String,
    pub asset_class: &'static str,
    pub category: &'static str,
    pub subcategory: &'static str,
    pub applicant: String,
    pub owner: String,
    pub zoning_previous: &'static str,
    pub zoning_new: &'static str,
    pub allowed_uses: &'static str,
    pub project_value: Option<i64>,
    pub lot_size: Option<i64>,
}

pub fn generate(d: &mut Dataset) {
    let mut rng = ChaCha8Rng::seed_from_u64(d.seed ^ 0xdec1_5105_0000_0001);
    let per_state: Vec<usize> = d.states.iter().map(|s| d.area(s.code).len()).collect();
    for (state, permits) in per_state.into_iter().enumerate() {
        let addrs: Vec<usize> = (0..d.addresses.len())
            .filter(|a| d.addresses[*a].state == state)
            .collect();
        if addrs.is_empty() {
            continue;
        }
        for _ in 0..permits * PER_HUNDRED_PERMITS / 100 {
            let address = addrs[rng.random_range(0..addrs.len())];
            let (category, subs) = CATEGORIES[rng.random_range(0..CATEGORIES.len())];
            let subcategory = subs[rng.random_range(0..subs.len())];
            let asset_class = ASSET_CLASSES[rng.random_range(0..ASSET_CLASSES.len())];
            let (from, to) = (
                ZONES[rng.random_range(0..ZONES.len())],
                ZONES[rng.random_range(0..ZONES.len())],
            );
            let a = &d.addresses[address];
            let street = format!("{} {}", a.street_no, a.street);
            let owner = a.property.legal_owner.clone();
            d.decisions.push(Decision {
                id: format!("{:016x}", rng.random::<u64>()),
                address,
                title: format!("{category} request at {street}"),
                date: ymd(2021, 1, 1) + Days::new(rng.random_range(0..1640)),
                description: format!(
                    "{subcategory} for a {} project at {street}, from {from} to {to}",
                    asset_class.to_lowercase()
                ),
                asset_class,
                category,
                subcategory,
                applicant: format!("{} Development LLC", a.street),
                owner,
                zoning_previous: from,
                zoning_new: to,
                allowed_uses: USES[rng.random_range(0..USES.len())],
                project_value: rng.random_bool(0.7).then(|| rng.random_range(1_000_000..2_000_000_000)),
                lot_size: a.property.lot_size,
            });
        }
    }
    d.decisions.sort_by(|a, b| a.id.cmp(&b.id));
}
