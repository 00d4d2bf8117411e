#!/usr/bin/env bash
# The one test command, on a fresh Debian machine with only the Rust
# toolchain: installs what the tests need when it is missing, then runs
# every test (`cargo test --workspace --locked`, plus any arguments given:
# `./test.sh --test it trace_context`). CI (.ci/run) runs exactly this.
#
#   ./test.sh              install what is missing, run every test
#   ./test.sh --deps-only  install what is missing, run nothing
#
# What the tests start for real: redis-server (and redis-cli; standalone,
# Cluster, TLS and Sentinel suites), prometheus and promtool (the
# observability suite), `kill` (procps: signals to the gateway binary), and
# the third-party `pyshovels` client in a venv of its own (python3-venv).
# apt-get needs root: as another user, a missing package stops the script
# with the line to run.
set -euo pipefail
cd "$(dirname "$0")"

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing+=(prometheus)
command -v kill >/dev/null 2>&1 || missing+=(procps)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# `python3 -m venv` needs ensurepip, which Debian ships apart.
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
if [ "${#missing[@]}" -gt 0 ]; then
  install=(apt-get install -y -qq --no-install-recommends "${missing[@]}")
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: the tests need: ${missing[*]}; install them as root, then run ./test.sh again:" >&2
    echo "  apt-get update && ${install[*]}" >&2
    exit 1
  fi
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  "${install[@]}" >/dev/null
  hash -r
fi

# The third-party client the pyshovels test drives through the gateway
# (pulls in pandas: a venv of its own, kept between runs). Setting
# PYSHOVELS_PYTHON makes that test fail, not skip, when the client cannot
# be imported.
tools="${PERMIT_GATEWAY_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/permit-gateway-ci}"
pyshovels_version=0.0.2
pyvenv="$tools/pyshovels"
if ! "$pyvenv/bin/python" -c "import pyshovels" 2>/dev/null; then
  echo "installing: pyshovels $pyshovels_version (venv $pyvenv)"
  mkdir -p "$tools"
  python3 -m venv "$pyvenv"
  "$pyvenv/bin/pip" install -q --disable-pip-version-check "pyshovels==$pyshovels_version"
fi
export PYSHOVELS_PYTHON="$pyvenv/bin/python"

if [ "${1:-}" = "--deps-only" ]; then
  exit 0
fi
exec cargo test --workspace --locked "$@"
