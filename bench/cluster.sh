#!/usr/bin/env bash
# Redis Cluster against standalone Redis, side by side in one run (about
# two minutes): hit and miss throughput of one gateway on standalone Redis,
# one and three gateways on a 3 + 3 node Redis Cluster. See bench/cluster.py.
#   bench/cluster.sh
# Needs: cargo, python3, wrk, redis-server, redis-cli
#   (Debian: apt-get install -y wrk redis-server).
# Knobs: BENCH_SECS (per wrk run, default 5), BENCH_ROUNDS (default 2),
#   CARGO_TARGET_DIR (default target/); extra arguments go to cluster.py.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in wrk redis-server redis-cli python3; do
  command -v "$tool" >/dev/null || { echo "bench/cluster.sh: $tool is missing (apt-get install wrk redis-server)" >&2; exit 2; }
done
target_dir="${CARGO_TARGET_DIR:-target}"
cargo build --release --workspace --locked
# Bounded: the harness kills its children and gives up after 10 minutes.
exec timeout --signal=TERM 600 python3 bench/cluster.py --bin-dir "$target_dir/release" "$@"
