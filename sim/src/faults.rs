//! Injected faults: what can go wrong between the gateway and the upstream,
//! switched on per test (`Sim::set_faults`, `POST /_sim/faults`).
//!
//! A fault applies to `/v2` requests that passed auth and the rate limit.
//! `count` and `ratio` pick which of them are affected; the ratio draws from a
//! seeded RNG so a run is reproducible. Faults that replace the answer
//! (Status, Reset, Hang, MalformedJson, WrongContentType, HugeBody) charge
//! nothing; the others serve the real answer (or, ForeignRecords and
//! PartialRecords, a reshaped one) and charge its real credits.

use crate::reply::{respond, Answer, Body};
use bytes::Bytes;
use http::{Response, StatusCode};
use hyper::body::{Frame, SizeHint};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Faults {
    pub kind: FaultKind,
    /// For `Status` (default 500).
    pub status: Option<u16>,
    /// Apply to the next N `/v2` requests; `None` = until cleared.
    pub count: Option<u64>,
    /// Fraction of requests affected (seeded); `None` = all.
    pub ratio: Option<f64>,
    /// `Retry-After` sent with a Status 429/503 fault.
    pub retry_after_secs: Option<u64>,
    /// SlowBody: whole body duration (default 1 s); Hang: how long (default 1 h).
    pub delay_ms: Option<u64>,
    /// HugeBody size (default 20 MiB).
    pub body_bytes: Option<u64>,
    /// Extra latency for affected requests.
    pub latency_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    #[default]
    None,
    Status,
    Reset,
    Hang,
    SlowBody,
    Truncated,
    MalformedJson,
    WrongContentType,
    AbsurdCredits,
    MissingCredits,
    HugeBody,
    Latency,
    /// A page of records for ids that were not asked: each record's `id`
    /// gets a `-foreign` suffix (charged as the real answer).
    ForeignRecords,
    /// Only the first record of the page (its `size` 1), charged as the
    /// whole real answer.
    PartialRecords,
}

/// Values AbsurdCredits rotates through: negative, overflowing, not a number.
const ABSURD: &[&str] = &["-5", "99999999999999999999", "abc"];

pub struct FaultState {
    faults: Faults,
    remaining: Option<u64>,
    rng: ChaCha8Rng,
    absurd_next: usize,
}

/// The fault that hits one request.
pub struct Active {
    pub faults: Faults,
    pub absurd: &'static str,
}

impl FaultState {
    pub fn new(seed: u64) -> FaultState {
        FaultState {
            faults: Faults::default(),
            remaining: None,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0xFA17),
            absurd_next: 0,
        }
    }

    pub fn set(&mut self, faults: Faults) {
        self.remaining = faults.count;
        self.faults = faults;
    }

    /// Decides whether this request is affected, consuming one of `count`.
    pub fn take(&mut self) -> Option<Active> {
        if self.faults.kind == FaultKind::None || self.remaining == Some(0) {
            return None;
        }
        if let Some(ratio) = self.faults.ratio {
            if self.rng.random::<f64>() >= ratio {
                return None;
            }
        }
        if let Some(n) = self.remaining.as_mut() {
            *n -= 1;
        }
        let absurd = ABSURD[self.absurd_next % ABSURD.len()];
        self.absurd_next += 1;
        Some(Active {
            faults: self.faults.clone(),
            absurd,
        })
    }
}

/// What a fault does before the real answer is computed.
pub enum Before {
    /// Serve the real answer (maybe mangled afterwards).
    Continue,
    /// Answer with this instead; costs nothing.
    Replace(Answer),
    /// Close the connection without an answer.
    Reset,
}

impl Active {
    /// Extra latency this fault adds.
    pub fn latency(&self) -> Duration {
        let f = &self.faults;
        let ms = match f.kind {
            FaultKind::Latency => f.latency_ms.or(f.delay_ms).unwrap_or(0),
            _ => f.latency_ms.unwrap_or(0),
        };
        Duration::from_millis(ms)
    }

    pub async fn before(&self, limit: Option<u64>, upgrade_url: &str) -> Before {
        let f = &self.faults;
        match f.kind {
            FaultKind::Status => Before::Replace(status_answer(f, limit, upgrade_url)),
            FaultKind::Reset => Before::Reset,
            FaultKind::Hang => {
                tokio::time::sleep(Duration::from_millis(f.delay_ms.unwrap_or(3_600_000))).await;
                Before::Reset
            }
            FaultKind::MalformedJson => Before::Replace(raw(
                "application/json",
                Bytes::from_static(b"{\"items\": [{\"id\": \"0f3a\", \"descr\x00\xff<<<"),
            )),
            FaultKind::WrongContentType => Before::Replace(raw(
                "text/html; charset=utf-8",
                Bytes::from_static(b"<html><body><h1>Service temporarily unavailable</h1></body></html>"),
            )),
            FaultKind::HugeBody => {
                Before::Replace(raw("application/json", huge_page(f.body_bytes.unwrap_or(20 << 20))))
            }
            _ => Before::Continue,
        }
    }

