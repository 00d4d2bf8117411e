//! Query-string parsing with FastAPI/Pydantic-v2 validation semantics.
//!
//! A [`Query`] collects every error of a request (as Pydantic does) in the
//! v2 array shape `{"type","loc":["query",name(,index)],"msg","input"(,"ctx")}`
//! and [`Query::finish`] turns them into one 422. Repeated scalar parameters:
//! the last wins; list parameters take every occurrence; unknown ones are ignored.

use crate::pagination;
use crate::reply::Answer;
use chrono::NaiveDate;
use serde_json::{json, Value};

pub const DEFAULT_SIZE: i64 = 50;

pub struct Query {
    pairs: Vec<(String, String)>,
    errors: Vec<Value>,
}

/// One Pydantic-v2 error object.
pub fn error(kind: &str, loc: Value, msg: &str, input: Value, ctx: Option<Value>) -> Value {
    let mut e = json!({"type": kind, "loc": loc, "msg": msg, "input": input});
    if let Some(ctx) = ctx {
        e["ctx"] = ctx;
    }
    e
}

/// Pydantic's "'a', 'b' or 'c'" rendering of allowed literals.
fn expected(allowed: &[&str]) -> String {
    let quoted: Vec<String> = allowed.iter().map(|a| format!("'{a}'")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.join(""),
    }
}

/// Parses `YYYY-MM-DD` the way pydantic-core's speedate does, with its messages.
pub fn parse_date(s: &str) -> Result<NaiveDate, &'static str> {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if b.len() < 10 {
        return Err("input is too short");
    }
    if !digits(0..4) {
        return Err("invalid character in year");
    }
    if b[4] != b'-' || b[7] != b'-' {
        return Err("invalid date separator, expected `-`");
    }
    if !digits(5..7) {
        return Err("invalid character in month");
    }
    if !digits(8..10) {
        return Err("invalid character in day");
    }
    if b.len() > 10 {
        return Err("unexpected extra characters at the end of the input");
    }
    let num = |r: std::ops::Range<usize>| s[r].parse::<u32>().unwrap_or(0);
    let (y, m, d) = (num(0..4) as i32, num(5..7), num(8..10));
    if !(1..=12).contains(&m) {
        return Err("month value is outside expected range of 1-12");
    }
    NaiveDate::from_ymd_opt(y, m, d).ok_or("day value is outside expected range")
}

/// Pydantic's lax boolean strings.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" | "t" | "y" => Some(true),
        "false" | "0" | "no" | "off" | "f" | "n" => Some(false),
        _ => None,
    }
}

