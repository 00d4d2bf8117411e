//! Loading: defaults → file → environment merged by figment, then the typed
//! [`Config`] extracted with every type error and unknown key listed at once.
//! Runs before validation (`validate.rs`), once at start-up and on reload.

use super::{Config, ConfigErrors, Source, DEFAULTS_TOML, DEFAULT_CONFIG_PATH, ENV_PREFIX};
use figment::error::Kind;
use figment::providers::{Env, Format, Toml};
use figment::value::Value;
use figment::Figment;
use std::path::{Path, PathBuf};

/// The folder of the file the config is read from, absolute: a relative
/// `quota.path` is taken from there, so `serve` finds the same ledger
/// whichever directory it is started in. `None` without a file.
pub(super) fn config_folder(source: &Source<'_>) -> Option<PathBuf> {
    let file = match source {
        Source::File(path) => path.to_path_buf(),
        Source::Default if Path::new(DEFAULT_CONFIG_PATH).is_file() => PathBuf::from(DEFAULT_CONFIG_PATH),
        _ => return None,
    };
    let folder = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::path::absolute(folder).ok()
}

/// Where a source's configuration comes from, in words, for the start-up
/// log and the no-team warning.
pub(super) fn origin(source: &Source<'_>) -> String {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    match source {
        Source::File(path) => format!("--config {}", absolute(path).display()),
        Source::Default if Path::new(DEFAULT_CONFIG_PATH).is_file() => {
            format!("{} (no --config)", absolute(Path::new(DEFAULT_CONFIG_PATH)).display())
        }
        Source::Default => format!(
            "built-in defaults only: no --config, and no {DEFAULT_CONFIG_PATH} in {}",
            absolute(Path::new(".")).display()
        ),
        Source::Text(_) => "a configuration text (demo or test)".to_string(),
    }
}

/// `path` against `folder` when it is relative (`data/ledger` next to the
/// file), unchanged when absolute.
pub(super) fn resolve(folder: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        folder.join(path)
    }
}

/// Allowed but unwise: an upstream key written into a file, which the
/// docs forbid (files get committed, copied, attached to tickets).
pub(super) fn warnings(figment: &Figment) -> Vec<String> {
    let from_file = figment
        .find_metadata("upstream.api_key")
        .and_then(|m| m.source.as_ref())
        .and_then(|s| s.file_path().map(Path::to_path_buf));
    from_file
        .map(|file| {
            format!(
                "upstream.api_key: the upstream key is written in {}; give it as \
                 PERMIT_GATEWAY_UPSTREAM__API_KEY or in upstream.api_key_file instead, \
                 and keep it out of files that get committed or copied",
                file.display()
            )
        })
        .into_iter()
        .collect()
}

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
    let known = config.as_ref().and_then(|c| serde_json::to_value(c).ok());
    let _ = serde_ignored::deserialize(&value, |path| {
        let mut segments = Vec::new();
        segments_of(&path, &mut segments);
        let guess = known.as_ref().and_then(|k| nearest_key(k, &segments));
        match guess {
            Some(key) => problems.push(format!("{}: unknown key (did you mean `{key}`?)", key_path(&segments))),
            None => problems.push(format!("{}: unknown key", key_path(&segments))),
        }
    })
    .map(|_: Config| ());
    (config, problems)
}

/// The key of the same section nearest to the unknown one at `segments`
/// (a typo's distance: a few letters), from the keys the config has.
fn nearest_key(known: &serde_json::Value, segments: &[String]) -> Option<String> {
    let (unknown, parents) = segments.split_last()?;
    let mut at = known;
    for s in parents {
        at = match at {
            serde_json::Value::Array(items) => items.get(s.parse::<usize>().ok()?)?,
            other => other.get(s)?,
        };
    }
    nearest(unknown, at.as_object()?.keys().map(String::as_str)).map(str::to_string)
}

/// The name among `known` nearest to `unknown`, within a typo's distance
/// (a few letters): the "did you mean" of an unknown config key, and of
/// an unknown parameter of the admin API (`admin::params`).
pub(crate) fn nearest<'k>(unknown: &str, known: impl IntoIterator<Item = &'k str>) -> Option<&'k str> {
    let within = (unknown.len() / 3).max(2);
    known
        .into_iter()
        .map(|k| (strsim::damerau_levenshtein(unknown, k), k))
        .filter(|(d, _)| *d <= within)
        .min()
        .map(|(_, k)| k)
}

