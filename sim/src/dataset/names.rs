//! Fixed word lists the generator draws from: states, place-name parts, tags,
//! enums of the spec. Kept apart so the generator reads as logic, not data.

/// Every US state code and name (plus DC), for `/v2/states/search` and for
/// telling "a real state with no data" (200, empty) from garbage (422).
#[rustfmt::skip]
pub const US_STATES: &[(&str, &str)] = &[
    ("AL", "Alabama"), ("AK", "Alaska"), ("AZ", "Arizona"), ("AR", "Arkansas"),
    ("CA", "California"), ("CO", "Colorado"), ("CT", "Connecticut"), ("DE", "Delaware"),
    ("DC", "District of Columbia"), ("FL", "Florida"), ("GA", "Georgia"), ("HI", "Hawaii"),
    ("ID", "Idaho"), ("IL", "Illinois"), ("IN", "Indiana"), ("IA", "Iowa"),
    ("KS", "Kansas"), ("KY", "Kentucky"), ("LA", "Louisiana"), ("ME", "Maine"),
    ("MD", "Maryland"), ("MA", "Massachusetts"), ("MI", "Michigan"), ("MN", "Minnesota"),
    ("MS", "Mississippi"), ("MO", "Missouri"), ("MT", "Montana"), ("NE", "Nebraska"),
    ("NV", "Nevada"), ("NH", "New Hampshire"), ("NJ", "New Jersey"), ("NM", "New Mexico"),
    ("NY", "New York"), ("NC", "North Carolina"), ("ND", "North Dakota"), ("OH", "Ohio"),
    ("OK", "Oklahoma"), ("OR", "Oregon"), ("PA", "Pennsylvania"), ("RI", "Rhode Island"),
    ("SC", "South Carolina"), ("SD", "South Dakota"), ("TN", "Tennessee"), ("TX", "Texas"),
    ("UT", "Utah"), ("VT", "Vermont"), ("VA", "Virginia"), ("WA", "Washington"),
    ("WV", "West Virginia"), ("WI", "Wisconsin"), ("WY", "Wyoming"),
];

/// States that carry data: (code, permit count, first ZIP, centre lat, centre lng).
/// The first is the big one (> 10,000 permits) so the total_count cap is reachable.
#[rustfmt::skip]
pub const DATA_STATES: &[(&str, usize, u32, f64, f64)] = &[
    ("CA", 11_200, 90_001, 36.7, -119.4),
    ("TX", 3_600, 75_001, 31.0, -97.5),
    ("FL", 2_900, 32_003, 28.1, -81.6),
    ("NY", 2_800, 10_001, 42.9, -75.5),
    ("WA", 2_000, 98_001, 47.4, -121.5),
    ("CO", 1_500, 80_001, 39.0, -105.5),
];

pub const PLACE_HEADS: &[&str] = &[
    "Oak", "Cedar", "Maple", "River", "Lake", "Pine", "Elm", "Spring", "Fair", "Green", "Red", "Clear", "Stone",
    "Mill", "Bay", "Sun", "Ash", "Silver", "North", "West",
];
pub const PLACE_TAILS: &[&str] = &[
    "ville", "field", "ton", "wood", "dale", "port", "view", "brook", "ford", "haven",
];
pub const COUNTY_NAMES: &[&str] = &[
    "Alder", "Brant", "Carver", "Dorset", "Elgin", "Fulton", "Garnet", "Harlan", "Iris", "Jasper", "Kendall", "Lowell",
    "Marion", "Nolan", "Orland", "Preston", "Quincy", "Radford", "Sutton", "Tolland", "Union", "Vance", "Warren",
    "Yates",
];
pub const STREETS: &[&str] = &[
    "Main St",
    "Oak Ave",
    "Park Rd",
    "Hill St",
    "Lake Dr",
    "Cedar Ln",
    "Elm St",
    "Washington Blvd",
    "Sunset Ave",
    "Ridge Rd",
    "Mission St",
    "Valley Way",
    "Church St",
    "Maple Ct",
    "Highland Ave",
    "Broadway",
    "Pine St",
    "River Rd",
    "Forest Dr",
    "Bay St",
];
pub const FIRST_NAMES: &[&str] = &[
    "James", "Maria", "Robert", "Linda", "Wei", "Aisha", "Carlos", "Emma", "Noah", "Priya", "Omar", "Grace", "Luis",
    "Hannah", "Kenji", "Sofia", "Daniel", "Fatima", "Ivan", "Chloe",
];
pub const LAST_NAMES: &[&str] = &[
    "Smith", "Garcia", "Nguyen", "Johnson", "Patel", "Kim", "Brown", "Lopez", "Miller", "Chen", "Davis", "Wilson",
    "Moore", "Taylor", "Clark", "Rivera", "Walker", "Young",
];

