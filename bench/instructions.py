"""Instructions per request, counted by callgrind: `python3 bench/instructions.py --bin-dir DIR`.

Wall-clock benchmarks on a 2-core VM move by ±15 % with whatever else runs;
an instruction count does not (valgrind counts the instructions the process
executes in user space, the same for the same binary and inputs, whatever
the load). So each hit-path change is judged here first, then confirmed by
bench/run.sh on a quiet machine.

For each target (the gateway with its memory tier, the gateway with the Redis
tier only, the hyper ceiling) it starts the target under
`valgrind --tool=callgrind --instr-atstart=no`, fills the cache, switches
collection on with `callgrind_control`, sends a fixed load with wrk, switches
it off and divides the instructions counted by the requests wrk completed.
Kernel time (the TCP stack) is not counted: that is the same work for every
target that sends the same bytes.
"""

import argparse
import glob
import os
import re
import stat
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib  # noqa: E402
import run  # noqa: E402


def wrapped_bin_dir(bin_dir, tmp, name):
    """A bin dir whose binaries run under callgrind, writing to tmp."""
    out = os.path.join(tmp, f"wrap-{name}")
    os.makedirs(out, exist_ok=True)
    for binary in ("permit-gateway", "bench-ceiling"):
        path = os.path.join(out, binary)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n"
                    f"exec valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file={tmp}/cg-{name}.%p "
                    f"-q {os.path.abspath(os.path.join(bin_dir, binary))} \"$@\"\n")
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return out


def count(pid, url, headers, secs, conns, dumps):
    """Instructions per completed request while wrk drives `url`; `dumps`
    is the glob of this target's callgrind files."""
    ctl = lambda *a: subprocess.run(["callgrind_control", *a, str(pid)], capture_output=True, timeout=120)
    ctl("-z")
    ctl("-i", "on")
    r = lib.wrk(url, conns, secs, headers, threads=1)
    ctl("-d")
    ctl("-i", "off")
    newest = max(glob.glob(dumps), key=os.path.getmtime)
    with open(newest) as f:
        m = re.search(r"^summary:\s+(\d+)", f.read(), re.M)
    done = int(re.search(r"(\d+) requests in", r["raw"]).group(1))
    return int(m.group(1)), done


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--secs", type=int, default=5)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--only", nargs="*", default=["gateway", "gateway_redis_l2", "ceiling"])
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pgw-instr-")
    sim = lib.Sim(args.bin_dir, tmp, "sim", run.SIM_KEY, 0, 0)
    url, body = run.pick_page(sim)
    body_file = os.path.join(tmp, "page.json")
    with open(body_file, "wb") as f:
        f.write(body)
    headers = {"X-API-Key": run.TOKEN}
    team = {"bench": run.TOKEN}
    redis = lib.Redis(tmp) if "gateway_redis_l2" in args.only else None
    results = {}
    for name in args.only:
        wrap = wrapped_bin_dir(args.bin_dir, tmp, name)
        if name == "ceiling":
            t = lib.Ceiling(wrap, tmp, body_file)
        elif name == "gateway":
            t = lib.Gateway(wrap, tmp, name, sim, team)
        else:
            t = lib.Gateway(wrap, tmp, name, sim, team, memory_max_bytes=0, redis_url=redis.url)
        for _ in range(3):
            status, h, _ = lib.get(t.base + url, headers=headers, timeout=60)
        assert status == 200, (name, status)
        total, done = count(t.proc.pid, t.base + url, headers, args.secs, args.conns,
                             os.path.join(tmp, f"cg-{name}.*"))
        results[name] = (total, done)
        print(f"{name}: {total / max(done, 1):,.0f} instructions per request ({done} requests)", flush=True)
        lib.stop(t.proc)
    lib.stop(sim.proc)
    if "ceiling" in results and len(results) > 1:
        base = results["ceiling"][0] / max(results["ceiling"][1], 1)
        for name, (total, done) in results.items():
            print(f"  {name}: {total / max(done, 1) / base:.2f}x the ceiling's instructions")


if __name__ == "__main__":
    main()
