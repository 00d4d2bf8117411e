//! The config's values that are more than text: each parsed once, by serde
//! while loading, with its error in plain words (`load::describe` puts the
//! key path in front), and written back as the same text by `Serialize`
//! (`check-config`'s printout, the reload's diff). Nothing after loading
//! parses them again: the upstream client joins paths onto [`BaseUrl`]'s
//! parts, the admin port and `auth` compare [`TokenHash`] bytes, telemetry
//! builds its filter from [`LogLevel`]'s directives.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;
use subtle::ConstantTimeEq;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Directive;

/// Deserializes `T` from text through its `FromStr`, whose error is the
/// message; anything but text is refused saying what `expecting` would be.
fn from_text<'de, T, D>(d: D, expecting: &'static str) -> Result<T, D::Error>
where
    T: FromStr<Err = String>,
    D: Deserializer<'de>,
{
    struct Text<T>(&'static str, std::marker::PhantomData<T>);
    impl<T: FromStr<Err = String>> Visitor<'_> for Text<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
            text.parse().map_err(E::custom)
        }
    }
    d.deserialize_str(Text(expecting, std::marker::PhantomData))
}

/// `upstream.base_url`, split once into what every upstream request reuses:
/// the scheme and authority as `http` types, and the base path (without a
/// trailing `/`) the route's `/v2/...` path is appended to.
#[derive(Clone, PartialEq, Eq)]
pub struct BaseUrl {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// `""` or `/prefix`: never ends with `/`.
    path: String,
}

impl BaseUrl {
    /// The upstream URI of `path` (canonical, from `/`) and `query`; `None`
    /// when the two do not make a valid URI path.
    pub(crate) fn join(&self, path: &str, query: Option<&str>) -> Option<http::Uri> {
        let mut path_and_query = String::with_capacity(self.path.len() + path.len() + query.map_or(0, |q| q.len() + 1));
        path_and_query.push_str(&self.path);
        path_and_query.push_str(path);
        if let Some(q) = query {
            path_and_query.push('?');
            path_and_query.push_str(q);
        }
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(http::uri::PathAndQuery::try_from(path_and_query).ok()?);
        http::Uri::from_parts(parts).ok()
    }
}

impl FromStr for BaseUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<BaseUrl, String> {
        let not_a_url = || format!("{text:?} is not an http(s) URL");
        let uri: http::Uri = text.parse().map_err(|_| not_a_url())?;
        let parts = uri.into_parts();
        let (Some(scheme), Some(authority)) = (parts.scheme, parts.authority) else {
            return Err(not_a_url());
        };
        if !matches!(scheme.as_str(), "http" | "https") || authority.host().is_empty() {
            return Err(not_a_url());
        }
        let path_and_query = parts.path_and_query;
        if path_and_query.as_ref().and_then(|p| p.query()).is_some() {
            return Err("must not have a query".into());
        }
        let path = path_and_query.as_ref().map_or("", |p| p.path());
        Ok(BaseUrl {
            scheme,
            authority,
            path: path.trim_end_matches('/').to_string(),
        })
    }
}

impl fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.path)
    }
}

impl fmt::Debug for BaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

impl<'de> Deserialize<'de> for BaseUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<BaseUrl, D::Error> {
        from_text(d, "an http(s) URL like https://api.example.com")
    }
}

impl Serialize for BaseUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A token's SHA-256 (`teams[].token_sha256`, `admin.token_sha256`):
/// written as 64 hex characters, held as its 32 bytes.
///
/// `==` is for comparing configs; a presented token is checked with
/// [`TokenHash::matches`], in constant time.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    /// The hash of `token`: what its `token_sha256` line holds.
    pub fn of(token: &str) -> TokenHash {
        TokenHash(Sha256::digest(token.as_bytes()).into())
    }

    /// Whether `digest` (the SHA-256 of a presented token) is this hash,
    /// in constant time. The bytes are folded into one first: one `subtle`
    /// comparison per team instead of 32 (`ct_eq` on slices guards every
    /// byte; with 50 teams that was 2 µs a request, more than routing and
    /// key normalization together). No branch depends on the bytes.
    pub fn matches(&self, digest: &[u8; 32]) -> subtle::Choice {
        let diff = self.0.iter().zip(digest).fold(0u8, |acc, (x, y)| acc | (x ^ y));
        diff.ct_eq(&0u8)
    }
}

impl From<[u8; 32]> for TokenHash {
    fn from(bytes: [u8; 32]) -> TokenHash {
        TokenHash(bytes)
    }
}

/// The message of a malformed hash, after its key.
const HEX_SHA256: &str = "must be 64 hex characters (the SHA-256 of the token, see `permit-gateway token`)";

impl FromStr for TokenHash {
    type Err = String;

