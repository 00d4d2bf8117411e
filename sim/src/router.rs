//! The life of a `/v2` request, top to bottom, one step per phase:
//! route (404/405) → auth (422/401) → rate limit (429) → fault pick →
//! latency → fault that replaces the answer → answer (validation 422, search)
//! → credits (402 or headers) → record → fault that mangles the answer.
//!
//! The order is the upstream's: a request that fails an early phase never
//! reaches a later one, and only a 200 from a metered endpoint costs credits.

use crate::control;
use crate::faults::Before;
use crate::query::Query;
use crate::reply::{Answer, Body};
use crate::state::Shared;
use crate::stats::LogEntry;
use crate::{decisions, geo, lookup, meta, metrics, people, places, properties, search};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// Every `/v2` operation of the vendor's OpenAPI (34 GETs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    PermitSearch,
    PermitsById,
    ContractorSearch,
    ContractorsById,
    ContractorPermits(String),
    ContractorEmployees(String),
    ContractorMetrics(String),
    DecisionSearch,
    DecisionsById,
    PropertySearch,
    PropertiesById,
    Monthly(metrics::Level, String),
    Current(metrics::Level, String),
    Residents(String),
    Details(geo::Level),
    ListZip,
    ListTags,
    ZipSearch,
    StateSearch,
    JurisdictionSearch,
    AddressSearch,
    CitySearch,
    CountySearch,
    Coverage,
    Release,
    Usage,
}

pub fn route(path: &str) -> Option<Route> {
    use metrics::Level as M;
    let segs: Vec<&str> = path.strip_prefix("/v2/")?.split('/').collect();
    let id = |s: &str| s.to_string();
    Some(match segs.as_slice() {
        ["permits", "search"] => Route::PermitSearch,
        ["permits"] => Route::PermitsById,
        ["contractors", "search"] => Route::ContractorSearch,
        ["contractors"] => Route::ContractorsById,
        ["contractors", c, "permits"] => Route::ContractorPermits(id(c)),
        ["contractors", c, "employees"] => Route::ContractorEmployees(id(c)),
        ["contractors", c, "metrics"] => Route::ContractorMetrics(id(c)),
        ["decisions", "search"] => Route::DecisionSearch,
        ["decisions"] => Route::DecisionsById,
        ["properties", "search"] => Route::PropertySearch,
        ["properties"] => Route::PropertiesById,
        ["addresses", g, "metrics", "monthly"] => Route::Monthly(M::Address, id(g)),
        ["counties", g, "metrics", "monthly"] => Route::Monthly(M::County, id(g)),
        ["cities", g, "metrics", "monthly"] => Route::Monthly(M::City, id(g)),
        ["jurisdictions", g, "metrics", "monthly"] => Route::Monthly(M::Jurisdiction, id(g)),
        ["addresses", g, "metrics", "current"] => Route::Current(M::Address, id(g)),
        ["counties", g, "metrics", "current"] => Route::Current(M::County, id(g)),
        ["cities", g, "metrics", "current"] => Route::Current(M::City, id(g)),
        ["jurisdictions", g, "metrics", "current"] => Route::Current(M::Jurisdiction, id(g)),
        ["addresses", g, "residents"] => Route::Residents(id(g)),
        ["counties"] => Route::Details(geo::Level::County),
        ["cities"] => Route::Details(geo::Level::City),
        ["jurisdictions"] => Route::Details(geo::Level::Jurisdiction),
        ["list", "zip"] => Route::ListZip,
        ["list", "tags"] => Route::ListTags,
        ["zipcodes", "search"] => Route::ZipSearch,
        ["states", "search"] => Route::StateSearch,
        ["jurisdictions", "search"] => Route::JurisdictionSearch,
        ["addresses", "search"] => Route::AddressSearch,
        ["cities", "search"] => Route::CitySearch,
        ["counties", "search"] => Route::CountySearch,
        ["meta", "coverage"] => Route::Coverage,
        ["meta", "release"] => Route::Release,
        ["usage"] => Route::Usage,
        _ => return None,
    })
}

/// The 402 body (the object form every plan gets per our spec).
pub fn over_limit_body(limit: u64, upgrade_url: &str) -> Value {
    json!({"detail": {"error": "Monthly credit limit exceeded.", "limit": limit, "upgrade_url": upgrade_url}})
}

/// Entry point for every request on the simulator's listener.
pub async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, std::io::Error> {
    if req.uri().path().starts_with("/_sim/") {
        return Ok(control::handle(&shared, req).await);
    }
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let key = header("x-api-key");
    let mut entry = LogEntry {
        seq: 0,
        path: req.uri().path().to_string(),
        query: req.uri().query().unwrap_or("").to_string(),
        status: 0,
        credits: 0,
        request_id: header("x-request-id"),
        api_key_ok: key.as_deref() == Some(shared.cfg.api_key.as_str()),
        traceparent: header("traceparent"),
        tracestate: header("tracestate"),
    };
    let served = v2(&shared, req.method(), key.as_deref(), &mut entry).await;
    entry.status = served.as_ref().map_or(0, |r| r.status().as_u16());
    shared.stats_book().record(entry);
    // An Err makes hyper drop the connection without an answer (Reset/Hang).
    served.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::ConnectionReset, "injected reset"))
}

