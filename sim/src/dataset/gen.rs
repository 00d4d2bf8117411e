//! The seeded generator behind [`Dataset`]: ChaCha8 from the seed, so one seed
//! always gives the same world on every machine and in every build.

use super::names::*;
use super::*;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::Days;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;

/// Share of permits with a contractor (the rest carry `contractor_id: null`).
const CONTRACTOR_SHARE: f64 = 0.7;
/// Contractors overall, split across states by permit volume.
const CONTRACTORS_TOTAL: usize = 400;
const PERMITS_PER_ADDRESS: usize = 3;

struct Gen {
    rng: ChaCha8Rng,
    ids: HashSet<String>,
    names: HashSet<String>,
}

impl Gen {
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        self.rng.random_range(lo..=hi)
    }
    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.rng.random_range(0..xs.len())]
    }
    fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut r = self.rng.random_range(0..total);
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return i;
            }
            r -= w;
        }
        weights.len() - 1
    }
    /// An upstream-style geo ID: 8 random bytes, unpadded base64url (11 chars).
    fn geo_id(&mut self) -> String {
        loop {
            let bytes: [u8; 8] = self.rng.random();
            let id = URL_SAFE_NO_PAD.encode(bytes);
            if self.ids.insert(id.clone()) {
                return id;
            }
        }
    }
    fn unique_name(&mut self, make: impl Fn(&mut Self) -> String) -> String {
        loop {
            let name = make(self);
            if self.names.insert(name.clone()) {
                return name;
            }
        }
    }
    fn date(&mut self, from: NaiveDate, span_days: u64) -> NaiveDate {
        from + Days::new(self.range(0, span_days))
    }
    fn person(&mut self) -> (&'static str, &'static str) {
        (self.pick(FIRST_NAMES), self.pick(LAST_NAMES))
    }
}

pub(super) fn ymd(y: i32, m: u32, d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, d).expect("constant date is valid")
}

pub fn generate(seed: u64) -> Dataset {
    let mut g = Gen {
        rng: ChaCha8Rng::seed_from_u64(seed),
        ids: HashSet::new(),
        names: HashSet::new(),
    };
    let mut d = Dataset {
        seed,
        states: Vec::new(),
        counties: Vec::new(),
        cities: Vec::new(),
        jurisdictions: Vec::new(),
        zips: Vec::new(),
        addresses: Vec::new(),
        permits: Vec::new(),
        contractors: Vec::new(),
        by_area: HashMap::new(),
        geo: HashMap::new(),
        contractor_by_id: HashMap::new(),
        decisions: Vec::new(),
        released_at: ymd(2025, 7, 15),
    };
    let total: usize = DATA_STATES.iter().map(|s| s.1).sum();
    for (si, &(code, count, zip0, lat, lng)) in DATA_STATES.iter().enumerate() {
        let name = US_STATES.iter().find(|s| s.0 == code).map_or(code, |s| s.1);
        d.states.push(State { code, name });
        geography(&mut g, &mut d, si, zip0);
        let addrs = addresses(&mut g, &mut d, si, count / PERMITS_PER_ADDRESS, lat, lng);
        let n_contractors = (CONTRACTORS_TOTAL * count / total).max(10);
        let cons = contractors(&mut g, &mut d, n_contractors, addrs.clone());
        for _ in 0..count {
            let address = g.range(addrs.start as u64, addrs.end as u64 - 1) as usize;
            let contractor = if g.chance(CONTRACTOR_SHARE) {
                // Squaring skews the pick so a few contractors are busy and
                // many are small, as in real permit data.
                let u: f64 = g.rng.random();
                Some(cons.start + ((u * u) * cons.len() as f64) as usize)
            } else {
                None
            };
            let p = permit(&mut g, address, contractor, d.permits.len());
            d.permits.push(p);
        }
    }
    d.permits.sort_by(|a, b| a.id.cmp(&b.id));
    super::index::build(&mut d);
    super::decisions::generate(&mut d);
    d
}

