//! The path and query of a `/v2` request, built from typed parts instead of
//! written out by hand: `Query::state_permits(&s).size(7)` renders
//! `/v2/permits/search?geo_id=…&permit_from=…&permit_to=…&size=7`.
//!
//! Parameters render in the order they were added, `&`-joined, and values
//! go in as given: the dataset's ids and dates need no escaping, and a test
//! that needs a particular spelling (another order, `include_count=0`, a
//! percent-encoded value) writes that request out literally, since the
//! spelling is then what it tests. The client (`super::client`) accepts a
//! `Query` or any such literal string.

use super::sim::Samples;
use std::fmt::{self, Display};

/// One request's path and query parameters, rendered by `Display`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    path: String,
    params: Vec<(String, String)>,
}

impl Query {
    /// Any path of the vendor's API, parameters added with `param`.
    pub fn new(path: impl Into<String>) -> Query {
        Query {
            path: path.into(),
            params: Vec::new(),
        }
    }

    /// `GET /v2/permits/search` in the area `geo_id`.
    pub fn permit_search(geo_id: impl Display) -> Query {
        Query::new("/v2/permits/search").param("geo_id", geo_id)
    }

    /// `GET /v2/contractors/search` in the area `geo_id`.
    pub fn contractor_search(geo_id: impl Display) -> Query {
        Query::new("/v2/contractors/search").param("geo_id", geo_id)
    }

    /// An id lookup, `GET /v2/{resource}?id=…&id=…`, ids in the order given.
    pub fn by_id<I: AsRef<str>>(resource: &str, ids: &[I]) -> Query {
        ids.iter().fold(Query::new(format!("/v2/{resource}")), |q, id| {
            q.param("id", id.as_ref())
        })
    }

    /// `GET /v2/permits?id=…`: permits by id.
    pub fn permits_by_id<I: AsRef<str>>(ids: &[I]) -> Query {
        Query::by_id("permits", ids)
    }

    /// `GET /v2/decisions/search` in `geo_id`, decided between `from` and `to`.
    pub fn decision_search(geo_id: impl Display, from: impl Display, to: impl Display) -> Query {
        Query::new("/v2/decisions/search")
            .param("geo_id", geo_id)
            .param("decision_from", from)
            .param("decision_to", to)
    }

    /// `GET /v2/properties/search` in `geo_id`.
    pub fn property_search(geo_id: impl Display) -> Query {
        Query::new("/v2/properties/search").param("geo_id", geo_id)
    }

    /// A place by its id, `GET /v2/{kind}?geo_id=…` (`counties`, `cities`,
    /// `jurisdictions`).
    pub fn place(kind: &str, geo_id: impl Display) -> Query {
        Query::new(format!("/v2/{kind}")).param("geo_id", geo_id)
    }

    /// A search by text, `GET /v2/{kind}/search?q=…` (`cities`, `states`,
    /// `zipcodes`, …). The text goes in as given: percent-encode it.
    pub fn text_search(kind: &str, q: impl Display) -> Query {
        Query::new(format!("/v2/{kind}/search")).param("q", q)
    }

    /// A list of the vendor's, `GET /v2/list/{kind}` (`zip`, `tags`).
    pub fn list(kind: &str) -> Query {
        Query::new(format!("/v2/list/{kind}"))
    }

    /// An area's metrics, `GET /v2/{kind}/{geo_id}/metrics/{period}`
    /// (`addresses`, `counties`, `cities`, `jurisdictions`; `monthly`,
    /// `current`).
    pub fn metrics(kind: &str, geo_id: impl Display, period: &str) -> Query {
        Query::new(format!("/v2/{kind}/{geo_id}/metrics/{period}"))
    }

    /// One contractor's `what`, `GET /v2/contractors/{id}/{what}`
    /// (`permits`, `employees`, `metrics`).
    pub fn contractor(id: impl Display, what: &str) -> Query {
        Query::new(format!("/v2/contractors/{id}/{what}"))
    }

    /// `GET /v2/addresses/{geo_id}/residents`.
    pub fn residents(address_geo_id: impl Display) -> Query {
        Query::new(format!("/v2/addresses/{address_geo_id}/residents"))
    }

    /// `GET /v2/meta/coverage` of one area (`geo_type` `state`, …).
    pub fn coverage(geo_type: &str, geo_id: impl Display) -> Query {
        Query::new("/v2/meta/coverage")
            .param("geo_type", geo_type)
            .param("geo_id", geo_id)
    }

    /// `GET /v2/usage`: the team's own spend (never cached, never billed).
    pub fn usage() -> Query {
        Query::new("/v2/usage")
    }

