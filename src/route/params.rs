//! The parameters a reservation depends on, validated as the upstream would
//! before anything is reserved, and the worst-case credit estimate computed
//! from the validated values.
//!
//! Sits after authentication, before the cache: a `size` or an `id` list the
//! upstream would answer with a (free) 422, or a query without a parameter
//! the vendor's OpenAPI declares required, is answered with the same 422 by
//! the gateway, so a team near its limit is not refused with a 402 for a
//! call that could never cost anything, and nothing goes upstream: a 422
//! costs no credit but would still take one of the org's calls a minute,
//! and an app retrying a bad request in a loop would burn everyone's rate.
//! Values beyond these (a date's format, a geography the vendor does not
//! know) stay the upstream's to judge; its 422 is then kept for a while
//! (`cache.refusal_ttl_secs`), so a retry loop costs one call.
//!
//! The integer rules are Pydantic v2's lax `int` from a query string, as
//! measured against pydantic 2.13 (the vendor runs FastAPI + Pydantic v2):
//! surrounding whitespace, one sign, leading zeros, `_` between digits and a
//! `.0…` tail are accepted; anything else is `int_parsing`.

use super::table::{Cost, Kind};
use super::Target;
use crate::error::{GatewayError, Violation};
use serde_json::{json, Value};
use std::borrow::Cow;

/// Page size bounds and default (every paged operation of the OpenAPI).
const SIZE_MIN: i64 = 1;
const SIZE_MAX: i64 = 100;
const SIZE_DEFAULT: u64 = 50;
/// Ids one lookup may ask for (`maxItems` of every `id` list).
const MAX_IDS: usize = 50;
/// Pydantic refuses longer integer strings outright (`int_parsing_size`).
const MAX_INT_DIGITS: usize = 4300;

/// The parameters the OpenAPI declares as dates (`format: date`; the
/// conformance test holds this list to the file).
pub(super) const DATES: [&str; 8] = [
    "permit_from",
    "permit_to",
    "decision_from",
    "decision_to",
    "metric_from",
    "metric_to",
    "date_from",
    "date_to",
];

/// What the estimate needs from a query: the last `size` and every `id`;
/// and, for the required parameters, every other parameter as sent.
struct Read<'a> {
    size: Option<Cow<'a, str>>,
    ids: Vec<Cow<'a, str>>,
    others: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

fn read(query: Option<&str>) -> Read<'_> {
    let mut out = Read {
        size: None,
        ids: Vec::new(),
        others: Vec::new(),
    };
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            // Repeated scalars: Starlette hands FastAPI the last one.
            "size" => out.size = Some(v),
            "id" => out.ids.push(v),
            _ => out.others.push((k, v)),
        }
    }
    out
}

/// Refuses, with the upstream's 422, a query whose `size` or `id` list the
/// upstream would refuse. Free operations are checked too: the upstream
/// refuses them alike, and the answer is then the same whatever the cache.
pub(crate) fn validate(target: &Target) -> Result<(), GatewayError> {
    let row = target.route.row();
    let read = read(target.query.as_deref());
    let mut violations = missing(target, &read);
    if let (Some(Kind::Size), Some(raw)) = (row.param("size"), read.size.as_deref()) {
        if let Err(v) = page_size(raw) {
            violations.push(v);
        }
    }
    if row.param("id") == Some(Kind::Ids) {
        if read.ids.is_empty() {
            violations.push(Violation::new("missing", "id", "Field required", Value::Null, None));
        } else if read.ids.len() > MAX_IDS {
            let n = read.ids.len();
            let msg = format!("List should have at most {MAX_IDS} items after validation, not {n}");
            let ctx = json!({"field_type": "List", "max_length": MAX_IDS, "actual_length": n});
            violations.push(Violation::new("too_long", "id", &msg, json!(read.ids), Some(ctx)));
        }
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(GatewayError::InvalidQuery(violations))
    }
}

