# shellcheck shell=bash disable=SC2154  # root, work, image, cleanup: set by ops/image.sh
# The run checks of ops/image.sh (sourced by it): the built image, started as
# production starts it, in front of the upstream simulator on this host.
#   - read-only root filesystem, all capabilities dropped, no new privileges;
#   - the process runs as uid 65532;
#   - /readyz answers 200, a team request is answered and reaches the
#     simulator, a second one is a cache hit;
#   - SIGTERM: an in-flight request still gets its 200 and the container
#     exits 0.

# The admin address from the gateway's "serving" log line (it binds port 0).
serving_addr() {
  docker logs "$1" 2>&1 | grep -m1 'permit-gateway serving' | jq -er ".$2"
}

http_status() { curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$@"; }

# Polled by wait_for: each call asks again ($admin, $sim_url: check's locals).
ready() { [ "$(http_status "$admin/readyz")" = 200 ]; }
sim_saw() { [ "$(curl -s "$sim_url/_sim/stats" | jq -r .requests_total)" = "$1" ]; }
# A team connection is open (the simulator counts a request only once it answers).
in_flight() { curl -s "$admin/metrics" | awk '$1 == "gateway_open_connections" && $2 >= 1 { ok = 1 } END { exit !ok }'; }

check() {
  local run="$work/run" sim_pid sim_url cid admin listen token sha key="image-check-upstream-key"
  rm -rf "$run" && mkdir -p "$run"
  say "simulator on the host (cargo build --release -p permit-api-sim)"
  (cd "$root" && cargo build --release --locked -q -p permit-api-sim)
  # Slow on purpose: a request is still in flight when SIGTERM comes.
  "$root/target/release/permit-api-sim" --listen 127.0.0.1:0 --api-key "$key" \
    --requests-per-minute 0 --latency-ms 1500 >"$run/sim.out" 2>"$run/sim.log" &
  sim_pid=$!
  cleanup+=("kill $sim_pid")
  wait_for 30 test -s "$run/sim.out" || die "simulator did not start: $run/sim.log"
  sim_url="$(head -n1 "$run/sim.out")"
  [[ "$sim_url" == http://* ]] || sim_url="http://$sim_url"

  # A team token made by the image itself.
  docker run --rm --network none "$image" token >"$run/token.txt" 2>/dev/null
  token="$(awk '/^token:/ {print $2}' "$run/token.txt")"
  sha="$(sed -n 's/^token_sha256 = "\(.*\)"$/\1/p' "$run/token.txt")"
  if [ -z "$token" ] || [ -z "$sha" ]; then die "permit-gateway token printed no token: $(cat "$run/token.txt")"; fi
  cat >"$run/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
shutdown_grace_secs = 20

[upstream]
base_url = "$sim_url"

[quota]
store = "file"
path = "/var/lib/permit-gateway/ledger"

[log]
format = "json"

[[teams]]
name = "image-check"
token_sha256 = "$sha"
EOF
  chmod 0644 "$run/gateway.toml"

  say "docker run --read-only --cap-drop ALL $image"
  cid="$(docker run -d --network host --read-only --cap-drop ALL --security-opt no-new-privileges \
    -e PERMIT_GATEWAY_UPSTREAM__API_KEY="$key" \
    -v "$run/gateway.toml:/etc/permit-gateway/gateway.toml:ro" "$image")"
  cleanup+=("docker rm -f -v $cid >/dev/null")
  wait_for 30 serving_addr "$cid" admin || { docker logs "$cid" >&2; die "the gateway did not start"; }
  admin="http://$(serving_addr "$cid" admin)"
  listen="http://$(serving_addr "$cid" listen)"

  local user ro uid
  user="$(docker image inspect -f '{{.Config.User}}' "$image")"
  ro="$(docker inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$cid")"
  uid="$(awk '/^Uid:/ {print $2}' "/proc/$(docker inspect -f '{{.State.Pid}}' "$cid")/status")"
  [ "$user" = "65532:65532" ] || die "image USER is '$user', not 65532:65532"
  [ "$ro" = "true" ] || die "root filesystem not read-only"
  [ "$uid" = "65532" ] || die "the gateway runs as uid $uid, not 65532"

  wait_for 30 ready || die "/readyz is not 200: $(curl -s "$admin/readyz")"
  local url="$listen/v2/meta/release" first second
  first="$(curl -s -D - -o /dev/null --max-time 10 -H "X-API-Key: $token" "$url")"
  second="$(curl -s -D - -o /dev/null --max-time 10 -H "X-API-Key: $token" "$url")"
  if ! grep -q '^HTTP/1.1 200' <<<"$first" || ! grep -qi '^x-cache: MISS' <<<"$first"; then die "first request: $first"; fi
  grep -qi '^x-cache: HIT' <<<"$second" || die "second request is not a hit: $second"
  sim_saw 1 || die "the simulator did not see exactly one request"

  # SIGTERM while a request waits on the slow upstream (no-cache: it must go there).
  curl -s -o "$run/inflight.body" -w '%{http_code} %{time_total}' --max-time 30 -H "X-API-Key: $token" \
    -H 'Cache-Control: no-cache' "$url" >"$run/inflight.status" &
  local inflight=$!
  wait_for 10 in_flight || die "the slow request never reached the gateway"
  local start code status took stopped
  start="$(date +%s.%N)"
  docker kill --signal TERM "$cid" >/dev/null
  code="$(docker wait "$cid")"
  stopped="$(date +%s.%N)"
  wait "$inflight" || true
  read -r status took <"$run/inflight.status" || true  # no newline at the end
  [ "$status" = 200 ] || die "in-flight request during SIGTERM: $status"
  [ "$code" = 0 ] || { docker logs "$cid" >&2; die "exit code $code after SIGTERM"; }
  sim_saw 2 || die "the in-flight request's 200 did not come from the simulator"
  # The upstream takes 1.5 s: an exit much sooner did not wait for it.
  awk -v a="$start" -v b="$stopped" 'BEGIN { exit !(b - a >= 1.0) }' \
    || die "exited $(awk -v a="$start" -v b="$stopped" 'BEGIN { print b - a }') s after SIGTERM: it did not wait for the in-flight request"
  say "image checks passed: read-only root, uid 65532, /readyz 200, MISS then HIT;" \
    "SIGTERM: the in-flight request (${took} s) got its 200, exit 0 after" \
    "$(awk -v a="$start" -v b="$stopped" 'BEGIN { printf "%.1f", b - a }') s"
}
