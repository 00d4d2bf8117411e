#!/usr/bin/env bash
# The one test command, on a fresh Debian machine with the README's
# prerequisites (build-essential ca-certificates curl git, Rust through
# rustup): installs what the tests need when it is missing, then runs
# every test (`cargo test --workspace --locked`, plus any arguments given:
# `./test.sh --test it trace_context`). CI (.ci/run) runs exactly this.
#
#   ./test.sh              install what is missing, run every test
#   ./test.sh --deps-only  install what is missing, run nothing
#
# What the build needs: a C compiler and linker (`cc`: ring and mimalloc
# build C; gcc and libc6-dev when missing). What the tests start for real:
# redis-server (and redis-cli; standalone, Cluster, TLS and Sentinel
# suites), prometheus and promtool (the observability suite), `kill`
# (procps: signals to the gateway binary), and the third-party `pyshovels`
# client in a venv of its own (python3-venv). apt-get needs root: as
# another user, a missing package stops the script with the line to run.
#
# The host is left as it was found: packages are installed with their
# services neither enabled nor started. Debian's prometheus and
# redis-server packages would otherwise start system services at once
# (prometheus then holds :9090, the gateway's default admin port); the
# tests start their own, on free ports.
set -euo pipefail
cd "$(dirname "$0")"

missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v curl >/dev/null 2>&1 || missing+=(curl)
[ -e /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing+=(prometheus)
# `type -P`, not `command -v`: bash has a `kill` builtin, and the tests run
# /bin/kill (procps), which a minimal Debian lacks (found by
# ops/fresh-debian.sh).
type -P kill >/dev/null 2>&1 || missing+=(procps)
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
  echo "installing: ${missing[*]} (their services neither enabled nor started)"
  export DEBIAN_FRONTEND=noninteractive
  # invoke-rc.d asks /usr/sbin/policy-rc.d before it starts a service;
  # 101 is "action forbidden". Ours only while apt-get runs; one that was
  # there before is put back.
  policy=/usr/sbin/policy-rc.d
  saved=""
  if [ -e "$policy" ]; then
    saved="$(mktemp)"
    cp -p "$policy" "$saved"
  fi
  restore_policy() {
    if [ -n "$saved" ]; then mv -f "$saved" "$policy"; else rm -f "$policy"; fi
  }
  trap restore_policy EXIT
  printf '#!/bin/sh\n# test.sh: no service starts while packages are installed\nexit 101\n' >"$policy"
  chmod 0755 "$policy"
  apt-get update -qq
  "${install[@]}" >/dev/null
  restore_policy
  trap - EXIT
  # Packages also enable their units for the next boot (and, where systemd
  # runs, a deb-systemd-invoke outside invoke-rc.d may have started one):
  # disable (and, where systemd runs, stop) those of the packages installed
  # here; a service the host had before is none of ours.
  # Without systemctl (a container, a chroot), the boot links the
  # packages made are removed by Debian's own helpers.
  for pkg in prometheus redis-server; do
    [[ " ${missing[*]} " == *" $pkg "* ]] || continue
    unit="$pkg.service"
    if command -v systemctl >/dev/null 2>&1; then
      now=()
      [ -d /run/systemd/system ] && now=(--now)
      systemctl disable "${now[@]}" "$unit" >/dev/null 2>&1 || true
      echo "disabled $unit${now:+ and stopped it} (the tests start their own)"
    else
      command -v deb-systemd-helper >/dev/null 2>&1 && deb-systemd-helper disable "$unit" >/dev/null 2>&1 || true
      [ -e "/etc/init.d/$pkg" ] && update-rc.d "$pkg" disable >/dev/null 2>&1 || true
      echo "disabled $pkg at boot (the tests start their own)"
    fi
  done
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
command -v cargo >/dev/null 2>&1 || {
  echo "test.sh: cargo not found: install Rust through rustup (the README's Quick start)" >&2
  exit 1
}
exec cargo test --workspace --locked "$@"
