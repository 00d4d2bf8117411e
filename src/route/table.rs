//! The route table: every vendor operation as data, in one place.
//!
//! Each row names one `GET /v2/...` operation of the vendor's OpenAPI
//! (`sim/openapi/shovels-openapi.json`, 34 operations) plus the
//! catch-all `other`: its route name (the `route` metric label), its path
//! pattern, what it costs ([`Cost`]), how long its answers stay fresh
//! ([`TtlClass`]) and how the upstream reads each declared parameter
//! ([`Kind`]: what the cache key may normalize, what is validated before a
//! reservation). Routing, metering, TTLs, key normalization and the docs
//! all read this table; the unit tests check it against the OpenAPI file.
//!
//! Row order is the L2 entry encoding of a route (`Route::index`): rows are
//! only ever appended, so entries written by an older replica still decode.

use super::Route;
use std::sync::LazyLock;

/// What one call of an operation costs the org, by the upstream's metering
/// (`docs/vendor-api.md`, "Credits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cost {
    /// No credit headers, nothing billed: never reserved, never refused for
    /// budget (geo searches and details, `list/*`, `meta/*`, contractor
    /// metrics, usage).
    Free,
    /// One credit per record of a page: at worst the page size asked for
    /// (`size`, 1..=100, default 50).
    Page,
    /// One credit per record of an id lookup: at worst one per `id` asked
    /// for (≤ 50).
    Ids,
    /// A path the table does not know (route `other`): answered 404 by the
    /// gateway before any reserve, as the vendor answers it (so a team with
    /// no credit left gets the vendor's 404, not a 402). Its estimate (its ids, else its page size) is never reserved.
    Unknown,
}

/// How long an operation's answers stay fresh unless
/// `cache.route_ttl_secs.<route>` says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlClass {
    /// Permit, contractor, decision, property and metrics data: refreshed by
    /// the vendor's daily release. One day.
    Records,
    /// Geography, lists and coverage: change rarely. Seven days.
    Reference,
    /// `meta/release`: the one answer that says when the data changed. Five minutes.
    Release,
    /// Unknown paths: `cache.default_ttl_secs`.
    Default,
    /// Never cached (`usage` is the team's own, answered by the gateway).
    Never,
}

impl TtlClass {
    /// The class's freshness in seconds; `None` for [`TtlClass::Default`]
    /// (the configured default) and [`TtlClass::Never`].
    pub fn secs(self) -> Option<u64> {
        match self {
            TtlClass::Records => Some(86_400),
            TtlClass::Reference => Some(604_800),
            TtlClass::Release => Some(300),
            TtlClass::Default | TtlClass::Never => None,
        }
    }
}

/// How the upstream (FastAPI + Pydantic v2) reads one declared parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A repeatable filter with set semantics (documented AND/OR sets):
    /// order and repeats do not matter, within `max_items`.
    Set { max_items: Option<usize> },
    /// A repeatable parameter whose order and repeats are not proven free:
    /// kept exactly as sent.
    List { max_items: Option<usize> },
    /// The ids of a lookup: required, at most 50, order kept (whether the
    /// answer follows the request order is not known).
    Ids,
    /// A scalar: repeated, Starlette hands FastAPI the last one.
    Scalar,
    /// A boolean scalar; `default` equals its absence.
    Flag { default: Option<bool> },
    /// The page size: an integer 1..=100, default 50.
    Size,
    /// `include_count` (default false), documented as honoured on the first
    /// page only, so ignored on a cursor page.
    Count,
}

/// One declared query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Param {
    pub(super) name: &'static str,
    kind: Kind,
    /// The OpenAPI's `required`: its absence is the upstream's free 422.
    pub(super) required: bool,
}

/// One row: an operation (or `other`).
#[derive(Debug)]
pub struct Row {
    pub(super) route: Route,
    /// The metric label; a contract (docs/design.md §3.5) for the first 18 rows.
    pub(super) name: &'static str,
    /// The OpenAPI path under `/v2`, `{..}` matching one segment; `None` for `other`.
    pub pattern: Option<&'static str>,
    pub cost: Cost,
    pub ttl: TtlClass,
    /// Declared query parameters, in groups shared between operations.
    pub(super) params: &'static [&'static [Param]],
}

impl Row {
    /// The parameters the operation cannot be called without, in the
    /// order it declares them (the order of the upstream's 422 items).
    pub(super) fn required(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.params
            .iter()
            .flat_map(|g| g.iter())
            .filter(|p| p.required)
            .map(|p| p.name)
    }

    /// How this operation reads `name`; `None` when it does not declare it.
    pub(super) fn param(&self, name: &str) -> Option<Kind> {
        self.params
            .iter()
            .flat_map(|g| g.iter())
            .find(|p| p.name == name)
            .map(|p| p.kind)
    }
}

