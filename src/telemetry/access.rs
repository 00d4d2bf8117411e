//! The access line: one line per request, its fields listed once
//! ([`Line::fields`]) and formatted by one function ([`format`]) for text
//! and JSON, in the shape `tracing-subscriber`'s formatters give the same
//! event (text or JSON, the `access` target, `log.level` deciding which
//! levels are written); a test formats the same event through them and
//! compares bytes. Written straight into the log queue ([`super::sink`]).
//!
//! Why not a `tracing` event: its formatter visits each field through
//! `dyn Value`, Debug-formats numbers and strings, and formats the
//! timestamp from scratch; at `info` that was more than half of a cache
//! hit's user-space work (callgrind, BENCHMARKS.md). Here the timestamp's
//! seconds are formatted once a second, numbers through `itoa`, and the
//! line is built in a buffer the thread keeps. `duration_ms` always has
//! three decimals (microseconds): `12.500` where an `f64` field would print
//! `12.5`, the one way the line differs from `tracing`'s.
//!
//! Installed by [`super::init`] unless stderr is a terminal and the format
//! is text (a person at a terminal gets `tracing`'s coloured line). Until
//! then, and in tests that run the gateway in-process, [`write`] logs the
//! line as a `tracing` event whose message is the same fields as text, so
//! `tracing`'s text formatter prints the same line.

use super::sink::Sink;
use crate::auth::Tenant;
use crate::metrics::LogLine;
use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, Ordering};
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

/// One access line: its level, and what its fields say.
#[derive(Debug)]
pub(crate) struct Line<'a> {
    pub(crate) level: Level,
    pub(crate) request_id: &'a str,
    /// The W3C trace id's 16 bytes, written as 32 lowercase hex digits.
    pub(crate) trace_id: [u8; 16],
    pub(crate) team: &'a str,
    /// The team's app, by its token's name; only for a team that names
    /// its apps (`tokens`).
    pub(crate) app: Option<&'a str>,
    pub(crate) method: &'a str,
    pub(crate) route: &'a str,
    pub(crate) status: u16,
    /// How it was answered: its `cache` and `answered` fields.
    pub(crate) answer: &'static Answer,
    pub(crate) credits: u64,
    pub(crate) took: Duration,
    /// A background refresh's line (no client waited for it).
    pub(crate) refresh: bool,
    /// On a budget's 402, the budget that refused: `team`, `app` or
    /// `org` (the 402 body's `budget`). Written last, only then.
    pub(crate) budget: Option<&'static str>,
    /// The team's tenant; `None`: no team was authenticated, the line the
    /// log sink drops first.
    pub(crate) tenant: Option<Tenant>,
}

/// How a request was answered, as the access line writes it
/// (`proxy::Answered::names`): one static value per way of answering, so a
/// line carries one pointer for its two fields.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The `cache` field (`X-Cache`, lower case).
    pub(crate) cache: &'static str,
    /// The `answered` field.
    pub(crate) answered: &'static str,
    /// The JSON from `cache`'s value to `answered`'s, both included
    /// (`hit","answered":"held_memory`): one copy for the two fields.
    pub(crate) json: &'static str,
}

