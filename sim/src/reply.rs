//! Building responses: an [`Answer`] is what a handler decided (status, JSON
//! body, how many metered records), turned into an HTTP response only at the
//! end of the pipeline so credits and faults can still adjust it.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use serde_json::{json, Value};

pub type Body = BoxBody<Bytes, std::io::Error>;

/// A handler's result before credits and faults: `Err` answers are errors
/// (which never cost credits), `Ok` answers are successes.
pub type Outcome = Result<Answer, Answer>;

pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
    pub content_type: &'static str,
    /// Records returned by a metered endpoint; `None` on free endpoints.
    pub metered: Option<u64>,
    pub headers: Vec<(&'static str, String)>,
}

impl Answer {
    pub fn json(status: StatusCode, value: &impl Serialize) -> Answer {
        match serde_json::to_vec(value) {
            Ok(body) => Answer {
                status,
                body: Bytes::from(body),
                content_type: "application/json",
                metered: None,
                headers: Vec::new(),
            },
            Err(_) => Answer::detail(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error"),
        }
    }

    /// A free 200.
    pub fn ok(value: &impl Serialize) -> Answer {
        Answer::json(StatusCode::OK, value)
    }

    /// A 200 that costs one credit per record in it.
    pub fn metered(value: &impl Serialize, records: usize) -> Answer {
        let mut a = Answer::json(StatusCode::OK, value);
        a.metered = Some(records as u64);
        a
    }

    /// FastAPI's `{"detail": "..."}` error shape.
    pub fn detail(status: StatusCode, msg: &str) -> Answer {
        Answer::json(status, &json!({ "detail": msg }))
    }

    /// A 422 with every validation error of the request at once.
    pub fn validation(errors: Vec<Value>) -> Answer {
        Answer::json(StatusCode::UNPROCESSABLE_ENTITY, &json!({ "detail": errors }))
    }

    pub fn not_found() -> Answer {
        Answer::detail(StatusCode::NOT_FOUND, "Not Found")
    }

    pub fn with_header(mut self, name: &'static str, value: impl ToString) -> Answer {
        self.headers.push((name, value.to_string()));
        self
    }

    pub fn into_response(self) -> Response<Body> {
        respond(self.status, self.content_type, full(self.body), &self.headers)
    }
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// Every response carries `server: uvicorn`, as the real upstream does.
pub fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: Body,
    headers: &[(&'static str, String)],
) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert("content-type", HeaderValue::from_static(content_type));
    h.insert("server", HeaderValue::from_static("uvicorn"));
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(*name, v);
        }
    }
    resp
}
