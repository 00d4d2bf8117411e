//! The request path's one error type, and the only place it becomes HTTP.
//!
//! Every phase of `proxy::pipeline` returns `Result<_, GatewayError>`; the
//! variant records whose fault it is (the client's, the upstream's, ours) and
//! [`GatewayError::into_response`] turns it into a status and a body in the
//! upstream's shapes so existing clients parse it: 422 `{"detail":[...]}`,
//! 402 `{"detail":{"error","limit","upgrade_url","needed","remaining"}}`, others `{"detail":"..."}`.
//! Bodies name the problem, never internals (no addresses, keys or causes).

use crate::http_util::{json_response, Body};
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::{json, Value};
use std::borrow::Cow;

/// Who caused a failure: decides logging level and which metrics move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    Client,
    Upstream,
    Internal,
}

/// Why a call was refused for the upstream's rate (429):
/// `gateway_gate_refusals_total`'s `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateRefusal {
    /// Refused on arrival: the wait predicted for it passed its deadline.
    Predicted,
    /// It waited until its deadline.
    Deadline,
    /// The upstream itself answered 429.
    Upstream,
}

impl GateRefusal {
    pub const fn as_str(self) -> &'static str {
        match self {
            GateRefusal::Predicted => "predicted",
            GateRefusal::Deadline => "deadline",
            GateRefusal::Upstream => "upstream_429",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayError {
    /// Not under /v2/, or a path that leaves it.
    NotFound,
    /// Anything but GET and HEAD.
    MethodNotAllowed,
    /// A request we refuse to interpret (bad encoding, control characters).
    BadRequest(&'static str),
    /// Query parameters the upstream would refuse with a 422 (checked before
    /// anything is reserved): the upstream's 422, from the gateway.
    InvalidQuery(Vec<Violation>),
    /// The request target is longer than `server.max_uri_bytes`.
    UriTooLong,
    /// The request headers together exceed `server.max_header_bytes`.
    HeadersTooLarge,
    /// No team credential at all: the upstream's own 422 for a missing key.
    MissingCredential,
    /// A credential that matches no team.
    InvalidCredential,
    /// An app's token past its `not_after` (a rotation's old token).
    ExpiredCredential,
    /// Two credentials that disagree (X-API-Key vs Bearer, or repeated).
    ConflictingCredentials,
    /// The team's own request rate is exceeded.
    TeamRateLimited { retry_after_secs: u64 },
    /// The shared upstream rate is exhausted for longer than a team may
    /// wait: refused at the gate, or by the upstream itself.
    UpstreamRateLimited { retry_after_secs: u64, why: GateRefusal },
    /// The team's credit budget cannot cover this call: it `needed` that
    /// many credits held (its worst case) and `remaining` were left.
    QuotaExceeded {
        limit: u64,
        needed: u64,
        remaining: u64,
        upgrade_url: String,
        /// Whose budget ran out: the team's, its app's, or the company's.
        budget: Spent,
    },
    /// `Cache-Control: only-if-cached` and nothing cached.
    NotCached,
    /// The upstream did not answer within `upstream.timeout_secs`.
    UpstreamTimeout,
    /// The upstream could not be reached, or answered 5xx after retries.
    UpstreamUnavailable,
    /// The upstream answered something we cannot pass on (too large, cut off).
    UpstreamInvalid(&'static str),
    /// The upstream refused the gateway's own key (401/403): the team's
    /// token was fine, the operator's `upstream.api_key` is not.
    UpstreamKeyRefused,
    /// A backend we must not fail open on (the ledger) is down.
    Unavailable(&'static str),
    /// An HTTP/2 stream refused before anything was bought for it: the
    /// listener's answer bytes are spent and its tenant holds its share
    /// (`server::overload`). 503 with `Retry-After`.
    AnswersBusy,
    /// A bug: never expected.
    Internal,
    /// `POST /admin/reload` found a config it will not load: every problem.
    ReloadRefused(Vec<String>),
    /// A failure the upstream still billed (a 200 head with its bill whose
    /// body then failed): `error` answers as itself, and the team that led
    /// the call paid `credits` for it, which its answer (a stale copy or
    /// this error) and its access log say. Never nested; a follower takes
    /// the `error` alone ([`GatewayError::unbilled`]).
    Billed { credits: u64, error: Box<GatewayError> },
}

/// The budget a 402 names (`detail.budget`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Spent {
    #[default]
    Team,
    /// The app's own `credit_limit` (its name).
    App(String),
    /// `quota.org_credit_limit`: every team's spend together.
    Org,
}

impl Spent {
    /// Its name in a 402's `detail.budget` and `/v2/usage`'s `budget`.
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Spent::Team => "team",
            Spent::App(_) => "app",
            Spent::Org => "org",
        }
    }
}

/// One finding of the gateway's own query validation, rendered as one item
/// of FastAPI's 422 `detail` array (`{"type","loc","msg","input"(,"ctx")}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Pydantic's error type (`int_parsing`, `too_long`, ...).
    pub(crate) kind: &'static str,
    /// The query parameter at fault: a declared one, or one a caller sent
    /// that the endpoint does not take (the admin API's 422).
    pub(crate) param: Cow<'static, str>,
    msg: String,
    /// What was sent, as Pydantic echoes it.
    input: Value,
    /// Boxed: rarely set, and a `Result` carrying a `Violation` stays small.
    ctx: Option<Box<Value>>,
}

impl Violation {
    pub(crate) fn new(
        kind: &'static str,
        param: impl Into<Cow<'static, str>>,
        msg: &str,
        input: Value,
        ctx: Option<Value>,
    ) -> Violation {
        Violation {
            kind,
            param: param.into(),
            msg: msg.to_string(),
            input,
            ctx: ctx.map(Box::new),
        }
    }

