//! Secret scanning over the whole suite: every reply the test client reads
//! and every log line an in-process gateway writes is checked for the
//! upstream key and every team or admin token the tests use. A hit fails the
//! test that sees it (and every later reply check, so it cannot go unseen).

use std::io::Write;
use std::sync::{Mutex, OnceLock};

/// The simulator's default upstream key and every token in the harness.
fn secrets() -> &'static Mutex<Vec<String>> {
    static SECRETS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    SECRETS.get_or_init(|| {
        let mut known = vec![permit_api_sim::SimConfig::default().api_key];
        known.extend(super::gateway::ALL_TOKENS.iter().map(|t| t.to_string()));
        Mutex::new(known)
    })
}

fn leaks() -> &'static Mutex<Vec<String>> {
    static LEAKS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    LEAKS.get_or_init(Mutex::default)
}

/// Adds a secret a test made up (a custom upstream key, say).
pub fn register(secret: &str) {
    secrets().lock().expect("secrets lock").push(secret.to_string());
}

/// The secret `text` contains, if any.
pub fn find_secret(text: &str) -> Option<String> {
    secrets()
        .lock()
        .expect("secrets lock")
        .iter()
        .find(|s| text.contains(s.as_str()))
        .cloned()
}

/// Panics when `text` carries a secret, or when any log line did before.
pub fn assert_clean(text: &str, what: &str) {
    if let Some(secret) = find_secret(text) {
        panic!(
            "a secret ({}…) leaked in {what}: {text}",
            &secret[..6.min(secret.len())]
        );
    }
    let leaked = leaks().lock().expect("leaks lock");
    assert!(leaked.is_empty(), "a secret leaked in a log line: {:?}", *leaked);
}

/// Log lines of in-process gateways go through here.
struct ScanningWriter;

impl Write for ScanningWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        if find_secret(&line).is_some() {
            leaks().lock().expect("leaks lock").push(line.into_owned());
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the scanning log subscriber for this test process (once), at
/// debug level so that even detailed lines are checked.
pub fn capture_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("debug,h2=info,hyper=info,rustls=info")
            .with_writer(|| ScanningWriter)
            .try_init();
    });
}