/// A field's value, and so how the text form writes it. Each kind is what
/// `tracing` records for the same value: a `%` field ([`Value::Shown`],
/// [`Value::Hex`]), a `&str`, an integer, a bool; `duration_ms` is written
/// with three decimals where an `f64` would print as few as it needs
/// (`12.5`, not `12.500`). (In JSON, [`json_fields`]: every string a JSON
/// string, the numbers as they are.)
enum Value<'a> {
    /// As is (`tracing`'s `%`).
    Shown(&'a str),
    /// Bytes as lowercase hex digits (a trace id's `%`).
    Hex(&'a [u8; 16]),
    /// Quoted and escaped as Rust's `Debug`.
    Str(&'a str),
    /// A string of the gateway's own (a route's name, a cache state): plain
    /// characters, so quoted as it is.
    Known(&'a str),
    Int(u64),
    /// Milliseconds with three decimals: `12.345`.
    Millis(Duration),
    Bool(bool),
}

/// A field's name with what comes before its value in text: ` name=`
/// (one string, made at compile time).
macro_rules! name {
    ($name:literal) => {
        concat!(" ", $name, "=")
    };
}

impl Line<'_> {
    /// The line's fields, in the order they are written, handed to
    /// `field` one by one (no array of them built per line); `refresh`
    /// only on a background refresh's line. The text form and `tracing`'s
    /// fallback write them from here; [`json_fields`] writes the same
    /// fields in the same order by hand, held to it by the byte-for-byte
    /// test.
    fn each_field<E>(&self, mut field: impl FnMut(&'static str, Value<'_>) -> Result<(), E>) -> Result<(), E> {
        field(name!("request_id"), Value::Shown(self.request_id))?;
        field(name!("trace_id"), Value::Hex(&self.trace_id))?;
        field(name!("team"), Value::Str(self.team))?;
        if let Some(app) = self.app {
            field(name!("app"), Value::Str(app))?;
        }
        field(name!("method"), Value::Shown(self.method))?;
        field(name!("route"), Value::Known(self.route))?;
        field(name!("status"), Value::Int(u64::from(self.status)))?;
        field(name!("cache"), Value::Known(self.answer.cache))?;
        field(name!("answered"), Value::Known(self.answer.answered))?;
        field(name!("credits"), Value::Int(self.credits))?;
        field(name!("duration_ms"), Value::Millis(self.took))?;
        if self.refresh {
            field(name!("refresh"), Value::Bool(true))?;
        }
        if let Some(budget) = self.budget {
            field(name!("budget"), Value::Known(budget))?;
        }
        Ok(())
    }
}

/// The access line's message, as `tracing` writes an event's.
const MESSAGE: &str = "request";

/// The levels `log.level` lets the access target through at, one bit
/// each ([`bit`]): asked of the subscriber once the log layer is installed
/// and after each reload ([`levels_changed`]), not on every request (the
/// question went through the dispatcher: ~200 instructions a line).
static ENABLED: AtomicU8 = AtomicU8::new(0);

fn bit(level: Level) -> u8 {
    match level {
        Level::ERROR => 1,
        Level::WARN => 2,
        _ => 4,
    }
}

/// Asks the installed subscriber again which levels of the access target
/// it takes: after the log layer is installed, and after `log.level` is
/// reloaded.
pub(super) fn levels_changed() {
    let mut bits = 0;
    if tracing::enabled!(target: "access", Level::ERROR) {
        bits |= bit(Level::ERROR);
    }
    if tracing::enabled!(target: "access", Level::WARN) {
        bits |= bit(Level::WARN);
    }
    if tracing::enabled!(target: "access", Level::INFO) {
        bits |= bit(Level::INFO);
    }
    ENABLED.store(bits, Ordering::Relaxed);
}

/// Whether `log.level` lets the access target through at `level`.
fn enabled(level: Level) -> bool {
    ENABLED.load(Ordering::Relaxed) & bit(level) != 0
}

/// Writes `line` into the log queue, or, when no sink is installed (a
/// terminal's coloured text, or a gateway run in-process by a test), logs
/// it as a `tracing` event whose message is the same fields as text.
pub(crate) fn write(line: &Line<'_>) {
    let Some(sink) = SINK.get() else {
        let fields = Fields(line);
        match line.level {
            Level::ERROR => tracing::error!(target: "access", "{fields}"),
            Level::WARN => tracing::warn!(target: "access", "{fields}"),
            _ => tracing::info!(target: "access", "{fields}"),
        }
        return;
    };
    if !enabled(line.level) {
        return;
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    // Formatted into the buffer the queue keeps: no copy of the line.
    let mut out = String::with_capacity(LINE_CAPACITY);
    format(&mut out, line, now, sink.json);
    // One line, one entry of the queue: lines never interleave.
    let team = line.tenant.map(|tenant| (tenant, line.team));
    let kind = if team.is_some() {
        LogLine::Team
    } else {
        LogLine::Anonymous
    };
    sink.sink.push(kind, team, out.into_bytes());
}

/// Room for a whole access line (a hit's JSON line is about 300 bytes):
/// one allocation per line.
const LINE_CAPACITY: usize = 384;

thread_local! {
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

/// Writes `took` as milliseconds with three decimals: `12.345`.
fn write_millis(out: &mut impl fmt::Write, took: Duration) -> fmt::Result {
    let micros = took.as_micros();
    let mut digits = itoa::Buffer::new();
    out.write_str(digits.format(micros / 1000))?;
    out.write_char('.')?;
    let frac = digits.format(micros % 1000);
    for _ in frac.len()..3 {
        out.write_char('0')?;
    }
    out.write_str(frac)
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

/// The whole line, as `tracing-subscriber` formats the event (without
/// colours): its full text format,
/// `<time>  INFO access: request request_id=… team="alpha" …`, or its JSON
/// format with flattened fields.
fn format(out: &mut String, line: &Line<'_>, now: Duration, json: bool) {
    let level = level_name(line.level);
    if json {
        out.push_str("{\"timestamp\":\"");
        timestamp(out, now);
        out.push_str("\",\"level\":\"");
        out.push_str(level);
        out.push_str("\",\"message\":\"");
        out.push_str(MESSAGE);
        out.push('"');
    } else {
        timestamp(out, now);
        // The level is right-aligned in five columns, after a space.
        out.push_str(&"      "[..6 - level.len()]);
        out.push_str(level);
        out.push_str(" access: ");
        out.push_str(MESSAGE);
    }
    if json {
        json_fields(out, line);
        out.push_str(",\"target\":\"access\"}");
    } else {
        let _ = fields(out, line);
    }
    out.push('\n');
}

/// [`fields`] in JSON, written out field by field: each name a literal,
/// so that its copy is a few moves rather than a call (the JSON line is
/// the default, written for every request). The byte-for-byte test holds
/// it to `tracing`'s JSON, like the text form; the fields and their order
/// are [`Line::each_field`]'s.
fn json_fields(out: &mut String, line: &Line<'_>) {
    let mut n = itoa::Buffer::new();
    // Plain by construction: a request id is checked to be (or made of)
    // letters, digits and `-_.:`, a method is an HTTP token, a route and a
    // cache state are the gateway's own names.
    debug_assert!(
        [
            line.request_id,
            line.method,
            line.route,
            line.answer.cache,
            line.answer.answered
        ]
        .into_iter()
        .all(plain),
        "{line:?} needs escaping"
    );
    out.push_str(",\"request_id\":\"");
    out.push_str(line.request_id);
    out.push_str("\",\"trace_id\":\"");
    let _ = hex(out, &line.trace_id);
    out.push_str("\",\"team\":");
    json_string(out, line.team);
    if let Some(app) = line.app {
        out.push_str(",\"app\":");
        json_string(out, app);
    }
    out.push_str(",\"method\":\"");
    out.push_str(line.method);
    out.push_str("\",\"route\":\"");
    out.push_str(line.route);
    out.push_str("\",\"status\":");
    out.push_str(n.format(line.status));
    out.push_str(",\"cache\":\"");
    out.push_str(line.answer.json);
    out.push_str("\",\"credits\":");
    out.push_str(n.format(line.credits));
    out.push_str(",\"duration_ms\":");
    let _ = write_millis(out, line.took);
    if line.refresh {
        out.push_str(",\"refresh\":true");
    }
    if let Some(budget) = line.budget {
        debug_assert!(plain(budget), "{budget:?} needs escaping");
        out.push_str(",\"budget\":\"");
        out.push_str(budget);
        out.push('"');
    }
}

/// A JSON string: quoted, escaped as serde_json escapes
/// (`tracing-subscriber`'s JSON is serde_json's); plain text (names,
/// routes, request ids) as it is.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    if plain(s) {
        out.push_str(s);
    } else {
        let mut plain = 0;
        for (i, b) in s.bytes().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0..0x20 => "",
                _ => continue,
            };
            out.push_str(&s[plain..i]);
            if escape.is_empty() {
                let _ = write!(out, "\\u{b:04x}");
            } else {
                out.push_str(escape);
            }
            plain = i + 1;
        }
        out.push_str(&s[plain..]);
    }
    out.push('"');
}

/// The fields as text, each after its separator: ` name=value` (the JSON
/// form is [`json_fields`]).
fn fields(out: &mut impl fmt::Write, line: &Line<'_>) -> fmt::Result {
    let mut n = itoa::Buffer::new();
    line.each_field(|name, value| {
        out.write_str(name)?;
        match value {
            Value::Shown(s) => out.write_str(s),
            Value::Known(s) => {
                debug_assert!(plain(s), "{s:?} needs escaping");
                out.write_char('"')?;
                out.write_str(s)?;
                out.write_char('"')
            }
            Value::Hex(bytes) => hex(out, bytes),
            // What `{s:?}` writes: a string of plain characters (every
            // name and route the gateway logs) quoted as it is.
            Value::Str(s) if plain(s) => {
                out.write_char('"')?;
                out.write_str(s)?;
                out.write_char('"')
            }
            Value::Str(s) => write!(out, "{s:?}"),
            Value::Int(i) => out.write_str(n.format(i)),
            Value::Millis(took) => write_millis(out, took),
            Value::Bool(b) => out.write_str(if b { "true" } else { "false" }),
        }
    })
}

/// Printable ASCII but `"` and `\`: the bytes that both Rust's `Debug`
/// of a string and a JSON string write as they are.
const PLAIN: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0x20;
    while b < 0x7f {
        table[b] = b != b'"' as usize && b != b'\\' as usize;
        b += 1;
    }
    table
};

