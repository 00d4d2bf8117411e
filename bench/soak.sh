#!/usr/bin/env bash
# The longer soak of RELIABILITY.md: builds the release binaries (as
# bench/run.sh does) and runs bench/soak.py. SOAK_MINUTES (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir="${CARGO_TARGET_DIR:-target}"
cargo build --release --workspace --locked
minutes="${SOAK_MINUTES:-10}"
exec timeout --signal=TERM $((minutes * 60 + 300)) python3 bench/soak.py --bin-dir "$target_dir/release" --minutes "$minutes"
