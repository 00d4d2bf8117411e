"""The hit path pinned on a 2-core machine (issue 38): the server on one
core, wrk (and the simulator and Redis) on the other, so that the load
generator no longer takes the server's CPU. Several gateway builds side by
side with nginx `proxy_cache`, in interleaved rounds:

    python3 bench/pinned.py [--secs 5] [--rounds 3] [--conns 128] [--l1-only] \
        [--server-core 0] [--aux-core 1] [--logs] before=DIR after=DIR[,KEY=VALUE...] [...]

Each DIR holds `permit-gateway` and `permit-api-sim` (copied out of
target/ per build); KEY=VALUEs are environment for that build's gateways
(`percore=DIR,PERMIT_GATEWAY_SERVER__RUNTIME=per_core`: one binary, the
thread-per-core mode). Targets: each build's L1 hit and (unless
`--l1-only`) Redis-tier hit (`memory_max_bytes = 0`, so every hit reads
Redis), and nginx with one worker. The gateway runs with `TOKIO_WORKER_THREADS=1`. A build named
`after` (one that knows `cache.redis_connections`) runs its Redis tier
twice, with 1 and with 4 connections.

Per target and round: req/s, p50 and p99 (wrk), the CPU the server's
whole process group used (from /proc, user + system) and Redis's, as
cores busy and as microseconds per request. Prints a Markdown table of
medians. Pinning is by `taskset` wrappers put first on PATH (nginx,
redis-server, wrk) or in a bin dir of their own (the gateway).

`--spread`: nothing pinned, the shape of `bench/run.sh`'s hit phase (the
gateway with its default worker threads, nginx with 2 workers, wrk
`-t2`, all sharing both cores), for the same builds in the same
interleaved rounds.
"""
import argparse
import os
import shutil
import stat
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib  # noqa: E402
import run  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def wrapper(path, core, real, env=""):
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\n{env}exec taskset -c {core} {real} \"$@\"\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


def pinned_bin_dir(bin_dir, tmp, name, core, binary="permit-gateway"):
    """A bin dir whose `binary` (the gateway, or the hyper ceiling) runs
    on `core` with one worker thread."""
    out = os.path.join(tmp, f"pin-{name}")
    os.makedirs(out, exist_ok=True)
    wrapper(os.path.join(out, binary), core,
            os.path.abspath(os.path.join(bin_dir, binary)), env="export TOKIO_WORKER_THREADS=1\n")
    return out