    fn from_str(text: &str) -> Result<TokenHash, String> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).map_err(|_| HEX_SHA256.to_string())?;
        Ok(TokenHash(bytes))
    }
}

impl fmt::Display for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As the hex text it was written as: a hash, never the token.
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

impl<'de> Deserialize<'de> for TokenHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TokenHash, D::Error> {
        from_text(
            d,
            "64 hex characters in quotes (the SHA-256 of the token, see `permit-gateway token`)",
        )
    }
}

impl Serialize for TokenHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `log.level`: a level (`info`), or a level and per-target levels
/// (`info,permit_gateway=debug`), as tracing's filter reads them. Kept as
/// the parsed directives, and as written for printing it back.
///
/// A bare word must be a level: tracing would read `inof` as a target
/// enabled at every level (and everything else off), so a typo is refused
/// here instead of silencing the logs. A target's level is `target=level`.
#[derive(Clone, PartialEq, Eq)]
pub struct LogLevel {
    text: String,
    directives: Vec<Directive>,
}

impl LogLevel {
    /// The filter the log layer applies.
    pub(crate) fn filter(&self) -> tracing_subscriber::EnvFilter {
        self.directives
            .iter()
            .cloned()
            .fold(tracing_subscriber::EnvFilter::default(), |filter, d| {
                filter.add_directive(d)
            })
    }
}

impl From<LevelFilter> for LogLevel {
    fn from(level: LevelFilter) -> LogLevel {
        LogLevel {
            text: level.to_string().to_ascii_lowercase(),
            directives: vec![level.into()],
        }
    }
}

impl FromStr for LogLevel {
    type Err = String;

    fn from_str(text: &str) -> Result<LogLevel, String> {
        let refused = || {
            format!(
                "{text:?} is not a level (off, error, warn, info, debug or trace) \
                 or a filter like \"info,permit_gateway=debug\""
            )
        };
        let mut directives = Vec::new();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            if !part.contains('=') && part.parse::<LevelFilter>().is_err() {
                return Err(refused());
            }
            directives.push(part.parse::<Directive>().map_err(|_| refused())?);
        }
        if directives.is_empty() {
            return Err(refused());
        }
        Ok(LogLevel {
            text: text.to_string(),
            directives,
        })
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl<'de> Deserialize<'de> for LogLevel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<LogLevel, D::Error> {
        from_text(d, "a level in quotes, like \"info\"")
    }
}

impl Serialize for LogLevel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// The forms a `not_after` may take, for its error message.
const NOT_AFTER_FORMS: &str = "write 2026-12-31 or 2026-12-31T00:00:00Z";

/// The key toml's deserializer gives an unquoted TOML date or time as
/// (a one-entry table holding its text): figment keeps that table.
const TOML_DATETIME_KEY: &str = "$__toml_private_datetime";

/// A token's `not_after` (`teams[].not_after`, `teams[].tokens[].not_after`),
/// as an operator writes an end date: a date (`2026-12-31`: the start of
/// that day, UTC), an RFC 3339 time (`2026-12-31T00:00:00Z`, or with an
/// offset), or one without an offset (taken as UTC); quoted, or as a TOML
/// date or date-time. chrono's own reading took only full RFC 3339, and
/// said `premature end of input` of a date.
pub(super) fn not_after<'de, D: Deserializer<'de>>(d: D) -> Result<Option<chrono::DateTime<chrono::Utc>>, D::Error> {
    struct End;
    impl<'de> Visitor<'de> for End {
        type Value = chrono::DateTime<chrono::Utc>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a date: {NOT_AFTER_FORMS}")
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            parse_not_after(text).map_err(E::custom)
        }
        fn visit_map<M: de::MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
            // An unquoted TOML date or date-time: its text under toml's key.
            match map.next_entry::<String, String>()? {
                Some((key, text)) if key == TOML_DATETIME_KEY => parse_not_after(&text).map_err(de::Error::custom),
                _ => Err(de::Error::custom(format!("a table is not a date: {NOT_AFTER_FORMS}"))),
            }
        }
    }
    d.deserialize_any(End).map(Some)
}

/// `text` as a `not_after` ([`not_after`]'s forms), or the error that says
/// what to write.
fn parse_not_after(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    use chrono::{NaiveDate, NaiveDateTime, TimeZone, Utc};
    let text = text.trim();
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    if let Ok(day) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(Utc.from_utc_datetime(&day.and_time(chrono::NaiveTime::MIN)));
    }
    // No offset (a TOML local date-time): UTC, as every other time here.
    for form in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dt%H:%M:%S%.f"] {
        if let Ok(at) = NaiveDateTime::parse_from_str(text, form) {
            return Ok(Utc.from_utc_datetime(&at));
        }
    }
    Err(format!("{text:?} is not a date: {NOT_AFTER_FORMS}"))
}
