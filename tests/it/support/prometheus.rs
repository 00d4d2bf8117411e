//! Prometheus for tests: the text exposition parsed into samples, `promtool`
//! checks, a real `prometheus` child scraping a gateway (killed on drop), and
//! the queries the shipped dashboards and rules hold.
//!
//! `promtool` and `prometheus` come from Debian's `prometheus` package;
//! `.ci/run` installs it when missing.

use super::client::Client;
use super::free_port;
use super::wait::eventually;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const INSTALL: &str = "install Debian's `prometheus` package (apt-get install prometheus); .ci/run does this";

/// The repository's `dashboards/` folder.
pub fn dashboards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards")
}

/// One sample line of the text exposition.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone)]
pub struct Exposition {
    pub samples: Vec<Sample>,
    /// Names declared by `# TYPE` lines.
    pub families: BTreeSet<String>,
}

impl Exposition {
    pub fn parse(text: &str) -> Exposition {
        let mut samples = Vec::new();
        let mut families = BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some(name) = rest.split_whitespace().next() {
                    families.insert(name.to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            samples.push(parse_sample(line).unwrap_or_else(|| panic!("unparsable sample line: {line}")));
        }
        Exposition { samples, families }
    }

    /// Every sample and family name.
    pub fn names(&self) -> BTreeSet<String> {
        let mut names = self.families.clone();
        names.extend(self.samples.iter().map(|s| s.name.clone()));
        names
    }

    /// The sum of the samples of `name` whose labels include all of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// Like [`Exposition::sum`], but `None` when no sample matches.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = self.matching(name, labels).peekable();
        found.peek()?;
        Some(found.map(|s| s.value).sum())
    }

    pub fn matching<'a>(&'a self, name: &'a str, labels: &'a [(&str, &str)]) -> impl Iterator<Item = &'a Sample> {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let Some(open) = line.find('{') else {
        let (name, value) = line.split_once(' ')?;
        return Some(Sample {
            name: name.into(),
            labels: BTreeMap::new(),
            value: parse_value(value)?,
        });
    };
    let chars: Vec<char> = line[open + 1..].chars().collect();
    let mut i = 0;
    let mut labels = BTreeMap::new();
    // key="value" pairs separated by commas, up to the closing brace.
    loop {
        while chars.get(i).is_some_and(|c| *c == ',' || *c == ' ') {
            i += 1;
        }
        if *chars.get(i)? == '}' {
            i += 1;
            break;
        }
        let start = i;
        while *chars.get(i)? != '=' {
            i += 1;
        }
        let key: String = chars[start..i].iter().collect();
        if *chars.get(i + 1)? != '"' {
            return None;
        }
        i += 2;
        let mut value = String::new();
        loop {
            let c = *chars.get(i)?;
            i += 1;
            match c {
                '\\' => {
                    let escaped = *chars.get(i)?;
                    i += 1;
                    value.push(if escaped == 'n' { '\n' } else { escaped });
                }
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key, value);
    }
    let rest: String = chars[i..].iter().collect();
    Some(Sample {
        name: line[..open].into(),
        labels,
        value: parse_value(rest.trim())?,
    })
}

fn parse_value(v: &str) -> Option<f64> {
    match v.split_whitespace().next()? {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        n => n.parse().ok(),
    }
}

/// `gateway_[a-z_]+` names in a text (dashboards, rules).
pub fn gateway_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("gateway_") {
        let before = rest[..i].chars().last();
        let tail = &rest[i..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        // Part of a longer identifier (`permit_gateway_x`) is not a name.
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            names.insert(tail[..len].trim_end_matches('_').to_string());
        }
        rest = &tail[len.max(1)..];
    }
    names
}

fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| panic!("`{name}` not found on PATH: {INSTALL}"))
}

