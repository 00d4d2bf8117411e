#!/usr/bin/env bash
# Builds the permit-gateway container image from this checkout and runs it as
# production does: read-only root filesystem, uid 65532, /readyz 200 in front
# of the upstream simulator, a request answered, SIGTERM drains an in-flight
# request and exits 0. docs/operations.md, "Container image", explains it.
#
#   ops/image.sh          build the image, then run the checks
#   ops/image.sh build    build only
#   ops/image.sh check    run the checks on the image already built
#
# Works without any container registry: when the Dockerfile's base images are
# not on the machine, local stand-ins are made from Debian packages and tagged
# with their names (labelled org.permit-gateway.stand-in; real images are
# never replaced):
#   rust:1-bookworm                        debootstrap minbase + gcc, this
#                                          machine's Rust toolchain, and the
#                                          workspace's crates (`cargo vendor`)
#                                          as an offline registry
#   gcr.io/distroless/cc-debian12:nonroot  libc, libgcc, CA certificates and
#                                          the nonroot user (65532)
# The image build itself runs with no network. Needs root (apt-get, dockerd,
# debootstrap); starts dockerd if none answers, and stops it at the end.
#
# Environment: IMAGE (default permit-gateway:<crate version>), WORK (cache
# of root filesystems and contexts, default /var/tmp/permit-gateway-image).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)"
image="${IMAGE:-permit-gateway:$version}"
work="${WORK:-/var/tmp/permit-gateway-image}"
builder_ref="rust:1-bookworm"
runtime_ref="gcr.io/distroless/cc-debian12:nonroot"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$work"
cleanup=()
on_exit() {
  local i
  for ((i = ${#cleanup[@]} - 1; i >= 0; i--)); do eval "${cleanup[$i]}" || true; done
}
trap on_exit EXIT
say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Polls `$2...` every 0.2 s until it succeeds; fails after $1 seconds.
wait_for() {
  local limit=$1 start=$SECONDS
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS - start < limit)) || return 1
    sleep 0.2
  done
}

ensure_tools() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v curl >/dev/null || missing+=(curl)
  if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# A Docker engine: the running one, else dockerd started here (no bridge or
# iptables: builds run with --network none, the check with --network host).
ensure_engine() {
  docker info >/dev/null 2>&1 && return
  say "starting dockerd (log: $work/dockerd.log)"
  dockerd --iptables=false --bridge=none >"$work/dockerd.log" 2>&1 &
  local pid=$!
  cleanup+=("kill $pid; wait $pid")
  wait_for 60 docker info || die "dockerd did not start: $work/dockerd.log"
}

is_stand_in() { [ -n "$(docker image inspect -f '{{index .Config.Labels "org.permit-gateway.stand-in"}}' "$1" 2>/dev/null)" ]; }
present() { docker image inspect "$1" >/dev/null 2>&1; }

debian_rootfs() {
  local dir="$work/rootfs-bookworm"
  if [ ! -x "$dir/usr/bin/gcc" ]; then
    say "debootstrap bookworm minbase + gcc (a few minutes, once)"
    rm -rf "$dir"
    debootstrap --variant=minbase --include=gcc,libc6-dev,ca-certificates bookworm "$dir" "$mirror" \
      >"$work/debootstrap.log" 2>&1 || die "debootstrap failed: $work/debootstrap.log"
  fi
  printf '%s\n' "$dir"
}

# The builder stand-in: Debian + gcc, the toolchain and an offline registry.
# Rebuilt when Cargo.lock or the toolchain changes (labels say which).
builder_stand_in() {
  local lock rustc_v
  lock="$(sha256sum "$root/Cargo.lock" | cut -c1-16)"
  rustc_v="$(rustc --version | cut -d' ' -f2)"
  if present "$builder_ref"; then
    is_stand_in "$builder_ref" || { say "using the real $builder_ref"; return; }
    local have
    have="$(docker image inspect -f '{{index .Config.Labels "org.permit-gateway.cargo-lock"}} {{index .Config.Labels "org.permit-gateway.rustc"}}' "$builder_ref")"
    [ "$have" = "$lock $rustc_v" ] && return
  fi
  local rootfs ctx sysroot
  rootfs="$(debian_rootfs)"
  if ! present permit-gateway-stand-in/debian:bookworm; then
    tar -C "$rootfs" -c . | docker import - permit-gateway-stand-in/debian:bookworm >/dev/null
  fi
  ctx="$work/builder-context"
  rm -rf "$ctx" && mkdir -p "$ctx"
  sysroot="$(rustc --print sysroot)"
  say "stand-in $builder_ref: rustc $rustc_v, vendored crates of Cargo.lock $lock"
  mkdir "$ctx/rust" && tar -C "$sysroot" --exclude=./share/doc -cf - . | tar -C "$ctx/rust" -xf -
  (cd "$root" && cargo vendor --locked --versioned-dirs -q "$ctx/vendor" >/dev/null)
  cat >"$ctx/config.toml" <<'EOF'
# Offline registry: every crate of Cargo.lock, vendored (ops/image.sh).
[source.crates-io]
replace-with = "vendored-sources"
[source.vendored-sources]
directory = "/usr/local/cargo/vendor"
[net]
offline = true
EOF
  cat >"$ctx/Dockerfile" <<EOF
FROM permit-gateway-stand-in/debian:bookworm
COPY rust /usr/local/rust
COPY vendor /usr/local/cargo/vendor
COPY config.toml /usr/local/cargo/config.toml
ENV CARGO_HOME=/usr/local/cargo \\
    PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL org.permit-gateway.stand-in=builder org.permit-gateway.cargo-lock=$lock org.permit-gateway.rustc=$rustc_v
EOF
  DOCKER_BUILDKIT=0 docker build -q --network none -t "$builder_ref" "$ctx" >/dev/null
  rm -rf "$ctx"
}

# The runtime stand-in: what distroless cc holds that the binary uses.
runtime_stand_in() {
  if present "$runtime_ref"; then
    is_stand_in "$runtime_ref" || say "using the real $runtime_ref"
    return
  fi
  local rootfs dir
  rootfs="$(debian_rootfs)"
  dir="$work/rootfs-runtime"
  say "stand-in $runtime_ref: libc6, libgcc-s1, base-files, CA certificates, uid 65532"
  rm -rf "$dir" && mkdir -p "$dir"/{etc/ssl/certs,home/nonroot,tmp,usr/bin,usr/lib,usr/lib64,usr/sbin}
  for l in bin lib lib64 sbin; do ln -s "usr/$l" "$dir/$l"; done
  dpkg-query --admindir="$rootfs/var/lib/dpkg" -L libc6 libgcc-s1 base-files \
    | sed 's|^/||' | while read -r p; do [ -e "$rootfs/$p" ] && [ ! -d "$rootfs/$p" ] && printf '%s\n' "$p"; done \
    | tar -C "$rootfs" -cf - --no-recursion -T - | tar -C "$dir" -xf - --keep-directory-symlink
  cp "$rootfs/etc/ssl/certs/ca-certificates.crt" "$dir/etc/ssl/certs/"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$dir/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$dir/etc/group"
  printf '%s\n' 'hosts: files dns' >"$dir/etc/nsswitch.conf"
  chown 65532:65532 "$dir/home/nonroot" && chmod 1777 "$dir/tmp"
  tar -C "$dir" -c . | docker import \
    --change 'USER 65532:65532' --change 'WORKDIR /home/nonroot' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    --change 'LABEL org.permit-gateway.stand-in=runtime' - "$runtime_ref" >/dev/null
  rm -rf "$dir"
}

build() {
  ensure_tools
  ensure_engine
  builder_stand_in
  runtime_stand_in
  say "docker build $image (no network; the release build takes minutes)"
  local start=$SECONDS
  DOCKER_BUILDKIT=0 docker build -q --network none -t "$image" "$root" >/dev/null
  say "built $image in $((SECONDS - start)) s: $(docker image inspect -f '{{.Id}} {{.Size}} bytes' "$image")"
}

# shellcheck source=ops/image-check.sh
. "$root/ops/image-check.sh"

case "${1:-all}" in
  build) build ;;
  check) ensure_tools && ensure_engine && check ;;
  all) build && check ;;
  *) die "usage: ops/image.sh [build|check]" ;;
esac
