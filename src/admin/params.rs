//! The query parameters each `/admin/*` endpoint takes. Any other is a
//! 422 naming it, with the known one nearest to it (as `check-config`
//! names a mistyped key), and so is one given twice: an admin call is
//! acted on only as written (`?routes=x`, one letter too many, once
//! purged everything). Checked before the endpoint runs, so a refused
//! call changes nothing.

use crate::error::{GatewayError, Violation};
use serde_json::Value;

/// The parameters of `POST /admin/cache/purge`: what to purge, one of them.
pub(super) const PURGE: [&str; 4] = ["all", "route", "request", "record"];

/// The parameters an endpoint takes, by path; `None`: no such endpoint.
pub(super) fn taken_by(path: &str) -> Option<&'static [&'static str]> {
    Some(match path {
        "/admin/teams" | "/admin/reload" | "/admin/ledger/backup" => &[],
        "/admin/usage.csv" => &["from", "to"],
        "/admin/cache/purge" => &PURGE,
        _ => return None,
    })
}

/// `query` read against what an endpoint `takes`: every parameter it does
/// not take, and every one given more than once, in one 422.
pub(super) fn check(query: Option<&str>, takes: &[&str]) -> Result<(), GatewayError> {
    let mut seen: Vec<String> = Vec::new();
    let mut violations = Vec::new();
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let value = Value::String(value.into_owned());
        if !takes.contains(&name.as_ref()) {
            let msg = unknown(&name, takes);
            violations.push(Violation::new("extra_forbidden", name.into_owned(), &msg, value, None));
        } else if seen.contains(&name.to_string()) {
            let msg = format!("Parameter `{name}` given more than once: give it once");
            violations.push(Violation::new("value_error", name.into_owned(), &msg, value, None));
        } else {
            seen.push(name.into_owned());
        }
    }
    match violations.is_empty() {
        true => Ok(()),
        false => Err(GatewayError::InvalidQuery(violations)),
    }
}

/// The message for a parameter the endpoint does not take.
fn unknown(name: &str, takes: &[&str]) -> String {
    match crate::config::nearest(name, takes.iter().copied()) {
        Some(near) => format!("Unknown parameter `{name}` (did you mean `{near}`?)"),
        None if takes.is_empty() => format!("Unknown parameter `{name}`: this endpoint takes none"),
        None => format!("Unknown parameter `{name}`: this endpoint takes {}", takes.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a call to `path` with `query` is refused for: (type, parameter).
    fn refused(path: &str, query: &str) -> Vec<(&'static str, String)> {
        let takes = taken_by(path).expect("an endpoint");
        match check(Some(query), takes) {
            Err(GatewayError::InvalidQuery(v)) => v.iter().map(|v| (v.kind, v.param.to_string())).collect(),
            Err(e) => panic!("{e:?}"),
            Ok(()) => Vec::new(),
        }
    }

    #[test]
    fn an_unknown_or_repeated_parameter_is_refused_by_name() {
        let purge = |q| refused("/admin/cache/purge", q);
        assert_eq!(
            purge("routes=contractor_permits"),
            [("extra_forbidden", "routes".into())]
        );
        assert_eq!(purge("request=%2Fv2%2Fpermits%3Fid%3Da"), []);
        assert_eq!(
            refused("/admin/usage.csv", "from=2025-01-01&from=2025-02-01&format=v1"),
            [("value_error", "from".into()), ("extra_forbidden", "format".into())]
        );
        assert_eq!(
            refused("/admin/teams", "verbose=1"),
            [("extra_forbidden", "verbose".into())]
        );
        assert_eq!(taken_by("/admin/nope"), None);
    }

    #[test]
    fn the_nearest_known_parameter_is_suggested_within_a_typo() {
        assert_eq!(
            unknown("routes", &PURGE),
            "Unknown parameter `routes` (did you mean `route`?)"
        );
        assert_eq!(
            unknown("records", &PURGE),
            "Unknown parameter `records` (did you mean `record`?)"
        );
        assert_eq!(
            unknown("everything", &PURGE),
            "Unknown parameter `everything`: this endpoint takes all, route, request, record"
        );
        assert_eq!(unknown("v", &[]), "Unknown parameter `v`: this endpoint takes none");
    }
}