/// Runs promtool with `args` (and `stdin`); returns (success, stdout + stderr).
pub fn promtool(args: &[&str], stdin: Option<&[u8]>) -> (bool, String) {
    let mut child = Command::new(tool("promtool"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run promtool ({e}): {INSTALL}"));
    let mut input = child.stdin.take().expect("stdin piped");
    if let Some(bytes) = stdin {
        input.write_all(bytes).expect("write promtool stdin");
    }
    drop(input);
    let out = child.wait_with_output().expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Percent-encodes a query parameter value.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A real Prometheus server on loopback; killed when dropped.
pub struct Prometheus {
    child: Child,
    dir: tempfile::TempDir,
    pub url: String,
}

impl Prometheus {
    /// Starts `prometheus` scraping `target` (host:port) every second and
    /// evaluating `rules` every second, and waits until it is ready.
    pub async fn start(target: &str, rules: &Path) -> Prometheus {
        let dir = tempfile::tempdir().expect("tmp");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules:?}\n\
                 scrape_configs:\n  - job_name: permit-gateway\n    static_configs:\n      - targets: [{target:?}]\n",
            ),
        )
        .expect("write prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start prometheus ({e}): {INSTALL}"));
        let prom = Prometheus {
            child,
            dir,
            url: format!("http://127.0.0.1:{port}"),
        };
        let api = Client::anonymous(&prom.url);
        prom.wait_for("Prometheus ready", Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() && api.get("/-/ready").await.status == 200
        })
        .await;
        prom
    }

    /// Polls `check` every 100 ms until true; panics with the log after `limit`.
    pub async fn wait_for<F, Fut>(&self, what: &str, limit: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        eventually(what, limit, || {
            let held = check();
            async move {
                match held.await {
                    true => Ok(()),
                    false => Err(format!("\n{}", self.log())),
                }
            }
        })
        .await
    }

    /// An instant query: `Ok(result)` (the vector, matrix or scalar), or the
    /// error Prometheus gave.
    pub async fn query(&self, expr: &str) -> Result<Value, String> {
        let reply = Client::anonymous(&self.url)
            .get(format!("/api/v1/query?query={}", encode(expr)))
            .await;
        let v: Value = serde_json::from_slice(&reply.body).map_err(|e| format!("{e}: {}", reply.text()))?;
        if v["status"] == "success" {
            Ok(v["data"]["result"].clone())
        } else {
            Err(format!("{}: {}", v["errorType"], v["error"]))
        }
    }

    /// A GET on the HTTP API, its `data`.
    pub async fn api(&self, path: &str) -> Value {
        let reply = Client::anonymous(&self.url).get(format!("/api/v1/{path}")).await;
        let v = reply.json();
        assert_eq!(v["status"], "success", "{path}: {v}");
        v["data"].clone()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether a query result holds data: a non-empty vector or matrix, or a scalar.
pub fn has_data(result: &Value) -> bool {
    match result {
        Value::Array(items) => !items.is_empty(),
        Value::Null => false,
        _ => true,
    }
}

/// A panel query of a dashboard.
#[derive(Debug, Clone)]
pub struct PanelQuery {
    pub dashboard: String,
    pub panel: String,
    pub expr: String,
}

/// Every target expression of every panel (rows included) of a dashboard.
pub fn panel_queries(file: &Path) -> Vec<PanelQuery> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let dash: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", file.display()));
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dash["panels"]
        .as_array()
        .map(|p| p.iter().collect())
        .unwrap_or_default();
    while let Some(panel) = stack.pop() {
        if let Some(inner) = panel["panels"].as_array() {
            stack.extend(inner);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push(PanelQuery {
                    dashboard: name.clone(),
                    panel: panel["title"].as_str().unwrap_or("?").to_string(),
                    expr: expr.to_string(),
                });
            }
        }
    }
    out
}

/// A Grafana expression with its variables replaced for Prometheus:
/// `team` by `team`, `route` by every route (Grafana's "All"), intervals and
/// ranges by `interval`.
pub fn substitute(expr: &str, team: &str, interval: &str) -> String {
    expr.replace("${team}", team)
        .replace("$team", team)
        .replace("${route}", ".*")
        .replace("$route", ".*")
        .replace("$__rate_interval", interval)
        .replace("$__interval", interval)
        .replace("$__range", interval)
}
