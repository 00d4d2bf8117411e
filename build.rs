//! The git commit the binary is built from, for `permit-gateway --version`
//! and `gateway_build_info{commit}`: `BUILD_COMMIT` when set (the image's
//! build has no `.git`: `docker build --build-arg BUILD_COMMIT=$(git
//! rev-parse --short HEAD)`), else `git rev-parse --short HEAD`, else
//! `unknown`. A build without git never fails for it. The result is
//! `GATEWAY_COMMIT` to the compiler: not `PERMIT_GATEWAY_*`, which cargo
//! also sets when it runs the tests, where the config would read it as a
//! key.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=BUILD_COMMIT");
    let commit = std::env::var("BUILD_COMMIT")
        .ok()
        .filter(|c| is_commit(c))
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]).filter(|c| is_commit(c)))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=GATEWAY_COMMIT={commit}");
    // Built again when HEAD moves: its file, the branch it names, the
    // packed refs. Only files that exist (a missing one would rerun this
    // script, and rebuild the crate, on every build).
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
    }
    watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watched.into_iter().flatten() {
        if Path::new(&path).is_file() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

/// A git command's first line of output, when git is there and answers.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.lines().next()?.trim().to_string()).filter(|l| !l.is_empty())
}

/// A short commit: hex digits only, so nothing odd reaches a label.
fn is_commit(text: &str) -> bool {
    (4..=40).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit())
}