/// A pattern's segments; `{..}` matches any one segment.
fn split(pattern: &'static str) -> Vec<&'static str> {
    pattern.split('/').collect()
}

fn matches(pattern: &[&str], rest: &[&str]) -> bool {
    pattern.len() == rest.len()
        && pattern
            .iter()
            .zip(rest)
            .all(|(want, got)| want.starts_with('{') || want == got)
}

const fn p(name: &'static str, kind: Kind) -> Param {
    Param {
        name,
        kind,
        required: false,
    }
}
const fn scalar(name: &'static str) -> Param {
    p(name, Kind::Scalar)
}
/// A scalar the operation cannot be called without.
const fn required(name: &'static str) -> Param {
    Param {
        name,
        kind: Kind::Scalar,
        required: true,
    }
}
const fn set(name: &'static str) -> Param {
    p(name, Kind::Set { max_items: None })
}
const fn list(name: &'static str) -> Param {
    p(name, Kind::List { max_items: None })
}

const NONE: &[&[Param]] = &[];
/// Cursor pagination.
const PAGE: &[Param] = &[scalar("cursor"), p("size", Kind::Size)];
const COUNT: &[Param] = &[p("include_count", Kind::Count)];
const IDS: &[Param] = &[Param {
    name: "id",
    kind: Kind::Ids,
    required: true,
}];
const Q: &[Param] = &[required("q")];
const GEO_ID: &[Param] = &[required("geo_id")];
const TAG: &[Param] = &[required("tag")];
const PROPERTY_TYPE: &[Param] = &[required("property_type")];
const MONTHS: &[Param] = &[required("metric_from"), required("metric_to")];

/// The filters permit search and contractor search share.
const PERMIT_FILTERS: &[Param] = &[
    required("permit_from"),
    required("permit_to"),
    required("geo_id"),
    p("permit_status", Kind::Set { max_items: Some(4) }),
    set("permit_tags"),
    set("property_type"),
    set("contractor_classification_derived"),
    scalar("permit_q"),
    scalar("permit_min_approval_duration"),
    scalar("permit_min_construction_duration"),
    scalar("permit_min_inspection_pr"),
    scalar("permit_min_job_value"),
    scalar("permit_min_fees"),
    scalar("property_min_market_value"),
    scalar("property_min_building_area"),
    scalar("property_min_lot_size"),
    scalar("property_min_story_count"),
    scalar("property_min_unit_count"),
    scalar("contractor_name"),
    scalar("contractor_website"),
    scalar("contractor_min_total_job_value"),
    scalar("contractor_min_total_permits_count"),
    scalar("contractor_min_inspection_pr"),
    scalar("contractor_license"),
];

const DECISION_FILTERS: &[Param] = &[
    required("decision_from"),
    required("decision_to"),
    required("geo_id"),
    list("asset_class"),
    list("category"),
    list("subcategory"),
    list("property_type"),
    scalar("min_project_value"),
    scalar("max_project_value"),
    scalar("decision_q"),
];

const PROPERTY_FILTERS: &[Param] = &[
    scalar("geo_id"),
    p("legal_owner", Kind::List { max_items: Some(10) }),
    list("permit_tags"),
    list("permit_status"),
    scalar("permit_from"),
    scalar("permit_to"),
    list("property_type"),
    list("permit_tags_unfinaled"),
    scalar("property_min_market_value"),
    scalar("property_max_market_value"),
    scalar("property_min_lot_size"),
    scalar("property_max_lot_size"),
    scalar("property_min_building_area"),
    scalar("property_max_building_area"),
    scalar("property_min_unit_count"),
    scalar("property_max_unit_count"),
    scalar("property_min_year_built"),
    scalar("property_max_year_built"),
    p("include_total_count", Kind::Flag { default: Some(false) }),
];

const fn row(
    route: Route,
    name: &'static str,
    pattern: &'static str,
    cost: Cost,
    ttl: TtlClass,
    params: &'static [&'static [Param]],
) -> Row {
    Row {
        route,
        name,
        pattern: Some(pattern),
        cost,
        ttl,
        params,
    }
}

use Cost::{Free, Ids, Page};
use TtlClass::{Records, Reference, Release};

