#!/usr/bin/env bash
# Proves the README's set-up on a stock Debian 12: in a fresh Debian root
# (debootstrap, as ops/image.sh does for the image) it runs, exactly as the
# README writes them, the prerequisites block of "Quick start" (apt-get
# install ..., rustup), gets the code with git, then the README's two
# commands: `cargo run --release -- demo` (waits for its banner, sends one
# of its printed curl lines, stops it with Ctrl-C and checks it removed
# its temp directory) and `./test.sh`. Then it checks the tests left the
# root as they found it: no redis-server or prometheus running or enabled
# for a boot, no policy-rc.d left. And it leaves the host as it found it:
# the host's packages, mounts, listening sockets and test services are
# read before anything is done and again at the end, whatever the outcome
# (a debootstrap the script installed is removed again), and a difference
# fails the run.
# Fails at the first step that does, so a prerequisite the README forgets
# fails here.
#
#   ops/fresh-debian.sh                   everything (a full build and every test: long)
#   ops/fresh-debian.sh --deps-only       up to `./test.sh --deps-only` (no test run)
#   ops/fresh-debian.sh --prereqs-only    the prerequisites and the git clone, then a C
#                                         compiler, cargo and curl are checked (no build)
#   ops/fresh-debian.sh --drop PKG        the same with PKG taken out of the README's
#                                         apt-get line: must fail (the check checks itself)
#   ops/fresh-debian.sh --keep            leave the root in $WORK for a look
#
# The code is the checkout's HEAD (committed work only), handed over as a
# git bundle and cloned inside with the root's own git. Needs root
# (debootstrap, chroot, mounts) and the network (Debian mirror, rustup,
# crates.io). Environment: WORK (default /var/tmp/permit-gateway-fresh;
# the debootstrap result is kept there as a tarball, each run starts from a
# fresh copy), DEBIAN_MIRROR, VARIANT (debootstrap variant, default minbase:
# less than a stock install, so what passes here passes there), RUSTUP_URL
# (the rustup installer from another address than sh.rustup.rs),
# LOCAL_CAS (a folder of *.crt: the CAs of a network that intercepts TLS).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${WORK:-/var/tmp/permit-gateway-fresh}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
variant="${VARIANT:-minbase}"
mode=full
drop=""
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --deps-only) mode=deps ;;
    --prereqs-only) mode=prereqs ;;
    --drop) drop="${2:?--drop needs a package name}"; shift ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, mounts)"

# The README's own lines: the sh blocks of "## Quick start" (the
# prerequisites, rustup, the demo) and of "## Tests".
readme_block() {
  awk -v section="$1" '
    /^## / { inside = ($0 == "## " section) }
    inside && /^```sh$/ { code = 1; next }
    inside && /^```$/ { code = 0; next }
    inside && code { print }
  ' "$repo/README.md"
}
prereqs="$(readme_block "Quick start" | grep -v -- '-- demo$')"
demo_cmd="$(readme_block "Quick start" | grep -- '-- demo$')"
test_cmd="$(readme_block "Tests")"
grep -q 'apt-get install' <<<"$prereqs" || die "no apt-get line in the README's Quick start"
[ -n "$demo_cmd" ] && [ "$test_cmd" = "./test.sh" ] || die "README: expected the demo command and ./test.sh"
if [ -n "${RUSTUP_URL:-}" ]; then
  # The same installer from another address, where sh.rustup.rs is not
  # reachable (e.g. https://static.rust-lang.org/rustup/rustup-init.sh).
  prereqs="${prereqs//https:\/\/sh.rustup.rs/$RUSTUP_URL}"
fi
if [ -n "$drop" ]; then
  grep -qw -- "$drop" <<<"$prereqs" || die "--drop $drop: not in the README's apt-get line"
  prereqs="$(sed -E "/apt-get install/ s/ $drop( |$)/ /" <<<"$prereqs")"
  say "dropped $drop: this run must fail"
fi

# The host as found: its packages, its mounts, the ports it listens on and
# the test services it runs (what this script or the tests could leave).
host_state() {
  echo "# packages"
  dpkg-query -W -f '${Package} ${Status}\n' 2>/dev/null | awk '$4 == "installed" { print $1 }' | sort
  echo "# mounts"
  awk '{ print $2 }' /proc/self/mounts | sort
  echo "# listening (tcp, tcp6)"
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" { print $2 }' | sort -u
  echo "# test services running"
  cat /proc/[0-9]*/comm 2>/dev/null | grep -E '^(redis-server|redis-sentinel|prometheus|nginx|permit-gateway|permit-api-sim)$' | sort -u || true
}
host_before="$(host_state)"

installed_debootstrap=0
command -v debootstrap >/dev/null || {
  say "installing debootstrap (removed again at the end)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  installed_debootstrap=1
}

