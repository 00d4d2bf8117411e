#!/usr/bin/env bash
# The whole benchmark comparison in one command (under 10 minutes):
#   bench/run.sh
# Builds the workspace in release mode, then runs bench/run.py, which starts
# the simulator, the gateway, nginx proxy_cache, redis-server and the hyper
# ceiling on loopback ports, measures with wrk, and writes the markdown table
# to bench/results/latest.md (raw numbers in latest.json).
#
# Needs: cargo, python3, wrk, nginx, varnish, redis-server (Debian:
#   apt-get install -y wrk nginx varnish redis-server).
# Knobs: BENCH_SECS (per wrk run, default 8), BENCH_ROUNDS (default 2),
#   CARGO_TARGET_DIR (default target/); extra arguments go to run.py
#   (e.g. --only hit credits).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in wrk nginx varnishd redis-server redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "bench/run.sh: $tool is missing (apt-get install wrk nginx varnish redis-server)" >&2; exit 2; }
done
target_dir="${CARGO_TARGET_DIR:-target}"
cargo build --release --workspace --locked
# Bounded: the harness kills its children and gives up after 10 minutes.
exec timeout --signal=TERM 600 python3 bench/run.py --bin-dir "$target_dir/release" "$@"
