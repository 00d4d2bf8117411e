//! The `/_sim/*` control endpoints: the same knobs as the [`crate::Sim`]
//! methods, over HTTP, for scripts and for a simulator run as a child process.
//! They need no API key and are not counted in the stats.

use crate::faults::Faults;
use crate::reply::{Answer, Body};
use crate::state::Shared;
use crate::Samples;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};

/// Control bodies are tiny; anything bigger is a mistake.
const MAX_BODY: usize = 64 * 1024;

pub async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return bad_request("body too large or unreadable").into_response(),
    };
    let answer = match (method, path.as_str()) {
        (Method::GET, "/_sim/stats") => Answer::ok(&shared.stats()),
        (Method::GET, "/_sim/log") => Answer::ok(&shared.log()),
        (Method::GET, "/_sim/samples") => Answer::ok(&Samples::from_dataset(&shared.data())),
        (Method::POST, "/_sim/reset") => {
            shared.reset();
            ok()
        }
        (Method::POST, "/_sim/faults") => set_faults(shared, &body),
        (Method::DELETE, "/_sim/faults") => {
            shared.set_faults(Faults::default());
            ok()
        }
        (Method::POST, "/_sim/config") => config(shared, &body),
        (Method::POST, "/_sim/clock") => clock(shared, &body),
        (Method::POST, "/_sim/release") => release(shared, &body),
        _ => Answer::not_found(),
    };
    answer.into_response()
}

fn ok() -> Answer {
    Answer::ok(&json!({"ok": true}))
}

fn bad_request(msg: &str) -> Answer {
    Answer::detail(StatusCode::BAD_REQUEST, msg)
}

/// An empty body counts as `{}`.
fn parse(body: &Bytes) -> Result<Value, Answer> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(body).map_err(|e| bad_request(&format!("invalid JSON: {e}")))
}

fn set_faults(shared: &Shared, body: &Bytes) -> Answer {
    let faults = parse(body)
        .and_then(|v| serde_json::from_value::<Faults>(v).map_err(|e| bad_request(&format!("invalid faults: {e}"))));
    match faults {
        Ok(f) => {
            shared.set_faults(f);
            ok()
        }
        Err(a) => a,
    }
}

/// `{"credit_limit": N|null, "requests_per_minute": N}`, both optional.
fn config(shared: &Shared, body: &Bytes) -> Answer {
    let v = match parse(body) {
        Ok(v) => v,
        Err(a) => return a,
    };
    if let Some(limit) = v.get("credit_limit") {
        match (limit.is_null(), limit.as_u64()) {
            (true, _) => shared.credits().set_limit(None),
            (false, Some(n)) => shared.credits().set_limit(Some(n)),
            _ => return bad_request("credit_limit must be a non-negative integer or null"),
        }
    }
    if let Some(rpm) = v.get("requests_per_minute") {
        match rpm.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => shared.set_requests_per_minute(n),
            None => return bad_request("requests_per_minute must be a non-negative integer"),
        }
    }
    ok()
}

fn clock(shared: &Shared, body: &Bytes) -> Answer {
    match parse(body).map(|v| v.get("advance_secs").and_then(Value::as_u64)) {
        Ok(Some(secs)) => {
            shared.credits().advance(secs);
            ok()
        }
        Ok(None) => bad_request("advance_secs must be a non-negative integer"),
        Err(a) => a,
    }
}

/// `{"days": N}` (default 7): publishes the next data release N days
/// later; `{"released_at": "..."}`: `/v2/meta/release` answers that text
/// until the next publish (a test's unreadable or older release).
fn release(shared: &Shared, body: &Bytes) -> Answer {
    let v = match parse(body) {
        Ok(v) => v,
        Err(a) => return a,
    };
    if let Some(text) = v.get("released_at") {
        return match text.as_str() {
            Some(t) => {
                shared.garble_release(Some(t.to_string()));
                ok()
            }
            None => bad_request("released_at must be a string"),
        };
    }
    let days = match v.get("days") {
        None => Some(7),
        Some(d) => d.as_u64().and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0),
    };
    match days {
        Some(days) => Answer::ok(&json!({"released_at": shared.publish_release(days).to_string()})),
        None => bad_request("days must be a positive integer"),
    }
}
