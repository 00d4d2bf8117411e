//! The access line, preformatted: one line per request, written straight
//! into the log queue ([`super::sink`]), in the same shape `tracing`'s formatters give
//! it (text or JSON, the `access` target, `log.level` deciding which levels
//! are written).
//!
//! Why not a `tracing` event: its formatter visits each field through
//! `dyn Value`, Debug-formats numbers and strings, and formats the
//! timestamp from scratch; at `info` that was more than half of a cache
//! hit's user-space work (BENCHMARKS.md, issue 30). Here the timestamp's
//! seconds are formatted once a second, numbers through `itoa`, and the
//! line is built in a buffer the thread keeps. `duration_ms` has three
//! decimals (microseconds), not an `f64`'s seventeen digits.
//!
//! Installed by [`super::init`] when stderr is not a terminal (a person at
//! a terminal gets `tracing`'s coloured line); until then, and in tests
//! that run the gateway in-process, [`line`] returns `None` and the caller
//! logs through `tracing` as before.

use super::sink::Sink;
use crate::metrics::LogLine;
use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::Level;

/// The installed sink: the same queue and writer thread as every other
/// log line.
struct Installed {
    sink: Sink,
    json: bool,
}

static SINK: OnceLock<Installed> = OnceLock::new();

/// Sends access lines to `sink` from now on (once per process).
pub(super) fn install(sink: Sink, json: bool) {
    let _ = SINK.set(Installed { sink, json });
}

/// The fields of one access line, in the order they are written.
pub(crate) struct Line<'a> {
    pub(crate) level: Level,
    pub(crate) request_id: &'a str,
    pub(crate) trace_id: &'a dyn std::fmt::Display,
    pub(crate) team: &'a str,
    pub(crate) method: &'a str,
    pub(crate) route: &'a str,
    pub(crate) status: u16,
    pub(crate) cache: &'a str,
    pub(crate) credits: u64,
    pub(crate) took: Duration,
    /// A background refresh's line (no client waited for it).
    pub(crate) refresh: bool,
    /// No team was authenticated: the line the log sink drops first.
    pub(crate) anonymous: bool,
}

/// Whether `log.level` lets the access target through at `level`.
fn enabled(level: Level) -> bool {
    // Each arm is its own call site, whose interest the subscriber caches:
    // one relaxed load per request once the filter has answered.
    match level {
        Level::ERROR => tracing::enabled!(target: "access", Level::ERROR),
        Level::WARN => tracing::enabled!(target: "access", Level::WARN),
        _ => tracing::enabled!(target: "access", Level::INFO),
    }
}

/// Writes `line` if a sink is installed and `log.level` lets it through;
/// `false` when the caller must log through `tracing` instead.
pub(crate) fn write(line: &Line<'_>) -> bool {
    let Some(sink) = SINK.get() else { return false };
    if !enabled(line.level) {
        return true;
    }
    BUFFER.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.clear();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        if sink.json {
            json(&mut buf, line, now);
        } else {
            text(&mut buf, line, now);
        }
        // One line, one entry of the queue: lines never interleave.
        let kind = if line.anonymous {
            LogLine::Anonymous
        } else {
            LogLine::Team
        };
        sink.sink.push(kind, buf.as_bytes().to_vec());
    });
    true
}

thread_local! {
    static BUFFER: RefCell<String> = RefCell::new(String::with_capacity(384));
    /// The last second formatted, and its text (`2026-11-26T03:52:45`).
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// `2026-11-26T03:52:45.123456Z`, as `tracing-subscriber` writes it.
fn timestamp(out: &mut String, now: Duration) {
    let secs = now.as_secs();
    SECOND.with(|s| {
        let mut s = s.borrow_mut();
        if s.0 != secs {
            s.1.clear();
            let at = chrono::DateTime::from_timestamp(secs as i64, 0).unwrap_or_default();
            let _ = write!(s.1, "{}", at.format("%Y-%m-%dT%H:%M:%S"));
            s.0 = secs;
        }
        out.push_str(&s.1);
    });
    out.push('.');
    let micros = now.subsec_micros();
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(micros);
    for _ in digits.len()..6 {
        out.push('0');
    }
    out.push_str(digits);
    out.push('Z');
}

/// Milliseconds with three decimals: `12.345`.
fn millis(out: &mut String, took: Duration) {
    let micros = took.as_micros();
    let mut digits = itoa::Buffer::new();
    out.push_str(digits.format(micros / 1000));
    out.push('.');
    let frac = digits.format(micros % 1000);
    for _ in frac.len()..3 {
        out.push('0');
    }
    out.push_str(frac);
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "TRACE",
    }
}