impl Query {
    pub fn parse(raw: Option<&str>) -> Query {
        let pairs = form_urlencoded::parse(raw.unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Query {
            pairs,
            errors: Vec::new(),
        }
    }

    fn last(&self, name: &str) -> Option<String> {
        self.pairs.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    fn all(&self, name: &str) -> Vec<String> {
        self.pairs
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn push(&mut self, e: Value) {
        self.errors.push(e);
    }

    fn missing(&mut self, name: &str) {
        self.push(error(
            "missing",
            json!(["query", name]),
            "Field required",
            Value::Null,
            None,
        ));
    }

    pub fn required_str(&mut self, name: &str) -> Option<String> {
        let v = self.last(name);
        if v.is_none() {
            self.missing(name);
        }
        v
    }

    /// An optional string with Pydantic's length constraints.
    pub fn opt_str(&mut self, name: &str, min: Option<usize>, max: Option<usize>) -> Option<String> {
        let v = self.last(name)?;
        let n = v.chars().count();
        let loc = json!(["query", name]);
        if let Some(min) = min.filter(|m| n < *m) {
            let s = if min == 1 { "" } else { "s" };
            let msg = format!("String should have at least {min} character{s}");
            self.push(error(
                "string_too_short",
                loc,
                &msg,
                json!(v),
                Some(json!({"min_length": min})),
            ));
            return None;
        }
        if let Some(max) = max.filter(|m| n > *m) {
            let msg = format!("String should have at most {max} characters");
            self.push(error(
                "string_too_long",
                loc,
                &msg,
                json!(v),
                Some(json!({"max_length": max})),
            ));
            return None;
        }
        Some(v)
    }

    pub fn required_date(&mut self, name: &str) -> Option<NaiveDate> {
        let v = self.required_str(name)?;
        match parse_date(&v) {
            Ok(d) => Some(d),
            Err(why) => {
                let msg = format!("Input should be a valid date or datetime, {why}");
                let ctx = json!({ "error": why });
                self.push(error(
                    "date_from_datetime_parsing",
                    json!(["query", name]),
                    &msg,
                    json!(v),
                    Some(ctx),
                ));
                None
            }
        }
    }

    /// An optional integer with optional `ge`/`le` bounds.
    pub fn opt_int(&mut self, name: &str, ge: Option<i64>, le: Option<i64>) -> Option<i64> {
        let v = self.last(name)?;
        let loc = json!(["query", name]);
        let Ok(n) = v.trim().parse::<i64>() else {
            let msg = "Input should be a valid integer, unable to parse string as an integer";
            self.push(error("int_parsing", loc, msg, json!(v), None));
            return None;
        };
        if let Some(ge) = ge.filter(|g| n < *g) {
            let msg = format!("Input should be greater than or equal to {ge}");
            self.push(error(
                "greater_than_equal",
                loc,
                &msg,
                json!(v),
                Some(json!({"ge": ge})),
            ));
            return None;
        }
        if let Some(le) = le.filter(|l| n > *l) {
            let msg = format!("Input should be less than or equal to {le}");
            self.push(error("less_than_equal", loc, &msg, json!(v), Some(json!({"le": le}))));
            return None;
        }
        Some(n)
    }

    pub fn opt_bool(&mut self, name: &str) -> Option<bool> {
        let v = self.last(name)?;
        let b = parse_bool(&v);
        if b.is_none() {
            let msg = "Input should be a valid boolean, unable to interpret input";
            self.push(error("bool_parsing", json!(["query", name]), msg, json!(v), None));
        }
        b
    }

    /// A required single literal (e.g. `geo_type`).
    pub fn required_enum(&mut self, name: &str, allowed: &[&str]) -> Option<String> {
        let v = self.required_str(name)?;
        if allowed.contains(&v.as_str()) {
            return Some(v);
        }
        self.literal_error(json!(["query", name]), &v, allowed);
        None
    }

    fn literal_error(&mut self, loc: Value, v: &str, allowed: &[&str]) {
        let exp = expected(allowed);
        let msg = format!("Input should be {exp}");
        self.push(error(
            "literal_error",
            loc,
            &msg,
            json!(v),
            Some(json!({"expected": exp})),
        ));
    }

    /// A repeatable parameter; with `allowed`, each item must be one of them.
    pub fn list(&mut self, name: &str, allowed: Option<&[&str]>, max_items: Option<usize>) -> Vec<String> {
        let values = self.all(name);
        if let Some(max) = max_items.filter(|m| values.len() > *m) {
            let msg = format!(
                "List should have at most {max} items after validation, not {}",
                values.len()
            );
            let ctx = json!({"field_type": "List", "max_length": max, "actual_length": values.len()});
            self.push(error(
                "too_long",
                json!(["query", name]),
                &msg,
                json!(values),
                Some(ctx),
            ));
            return Vec::new();
        }
        if let Some(allowed) = allowed {
            for (i, v) in values.iter().enumerate() {
                if !allowed.contains(&v.as_str()) {
                    self.literal_error(json!(["query", name, i]), v, allowed);
                }
            }
        }
        values
    }

    /// `size`: 1..=100, default 50.
    pub fn size(&mut self) -> usize {
        self.opt_int("size", Some(1), Some(100)).unwrap_or(DEFAULT_SIZE) as usize
    }

    /// The decoded `cursor` key, or an error for a malformed one.
    pub fn cursor(&mut self) -> Option<String> {
        let raw = self.last("cursor").filter(|c| !c.is_empty())?;
        let key = pagination::decode(&raw);
        if key.is_none() {
            let ctx = json!({"error": "Invalid cursor"});
            let msg = "Value error, Invalid cursor";
            self.push(error(
                "value_error",
                json!(["query", "cursor"]),
                msg,
                json!(raw),
                Some(ctx),
            ));
        }
        key
    }

    pub fn has(&self, name: &str) -> bool {
        self.pairs.iter().any(|(k, _)| k == name)
    }

    /// `Err(422)` with every error collected so far.
    pub fn finish(&mut self) -> Result<(), Answer> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(Answer::validation(std::mem::take(&mut self.errors)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_fail_like_pydantic() {
        assert_eq!(parse_date("2024-01"), Err("input is too short"));
        assert_eq!(parse_date("01-01-2025"), Err("invalid character in year"));
        assert_eq!(
            parse_date("2024-13-01"),
            Err("month value is outside expected range of 1-12")
        );
        assert!(parse_date("2024-02-29").is_ok());
    }

    #[test]
    fn collects_every_error_and_last_scalar_wins() {
        let mut q = Query::parse(Some("size=5&size=0&permit_status=x&permit_status=final"));
        q.size();
        q.list("permit_status", Some(&["final", "active"]), Some(4));
        q.required_str("geo_id");
        let Err(answer) = q.finish() else {
            panic!("expected 422")
        };
        let v: Value = serde_json::from_slice(&answer.body).expect("json");
        let types: Vec<&str> = v["detail"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["type"].as_str())
            .collect();
        assert_eq!(types, ["greater_than_equal", "literal_error", "missing"]);
        assert_eq!(v["detail"][1]["loc"], json!(["query", "permit_status", 0]));
    }
}