/// The phases; `None` means "close the connection without answering".
async fn v2(shared: &Shared, method: &Method, key: Option<&str>, entry: &mut LogEntry) -> Option<Response<Body>> {
    // The configured latency is the network: every /v2 request pays it.
    let base_latency = shared.latency_ms();
    if base_latency > 0 {
        tokio::time::sleep(Duration::from_millis(base_latency)).await;
    }
    let Some(route) = route(&entry.path) else {
        return Some(Answer::not_found().into_response());
    };
    if method != Method::GET {
        let a = Answer::detail(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed").with_header("allow", "GET");
        return Some(a.into_response());
    }
    if let Err(a) = authenticate(shared, key) {
        return Some(a.into_response());
    }
    if let Err(retry_after) = shared.check_rate() {
        let a = Answer::detail(StatusCode::TOO_MANY_REQUESTS, "Rate limit exceeded")
            .with_header("retry-after", retry_after);
        return Some(a.into_response());
    }
    let fault = shared.faults().take();
    let latency = fault.as_ref().map_or(Duration::ZERO, |f| f.latency());
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if let Some(f) = &fault {
        let limit = shared.credits().limit();
        match f.before(limit, &shared.cfg.upgrade_url).await {
            Before::Continue => {}
            Before::Replace(a) => return Some(a.into_response()),
            Before::Reset => return None,
        }
    }
    let answer = charge(shared, answer(shared, &route, &entry.query), entry);
    Some(match fault {
        Some(f) => f.after(answer),
        None => answer.into_response(),
    })
}

fn authenticate(shared: &Shared, key: Option<&str>) -> Result<(), Answer> {
    match key {
        None => Err(Answer::validation(vec![json!({
            "type": "missing", "loc": ["header", "x-api-key"], "msg": "Field required", "input": null
        })])),
        Some(k) if k != shared.cfg.api_key => Err(Answer::detail(StatusCode::UNAUTHORIZED, "Not authenticated")),
        Some(_) => Ok(()),
    }
}

/// Dispatches to the endpoint; errors and successes come back alike.
fn answer(shared: &Shared, route: &Route, raw_query: &str) -> Answer {
    let data = shared.data();
    let d = &*data;
    let mut q = Query::parse(Some(raw_query));
    let outcome = match route {
        Route::PermitSearch => search::permits(d, &mut q),
        Route::PermitsById => lookup::permits(d, &mut q),
        Route::ContractorSearch => search::contractors(d, &mut q),
        Route::ContractorsById => lookup::contractors(d, &mut q),
        Route::ContractorPermits(id) => search::contractor_permits(d, id, &mut q),
        Route::ContractorEmployees(id) => people::employees(d, id, &mut q),
        Route::ContractorMetrics(id) => metrics::contractor(d, id, &mut q),
        Route::DecisionSearch => decisions::search(d, &mut q),
        Route::DecisionsById => decisions::by_id(d, &mut q),
        Route::PropertySearch => properties::search(d, &mut q),
        Route::PropertiesById => properties::by_id(d, &mut q),
        Route::Monthly(level, g) => metrics::monthly(d, *level, g, &mut q),
        Route::Current(level, g) => metrics::current(d, *level, g, &mut q),
        Route::Residents(g) => people::residents(d, g, &mut q),
        Route::Details(level) => geo::details(d, *level, &mut q),
        Route::ListZip => geo::list_zip(d, &mut q),
        Route::ListTags => places::tags(&mut q),
        Route::ZipSearch => geo::zip_search(d, &mut q),
        Route::StateSearch => geo::state_search(&mut q),
        Route::JurisdictionSearch => geo::jurisdiction_search(d, &mut q),
        Route::AddressSearch => places::addresses(d, &mut q),
        Route::CitySearch => places::cities(d, &mut q),
        Route::CountySearch => places::counties(d, &mut q),
        Route::Coverage => meta::coverage(d, &mut q),
        Route::Release => Ok(meta::release(&shared.release_text())),
        Route::Usage => Ok(Answer::ok(&shared.credits().usage())),
    };
    outcome.unwrap_or_else(|err| err)
}

/// Charges a metered 200 or turns it into a 402; errors cost nothing.
fn charge(shared: &Shared, answer: Answer, entry: &mut LogEntry) -> Answer {
    let Some(records) = answer.metered.filter(|_| answer.status == StatusCode::OK) else {
        return answer;
    };
    let charged = shared.credits().try_charge(records);
    match charged {
        Err(limit) => Answer::json(
            StatusCode::PAYMENT_REQUIRED,
            &over_limit_body(limit, &shared.cfg.upgrade_url),
        ),
        Ok(c) => {
            entry.credits = c.credits;
            let mut a = answer.with_header("x-credits-request", c.credits);
            if let (Some(limit), Some(remaining)) = (c.limit, c.remaining) {
                a = a
                    .with_header("x-credits-limit", limit)
                    .with_header("x-credits-remaining", remaining);
            }
            a
        }
    }
}