/// `tracing-subscriber`'s full text format, without colours:
/// `<time>  INFO access: request request_id=… team="alpha" …`.
fn text(out: &mut String, line: &Line<'_>, now: Duration) {
    let mut n = itoa::Buffer::new();
    timestamp(out, now);
    // The level is right-aligned in five columns, after two spaces.
    let level = level_name(line.level);
    out.push_str(&"      "[..6 - level.len()]);
    out.push_str(level);
    out.push_str(" access: request request_id=");
    out.push_str(line.request_id);
    let _ = write!(out, " trace_id={}", line.trace_id);
    let _ = write!(out, " team={:?}", line.team);
    out.push_str(" method=");
    out.push_str(line.method);
    let _ = write!(out, " route={:?} status=", line.route);
    out.push_str(n.format(line.status));
    let _ = write!(out, " cache={:?} credits=", line.cache);
    out.push_str(n.format(line.credits));
    out.push_str(" duration_ms=");
    millis(out, line.took);
    if line.refresh {
        out.push_str(" refresh=true");
    }
    out.push('\n');
}

/// `tracing-subscriber`'s JSON format with flattened fields.
fn json(out: &mut String, line: &Line<'_>, now: Duration) {
    let mut n = itoa::Buffer::new();
    out.push_str("{\"timestamp\":\"");
    timestamp(out, now);
    out.push_str("\",\"level\":\"");
    out.push_str(level_name(line.level));
    out.push_str("\",\"message\":\"request\",\"request_id\":");
    string(out, line.request_id);
    let _ = write!(out, ",\"trace_id\":\"{}\",\"team\":", line.trace_id);
    string(out, line.team);
    out.push_str(",\"method\":");
    string(out, line.method);
    out.push_str(",\"route\":");
    string(out, line.route);
    out.push_str(",\"status\":");
    out.push_str(n.format(line.status));
    out.push_str(",\"cache\":");
    string(out, line.cache);
    out.push_str(",\"credits\":");
    out.push_str(n.format(line.credits));
    out.push_str(",\"duration_ms\":");
    millis(out, line.took);
    if line.refresh {
        out.push_str(",\"refresh\":true");
    }
    out.push_str(",\"target\":\"access\"}\n");
}

/// A JSON string: quotes, backslashes and control characters escaped.
fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(refresh: bool) -> Line<'static> {
        Line {
            level: Level::INFO,
            request_id: "r-1",
            trace_id: &"4bf92f3577b34da6a3ce929d0e0e4736",
            team: "al\"pha",
            method: "GET",
            route: "permits_search",
            status: 200,
            cache: "hit",
            credits: 7,
            took: Duration::from_micros(12_045),
            refresh,
            anonymous: false,
        }
    }

    #[test]
    fn json_lines_parse_and_carry_every_field() {
        let mut out = String::new();
        json(&mut out, &sample(true), Duration::new(1_764_127_965, 1_000));
        let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
        assert_eq!(v["timestamp"], "2025-11-26T03:32:45.000001Z");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["target"], "access");
        assert_eq!(v["team"], "al\"pha");
        assert_eq!(v["status"], 200);
        assert_eq!(v["credits"], 7);
        assert_eq!(v["duration_ms"].as_f64(), Some(12.045));
        assert_eq!(v["refresh"], true);
        assert_eq!(v["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(out.ends_with("}\n"));
    }

    #[test]
    fn text_lines_read_like_tracings() {
        let mut out = String::new();
        text(&mut out, &sample(false), Duration::new(1_764_127_965, 999_999_000));
        assert_eq!(
            out,
            "2025-11-26T03:32:45.999999Z  INFO access: request request_id=r-1 \
             trace_id=4bf92f3577b34da6a3ce929d0e0e4736 team=\"al\\\"pha\" method=GET \
             route=\"permits_search\" status=200 cache=\"hit\" credits=7 duration_ms=12.045\n"
        );
    }

    #[test]
    fn milliseconds_keep_three_decimals() {
        for (micros, want) in [(0, "0.000"), (5, "0.005"), (10_435, "10.435"), (1_000_000, "1000.000")] {
            let mut out = String::new();
            millis(&mut out, Duration::from_micros(micros));
            assert_eq!(out, want);
        }
    }
}
