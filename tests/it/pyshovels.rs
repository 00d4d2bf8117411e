//! A real third-party client through the gateway: every public method of the
//! PyPI package `pyshovels` (0.0.2), pointed at the gateway's base URL with a
//! team token, must get its data with no logged error (the client logs every
//! non-200 at ERROR and carries on, so a silent failure would otherwise pass).
//!
//! Needs Python ≥ 3.10 with `pyshovels` installed: `PYSHOVELS_PYTHON` names
//! the interpreter (e.g. a virtualenv's), else `python3`. When
//! `PYSHOVELS_PYTHON` is set (CI sets it) a missing client is a failure;
//! otherwise the test says it skipped, so a machine without Python still runs
//! the rest of the suite.

use crate::support::gateway::{Setup, ALPHA};
use crate::support::sim::{start_sim, unlimited};
use std::process::Command;

fn python() -> String {
    std::env::var("PYSHOVELS_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether the interpreter can import the client.
fn pyshovels_available(python: &str) -> bool {
    Command::new(python)
        .args(["-c", "import pyshovels"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test]
async fn every_public_method_of_pyshovels_works_through_the_gateway() {
    let python = python();
    if !pyshovels_available(&python) {
        assert!(
            std::env::var_os("PYSHOVELS_PYTHON").is_none(),
            "PYSHOVELS_PYTHON={python} cannot import pyshovels"
        );
        eprintln!(
            "SKIPPED: `{python}` cannot import pyshovels; install it (`pip install pyshovels==0.0.2`, \
             Python >= 3.10) and set PYSHOVELS_PYTHON to that interpreter to run this test"
        );
        return;
    }
    let sim = start_sim(unlimited()).await;
    let gw = Setup::new().start(&sim).await;
    let dir = tempfile::tempdir().expect("tmp");
    let samples = dir.path().join("samples.json");
    std::fs::write(&samples, serde_json::to_vec(&sim.samples()).expect("samples json")).expect("write samples");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/pyshovels_drive.py");
    let base = format!("{}/v2", gw.base_url());
    let samples = samples.display().to_string();
    // The client is synchronous: run it off the runtime that serves the gateway.
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args([script, base.as_str(), ALPHA.1, samples.as_str()])
            .output()
            .expect("python runs")
    })
    .await
    .expect("driver task");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "pyshovels through the gateway:\n{stdout}\n{stderr}"
    );
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON summary line");
    assert_eq!(summary["errors"], serde_json::json!([]), "no logged error");
    let counts = summary["counts"].as_object().expect("counts");
    assert!(counts.len() >= 24, "every public method ran: {summary}");
    assert!(
        counts.values().all(|n| n.as_u64() > Some(0)),
        "each found records: {summary}"
    );
    let reached: u64 = sim.stats().by_path.values().sum();
    assert!(
        reached >= counts.len() as u64,
        "the calls reached the upstream through the gateway"
    );
}