/// The tag vocabulary, with the phrase a description uses for each.
pub const TAGS: &[(&str, &str)] = &[
    ("solar", "install rooftop solar panels"),
    ("hvac", "replace hvac system"),
    ("roofing", "tear off and reroof"),
    ("heat_pump", "install heat pump"),
    ("new_construction", "construct new single family dwelling"),
    ("electrical", "upgrade electrical panel"),
    ("plumbing", "repipe plumbing"),
    ("remodel", "interior remodel"),
    ("addition", "rear addition"),
    ("pool_and_hot_tub", "new pool and spa"),
    ("battery", "battery storage system"),
    ("ev_charger", "ev charger circuit"),
    ("kitchen", "kitchen renovation"),
    ("bathroom", "bathroom renovation"),
    ("demolition", "demolish accessory structure"),
    ("fire_sprinkler", "fire sprinkler tenant improvement"),
    ("window_door", "replace windows and doors"),
    ("water_heater", "replace water heater"),
    ("grading", "grading and drainage"),
    ("fence", "new fence"),
    ("adu", "accessory dwelling unit"),
    ("telecom", "telecom antenna upgrade"),
];

pub const STATUSES: &[&str] = &["final", "in_review", "inactive", "active"];

pub const PROPERTY_TYPES: &[&str] = &[
    "residential",
    "commercial",
    "industrial",
    "agricultural",
    "vacant land",
    "exempt",
    "miscellaneous",
    "office",
    "recreational",
];
/// Weights for PROPERTY_TYPES: mostly residential, like the real data.
pub const PROPERTY_WEIGHTS: &[u32] = &[60, 14, 5, 3, 4, 3, 5, 4, 2];
pub const PROPERTY_DETAILS: &[&str] = &[
    "single_family",
    "multi_family",
    "retail",
    "warehouse",
    "farm",
    "lot",
    "school",
    "mixed_use",
    "office_building",
    "park",
];
pub const OWNER_TYPES: &[&str] = &["individual", "private_owner", "company", "government"];

pub const PERMIT_TYPES: &[(&str, &str)] = &[
    ("Building", "Residential Alteration"),
    ("Building", "New Construction"),
    ("Electrical", "Residential"),
    ("Mechanical", "HVAC"),
    ("Plumbing", "Residential"),
    ("Roofing", "Reroof"),
    ("Demolition", "Partial"),
];

pub const CLASSIFICATIONS_DERIVED: &[&str] = &[
    "concrete_and_paving",
    "demolition_and_excavation",
    "electrical",
    "fencing_and_glazing",
    "framing_and_carpentry",
    "general_building_contractor",
    "general_engineering_contractor",
    "hvac",
    "landscaping_and_outdoor_work",
    "other",
    "plumbing",
    "roofing",
    "specialty_trades",
];
pub const CLASSIFICATION_CODES: &[&str] = &["B", "A", "C10", "C20", "C36", "C39", "C46", "C8"];
pub const BUSINESS_TYPES: &[&str] = &["llc", "corporation", "sole_proprietorship", "partnership"];
pub const BUSINESS_WORDS: &[&str] = &[
    "Builders",
    "Construction",
    "Solar",
    "Electric",
    "Roofing",
    "Mechanical",
    "Plumbing",
    "Home Services",
    "Contracting",
    "Energy",
];
pub const REVENUES: &[&str] = &["$0-$1M", "$1M-$5M", "$5M-$10M", "$10M-$50M"];
pub const EMPLOYEE_COUNTS: &[&str] = &["1-9", "10-49", "50-199", "200-499"];
pub const INDUSTRIES: &[&str] = &[
    "Construction",
    "Specialty Trade Contractors",
    "Building Equipment Contractors",
    "Utility System Construction",
];

/// Fields the coverage endpoint tracks (the vendor's `CoverageItem.field`
/// enum), in name order.
pub const COVERAGE_FIELDS: &[&str] = &[
    "contractor_id",
    "description",
    "fees",
    "file_date",
    "issue_date",
    "job_value",
    "owner_name",
    "property_building_area",
    "property_type",
    "property_year_built",
];