/// The required parameters the query lacks, as the upstream reports them
/// (in the order the operation declares them: before `size` in every
/// operation). Only when the upstream's answer is sure to be exactly these
/// (and the `size` this module checks): every other parameter sent is one
/// whose value is surely valid, and the path has no parameter of its own.
/// Otherwise nothing: the upstream judges, and reports everything at once.
fn missing(target: &Target, read: &Read<'_>) -> Vec<Violation> {
    let row = target.route.row();
    let lacking: Vec<&'static str> = row
        .required()
        .filter(|name| *name != "id" && !read.others.iter().any(|(n, _)| n == name))
        .collect();
    let path_free = row.pattern.is_some_and(|p| !p.contains('{'));
    let sure = path_free
        && read
            .others
            .iter()
            .all(|(name, value)| surely_valid(target, name, value));
    if lacking.is_empty() || !sure {
        return Vec::new();
    }
    lacking
        .into_iter()
        .map(|name| Violation::new("missing", name, "Field required", Value::Null, None))
        .collect()
}

/// Whether the upstream surely accepts `value` for `name`: a parameter the
/// operation does not declare (FastAPI ignores it), a plain `YYYY-MM-DD`
/// calendar date for a date, a boolean as Pydantic reads one. Anything
/// else (a geography, a tag, a cursor) may meet a check the OpenAPI does
/// not declare.
fn surely_valid(target: &Target, name: &str, value: &str) -> bool {
    match target.route.row().param(name) {
        None => true,
        Some(Kind::Count | Kind::Flag { .. }) => {
            let v = value.to_ascii_lowercase();
            ["0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"].contains(&v.as_str())
        }
        Some(Kind::Scalar) if DATES.contains(&name) => {
            value.len() == 10 && chrono::NaiveDate::parse_from_str(value, "%Y-%m-%d").is_ok()
        }
        Some(_) => false,
    }
}

/// The most this call can cost: 0 on free operations; the number of ids on
/// a lookup; else the page size asked for (default 50).
///
/// Ids are counted as the upstream reads them: one per `id` value (repeats
/// count, to be safe). A comma-joined value is one id: the upstream does
/// not split `id=a,b` (`docs/vendor-api.md`, "Id lookups"), so counting its
/// parts would refuse a team the credits the call cannot cost.
/// Called after [`validate`]; a value that would not validate counts as the
/// largest page.
pub(crate) fn credit_estimate(target: &Target) -> u64 {
    let cost = target.route.row().cost;
    if cost == Cost::Free {
        return 0;
    }
    let read = read(target.query.as_deref());
    let ids = || read.ids.len() as u64;
    let page = || match read.size.as_deref().map(page_size) {
        None => SIZE_DEFAULT,
        Some(Ok(n)) => n,
        Some(Err(_)) => SIZE_MAX as u64,
    };
    match cost {
        Cost::Free => 0,
        Cost::Page => page(),
        Cost::Ids => ids(),
        Cost::Unknown if !read.ids.is_empty() => ids(),
        Cost::Unknown => match read.size.as_deref().map(pydantic_int) {
            // Not ours to judge: the worst case a page of the upstream can be.
            Some(Ok(n)) => n.clamp(SIZE_MIN, SIZE_MAX) as u64,
            Some(Err(_)) | None => SIZE_DEFAULT,
        },
    }
}

/// The page size a paged operation is asked for (absent: the default), as
/// the upstream reads it; `None` on an operation without `size` or for a
/// value the upstream refuses.
pub(crate) fn page_size_asked(target: &Target) -> Option<u64> {
    target.route.row().param("size").filter(|k| *k == Kind::Size)?;
    match read(target.query.as_deref()).size.as_deref() {
        None => Some(SIZE_DEFAULT),
        Some(raw) => page_size(raw).ok(),
    }
}