def group_cpu_secs(pgid, split=False):
    """User + system seconds of every process in process group `pgid`
    (their threads included); with `split`, the two apart."""
    user = system = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is field 3 (state): pgrp is field 5, utime 14, stime 15.
        if int(fields[2]) == pgid:
            user += int(fields[11])
            system += int(fields[12])
    return (user / TICK, system / TICK) if split else (user + system) / TICK


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", type=int, default=128)
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--aux-core", type=int, default=1)
    ap.add_argument("--l1-only", action="store_true", help="no Redis-tier targets")
    ap.add_argument("--logs", action="store_true",
                    help="access logs on at both ends: the gateways at log.level info (JSON to a file), nginx's default access log")
    ap.add_argument("--spread", action="store_true",
                    help="nothing pinned: default worker threads, nginx 2 workers, wrk -t2 (bench/run.sh's shape)")
    ap.add_argument("--ceiling", action="store_true",
                    help="also the hyper ceiling (bench-ceiling of the first build's DIR): the same stack answering the page from memory")
    ap.add_argument("builds", nargs="+", help="name=DIR")
    args = ap.parse_args()
    builds = lib.builds(args.builds)
    tmp = tempfile.mkdtemp(prefix="pgw-pinned-")
    # nginx, redis-server and wrk found first on PATH: pinned wrappers.
    wraps = os.path.join(tmp, "path")
    os.makedirs(wraps)
    if not args.spread:
        wrapper(os.path.join(wraps, "nginx"), args.server_core, shutil.which("nginx"))
        wrapper(os.path.join(wraps, "redis-server"), args.aux_core, shutil.which("redis-server"))
        wrapper(os.path.join(wraps, "wrk"), args.aux_core, shutil.which("wrk"))
        os.environ["PATH"] = wraps + os.pathsep + os.environ["PATH"]
        os.sched_setaffinity(0, {args.aux_core})  # this script and the simulator
    sim = lib.Sim(builds[0][1], tmp, "sim", run.SIM_KEY, 0, 0)
    redis = lib.Redis(tmp)
    url, body = run.pick_page(sim)
    headers = {"X-API-Key": run.TOKEN}
    print(f"page {url}; uptime: {open('/proc/loadavg').read().strip()}", flush=True)

    targets = []
    for name, bin_dir, env in builds:
        pin = bin_dir if args.spread else pinned_bin_dir(bin_dir, tmp, name, args.server_core)
        level = "info" if args.logs else "warn"
        gw = lib.Gateway(pin, tmp, f"{name}-l1", sim, {"bench": run.TOKEN}, env=env, level=level)
        targets.append((f"{name} L1 hit", gw.proc, gw.base, headers))
        if args.l1_only:
            continue
        variants = [(name, name, ())]
        if name == "after":
            variants = [(f"{name} ({n} conn)", f"{name}-{n}conn", (f"redis_connections = {n}",)) for n in (1, 4)]
        for label, tag, lines in variants:
            gw = lib.Gateway(pin, tmp, f"{tag}-redis", sim, {"bench": run.TOKEN}, memory_max_bytes=0,
                             redis_url=redis.url, cache_lines=lines, env=env)
            targets.append((f"{label} Redis-tier hit", gw.proc, gw.base, headers))
    if args.ceiling:
        body_file = os.path.join(tmp, "ceiling-page.json")
        with open(body_file, "wb") as f:
            f.write(body)
        ceiling_dir = builds[0][1] if args.spread else pinned_bin_dir(
            builds[0][1], tmp, "ceiling", args.server_core, binary="bench-ceiling")
        c = lib.Ceiling(ceiling_dir, tmp, body_file)
        targets.append(("hyper ceiling", c.proc, c.base, headers))
    ng = lib.Nginx(tmp, "pinned", sim, workers=2 if args.spread else 1, access_log=args.logs)
    targets.append(("nginx proxy_cache", ng.proc, ng.base, {}))
    for name, _, base, h in targets:
        for _ in range(3):
            status, hdrs, _ = lib.get(base + url, headers=h, timeout=60)
        assert status == 200 and (name == "hyper ceiling" or hdrs.get("x-cache") == "HIT"), (name, status, hdrs.get("x-cache"))

    rows = {}
    for rnd in range(args.rounds):
        for name, proc, base, h in targets:
            (u0, s0), r0, t0 = group_cpu_secs(proc.pid, True), group_cpu_secs(redis.proc.pid), time.time()
            res = lib.wrk(base + url, args.conns, args.secs, h, threads=2 if args.spread else 1)
            took = time.time() - t0
            (u1, s1), rcpu = group_cpu_secs(proc.pid, True), group_cpu_secs(redis.proc.pid) - r0
            cpu = (u1 - u0) + (s1 - s0)
            n = max(res["rps"] * args.secs, 1)
            row = dict(rps=res["rps"], p50=res["p50"], p99=res["p99"], cores=cpu / took, us=cpu / n * 1e6,
                       user=(u1 - u0) / n * 1e6, sys=(s1 - s0) / n * 1e6,
                       redis=rcpu / took, bad=res["non2xx"] + res["errors"])
            rows.setdefault(name, []).append(row)
            print(f"round {rnd} {name}: {row['rps']:.0f} req/s p50 {row['p50']:.2f} ms p99 {row['p99']:.2f} ms "
                  f"server {row['cores']:.2f} cores {row['us']:.1f} us/req (user {row['user']:.1f}, sys {row['sys']:.1f}) redis {row['redis']:.2f} "
                  f"errors {row['bad']}", flush=True)

    med = lambda name, k: statistics.median(r[k] for r in rows[name])
    ref = med("nginx proxy_cache", "rps")
    print(f"\nuptime after: {open('/proc/loadavg').read().strip()}")
    print("| target | req/s | vs nginx | p50 ms | p99 ms | server cores busy | server CPU us/req | user | sys | redis cores |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, _, _, _ in targets:
        print(f"| {name} | {med(name, 'rps'):.0f} | {med(name, 'rps') / ref:.2f}x | {med(name, 'p50'):.2f} | "
              f"{med(name, 'p99'):.2f} | {med(name, 'cores'):.2f} | {med(name, 'us'):.1f} | {med(name, 'user'):.1f} | "
              f"{med(name, 'sys'):.1f} | {med(name, 'redis'):.2f} |")
    for name, proc, _, _ in targets:
        lib.stop(proc)


if __name__ == "__main__":
    main()
