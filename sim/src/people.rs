//! People records: a contractor's employees (`/v2/contractors/{id}/employees`)
//! and an address's residents (`/v2/addresses/{geo_id}/residents`), one
//! credit per record.
//!
//! They are derived on demand from a generator seeded by (dataset seed,
//! owner id), so every request for the same owner sees the same people
//! without storing them and without disturbing the main generator's stream.

use crate::dataset::names::{FIRST_NAMES, LAST_NAMES};
use crate::dataset::{Address, Contractor, Dataset};
use crate::pagination::{self, Envelope};
use crate::query::Query;
use crate::reply::{Answer, Outcome};
use http::StatusCode;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

const AGE_RANGES: &[&str] = &["25-34", "35-44", "45-54", "55-64"];
const INCOMES: &[&str] = &["$50,000 to $74,999", "$75,000 to $99,999", "$100,000 to $149,999"];
const NET_WORTHS: &[&str] = &["$50,000 to $99,999", "$150,000 to $249,999", "$500,000 to $749,999"];
const TITLES: &[(&str, &str, &str)] = &[
    ("Owner", "Owner", "Executive"),
    ("Project Manager", "Mid", "Operations"),
    ("Estimator", "Mid", "Sales"),
    ("Installation Technician", "Entry", "Installation"),
    ("Office Manager", "Senior", "Administration"),
];

/// A generator for the people of one owner (contractor id or address geo ID).
fn rng_for(d: &Dataset, owner: &str) -> ChaCha8Rng {
    let h = owner.bytes().fold(d.seed ^ 0x9e37_79b9_7f4a_7c15, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    ChaCha8Rng::seed_from_u64(h)
}

fn pick<T: Copy>(rng: &mut ChaCha8Rng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

fn phone(rng: &mut ChaCha8Rng) -> String {
    format!(
        "(555) {:03}-{:04}",
        rng.random_range(200..1000),
        rng.random_range(0..10_000)
    )
}

/// Between 1 and 6 employees, keyed by a 32-hex id.
fn employees_of(d: &Dataset, c: &Contractor) -> Vec<(String, Value)> {
    let mut rng = rng_for(d, &c.id);
    let home = &d.addresses[c.address];
    let domain = c.website.trim_start_matches("www.");
    let mut people: Vec<(String, Value)> = (0..rng.random_range(1..=6))
        .map(|_| {
            let id = format!("{:016x}{:016x}", rng.random::<u64>(), rng.random::<u64>());
            let (first, last) = (pick(&mut rng, FIRST_NAMES), pick(&mut rng, LAST_NAMES));
            let (title, seniority, dept) = pick(&mut rng, TITLES);
            let mail = format!("{}.{}", first.to_lowercase(), last.to_lowercase());
            let row = json!({
                "id": id, "contractor_id": c.id, "name": format!("{first} {last}"),
                "street_no": rng.random_range(1..9999).to_string(), "street": home.street,
                "city": d.cities[home.city].name, "zip_code": d.zips[home.zip].code,
                "zip_code_ext": home.zip_code_ext(), "state": d.state_code(home.state),
                "phone": phone(&mut rng), "email": format!("{mail}@example.com"),
                "business_email": format!("{mail}@{domain}"),
                "linkedin_url": format!("https://linkedin.com/in/{first}-{last}").to_lowercase(),
                "homeowner": if rng.random_bool(0.6) { "Y" } else { "N" },
                "gender": if rng.random_bool(0.5) { "F" } else { "M" },
                "age_range": pick(&mut rng, AGE_RANGES), "is_married": rng.random_bool(0.5),
                "has_children": rng.random_bool(0.4), "income_range": pick(&mut rng, INCOMES),
                "net_worth": pick(&mut rng, NET_WORTHS), "job_title": title,
                "seniority_level": seniority, "department": dept,
            });
            (id, row)
        })
        .collect();
    people.sort_by(|a, b| a.0.cmp(&b.0));
    people
}

/// 0 to 3 residents: a fifth of addresses have none (the vendor's 404).
fn residents_of(d: &Dataset, a: &Address) -> Vec<(String, Value)> {
    let mut rng = rng_for(d, &a.geo_id);
    let n = if rng.random_bool(0.2) {
        0
    } else {
        rng.random_range(1..=3)
    };
    (0..n)
        .map(|i| {
            let (first, last) = (pick(&mut rng, FIRST_NAMES), pick(&mut rng, LAST_NAMES));
            let row = json!({
                "name": format!("{first} {last}"),
                "personal_emails": format!("{}.{}@example.com", first, last).to_lowercase(),
                "phone": phone(&mut rng),
                "linkedin_url": format!("https://www.linkedin.com/in/{first}-{last}/").to_lowercase(),
                "net_worth": pick(&mut rng, NET_WORTHS), "income_range": pick(&mut rng, INCOMES),
                "is_homeowner": i == 0,
                "street_no": a.street_no, "street": a.street, "city": d.cities[a.city].name,
                "state": d.state_code(a.state), "zip_code": d.zips[a.zip].code,
                "zip_code_ext": a.zip_code_ext(),
            });
            (format!("{i:02}"), row)
        })
        .collect()
}

/// Whether an address has residents (the others answer 404).
pub fn has_residents(d: &Dataset, a: &Address) -> bool {
    !residents_of(d, a).is_empty()
}

/// `/v2/contractors/{id}/employees`: an unknown contractor has none (200, empty).
pub fn employees(d: &Dataset, id: &str, q: &mut Query) -> Outcome {
    let after = q.cursor();
    let size = q.size();
    q.finish()?;
    let all = d
        .contractor_by_id
        .get(id)
        .map_or_else(Vec::new, |c| employees_of(d, &d.contractors[*c]));
    let (items, next) = pagination::page(all, after.as_deref(), size);
    let n = items.len();
    Ok(Answer::metered(&Envelope::new(items, next, None), n))
}

/// `/v2/addresses/{geo_id}/residents`: 404 for an address without residents
/// (or a geo ID that is not an address).
pub fn residents(d: &Dataset, geo_id: &str, q: &mut Query) -> Outcome {
    let after = q.cursor();
    let size = q.size();
    q.finish()?;
    let address = match d.geo.get(geo_id) {
        Some(crate::dataset::GeoRef::Address(i)) => Some(&d.addresses[*i]),
        _ => None,
    };
    let all = address.map_or_else(Vec::new, |a| residents_of(d, a));
    if all.is_empty() {
        let msg = "The given geo_id doesn't have residents information.";
        return Err(Answer::detail(StatusCode::NOT_FOUND, msg));
    }
    let (items, next) = pagination::page(all, after.as_deref(), size);
    let n = items.len();
    Ok(Answer::metered(&Envelope::new(items, next, None), n))
}
