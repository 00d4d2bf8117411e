//! Cursor pagination: opaque base64url keyset cursors and the page envelope.
//!
//! Every list is served in a fixed order of string keys; a cursor holds the
//! key of the last record sent, and the next page starts strictly after it.
//! So no record is sent twice or skipped, however pages interleave.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Serialize;
use serde_json::{json, Value};

/// Counts above this are reported as `{"value": 10000, "relation": "gte"}`.
pub const COUNT_CAP: usize = 10_000;

pub fn encode(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(json!({ "after": key }).to_string())
}

/// The key inside a cursor, or `None` when it is not one of ours.
pub fn decode(cursor: &str) -> Option<String> {
    let bytes = URL_SAFE_NO_PAD.decode(cursor.trim_end_matches('=')).ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.get("after")?.as_str().map(str::to_owned)
}

/// `total_count` for an exact count, capped Elasticsearch-style.
pub fn total_count(n: usize) -> Value {
    if n > COUNT_CAP {
        json!({"value": COUNT_CAP, "relation": "gte"})
    } else {
        json!({"value": n, "relation": "eq"})
    }
}

#[derive(Serialize)]
pub struct Envelope<T: Serialize> {
    pub items: Vec<T>,
    pub size: usize,
    pub next_cursor: Option<String>,
    pub total_count: Option<Value>,
}

impl<T: Serialize> Envelope<T> {
    pub fn new(items: Vec<T>, next_cursor: Option<String>, total_count: Option<Value>) -> Self {
        Envelope {
            size: items.len(),
            items,
            next_cursor,
            total_count,
        }
    }
}

/// One page of an already ordered `(key, record)` list.
pub fn page<T>(all: Vec<(String, T)>, after: Option<&str>, size: usize) -> (Vec<T>, Option<String>) {
    let start = after.map_or(0, |a| all.partition_point(|(k, _)| k.as_str() <= a));
    let more = all.len() > start + size;
    let mut items: Vec<(String, T)> = all.into_iter().skip(start).take(size).collect();
    let next = if more {
        items.last().map(|(k, _)| encode(k))
    } else {
        None
    };
    (items.drain(..).map(|(_, t)| t).collect(), next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        let c = encode("00ff12ab|x");
        assert_eq!(decode(&c).as_deref(), Some("00ff12ab|x"));
        assert!(!c.contains('='));
        assert_eq!(decode("not a cursor!"), None);
        assert_eq!(decode(&URL_SAFE_NO_PAD.encode("[1,2]")), None);
    }

    #[test]
    fn pages_cover_everything_once() {
        let all: Vec<(String, u32)> = (0..23).map(|i| (format!("{i:03}"), i)).collect();
        let (mut seen, mut after) = (Vec::new(), None::<String>);
        loop {
            let (items, next) = page(all.clone(), after.as_deref(), 5);
            seen.extend(items);
            match next {
                Some(c) => after = decode(&c),
                None => break,
            }
        }
        assert_eq!(seen, (0..23).collect::<Vec<_>>());
    }

    #[test]
    fn count_is_capped() {
        assert_eq!(total_count(10_000)["relation"], "eq");
        assert_eq!(total_count(10_001), json!({"value": 10_000, "relation": "gte"}));
    }
}