/// Whether every byte of `s` is [`PLAIN`]: then it is written as it is.
fn plain(s: &str) -> bool {
    s.bytes().all(|b| PLAIN[usize::from(b)])
}

/// `bytes` as 32 lowercase hex digits, as a `u128`'s `{:032x}` writes
/// them (a trace id's `Display`), without the formatting machinery.
fn hex(out: &mut impl fmt::Write, bytes: &[u8; 16]) -> fmt::Result {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 32];
    for (i, b) in bytes.iter().enumerate() {
        text[2 * i] = DIGITS[usize::from(b >> 4)];
        text[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
    out.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
}

/// The message and fields of a line as text: what a `tracing` event of the
/// access target carries when no sink is installed.
struct Fields<'a>(&'a Line<'a>);

impl fmt::Display for Fields<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MESSAGE)?;
        fields(f, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    fn sample(refresh: bool) -> Line<'static> {
        Line {
            level: Level::INFO,
            request_id: "r-1",
            trace_id: 0x4bf92f3577b34da6a3ce929d0e0e4736_u128.to_be_bytes(),
            team: "al\"pha",
            app: None,
            method: "GET",
            route: "permits_search",
            status: 200,
            answer: &Answer {
                cache: "hit",
                answered: "held_memory",
                json: "hit\",\"answered\":\"held_memory",
            },
            credits: 7,
            took: Duration::from_micros(12_045),
            refresh,
            budget: None,
            tenant: Some(crate::auth::tenant_of("al\"pha")),
        }
    }

    /// What the gateway's log layer (`super::super::log_layer`, text or
    /// JSON, no colours) writes for the events `emit` logs.
    fn through_tracing(json: bool, emit: impl FnOnce()) -> String {
        let written = Arc::new(Mutex::new(Vec::<u8>::new()));
        let writer = {
            let written = written.clone();
            move || Captured(written.clone())
        };
        let filter = super::super::logged(tracing_subscriber::EnvFilter::new("trace"));
        let layer = super::super::log_layer(writer, json, false, filter);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), emit);
        let bytes = written.lock().unwrap().clone();
        String::from_utf8(bytes).expect("UTF-8")
    }

    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The access event as a `tracing` event with one field per value,
    /// each recorded as `tracing` records that kind of value (the way the
    /// gateway logged it before the line was preformatted).
    fn emit(line: &Line<'_>) {
        let duration_ms = line.took.as_micros() as f64 / 1000.0;
        // A trace id is recorded as the gateway's `Trace` shows it.
        let trace_id = opentelemetry::trace::TraceId::from_bytes(line.trace_id);
        let (request_id, team, method) = (line.request_id, line.team, line.method);
        let (route, status, credits) = (line.route, line.status, line.credits);
        let (cache, answered) = (line.answer.cache, line.answer.answered);
        // An `Option` field is recorded only when `Some`, as ours is written.
        let budget = line.budget;
        macro_rules! event {
            ($level:ident $(, $refresh:ident)?) => {
                tracing::$level!(
                    target: "access",
                    request_id = %request_id,
                    trace_id = %trace_id,
                    team,
                    method = %method,
                    route,
                    status,
                    cache,
                    answered,
                    credits,
                    duration_ms,
                    $($refresh = true,)?
                    budget,
                    "request"
                )
            };
        }
        match (line.level, line.refresh) {
            (Level::ERROR, false) => event!(error),
            (Level::WARN, false) => event!(warn),
            (_, false) => event!(info),
            (Level::ERROR, true) => event!(error, refresh),
            (Level::WARN, true) => event!(warn, refresh),
            (_, true) => event!(info, refresh),
        }
    }

    /// The time `tracing` stamped on a line it wrote, as ours takes it.
    fn stamped(written: &str, json: bool) -> Duration {
        let at = if json {
            let v: serde_json::Value = serde_json::from_str(written).expect("one JSON object");
            v["timestamp"].as_str().expect("a timestamp").to_string()
        } else {
            written.split(' ').next().expect("a timestamp").to_string()
        };
        let at = chrono::DateTime::parse_from_rfc3339(&at).expect("RFC 3339");
        let micros = u64::try_from(at.timestamp_micros()).expect("after 1970");
        Duration::from_micros(micros)
    }

    #[test]
    fn lines_are_byte_for_byte_what_tracings_formatters_write() {
        let awkward = "é \\ \" \n \r \t \u{1} \u{8} \u{c} \u{1f} \u{7f} end";
        let mut lines = vec![sample(false), sample(true)];
        for (level, team, request_id, trace_id) in [
            (Level::WARN, awkward, "id with spaces", u128::MAX),
            // A request id is plain by construction (`request_id_of`).
            (Level::ERROR, "unauthenticated", "a.b:c-d_e", 0xabc),
        ] {
            lines.push(Line {
                level,
                team,
                request_id,
                trace_id: trace_id.to_be_bytes(),
                status: 502,
                answer: &Answer {
                    cache: "bypass",
                    answered: "gateway",
                    json: "bypass\",\"answered\":\"gateway",
                },
                credits: 0,
                took: Duration::from_micros(1_234_567),
                ..sample(false)
            });
        }
        // A budget's 402: `budget` last.
        lines.push(Line {
            status: 402,
            answer: &Answer {
                cache: "bypass",
                answered: "budget_refused",
                json: "bypass\",\"answered\":\"budget_refused",
            },
            credits: 0,
            budget: Some("org"),
            ..sample(false)
        });
        for json in [false, true] {
            for line in &lines {
                let theirs = through_tracing(json, || emit(line));
                let mut ours = String::new();
                format(&mut ours, line, stamped(&theirs, json), json);
                assert_eq!(ours, theirs, "json: {json}");
            }
        }
    }

    #[test]
    fn the_tracing_fallback_prints_the_same_text_line() {
        for line in [sample(false), sample(true)] {
            let theirs = through_tracing(false, || write(&line));
            let mut ours = String::new();
            format(&mut ours, &line, stamped(&theirs, false), false);
            assert_eq!(ours, theirs);
        }
    }

    #[test]
    fn json_lines_parse_and_carry_every_field() {
        let mut out = String::new();
        format(&mut out, &sample(true), Duration::new(1_764_127_965, 1_000), true);
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
        assert!(v.get("budget").is_none(), "only on a budget's 402");
        let refused = Line {
            status: 402,
            budget: Some("app"),
            ..sample(false)
        };
        out.clear();
        format(&mut out, &refused, Duration::new(1_764_127_965, 0), true);
        let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
        assert_eq!(v["budget"], "app");
    }

    #[test]
    fn milliseconds_keep_three_decimals() {
        for (micros, want) in [(0, "0.000"), (5, "0.005"), (10_435, "10.435"), (1_000_000, "1000.000")] {
            let mut out = String::new();
            write_millis(&mut out, Duration::from_micros(micros)).unwrap();
            assert_eq!(out, want);
        }
    }
}
