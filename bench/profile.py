"""Profiles the gateway's hit path: `python3 bench/profile.py --bin-dir DIR`.

Starts the simulator and a gateway (log level warn), fills the cache with
the benchmark page, then samples the gateway with `perf record -e cpu-clock`
(software clock: hardware counters are often unavailable in VMs) while wrk
drives 64 connections at it. Writes the flat (self) and inclusive
(children) reports under bench/results/.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib  # noqa: E402
import run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--secs", type=int, default=6)
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(run.HERE, "results"))
    ap.add_argument("--redis", action="store_true", help="profile the Redis L2-only gateway")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pgw-profile-")
    sim = lib.Sim(args.bin_dir, tmp, "sim", run.SIM_KEY, 50, 150)
    url, _ = run.pick_page(sim)
    extra = {}
    name = "gateway"
    if args.redis:
        redis = lib.Redis(tmp)
        extra = {"memory_max_bytes": 0, "redis_url": redis.url}
        name = "gateway_redis_l2"
    gw = lib.Gateway(args.bin_dir, tmp, "profile", sim, {"bench": run.TOKEN}, **extra)
    for _ in range(3):
        lib.get(gw.base + url, headers={"X-API-Key": run.TOKEN})
    data = os.path.join(tmp, "perf.data")
    load = threading.Thread(target=lambda: print(
        lib.wrk(gw.base + url, args.conns, args.secs + 2, {"X-API-Key": run.TOKEN})["rps"], "req/s under perf"))
    load.start()
    subprocess.run(["perf", "record", "-e", "cpu-clock", "-F", "1999", "--call-graph", "dwarf,32768", "-p",
                    str(gw.proc.pid), "-o", data, "--", "sleep", str(args.secs)], capture_output=True, timeout=120)
    load.join(timeout=60)
    os.makedirs(args.out, exist_ok=True)
    for mode, flags in (("self", ["--no-children"]), ("children", ["--children"])):
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--sort", "symbol", "-g", "none",
                              "--percent-limit", "0.7", *flags], capture_output=True, text=True, timeout=600).stdout
        path = os.path.join(args.out, f"profile-{name}-{mode}.txt")
        # perf pads the symbol column to its widest name: trim each line.
        lines = [" ".join(line.replace(" -      -", "").split()) if line.startswith(" ") else line.rstrip()
                 for line in rep.splitlines()]
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