/// Counties, their cities, jurisdictions and ZIP codes for one state.
fn geography(g: &mut Gen, d: &mut Dataset, si: usize, zip0: u32) {
    let mut zip = zip0;
    for _ in 0..g.range(2, 4) {
        let county = d.counties.len();
        let cname = g.unique_name(|g| format!("{} County", g.pick(COUNTY_NAMES)));
        let county_jur = d.jurisdictions.len();
        d.jurisdictions.push(Jurisdiction {
            geo_id: g.geo_id(),
            name: format!("Unincorporated {cname}"),
            state: si,
            county,
            cities: Vec::new(),
        });
        let mut c = County {
            geo_id: g.geo_id(),
            name: cname,
            state: si,
            cities: Vec::new(),
            jurisdictions: vec![county_jur],
            zips: Vec::new(),
        };
        for _ in 0..g.range(2, 4) {
            let city = d.cities.len();
            let name = g.unique_name(|g| format!("{}{}", g.pick(PLACE_HEADS), g.pick(PLACE_TAILS)));
            let jur = d.jurisdictions.len();
            d.jurisdictions.push(Jurisdiction {
                geo_id: g.geo_id(),
                name: format!("City of {name}"),
                state: si,
                county,
                cities: vec![city],
            });
            d.jurisdictions[county_jur].cities.push(city);
            let mut zips = Vec::new();
            for _ in 0..g.range(2, 3) {
                zip += g.range(1, 9) as u32;
                zips.push(d.zips.len());
                d.zips.push(Zip {
                    code: format!("{zip:05}"),
                    state: si,
                    city,
                });
            }
            c.zips.extend(&zips);
            c.cities.push(city);
            c.jurisdictions.push(jur);
            d.cities.push(City {
                geo_id: g.geo_id(),
                name,
                state: si,
                county,
                jurisdiction: jur,
                zips,
            });
        }
        d.counties.push(c);
    }
}

fn addresses(g: &mut Gen, d: &mut Dataset, si: usize, n: usize, lat: f64, lng: f64) -> std::ops::Range<usize> {
    let start = d.addresses.len();
    let zips: Vec<usize> = (0..d.zips.len()).filter(|z| d.zips[*z].state == si).collect();
    for _ in 0..n {
        let zip = g.pick(&zips);
        let city = d.zips[zip].city;
        let county = d.cities[city].county;
        // Most parcels sit in the city's jurisdiction; some in the county's.
        let jurisdiction = if g.chance(0.8) {
            d.cities[city].jurisdiction
        } else {
            d.counties[county].jurisdictions[0]
        };
        let round = |x: f64| (x * 1e6).round() / 1e6;
        let latlng = [
            round(lat + g.rng.random_range(-1.5..1.5)),
            round(lng + g.rng.random_range(-1.5..1.5)),
        ];
        let property = property(g, si, county);
        d.addresses.push(Address {
            geo_id: g.geo_id(),
            street_no: g.range(1, 9999).to_string(),
            street: g.pick(STREETS),
            zip,
            city,
            county,
            jurisdiction,
            state: si,
            latlng,
            property,
        });
    }
    start..d.addresses.len()
}

fn property(g: &mut Gen, si: usize, county: usize) -> Property {
    let ptype = PROPERTY_TYPES[g.weighted(PROPERTY_WEIGHTS)];
    let (first, last) = g.person();
    let company = g.chance(0.3);
    let legal_owner = if company {
        format!("{} HOLDINGS LLC", last.to_uppercase())
    } else {
        format!("{} {}", last.to_uppercase(), first.to_uppercase())
    };
    let owner_type = if company {
        "private_owner"
    } else {
        g.pick(&OWNER_TYPES[..2])
    };
    let big = ptype != "residential";
    Property {
        census_tract: format!("{:02}{:03}{:06}", si + 1, county + 1, g.range(100, 999_999)),
        congressional_district: format!("{}-{:02}", DATA_STATES[si].0, g.range(1, 20)),
        ptype,
        detail: g.pick(PROPERTY_DETAILS),
        legal_owner,
        owner_type,
        lot_size: g.chance(0.85).then(|| g.range(1_000, 40_000) as i64),
        building_area: g.chance(0.8).then(|| g.range(500, 8_000) as i64),
        story_count: g.chance(0.8).then(|| g.range(1, 4) as i64),
        unit_count: g.chance(0.8).then(|| g.range(1, if big { 40 } else { 2 }) as i64),
        year_built: g.chance(0.75).then(|| g.range(1900, 2023) as i64),
        market_value: g.chance(0.8).then(|| g.range(10_000_000, 300_000_000) as i64),
    }
}