    fn to_json(&self) -> Value {
        let mut v = json!({"type": self.kind, "loc": ["query", self.param], "msg": self.msg, "input": self.input});
        if let Some(ctx) = &self.ctx {
            v["ctx"] = Value::clone(ctx);
        }
        v
    }

    /// The declared parameter at fault (tests compare it to a literal);
    /// empty for a name a caller sent.
    #[cfg(test)]
    pub(crate) fn declared(&self) -> &'static str {
        match self.param {
            Cow::Borrowed(name) => name,
            Cow::Owned(_) => "",
        }
    }
}

impl GatewayError {
    /// `self`, billed `credits` by the upstream (itself when 0).
    pub(crate) fn billed_at(self, credits: u64) -> GatewayError {
        match credits {
            0 => self,
            credits => GatewayError::Billed {
                credits,
                error: Box::new(self.unbilled()),
            },
        }
    }

    /// What the upstream billed for this failure (0 for most).
    pub(crate) fn billed(&self) -> u64 {
        match self {
            GatewayError::Billed { credits, .. } => *credits,
            _ => 0,
        }
    }

    /// The failure without its bill: what a request that did not pay sees.
    pub(crate) fn unbilled(self) -> GatewayError {
        match self {
            GatewayError::Billed { error, .. } => *error,
            other => other,
        }
    }

    pub(crate) fn fault(&self) -> Fault {
        use GatewayError::*;
        match self {
            Billed { error, .. } => error.fault(),
            NotFound
            | MethodNotAllowed
            | BadRequest(_)
            | InvalidQuery(_)
            | UriTooLong
            | HeadersTooLarge
            | MissingCredential
            | InvalidCredential
            | ExpiredCredential
            | ConflictingCredentials
            | TeamRateLimited { .. }
            | QuotaExceeded { .. }
            | NotCached
            | AnswersBusy
            | ReloadRefused(_) => Fault::Client,
            UpstreamRateLimited { .. }
            | UpstreamTimeout
            | UpstreamUnavailable
            | UpstreamInvalid(_)
            | UpstreamKeyRefused => Fault::Upstream,
            Unavailable(_) | Internal => Fault::Internal,
        }
    }

