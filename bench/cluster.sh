#!/usr/bin/env bash
# Replicas on standalone Redis and on Redis Cluster, alone (about two and a
# half minutes): the `replicas` phase of bench/run.py (bench/replicas.py) —
# one, two and three gateways on one redis-server, one and three on a 3 + 3
# node Redis Cluster, the same total load; hits (L1 on and off) and misses.
#   bench/cluster.sh
# The same as `bench/run.sh --only replicas` (the table goes to
# bench/results/latest.md with the other phases' last results).
# Knobs: BENCH_SECS (the phase runs BENCH_SECS / 2 per wrk run, default 8),
#   BENCH_REPLICA_SECS (overrides that), BENCH_ROUNDS (default 2),
#   CARGO_TARGET_DIR; extra arguments go to run.py.
set -euo pipefail
exec "$(dirname "$0")/run.sh" --only replicas "$@"