fn contractors(g: &mut Gen, d: &mut Dataset, n: usize, addrs: std::ops::Range<usize>) -> std::ops::Range<usize> {
    let start = d.contractors.len();
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for _ in 0..n {
        let id = g.unique_name(|g| (0..10).map(|_| g.pick(ALNUM) as char).collect());
        let (first, last) = g.person();
        let word = g.pick(BUSINESS_WORDS);
        let business_name = format!("{last} {word} {}", g.pick(&["Inc", "LLC", "Co"]));
        let domain = format!("{}{}.com", last, word.replace(' ', "")).to_lowercase();
        let mut classification_derived = vec![g.pick(CLASSIFICATIONS_DERIVED)];
        let second = g.pick(CLASSIFICATIONS_DERIVED);
        if g.chance(0.5) && second != classification_derived[0] {
            classification_derived.push(second);
        }
        let issued = g.date(ymd(2000, 1, 1), 7000);
        let phone = format!("(555) {:03}-{:04}", g.range(200, 999), g.range(0, 9999));
        let phone2 = format!("(555) {:03}-{:04}", g.range(200, 999), g.range(0, 9999));
        d.contractors.push(Contractor {
            license: format!("{}{:07}", DATA_STATES[d.states.len() - 1].0, g.range(1, 9_999_999)),
            name: format!("{first} {last}"),
            dba: g.chance(0.4).then(|| format!("{last} {word}")),
            business_type: g.pick(BUSINESS_TYPES),
            classification: g.pick(CLASSIFICATION_CODES),
            classification_derived,
            license_issue_date: issued,
            license_exp_date: issued + Days::new(365 * g.range(8, 30)),
            phone: format!("{phone}, {phone2}"),
            email: format!("info@{domain}, {}@{domain}", first.to_lowercase()),
            website: format!("www.{domain}"),
            sic: "1731",
            naics: "238210",
            revenue: g.pick(REVENUES),
            employee_count: g.pick(EMPLOYEE_COUNTS),
            primary_industry: g.pick(INDUSTRIES),
            review_count: g.range(0, 400) as i64,
            rating: (g.range(10, 50) as f64) / 10.0,
            address: g.range(addrs.start as u64, addrs.end as u64 - 1) as usize,
            business_name,
            id,
            permits: Vec::new(),
            lifetime: Lifetime::default(),
        });
    }
    start..d.contractors.len()
}

fn permit(g: &mut Gen, address: usize, contractor: Option<usize>, seq: usize) -> Permit {
    let status = STATUSES[g.weighted(&[50, 15, 15, 20])];
    let file = g.date(ymd(2021, 1, 1), 1640);
    let issue = (status != "in_review").then(|| file + Days::new(g.range(1, 60)));
    let start = match (status, issue) {
        ("final" | "active", Some(i)) => Some(i + Days::new(g.range(0, 30))),
        ("inactive", Some(i)) if g.chance(0.5) => Some(i + Days::new(g.range(0, 30))),
        _ => None,
    };
    let end = match (status, start) {
        ("final", Some(s)) => Some(s + Days::new(g.range(5, 240))),
        _ => None,
    };
    let n_tags = g.range(1, 3) as usize;
    let mut tags: Vec<usize> = Vec::new();
    while tags.len() < n_tags {
        let t = g.rng.random_range(0..TAGS.len());
        if !tags.contains(&t) {
            tags.push(t);
        }
    }
    let phrases: Vec<&str> = tags.iter().map(|t| TAGS[*t].1).collect();
    let mut description = phrases.join(", ");
    description[..1].make_ascii_uppercase();
    let (ptype, subtype) = g.pick(PERMIT_TYPES);
    let earliest = [Some(file), issue, start].into_iter().flatten().min().unwrap_or(file);
    let latest = [Some(file), issue, end].into_iter().flatten().max().unwrap_or(file);
    Permit {
        id: format!("{:016x}", g.rng.random::<u64>()),
        number: format!("{}{}-{:05}", &ptype[..1], file.format("%y"), seq % 100_000),
        description_derived: g
            .chance(0.5)
            .then(|| format!("{} project", TAGS[tags[0]].0.replace('_', " "))),
        description,
        ptype,
        subtype,
        status,
        job_value: g.chance(0.75).then(|| g.range(10_000, 200_000_000) as i64),
        fees: g.chance(0.8).then(|| g.range(5_000, 2_000_000) as i64),
        file_date: Some(file),
        issue_date: issue,
        final_date: end,
        start_date: start,
        end_date: end,
        inspection_pass_rate: g.chance(0.7).then(|| g.range(40, 100) as i64),
        contractor,
        tags: tags.iter().map(|t| TAGS[*t].0).collect(),
        address,
        earliest,
        latest,
    }
}