    /// The one rule for "the upstream failed": it timed out, could not be
    /// reached, answered 5xx or something unusable, or its shared rate is
    /// busy. Then a stale copy may answer instead (`stale_on_failure`), and coalesced
    /// followers take the failure as theirs: retrying would only repeat the
    /// same call against the same upstream. The shared rate counts too,
    /// although the fair queue's bound depends on the leader's team: a
    /// follower that queued again would add a second call for a key whose
    /// first call was just refused. Everything else (the leader's budget,
    /// its team's own rate, a ledger outage) is the leader's alone.
    pub(crate) fn upstream_failed(&self) -> bool {
        self.fault() == Fault::Upstream
    }

    /// What an upstream answer's status means, decided where the fetch
    /// returns so that every path (pages, id lookups, refreshes, followers)
    /// sees the same error: `None` for an answer passed on as it is (a 200,
    /// or the upstream's free 404/422/402 with its own body).
    ///
    /// A 401 or 403 is the upstream refusing **the gateway's** key (teams
    /// never reach the upstream with theirs): not the team's fault, so not
    /// the team's 401; it is an upstream failure a stale copy may answer,
    /// else a 502 that says what happened.
    pub(crate) fn of_upstream_status(
        status: StatusCode,
        headers: &http::HeaderMap,
        max_retry_after: std::time::Duration,
    ) -> Option<GatewayError> {
        match status.as_u16() {
            401 | 403 => Some(GatewayError::UpstreamKeyRefused),
            429 => {
                let wait = crate::http_util::retry_after(headers, max_retry_after);
                Some(GatewayError::UpstreamRateLimited {
                    retry_after_secs: wait.map_or(1, |d| d.as_secs()),
                    why: GateRefusal::Upstream,
                })
            }
            500..=599 => Some(GatewayError::UpstreamUnavailable),
            _ => None,
        }
    }

