//! Values that must never be printed: the upstream key, Redis URLs with
//! their passwords.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A value that must never be printed: Debug and Serialize redact it.
///
/// Redis URLs are secrets too: they may carry a password.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub(crate) struct Secret(String);

impl Secret {
    pub(super) fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself; call sites are the only places it is used.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

impl Secret {
    /// A URL's parts that are no secret (scheme, user, hosts, ports,
    /// database, service), its password `<redacted>`: what `check-config`
    /// and the start-up line show of a Redis URL.
    pub(crate) fn url_redacted(&self) -> String {
        let url = self.expose();
        let Some((scheme, rest)) = url.split_once("://") else {
            return "<redacted>".into();
        };
        // The userinfo ends at the last '@' before the path.
        let authority_end = rest.find('/').unwrap_or(rest.len());
        match rest[..authority_end].rfind('@') {
            Some(at) => {
                let user = rest[..at].split_once(':').map_or("", |(user, _)| user);
                let password = rest[..at].contains(':') || !user.is_empty();
                let shown = match (user.is_empty(), password) {
                    (_, false) => rest[..at].to_string(),
                    (true, true) => ":<redacted>".to_string(),
                    (false, true) => format!("{user}:<redacted>"),
                };
                format!("{scheme}://{shown}@{}", &rest[at + 1..])
            }
            None => url.to_string(),
        }
    }
}

/// A Redis URL in the printed config: its password redacted, the rest shown.
pub(super) fn url_redacted<S: serde::Serializer>(url: &Option<Secret>, s: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(url) => s.serialize_some(&url.url_redacted()),
        None => s.serialize_none(),
    }
}
