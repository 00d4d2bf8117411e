//! What a reload cannot apply: the settings outside `[[teams]]` that differ
//! between the running config and the file re-read. A reload swaps only
//! the teams (`App::reload`); every other key was built into listeners,
//! pools, the scheduler and the ledger at start-up, so a change to one of
//! them waits for a restart, and the reload says so by key.

use super::Config;
use serde_json::Value;
use std::collections::BTreeMap;

impl Config {
    /// The dotted keys (`upstream.requests_per_minute`) whose value in
    /// `new` differs from this running config's, teams aside; sorted.
    pub fn restart_required(&self, new: &Config) -> Vec<String> {
        let (mut old_keys, mut new_keys) = (BTreeMap::new(), BTreeMap::new());
        flatten("", &without_teams(self), &mut old_keys);
        flatten("", &without_teams(new), &mut new_keys);
        let mut changed: Vec<String> = old_keys
            .keys()
            .chain(new_keys.keys())
            .filter(|k| old_keys.get(*k) != new_keys.get(*k))
            .cloned()
            .collect();
        // Secrets serialize redacted, so they are compared as themselves.
        let secrets = [
            ("upstream.api_key", self.upstream.api_key == new.upstream.api_key),
            ("cache.redis_url", self.cache.redis_url == new.cache.redis_url),
            ("quota.redis_url", self.quota.redis_url == new.quota.redis_url),
            (
                "redis.sentinel_password",
                self.redis.sentinel_password == new.redis.sentinel_password,
            ),
        ];
        changed.extend(secrets.iter().filter(|(_, same)| !same).map(|(k, _)| k.to_string()));
        changed.sort();
        changed.dedup();
        changed
    }
}

fn without_teams(config: &Config) -> Value {
    let mut value = serde_json::to_value(config).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.remove("teams");
    }
    value
}

fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        leaf => {
            out.insert(prefix.to_string(), leaf.clone());
        }
    }
}