enum Reset {
    Default,
    Removed,
    /// Nothing to change: another try would meet the same error.
    Stuck,
}

/// Puts the key at `path` back to its default (or its [`stand_in`]), or
/// removes it when there is none.
fn reset(value: &mut Value, defaults: Option<&Value>, path: &[String]) -> Reset {
    let Some((last, parents)) = path.split_last() else {
        return Reset::Stuck;
    };
    let default = defaults
        .and_then(|d| d.find_ref(&path.join(".")))
        .cloned()
        .or_else(|| stand_in(path));
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

/// A valid value for a key that has no default but must be there for the
/// rest of its table to be checked: a team's `token_sha256` (a team without
/// one could not be read at all, and its name and limits would go
/// unchecked). Used only once the key's problem is recorded, so a config
/// holding a stand-in is never returned as valid. Each is the hash of its
/// own key path: no two teams share one (no "same token" complaint) and no
/// token matches it.
fn stand_in(path: &[String]) -> Option<Value> {
    (path.last()? == "token_sha256").then(|| {
        let hash = super::TokenHash::of(&format!("stand-in for {}", key_path(path)));
        Value::from(hash.to_string())
    })
}

/// The keys of a `serde_ignored` path, outermost first (option and
/// newtype wrappers are no keys a person wrote).
fn segments_of(path: &serde_ignored::Path<'_>, out: &mut Vec<String>) {
    use serde_ignored::Path as P;
    match path {
        P::Root => {}
        P::Seq { parent, index } => {
            segments_of(parent, out);
            out.push(index.to_string());
        }
        P::Map { parent, key } => {
            segments_of(parent, out);
            out.push(key.clone());
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => segments_of(parent, out),
    }
}

/// One spelling of a key path everywhere: `teams[0].name`, as validation
/// writes it.
pub(super) fn key_path(segments: &[String]) -> String {
    let mut out = String::new();
    for s in segments {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{s}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(s);
        }
    }
    out
}

/// Figment errors name the key path; the message in plain words, without
/// serde's type names (`expected usize`) or the profile.
fn describe(e: figment::Error) -> String {
    let mut segments = e.path.clone();
    if let Kind::MissingField(field) = &e.kind {
        segments.push(field.to_string());
    }
    let path = key_path(&segments);
    let kind = plain(&e.kind);
    if path.is_empty() {
        kind
    } else {
        format!("{path}: {kind}")
    }
}

fn plain(kind: &Kind) -> String {
    match kind {
        Kind::Message(m) => m.clone(),
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            format!("{} is not allowed here: expected {}", found(actual), wanted(expected))
        }
        Kind::UnknownVariant(v, options) => format!("{v:?} is not one of {}", one_of(options)),
        Kind::UnknownField(v, _) => format!("{v}: unknown key"),
        Kind::MissingField(_) => "required, and not set".into(),
        Kind::DuplicateField(f) => format!("{f}: given twice"),
        other => other.to_string(),
    }
}

/// What was written, as a person would say it.
fn found(actual: &figment::error::Actual) -> String {
    use figment::error::Actual as A;
    match actual {
        A::Bool(b) => format!("{b}"),
        A::Unsigned(n) => format!("{n}"),
        A::Signed(n) => format!("{n}"),
        A::Float(n) => format!("{n}"),
        A::Char(c) => format!("{c:?}"),
        A::Str(s) => format!("the text {s:?}"),
        A::Seq => "a list".into(),
        A::Map => "a table".into(),
        other => other.to_string(),
    }
}

/// What serde expected (`usize`, `a boolean`, `struct TeamConfig`), in
/// words.
fn wanted(expected: &str) -> String {
    let words = match expected {
        "u8" => "a whole number from 0 to 255",
        "u16" => "a whole number from 0 to 65535",
        "u32" => "a whole number from 0 to 4294967295",
        "u64" | "usize" | "u128" => "a whole number, 0 or more",
        "i8" | "i16" | "i32" | "i64" | "isize" | "i128" => "a whole number",
        "f32" | "f64" => "a number",
        "a boolean" => "true or false",
        "a string" | "path string" | "a borrowed string" => "text in quotes",
        "a sequence" => "a list [...]",
        e if e.starts_with("struct ") || e.starts_with("a map") => "a table",
        e => e,
    };
    words.to_string()
}

fn one_of(options: &[&str]) -> String {
    let quoted: Vec<String> = options.iter().map(|o| format!("`{o}`")).collect();
    match quoted.split_last() {
        None => "nothing".into(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}