/// Every route, in [`Route`] discriminant order (checked by a test).
#[rustfmt::skip]
pub(super) static TABLE: [Row; super::ROUTES] = [
    // The 18 routes of docs/design.md §3.5 (contract names), in their original order.
    row(Route::PermitsSearch, "permits_search", "permits/search", Page, Records,
        &[PERMIT_FILTERS, &[p("permit_has_contractor", Kind::Flag { default: None })], PAGE, COUNT]),
    row(Route::ContractorsSearch, "contractors_search", "contractors/search", Page, Records,
        &[PERMIT_FILTERS, &[p("include_tallies", Kind::Flag { default: Some(true) })], PAGE, COUNT]),
    row(Route::ContractorPermits, "contractor_permits", "contractors/{id}/permits", Page, Records, &[PAGE, COUNT]),
    row(Route::AddressMetricsMonthly, "address_metrics_monthly", "addresses/{geo_id}/metrics/monthly", Page, Records,
        &[MONTHS, TAG, PAGE]),
    row(Route::CountyMetricsMonthly, "county_metrics_monthly", "counties/{geo_id}/metrics/monthly", Page, Records,
        &[MONTHS, PROPERTY_TYPE, TAG, PAGE]),
    row(Route::CityMetricsMonthly, "city_metrics_monthly", "cities/{geo_id}/metrics/monthly", Page, Records,
        &[MONTHS, PROPERTY_TYPE, TAG, PAGE]),
    row(Route::CityMetricsCurrent, "city_metrics_current", "cities/{geo_id}/metrics/current", Page, Records,
        &[PROPERTY_TYPE, TAG, PAGE]),
    row(Route::Counties, "counties", "counties", Free, Reference, &[GEO_ID]),
    row(Route::Cities, "cities", "cities", Free, Reference, &[GEO_ID]),
    row(Route::Jurisdictions, "jurisdictions", "jurisdictions", Free, Reference, &[GEO_ID]),
    row(Route::ListZip, "list_zip", "list/zip", Free, Reference, &[PAGE]),
    row(Route::ZipcodesSearch, "zipcodes_search", "zipcodes/search", Free, Reference, &[Q, PAGE]),
    row(Route::StatesSearch, "states_search", "states/search", Free, Reference, &[Q, PAGE]),
    row(Route::JurisdictionsSearch, "jurisdictions_search", "jurisdictions/search", Free, Reference, &[Q]),
    row(Route::MetaCoverage, "meta_coverage", "meta/coverage", Free, Reference,
        &[&[required("geo_type"), required("geo_id"), required("date_from"), required("date_to")]]),
    row(Route::MetaRelease, "meta_release", "meta/release", Free, Release, NONE),
    row(Route::Usage, "usage", "usage", Free, TtlClass::Never, NONE),
    Row {
        route: Route::Other,
        name: "other",
        pattern: None,
        cost: Cost::Unknown,
        ttl: TtlClass::Default,
        params: NONE,
    },
    // The rest of the vendor's OpenAPI, appended.
    row(Route::PermitsById, "permits_by_id", "permits", Ids, Records, &[IDS]),
    row(Route::ContractorsById, "contractors_by_id", "contractors", Ids, Records, &[IDS, &[scalar("cursor")]]),
    row(Route::DecisionsSearch, "decisions_search", "decisions/search", Page, Records, &[DECISION_FILTERS, PAGE, COUNT]),
    row(Route::DecisionsById, "decisions_by_id", "decisions", Ids, Records, &[IDS]),
    row(Route::PropertiesSearch, "properties_search", "properties/search", Page, Records, &[PROPERTY_FILTERS, PAGE]),
    row(Route::PropertiesById, "properties_by_id", "properties", Ids, Records, &[IDS]),
    row(Route::ContractorEmployees, "contractor_employees", "contractors/{id}/employees", Page, Records, &[PAGE]),
    row(Route::ContractorMetrics, "contractor_metrics", "contractors/{id}/metrics", Free, Records,
        &[MONTHS, PROPERTY_TYPE, TAG, PAGE]),
    row(Route::AddressesSearch, "addresses_search", "addresses/search", Free, Reference, &[Q]),
    row(Route::CitiesSearch, "cities_search", "cities/search", Free, Reference, &[Q]),
    row(Route::CountiesSearch, "counties_search", "counties/search", Free, Reference, &[Q]),
    row(Route::AddressMetricsCurrent, "address_metrics_current", "addresses/{geo_id}/metrics/current", Page, Records,
        &[TAG, PAGE]),
    row(Route::CountyMetricsCurrent, "county_metrics_current", "counties/{geo_id}/metrics/current", Page, Records,
        &[PROPERTY_TYPE, TAG, PAGE]),
    row(Route::JurisdictionMetricsMonthly, "jurisdiction_metrics_monthly", "jurisdictions/{geo_id}/metrics/monthly",
        Page, Records, &[MONTHS, PROPERTY_TYPE, TAG, PAGE]),
    row(Route::JurisdictionMetricsCurrent, "jurisdiction_metrics_current", "jurisdictions/{geo_id}/metrics/current",
        Page, Records, &[PROPERTY_TYPE, TAG, PAGE]),
    row(Route::AddressResidents, "address_residents", "addresses/{geo_id}/residents", Page, Records, &[PAGE]),
    row(Route::ListTags, "list_tags", "list/tags", Free, Reference, &[PAGE]),
];

/// The patterns split once: routing runs on every request, hits included.
static PATTERNS: LazyLock<Vec<(Route, Vec<&'static str>)>> = LazyLock::new(|| {
    TABLE
        .iter()
        .filter_map(|row| row.pattern.map(|p| (row.route, split(p))))
        .collect()
});

/// The route of a decoded path below `/v2` (`["permits", "search"]`).
pub(super) fn route_of(rest: &[&str]) -> Route {
    PATTERNS
        .iter()
        .find(|(_, pattern)| matches(pattern, rest))
        .map_or(Route::Other, |(route, _)| *route)
}