    pub(crate) fn status(&self) -> StatusCode {
        use GatewayError::*;
        match self {
            Billed { error, .. } => error.status(),
            NotFound => StatusCode::NOT_FOUND,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            BadRequest(_) => StatusCode::BAD_REQUEST,
            UriTooLong => StatusCode::URI_TOO_LONG,
            HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            MissingCredential | InvalidQuery(_) | ReloadRefused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            InvalidCredential | ExpiredCredential | ConflictingCredentials => StatusCode::UNAUTHORIZED,
            TeamRateLimited { .. } | UpstreamRateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            QuotaExceeded { .. } => StatusCode::PAYMENT_REQUIRED,
            NotCached | UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            UpstreamUnavailable | UpstreamInvalid(_) | UpstreamKeyRefused => StatusCode::BAD_GATEWAY,
            Unavailable(_) | AnswersBusy => StatusCode::SERVICE_UNAVAILABLE,
            Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn body(&self) -> serde_json::Value {
        use GatewayError::*;
        let detail = match self {
            Billed { error, .. } => return error.body(),
            NotFound => "Not Found",
            MethodNotAllowed => "Method Not Allowed",
            BadRequest(why) => why,
            InvalidQuery(violations) => {
                return json!({ "detail": violations.iter().map(Violation::to_json).collect::<Vec<_>>() })
            }
            UriTooLong => "Request target too long",
            HeadersTooLarge => "Request headers too large",
            MissingCredential => {
                return json!({"detail": [{
                    "type": "missing",
                    "loc": ["header", "x-api-key"],
                    "msg": "Field required",
                    "input": null,
                }]})
            }
            InvalidCredential => "Not authenticated",
            ExpiredCredential => "Token expired: this app's token is past its not_after; use its new token",
            ConflictingCredentials => "Conflicting credentials: send one team token",
            TeamRateLimited { .. } => "Rate limit exceeded for this team",
            UpstreamRateLimited { .. } => "Rate limit exceeded: the shared upstream rate is busy",
            QuotaExceeded {
                limit,
                needed,
                remaining,
                upgrade_url,
                budget,
            } => {
                // The upstream's three keys first (clients read them), then
                // what this call would have held and what is left, so a
                // client can ask for fewer records instead of giving up;
                // then whose budget it was.
                let error = match budget {
                    Spent::Team => "Team credit limit exceeded.",
                    Spent::App(_) => "App credit limit exceeded.",
                    Spent::Org => "Company credit limit exceeded.",
                };
                let which = budget.as_str();
                let mut detail = json!({
                    "error": error,
                    "limit": limit,
                    "upgrade_url": upgrade_url,
                    "needed": needed,
                    "remaining": remaining,
                    "budget": which,
                });
                if let Spent::App(app) = budget {
                    detail["app"] = json!(app);
                }
                return json!({ "detail": detail });
            }
            NotCached => "Not cached: only-if-cached and HEAD are answered from the cache only",
            UpstreamTimeout => "Upstream timed out",
            UpstreamUnavailable => "Upstream unavailable",
            UpstreamInvalid(why) => why,
            UpstreamKeyRefused => "Upstream refused the gateway's credentials",
            Unavailable(why) => why,
            AnswersBusy => "Too many answers are waiting for slow readers; retry shortly",
            Internal => "Internal Server Error",
            ReloadRefused(problems) => return json!({ "detail": problems }),
        };
        json!({ "detail": detail })
    }

    /// The one mapping from error to response. What a billed failure
    /// cost is the request's to say (`X-Credits-Request`, written where
    /// every answer ends: `proxy::finish`), with its other calls' bills.
    pub(crate) fn into_response(self) -> Response<Body> {
        if let GatewayError::Billed { error, .. } = self {
            return error.into_response();
        }
        let mut resp = json_response(self.status(), &self.body());
        let headers = resp.headers_mut();
        match self {
            GatewayError::MethodNotAllowed => {
                headers.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            }
            GatewayError::TeamRateLimited { retry_after_secs }
            | GatewayError::UpstreamRateLimited { retry_after_secs, .. } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs.max(1)));
            }
            GatewayError::AnswersBusy => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(1u32));
            }
            GatewayError::InvalidCredential
            | GatewayError::ExpiredCredential
            | GatewayError::ConflictingCredentials => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_of(e: GatewayError) -> (StatusCode, serde_json::Value) {
        let resp = e.into_response();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, serde_json::from_slice(&bytes).expect("json"))
    }

    #[tokio::test]
    async fn every_variant_has_a_pinned_status_and_detail() {
        use GatewayError::*;
        let cases = [
            (NotFound, 404),
            (MethodNotAllowed, 405),
            (BadRequest("bad"), 400),
            (
                InvalidQuery(vec![Violation::new(
                    "missing",
                    "id",
                    "Field required",
                    Value::Null,
                    None,
                )]),
                422,
            ),
            (UriTooLong, 414),
            (HeadersTooLarge, 431),
            (MissingCredential, 422),
            (InvalidCredential, 401),
            (ExpiredCredential, 401),
            (ConflictingCredentials, 401),
            (TeamRateLimited { retry_after_secs: 3 }, 429),
            (
                UpstreamRateLimited {
                    retry_after_secs: 3,
                    why: GateRefusal::Predicted,
                },
                429,
            ),
            (
                QuotaExceeded {
                    limit: 5,
                    needed: 50,
                    remaining: 2,
                    upgrade_url: "u".into(),
                    budget: Spent::Team,
                },
                402,
            ),
            (NotCached, 504),
            (UpstreamTimeout, 504),
            (UpstreamUnavailable, 502),
            (UpstreamInvalid("x"), 502),
            (UpstreamKeyRefused, 502),
            (Unavailable("ledger"), 503),
            (AnswersBusy, 503),
            (Internal, 500),
            (ReloadRefused(vec!["x: bad".into()]), 422),
            (UpstreamTimeout.billed_at(25), 504),
            (UpstreamInvalid("too large").billed_at(3), 502),
        ];
        for (err, status) in cases {
            let (got, body) = body_of(err.clone()).await;
            assert_eq!(got.as_u16(), status, "{err:?}");
            assert!(body.get("detail").is_some(), "{err:?} has a detail");
        }
    }

    #[test]
    fn a_billed_failure_is_its_error_with_the_bill() {
        let billed = GatewayError::UpstreamTimeout.billed_at(25);
        assert_eq!(billed.billed(), 25);
        assert_eq!(billed.fault(), Fault::Upstream);
        assert!(billed.upstream_failed(), "a stale copy may answer");
        assert_eq!(billed.clone().billed_at(7).billed(), 7, "never nested");
        assert_eq!(billed.clone().unbilled(), GatewayError::UpstreamTimeout);
        assert_eq!(
            GatewayError::UpstreamTimeout.billed_at(0),
            GatewayError::UpstreamTimeout
        );
        let resp = billed.into_response();
        assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    }

    #[tokio::test]
    async fn quota_body_has_the_upstream_402_shape() {
        let (_, body) = body_of(GatewayError::QuotaExceeded {
            limit: 100,
            needed: 50,
            remaining: 7,
            upgrade_url: "https://w".into(),
            budget: Spent::App("web".into()),
        })
        .await;
        assert_eq!(body["detail"]["limit"], 100);
        assert_eq!(body["detail"]["needed"], 50);
        assert_eq!(body["detail"]["remaining"], 7);
        assert_eq!(body["detail"]["upgrade_url"], "https://w");
        assert_eq!(body["detail"]["budget"], "app");
        assert_eq!(body["detail"]["app"], "web");
        assert!(body["detail"]["error"].is_string());
    }

    #[tokio::test]
    async fn rate_limits_always_carry_retry_after() {
        for e in [
            GatewayError::TeamRateLimited { retry_after_secs: 0 },
            GatewayError::UpstreamRateLimited {
                retry_after_secs: 7,
                why: GateRefusal::Deadline,
            },
        ] {
            let resp = e.into_response();
            let ra: u64 = resp.headers()[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
            assert!(ra >= 1);
        }
    }

    #[tokio::test]
    async fn invalid_query_is_the_upstream_422_shape() {
        let v = Violation::new("less_than_equal", "size", "m", json!("101"), Some(json!({"le": 100})));
        let (_, body) = body_of(GatewayError::InvalidQuery(vec![v])).await;
        assert_eq!(
            body,
            json!({"detail": [{"type": "less_than_equal", "loc": ["query", "size"], "msg": "m", "input": "101", "ctx": {"le": 100}}]})
        );
    }

    #[test]
    fn upstream_statuses_map_to_one_error_each() {
        let max = std::time::Duration::from_secs(120);
        let of = |code: u16| {
            GatewayError::of_upstream_status(StatusCode::from_u16(code).unwrap(), &http::HeaderMap::new(), max)
        };
        assert_eq!(of(401), Some(GatewayError::UpstreamKeyRefused));
        assert_eq!(of(403), Some(GatewayError::UpstreamKeyRefused));
        assert_eq!(
            of(429),
            Some(GatewayError::UpstreamRateLimited {
                retry_after_secs: 1,
                why: GateRefusal::Upstream
            })
        );
        assert_eq!(of(503), Some(GatewayError::UpstreamUnavailable));
        for passed_on in [200, 402, 404, 422] {
            assert_eq!(of(passed_on), None, "{passed_on}");
        }
        assert!(
            GatewayError::UpstreamKeyRefused.upstream_failed(),
            "a stale copy may answer"
        );
    }

    #[tokio::test]
    async fn missing_credential_is_the_upstream_422_shape() {
        let (_, body) = body_of(GatewayError::MissingCredential).await;
        assert_eq!(body["detail"][0]["loc"], json!(["header", "x-api-key"]));
        assert_eq!(body["detail"][0]["type"], "missing");
    }
}
