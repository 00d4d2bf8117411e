#!/usr/bin/env python3
"""RSS of the gateway before, during and after an anonymous HTTP/2 attack
(issue 34: memory after an attack returns).

Starts the release simulator and gateway (one shared `cargo build
--release`), opens N hostile h2c connections (preface, SETTINGS with a zero
initial window, one token-less GET, then silence) spread over loopback
addresses, holds them, closes them all, and samples the gateway's VmRSS
every 5 s for 60 s. Prints one line per sample and the ratio after/before.

    python3 bench/overload_rss.py [--conns 3000] [--rounds 3] [--streams 100] [--env MIMALLOC_PURGE_DELAY=0]

`--rounds R --streams S` (issue 50, point 5): R rounds of N connections,
each opening S streams (token-less GETs on stream 1, 3, 5, ...), held,
then all closed before the next round; the samples start after the last.
"""
import argparse, os, resource, socket, struct, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0

def frame(kind, flags, stream, payload):
    n = len(payload)
    return struct.pack(">I", n)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload

def hostile_bytes(path, streams=1):
    out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, bytes([0, 4, 0, 0, 0, 0]))
    block = bytes([0x82, 0x86, 0x04, len(path)]) + path.encode() + bytes([0x01, 7]) + b"gateway"
    return out + b"".join(frame(1, 5, 2 * i + 1, block) for i in range(streams))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=3000)
    ap.add_argument("--hold", type=float, default=10.0)
    ap.add_argument("--after", type=float, default=60.0)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--streams", type=int, default=1)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rel = os.path.join(ROOT, "target", "release")
    sim = subprocess.Popen([os.path.join(rel, "permit-api-sim"), "--listen", "127.0.0.1:0"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    sim_addr = sim.stdout.readline().split()[-1]
    sim_url = sim_addr if sim_addr.startswith("http") else f"http://{sim_addr}"
    d = tempfile.mkdtemp()
    cfg = os.path.join(d, "gateway.toml")
    open(cfg, "w").write(f"""[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[upstream]
base_url = "{sim_url}"
[quota]
path = "{d}/ledger"
[log]
level = "info"
format = "json"
""")
    env = dict(os.environ, PERMIT_GATEWAY_UPSTREAM__API_KEY="sim-upstream-key")
    for kv in a.env:
        k, v = kv.split("=", 1)
        env[k] = v
    gw = subprocess.Popen([os.path.join(rel, "permit-gateway"), "serve", "--config", cfg],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    import json, threading
    addr = None
    for line in gw.stderr:
        if "permit-gateway serving" in line:
            addr = json.loads(line)["listen"]
            break
    # The access lines of the attack: read and dropped, so stderr never fills.
    threading.Thread(target=lambda: [None for _ in gw.stderr], daemon=True).start()
    host, port = addr.rsplit(":", 1)
    time.sleep(1)
    before = rss(gw.pid)
    payload = hostile_bytes("/v2/meta/release", a.streams)
    peak = before
    for rnd in range(a.rounds):
        socks = []
        for i in range(a.conns):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i // 400}", 0))
            s.setblocking(True)
            try:
                s.connect((host, int(port)))
                s.sendall(payload)
                socks.append(s)
            except OSError:
                s.close()
        time.sleep(a.hold)
        during = rss(gw.pid)
        peak = max(peak, during)
        for s in socks:
            s.close()
        print(f"env {a.env or 'default'}, round {rnd + 1}/{a.rounds}: {len(socks)} hostile h2 connections x "
              f"{a.streams} streams; RSS before {before:.1f} MiB, during {during:.1f} MiB", flush=True)
    t0 = time.time()
    last = during
    while time.time() - t0 < a.after:
        time.sleep(5)
        last = rss(gw.pid)
        fds = len(os.listdir(f"/proc/{gw.pid}/fd"))
        print(f"  +{time.time() - t0:4.0f} s after: {last:.1f} MiB, {fds} descriptors open")
    print(f"after {a.after:.0f} s: {last:.1f} MiB = {last / before:.2f}x before (peak {peak:.1f} MiB)")
    gw.kill(); sim.kill()

if __name__ == "__main__":
    main()