    /// `GET /v2/meta/release`: free, cacheable, and served by every
    /// simulator: the tests' cheapest request.
    pub fn meta_release() -> Query {
        Query::new("/v2/meta/release")
    }

    /// The permits of the samples' small state over every date of the
    /// dataset: a search with hits at any size, and quick to scan.
    pub fn state_permits(s: &Samples) -> Query {
        Query::permit_search(&s.state).window(&s.permit_from, &s.permit_to)
    }

    /// The contractors of the same state and window as `state_permits`.
    pub fn state_contractors(s: &Samples) -> Query {
        Query::contractor_search(&s.state).window(&s.permit_from, &s.permit_to)
    }

    /// The `i`th of a family of distinct, uncached searches: the `i`th day
    /// after 2015-01-01 as the lower date bound, over the big state
    /// (thousands of matches, so every page is full at any size).
    pub fn distinct(s: &Samples, i: u32) -> Query {
        let from = chrono::NaiveDate::from_ymd_opt(2015, 1, 1).expect("date") + chrono::Days::new(u64::from(i));
        Query::permit_search(&s.big_state).window(from, &s.permit_to)
    }

    /// `permit_from` and `permit_to`: the searches' date window.
    pub fn window(self, from: impl Display, to: impl Display) -> Query {
        self.param("permit_from", from).param("permit_to", to)
    }

    /// `metric_from` and `metric_to`: a metrics query's months.
    pub fn months(self, from: impl Display, to: impl Display) -> Query {
        self.param("metric_from", from).param("metric_to", to)
    }

    /// `date_from` and `date_to`: the coverage query's window.
    pub fn dates(self, from: impl Display, to: impl Display) -> Query {
        self.param("date_from", from).param("date_to", to)
    }

    /// `tag`: a metrics query's permit tag (`all`).
    pub fn tag(self, tag: impl Display) -> Query {
        self.param("tag", tag)
    }

    /// `property_type`: a metrics query's kind of property (`all`).
    pub fn property_type(self, kind: impl Display) -> Query {
        self.param("property_type", kind)
    }

    /// `size`: records per page, what a metered search reserves. Replaces
    /// an earlier `size` in its place, so a derived query keeps its order.
    pub fn size(mut self, n: impl Display) -> Query {
        let n = n.to_string();
        match self.params.iter_mut().find(|(k, _)| k == "size") {
            Some(kv) => kv.1 = n,
            None => self.params.push(("size".into(), n)),
        }
        self
    }

    /// `include_count=true|false`: whether the page carries `total_count`.
    pub fn include_count(self, yes: bool) -> Query {
        self.param("include_count", yes)
    }

    /// Any parameter, appended (a repeated key is sent as many times).
    pub fn param(mut self, key: &str, value: impl Display) -> Query {
        self.params.push((key.into(), value.to_string()));
        self
    }

    /// The same parameters on another path: a non-canonical spelling of
    /// the route (`/v2//permits/search`, `/v2/%70ermits/search`), which
    /// the test then writes out since the spelling is the point.
    pub fn on_path(mut self, path: &str) -> Query {
        self.path = path.into();
        self
    }

    /// The path without the query: what the simulator's log records as `path`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The gateway's reading of this request: its route, canonical path
    /// and query.
    pub fn target(&self) -> permit_gateway::route::Target {
        let uri: http::Uri = self.to_string().parse().expect("a request target");
        permit_gateway::route::classify(&uri, 8192).expect("a route")
    }

    /// The cache key the gateway files this request's answer under (its
    /// flights and leases are keyed by it too).
    pub fn cache_key(&self) -> String {
        permit_gateway::cache::key::cache_key(&self.target())
    }
}

impl Display for Query {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)?;
        for (i, (k, v)) in self.params.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { '?' } else { '&' })?;
        }
        Ok(())
    }
}

#[test]
fn a_query_renders_its_parameters_in_the_order_they_were_added() {
    let q = Query::permit_search("CA").window("2020-01-01", "2020-12-31").size(5);
    assert_eq!(
        q.to_string(),
        "/v2/permits/search?geo_id=CA&permit_from=2020-01-01&permit_to=2020-12-31&size=5"
    );
    assert_eq!(
        q.clone().include_count(true).size(7).to_string(),
        "/v2/permits/search?geo_id=CA&permit_from=2020-01-01&permit_to=2020-12-31&size=7&include_count=true",
        "size is replaced in its place"
    );
    assert_eq!(Query::permits_by_id(&["a", "b"]).to_string(), "/v2/permits?id=a&id=b");
    assert_eq!(Query::usage().to_string(), "/v2/usage");
}