mkdir -p "$work"
dir="$(mktemp -d "$work/root.XXXXXX")"
cleanup() {
  status=$?
  if [ "$keep" -eq 1 ]; then say "kept: $dir"; else rm -rf --one-file-system "$dir"; fi
  if [ "$installed_debootstrap" -eq 1 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq debootstrap >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get autoremove -y -qq >/dev/null 2>&1 || true
  fi
  # Whatever the outcome: the host as it was found, or the run fails.
  if ! changed="$(diff <(printf '%s\n' "$host_before") <(host_state))"; then
    printf 'error: the host is not as found (< before, > after):\n%s\n' "$changed" >&2
    [ "$status" -ne 0 ] || status=1
  else
    say "the host as found: its packages, mounts, listening sockets and test services unchanged"
  fi
  exit "$status"
}
trap cleanup EXIT

# debootstrap once; each run starts from an untouched copy of its result.
pristine="$work/bookworm-$variant.tar"
if [ ! -s "$pristine" ]; then
  say "debootstrap bookworm ($variant) (a few minutes, once; log: $work/debootstrap.log)"
  debootstrap --variant="$variant" bookworm "$dir" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || die "debootstrap failed: $work/debootstrap.log"
  tar -C "$dir" -cf "$pristine.part" . && mv "$pristine.part" "$pristine"
else
  say "a fresh bookworm ($variant) root from $pristine"
  tar -C "$dir" -xf "$pristine"
fi
cp -L /etc/resolv.conf "$dir/etc/resolv.conf"
if [ -n "${LOCAL_CAS:-}" ]; then
  # A network that intercepts TLS: its CAs, as any machine on it has them
  # (Debian's ca-certificates, once the README installs it, adds them).
  mkdir -p "$dir/usr/local/share/ca-certificates"
  cp "$LOCAL_CAS"/*.crt "$dir/usr/local/share/ca-certificates/"
fi
git -C "$repo" bundle create "$dir/root/permit-gateway.bundle" HEAD >/dev/null 2>&1 \
  || die "git bundle of $repo failed"

# One shell in the root: a mount namespace of its own (its /dev and /sys
# mounts are private, gone when it ends, never seen by the host) and a pid
# namespace (the process checks below see only what the root started); as
# root, with nothing but Debian's PATH.
in_root() {
  unshare --mount --pid --fork --mount-proc="$dir/proc" \
    /bin/sh -c 'mount --rbind /dev "$1/dev" && mount --rbind /sys "$1/sys" && shift && exec chroot "$@"' \
    sh "$dir" "$dir" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -euo pipefail -c "$1"
}

say "the README's prerequisites:"
printf '    %s\n' "$prereqs" >&2
in_root "$prereqs" || die "the README's prerequisites failed"

say "getting the code with git"
in_root 'git clone -q /root/permit-gateway.bundle /root/permit-gateway' \
  || die "git clone failed (is git in the prerequisites?)"

if [ "$mode" = prereqs ]; then
  in_root '. "$HOME/.cargo/env"; cc --version | head -n1; cargo --version; curl --version | head -n1
    test -e /etc/ssl/certs/ca-certificates.crt; echo "prerequisites: all there"' \
    || die "a prerequisite is missing after the README's line"
  [ -z "$drop" ] || die "--drop $drop: the prerequisites passed without it"
  say "the README's prerequisites work on a fresh Debian 12 (no build: --prereqs-only)"
  exit 0
fi

say "the README's first command: $demo_cmd (build, then the printed curl line)"
in_root "
  . \"\$HOME/.cargo/env\"
  cd /root/permit-gateway
  log=\$(mktemp)
  $demo_cmd >\"\$log\" 2>&1 &
  pid=\$!
  # A cold release build: ~15 min on 2 idle cores, far more on a busy host.
  for _ in \$(seq 1 10800); do
    grep -q 'Press Ctrl-C to stop' \"\$log\" && break
    kill -0 \$pid 2>/dev/null || { cat \"\$log\"; exit 1; }
    sleep 1
  done
  grep -q 'Press Ctrl-C to stop' \"\$log\" || { cat \"\$log\"; echo 'the demo did not start' >&2; exit 1; }
  line=\$(grep -m1 \"curl -s -H 'X-API-Key: pgw_demo_growth'\" \"\$log\")
  out=\$(eval \"\$line\")
  grep -q '\"items\"' <<<\"\$out\" || { echo \"the demo's curl line answered: \$out\" >&2; exit 1; }
  # Ctrl-C to the gateway itself (cargo only waits for it); no procps yet.
  # (Matched from the start of its command line: this shell's own holds
  # the words too.)
  for p in /proc/[0-9]*; do
    args=\$(tr '\\0' ' ' <\"\$p/cmdline\" 2>/dev/null || true)
    case \"\$args\" in
      /*/target/release/permit-gateway\\ demo\\ * | target/release/permit-gateway\\ demo\\ *) kill -INT \"\${p#/proc/}\" ;;
    esac
  done
  wait \$pid || true
  if ls -d /tmp/permit-gateway-demo-* 2>/dev/null; then echo 'the demo left its temp directory' >&2; exit 1; fi
  echo 'demo: served its curl line, stopped, cleaned up'
" || die "the demo command failed"

if [ "$mode" = deps ]; then
  test_cmd="./test.sh --deps-only"
fi
say "the README's second command: $test_cmd"
in_root "
  . \"\$HOME/.cargo/env\"
  cd /root/permit-gateway
  $test_cmd
" || die "$test_cmd failed"

say "the host as found: no service left running or enabled"
in_root '
  left=$(cat /proc/[0-9]*/comm 2>/dev/null | grep -E "^(redis-server|prometheus)$" || true)
  [ -z "$left" ] || { echo "still running: $left" >&2; exit 1; }
  enabled=$(ls /etc/rc*.d/ 2>/dev/null | grep -E "^S[0-9]+(redis-server|prometheus)$" || true)
  wanted=$(ls /etc/systemd/system/multi-user.target.wants/ 2>/dev/null | grep -E "^(redis-server|prometheus)\.service$" || true)
  [ -z "$enabled$wanted" ] || { echo "enabled at boot: $enabled $wanted" >&2; exit 1; }
  [ ! -e /usr/sbin/policy-rc.d ] || { echo "test.sh left /usr/sbin/policy-rc.d" >&2; exit 1; }
  echo "no test service running or enabled; no policy-rc.d left"
' || die "the tests left the root changed"
if [ -n "$drop" ]; then
  die "--drop $drop: everything passed without it; the README lists a package it does not need"
fi
say "the README works on a fresh Debian 12"