    /// Mangles a real (already charged) answer.
    pub fn after(&self, mut answer: Answer) -> Response<Body> {
        let f = &self.faults;
        match f.kind {
            FaultKind::Truncated => {
                let half = answer.body.len() / 2;
                answer.body = answer.body.slice(..half);
            }
            FaultKind::AbsurdCredits => {
                for (name, value) in answer.headers.iter_mut() {
                    if *name == "x-credits-request" {
                        *value = self.absurd.to_string();
                    }
                }
            }
            FaultKind::MissingCredits => {
                answer.headers.retain(|(n, _)| !n.starts_with("x-credits-"));
            }
            FaultKind::ForeignRecords | FaultKind::PartialRecords => {
                answer.body = reshape(&answer.body, f.kind);
            }
            FaultKind::SlowBody => {
                let total = Duration::from_millis(f.delay_ms.unwrap_or(1_000));
                let body = SlowBody::new(answer.body.clone(), total);
                return respond(answer.status, answer.content_type, Body::new(body), &answer.headers);
            }
            _ => {}
        }
        answer.into_response()
    }
}

/// A page envelope with foreign or fewer records; other bodies unchanged.
fn reshape(body: &Bytes, kind: FaultKind) -> Bytes {
    let Ok(mut page) = serde_json::from_slice::<serde_json::Value>(body) else {
        return body.clone();
    };
    let Some(items) = page.get_mut("items").and_then(|i| i.as_array_mut()) else {
        return body.clone();
    };
    if kind == FaultKind::PartialRecords {
        items.truncate(1);
    } else {
        for item in items.iter_mut() {
            if let Some(id) = item.get("id").and_then(|v| v.as_str()) {
                item["id"] = json!(format!("{id}-foreign"));
            }
        }
    }
    let n = items.len();
    page["size"] = json!(n);
    serde_json::to_vec(&page)
        .map(Bytes::from)
        .unwrap_or_else(|_| body.clone())
}

fn raw(content_type: &'static str, body: Bytes) -> Answer {
    Answer {
        status: StatusCode::OK,
        body,
        content_type,
        metered: None,
        headers: Vec::new(),
    }
}

/// An injected error status with the body the upstream would send for it.
fn status_answer(f: &Faults, limit: Option<u64>, upgrade_url: &str) -> Answer {
    let status = StatusCode::from_u16(f.status.unwrap_or(500)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let answer = match status.as_u16() {
        402 => Answer::json(status, &crate::router::over_limit_body(limit.unwrap_or(0), upgrade_url)),
        429 => Answer::detail(status, "Rate limit exceeded"),
        401 => Answer::detail(status, "Not authenticated"),
        _ => Answer::detail(status, status.canonical_reason().unwrap_or("Error")),
    };
    match (status.as_u16(), f.retry_after_secs) {
        (429, r) => answer.with_header("retry-after", r.unwrap_or(1)),
        (503, Some(r)) => answer.with_header("retry-after", r),
        _ => answer,
    }
}

/// A valid page of permit-like records about `bytes` long.
fn huge_page(bytes: u64) -> Bytes {
    let filler = "x".repeat(1_000);
    let mut out = String::with_capacity(bytes as usize + 2_048);
    out.push_str("{\"items\":[");
    let mut n = 0u64;
    while (out.len() as u64) < bytes {
        if n > 0 {
            out.push(',');
        }
        out.push_str(&json!({"id": format!("{n:016x}"), "description": filler}).to_string());
        n += 1;
    }
    out.push_str(&format!("],\"size\":{n},\"next_cursor\":null,\"total_count\":null}}"));
    Bytes::from(out)
}

/// A body that trickles out in small chunks spread over a duration.
struct SlowBody {
    chunks: VecDeque<Bytes>,
    interval: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl SlowBody {
    fn new(body: Bytes, total: Duration) -> SlowBody {
        const PIECES: usize = 20;
        let step = body.len().div_ceil(PIECES).max(1);
        let chunks: VecDeque<Bytes> = (0..body.len())
            .step_by(step)
            .map(|i| body.slice(i..(i + step).min(body.len())))
            .collect();
        let interval = total / (chunks.len().max(1) as u32);
        SlowBody {
            chunks,
            interval,
            sleep: Box::pin(tokio::time::sleep(interval)),
        }
    }
}

impl hyper::body::Body for SlowBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.chunks.is_empty() {
            return Poll::Ready(None);
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let next = std::time::Instant::now() + self.interval;
        self.sleep.as_mut().reset(next.into());
        Poll::Ready(self.chunks.pop_front().map(|c| Ok(Frame::data(c))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.chunks.iter().map(|c| c.len() as u64).sum())
    }
}
