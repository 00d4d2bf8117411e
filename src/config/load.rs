//! Loading: defaults → file → environment merged by figment, then the typed
//! [`Config`] extracted with every type error and unknown key listed at once.
//! Runs before validation (`validate.rs`), once at start-up and on reload.

use super::{Config, ConfigErrors, Source, DEFAULTS_TOML, DEFAULT_CONFIG_PATH, ENV_PREFIX};
use figment::error::Kind;
use figment::providers::{Env, Format, Toml};
use figment::value::Value;
use figment::Figment;

/// More type errors than any config has keys: the repair loop always ends.
const MAX_TYPE_ERRORS: usize = 256;

pub(super) fn figment_for(source: Source<'_>) -> Result<Figment, ConfigErrors> {
    let mut figment = Figment::from(Toml::string(DEFAULTS_TOML));
    match source {
        Source::File(path) => {
            if !path.is_file() {
                return Err(ConfigErrors(vec![format!(
                    "--config: {} does not exist or is not a file",
                    path.display()
                )]));
            }
            figment = figment.merge(Toml::file(path));
        }
        Source::Default => {
            figment = figment.merge(Toml::file(DEFAULT_CONFIG_PATH));
        }
        Source::Text(text) => figment = figment.merge(Toml::string(text)),
    }
    Ok(figment.merge(Env::prefixed(ENV_PREFIX).split("__")))
}

/// The typed config and every problem met extracting it. Serde stops at the
/// first bad value, so each one is recorded and its key put back to its
/// default (or dropped when it has none) and extraction tried again: the
/// config returned is whole enough to validate, and `None` only when a
/// problem cannot be set aside that way (a file that is not TOML).
pub(super) fn extract(figment: &Figment) -> (Option<Config>, Vec<String>) {
    let mut value = match figment.extract::<Value>() {
        Ok(value) => value,
        Err(e) => return (None, e.into_iter().map(describe).collect()),
    };
    let defaults = Figment::from(Toml::string(DEFAULTS_TOML)).extract::<Value>().ok();
    let mut problems = Vec::new();
    let mut removed: Vec<Vec<String>> = Vec::new();
    let mut config = None;
    for _ in 0..MAX_TYPE_ERRORS {
        match value.deserialize::<Config>() {
            Ok(typed) => {
                config = Some(typed);
                break;
            }
            Err(e) => {
                let mut path = e.path.clone();
                if let Kind::MissingField(field) = &e.kind {
                    path.push(field.to_string());
                    if removed.contains(&path) {
                        // A required key with no default we dropped for its
                        // type: already reported, and nothing can stand in.
                        break;
                    }
                }
                problems.push(describe(e));
                match reset(&mut value, defaults.as_ref(), &path) {
                    Reset::Default => {}
                    Reset::Removed => removed.push(path),
                    Reset::Stuck => break,
                }
            }
        }
    }
    // Serde alone would stop at the first unknown key.
    let _ = serde_ignored::deserialize(&value, |path| {
        problems.push(format!("{path}: unknown key"));
    })
    .map(|_: Config| ());
    (config, problems)
}

enum Reset {
    Default,
    Removed,
    /// Nothing to change: another try would meet the same error.
    Stuck,
}

/// Puts the key at `path` back to its default, or removes it when there is
/// none.
fn reset(value: &mut Value, defaults: Option<&Value>, path: &[String]) -> Reset {
    let Some((last, parents)) = path.split_last() else {
        return Reset::Stuck;
    };
    let default = defaults.and_then(|d| d.find_ref(&path.join("."))).cloned();
    let mut at = value;
    for key in parents {
        at = match at {
            Value::Dict(_, dict) => match dict.get_mut(key) {
                Some(next) => next,
                None => return Reset::Stuck,
            },
            Value::Array(_, items) => match key.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                Some(next) => next,
                None => return Reset::Stuck,
            },
            _ => return Reset::Stuck,
        };
    }
    let Value::Dict(_, dict) = at else {
        return Reset::Stuck;
    };
    match default {
        Some(default) if dict.get(last) != Some(&default) => {
            dict.insert(last.clone(), default);
            Reset::Default
        }
        None if dict.remove(last).is_some() => Reset::Removed,
        _ => Reset::Stuck,
    }
}

/// Figment errors name the key path; keep the message without the profile.
fn describe(e: figment::Error) -> String {
    let path = e.path.join(".");
    let kind = e.kind.to_string();
    if path.is_empty() {
        kind
    } else {
        format!("{path}: {kind}")
    }
}
