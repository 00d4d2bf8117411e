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
from dataclasses import dataclass

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


def count(pid, url, headers, secs, conns, dumps, h2=False):
    """Instructions per completed request while wrk drives `url`; `dumps`
    is the glob of this target's callgrind files."""
    ctl = lambda *a: subprocess.run(["callgrind_control", *a, str(pid)], capture_output=True, timeout=120)
    ctl("-z")
    ctl("-i", "on")
    if h2:
        cmd = ["h2load", "-t1", f"-c{conns}", "-m10", "-D", str(secs)]
        for k, v in headers.items():
            cmd += ["-H", f"{k}: {v}"]
        raw = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=secs + 120).stdout
        done = int(re.search(r"requests: \d+ total, \d+ started, (\d+) done", raw).group(1))
    else:
        raw = lib.wrk(url, conns, secs, headers, threads=1)["raw"]
        done = int(re.search(r"(\d+) requests in", raw).group(1))
    ctl("-d")
    ctl("-i", "off")
    newest = max(glob.glob(dumps), key=os.path.getmtime)
    with open(newest) as f:
        m = re.search(r"^summary:\s+(\d+)", f.read(), re.M)
    return int(m.group(1)), done


def src_files(dumps):
    """The files of the gateway's `src/` whose functions ran in the newest
    callgrind dump of `dumps` (a glob), sorted: callgrind_annotate lists
    every function with a cost as `file:function`; the crate's own files are
    paths ending in `src/…` (relative, or absolute for a build made outside
    its checkout) of functions of `permit_gateway` (the standard library's
    hashbrown has relative paths under its own `src` too)."""
    newest = max(glob.glob(dumps), key=os.path.getmtime)
    out = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", newest],
                         capture_output=True, text=True, timeout=300).stdout
    files = set()
    for line in out.splitlines():
        m = re.match(r"^\s*[\d,]+ \([^)]*\)\s+(\S*?)(src/[\w/]+\.rs):(.*)$", line)
        foreign = m and ("/.cargo/" in m.group(1) or "/rustc/" in m.group(1) or "/sim/" in m.group(1))
        if m and not foreign and "permit_gateway" in m.group(3):
            files.add(m.group(2))
    return sorted(f for f in files if ours(f))


def ours(path):
    """Whether `path` is (or was) a file of this repository: the standard
    library's hashbrown names relative paths of its own (its map and set
    files), in functions generic over the gateway's types."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.exists(os.path.join(root, path)):
        return True
    seen = subprocess.run(["git", "-C", root, "log", "--all", "--oneline", "-1", "--", path],
                          capture_output=True, text=True).stdout
    return bool(seen.strip())


@dataclass
class Page:
    """What every target's count shares: the binaries, the work dir, the
    simulator and Redis behind the gateways, and the page they all serve."""
    bin_dir: str
    tmp: str
    sim: lib.Sim
    redis: lib.Redis | None
    url: str
    body_file: str


def measure(page, names, secs, conns, h2, log=print):
    """{name: instructions per request} for each target in `names`."""
    bin_dir, tmp, sim, redis, url, body_file = page.bin_dir, page.tmp, page.sim, page.redis, page.url, page.body_file
    headers = {"X-API-Key": run.TOKEN}
    team = {"bench": run.TOKEN}
    out = {}
    for name in names:
        tag = f"{name}-{'h2' if h2 else 'h1'}"
        wrap = wrapped_bin_dir(bin_dir, tmp, tag)
        if name == "ceiling":
            t = lib.Ceiling(wrap, tmp, body_file)
        elif name == "gateway":
            t = lib.Gateway(wrap, tmp, tag, sim, team)
        else:
            t = lib.Gateway(wrap, tmp, tag, sim, team, memory_max_bytes=0, redis_url=redis.url)
        for _ in range(3):
            status, _, _ = lib.get(t.base + url, headers=headers, timeout=60)
        assert status == 200, (name, status)
        total, done = count(t.proc.pid, t.base + url, headers, secs, conns, os.path.join(tmp, f"cg-{tag}.*"), h2)
        out[name] = round(total / max(done, 1))
        log(f"  {'h2c' if h2 else 'HTTP/1.1'} {name}: {out[name]:,} instructions per request ({done} requests)")
        lib.stop(t.proc)
    return out


def phase(p):
    """The `instructions` phase of bench/run.py: HTTP/1.1 and h2c (`p`: a
    lib.Phase)."""
    args, tmp, redis, log, sim_key = p.opts, p.tmp, p.redis, p.log, p.sim_key
    sim = lib.Sim(args.bin_dir, tmp, "sim-instr", sim_key, 0, 0)
    url, body = run.pick_page(sim)
    body_file = os.path.join(tmp, "instr-page.json")
    with open(body_file, "wb") as f:
        f.write(body)
    res = {"url": url, "body_bytes": len(body), "conns": 8, "secs": 4}
    page = Page(args.bin_dir, tmp, sim, redis, url, body_file)
    res["h1"] = measure(page, ["gateway", "gateway_redis_l2", "ceiling"], 4, 8, False, log)
    res["h2"] = measure(page, ["gateway", "ceiling"], 4, 8, True, log)
    lib.stop(sim.proc)
    return res


def table(res):
    L = [f"### Instructions per hit (callgrind) — `{res['url']}` ({res['body_bytes']} bytes), "
         f"{res['conns']} connections, {res['secs']} s under `valgrind --tool=callgrind`", "",
         "| protocol | target | instructions / request | vs ceiling |", "|---|---|---:|---:|"]
    for proto, label in (("h1", "HTTP/1.1 (wrk)"), ("h2", "h2c (h2load -m10)")):
        base = res[proto].get("ceiling")
        for name, n in res[proto].items():
            ratio = f"{n / base:.2f}×" if base else ""
            L.append(f"| {label} | {name} | {n:,} | {ratio} |")
    L.append("")
    L.append("User-space instructions only (the kernel's TCP work is not counted). valgrind hides "
             "SHA-NI from the program, so the token's SHA-256 counts ~3.5k instructions here that the "
             "CPU does in a few hundred.")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--secs", type=int, default=4)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--h2", action="store_true", help="HTTP/2 (h2c, h2load -m10) instead of HTTP/1.1 (wrk)")
    ap.add_argument("--only", nargs="*", default=["gateway", "gateway_redis_l2", "ceiling"])
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pgw-instr-")
    sim = lib.Sim(args.bin_dir, tmp, "sim", run.SIM_KEY, 0, 0)
    url, body = run.pick_page(sim)
    body_file = os.path.join(tmp, "page.json")
    with open(body_file, "wb") as f:
        f.write(body)
    redis = lib.Redis(tmp) if "gateway_redis_l2" in args.only else None
    res = measure(Page(args.bin_dir, tmp, sim, redis, url, body_file), args.only, args.secs, args.conns, args.h2)
    lib.stop(sim.proc)
    if "ceiling" in res:
        for name, n in res.items():
            print(f"  {name}: {n / res['ceiling']:.2f}x the ceiling's instructions")


if __name__ == "__main__":
    main()