/// A `size` value as the upstream validates it: 1..=100.
fn page_size(raw: &str) -> Result<u64, Violation> {
    let input = json!(raw);
    match pydantic_int(raw) {
        Ok(n) if n < SIZE_MIN => {
            let msg = format!("Input should be greater than or equal to {SIZE_MIN}");
            let ctx = json!({ "ge": SIZE_MIN });
            Err(Violation::new("greater_than_equal", "size", &msg, input, Some(ctx)))
        }
        Ok(n) if n > SIZE_MAX => {
            let msg = format!("Input should be less than or equal to {SIZE_MAX}");
            let ctx = json!({ "le": SIZE_MAX });
            Err(Violation::new("less_than_equal", "size", &msg, input, Some(ctx)))
        }
        Ok(n) => Ok(n as u64),
        Err(IntError::Parsing) => Err(Violation::new(
            "int_parsing",
            "size",
            "Input should be a valid integer, unable to parse string as an integer",
            input,
            None,
        )),
        Err(IntError::TooLong) => Err(Violation::new(
            "int_parsing_size",
            "size",
            "Unable to parse input string as an integer, exceeded maximum size",
            input,
            None,
        )),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum IntError {
    Parsing,
    TooLong,
}

/// Pydantic v2's lax integer from a string; values beyond `i64` saturate
/// (they are out of every range checked here anyway).
fn pydantic_int(raw: &str) -> Result<i64, IntError> {
    let t = raw.trim();
    if t.len() > MAX_INT_DIGITS {
        return Err(IntError::TooLong);
    }
    let (negative, unsigned) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    // `5.0` and `5.00` are integers to Pydantic; `5.` and `.0` are not.
    let whole = match unsigned.split_once('.') {
        Some((whole, zeros)) if !zeros.is_empty() && zeros.bytes().all(|b| b == b'0') => whole,
        Some(_) => return Err(IntError::Parsing),
        None => unsigned,
    };
    // Digits, `_` only between two digits (Python's literal rule).
    let b = whole.as_bytes();
    let well_formed = !b.is_empty()
        && b[0].is_ascii_digit()
        && b[b.len() - 1].is_ascii_digit()
        && b.iter().all(|c| c.is_ascii_digit() || *c == b'_')
        && !whole.contains("__");
    if !well_formed {
        return Err(IntError::Parsing);
    }
    let digits: String = whole.chars().filter(|c| *c != '_').collect();
    let magnitude = match digits.trim_start_matches('0') {
        "" => 0,
        d if d.len() > 18 => i64::MAX,
        d => d.parse::<i64>().map_err(|_| IntError::Parsing)?,
    };
    Ok(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Route;

    fn t(route: Route, query: &str) -> Target {
        Target {
            route,
            path: "".into(),
            query: (!query.is_empty()).then(|| query.into()),
        }
    }

    /// Pydantic 2.13's answers for `int` with ge=1, le=100, measured.
    #[test]
    fn sizes_parse_like_pydantic() {
        let ok = [
            ("5", 5),
            (" 5", 5),
            ("+05", 5),
            ("5.0", 5),
            ("5.00", 5),
            ("1_0", 10),
            ("1_0_0", 100),
            ("1_0.0", 10),
            ("00100", 100),
            ("100.0", 100),
            ("5\u{a0}", 5),
            ("5\r\n", 5),
        ];
        for (raw, n) in ok {
            assert_eq!(page_size(raw).map_err(|v| v.kind), Ok(n), "{raw:?}");
        }
        let bad = [
            ("", "int_parsing"),
            (" ", "int_parsing"),
            ("abc", "int_parsing"),
            ("5.", "int_parsing"),
            (".0", "int_parsing"),
            ("5.5", "int_parsing"),
            ("5.0.0", "int_parsing"),
            ("1__0", "int_parsing"),
            ("_10", "int_parsing"),
            ("10_", "int_parsing"),
            ("+_5", "int_parsing"),
            ("5_.0", "int_parsing"),
            ("1e2", "int_parsing"),
            ("0x5", "int_parsing"),
            ("\u{ff13}", "int_parsing"),
            ("1&size=100", "int_parsing"),
            ("-", "int_parsing"),
            ("0", "greater_than_equal"),
            ("-0", "greater_than_equal"),
            ("0.0", "greater_than_equal"),
            ("-5", "greater_than_equal"),
            ("101", "less_than_equal"),
            ("999999999999999999999999999999", "less_than_equal"),
        ];
        for (raw, kind) in bad {
            assert_eq!(page_size(raw).map_err(|v| v.kind), Err(kind), "{raw:?}");
        }
        let huge = "1".repeat(4301);
        assert_eq!(page_size(&huge).map_err(|v| v.kind), Err("int_parsing_size"));
    }

    /// The parameters permit search cannot be called without.
    const SEARCH: &str = "permit_from=2024-01-01&permit_to=2024-12-31&geo_id=CA";

    #[test]
    fn the_last_size_is_the_one_validated() {
        let search = |q: &str| t(Route::PermitsSearch, &format!("{SEARCH}&{q}"));
        assert!(validate(&search("size=3&size=")).is_err());
        assert!(validate(&search("size=1%26size%3D100")).is_err());
        assert!(validate(&search("size=0&size=3")).is_ok());
        assert_eq!(credit_estimate(&search("size=0&size=3")), 3);
    }

    #[test]
    fn a_required_parameter_missing_is_the_upstreams_422_in_its_order() {
        let missing = |route, q: &str| match validate(&t(route, q)) {
            Err(GatewayError::InvalidQuery(v)) => v.iter().map(|v| (v.kind, v.declared())).collect(),
            Ok(()) => Vec::new(),
            Err(e) => panic!("{e:?}"),
        };
        assert_eq!(missing(Route::PermitsSearch, SEARCH), []);
        assert_eq!(
            missing(Route::PermitsSearch, "permit_from=2024-01-01&permit_to=2024-12-31"),
            [("missing", "geo_id")]
        );
        assert_eq!(
            missing(
                Route::PermitsSearch,
                "permit_from=2024-01-01&size=0&foo=x&include_count=TRUE"
            ),
            [
                ("missing", "permit_to"),
                ("missing", "geo_id"),
                ("greater_than_equal", "size")
            ],
            "the required ones before size; an undeclared parameter is ignored"
        );
        // A value the upstream may refuse for reasons the OpenAPI does not
        // declare (a geography), or a date it may not read as one: the
        // upstream reports everything at once.
        assert_eq!(missing(Route::PermitsSearch, "geo_id=somewhere"), []);
        assert_eq!(missing(Route::PermitsSearch, "permit_from=2024-02-30"), []);
        assert_eq!(
            missing(Route::PermitsSearch, "geo_id=&size=0"),
            [("greater_than_equal", "size")]
        );
        // A path parameter is checked by the upstream too.
        assert_eq!(missing(Route::CountyMetricsMonthly, "metric_from=2024-01-01"), []);
        assert_eq!(
            missing(Route::MetaCoverage, "date_from=2024-01-01"),
            [("missing", "geo_type"), ("missing", "geo_id"), ("missing", "date_to")]
        );
        assert_eq!(missing(Route::MetaRelease, ""), []);
        assert_eq!(missing(Route::PermitsById, ""), [("missing", "id")], "once");
    }

    #[test]
    fn size_is_only_checked_where_it_is_declared() {
        // jurisdictions/search declares no size: the upstream ignores it.
        assert!(validate(&t(Route::JurisdictionsSearch, "q=a&size=0")).is_ok());
        assert!(validate(&t(Route::ListZip, "size=0")).is_err());
        assert!(validate(&t(Route::Other, "size=abc")).is_ok());
    }

    #[test]
    fn lookups_need_between_one_and_fifty_ids() {
        let err = |q: &str| match validate(&t(Route::PermitsById, q)) {
            Err(GatewayError::InvalidQuery(v)) => v[0].kind,
            other => panic!("{q}: {other:?}"),
        };
        assert_eq!(err(""), "missing");
        let many = (0..51).map(|i| format!("id={i}")).collect::<Vec<_>>().join("&");
        assert_eq!(err(&many), "too_long");
        let fifty = (0..50).map(|i| format!("id={i}")).collect::<Vec<_>>().join("&");
        assert!(validate(&t(Route::PermitsById, &fifty)).is_ok());
        assert_eq!(credit_estimate(&t(Route::PermitsById, &fifty)), 50);
    }

    #[test]
    fn estimates_are_the_worst_case() {
        let est = |r, q| credit_estimate(&t(r, q));
        assert_eq!(est(Route::PermitsSearch, "size=10"), 10);
        assert_eq!(est(Route::PermitsSearch, ""), 50);
        assert_eq!(est(Route::PermitsSearch, "size=5.0"), 5);
        assert_eq!(est(Route::DecisionsSearch, "size=7"), 7);
        assert_eq!(est(Route::AddressResidents, "size=2"), 2);
        assert_eq!(est(Route::PermitsById, "id=a&id=b&id=c"), 3);
        assert_eq!(est(Route::ContractorsById, "id=a&id=a&cursor=x&size=90"), 2);
        assert_eq!(est(Route::PropertiesById, "id=a,b,c&id=d"), 2, "a comma list is one id");
        assert_eq!(est(Route::Other, "id=a&id=b"), 2);
        assert_eq!(est(Route::Other, "size=500"), 100);
        assert_eq!(est(Route::Other, "size=abc"), 50);
        for free in [
            Route::ContractorMetrics,
            Route::ListTags,
            Route::CitiesSearch,
            Route::MetaRelease,
        ] {
            assert_eq!(est(free, "size=100&id=a"), 0, "{free:?}");
        }
    }
}
