"""The Redis-tier hit, A/B: gateways with L1 off (`memory_max_bytes = 0`)
from several bin dirs on one Redis, nginx `proxy_cache` and Varnish,
interleaved rounds of `wrk -t2`; with the CPU time per request of each
process (the server's process tree, of it kernel; redis-server; wrk) from
/proc, which moves less with the shared machine's load than req/s does.

    python3 bench/redis_tier_ab.py --bins main=DIR new=DIR [--env new=VAR=VALUE] [--rounds 4 --secs 8 --conns 64]
"""
import argparse, os, sys, tempfile, subprocess, time, json
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib, run

def cpu_of(pids, which=(11, 12)):
    tot = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            tot += sum(int(parts[i]) for i in which)  # utime stime (ticks)
        except OSError:
            pass
    return tot / os.sysconf("SC_CLK_TCK")

def tree(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    res = [pid]
    for c in out:
        res += tree(int(c))
    return res

ap = argparse.ArgumentParser()
ap.add_argument("--bins", nargs="+", required=True, help="name=DIR")
ap.add_argument("--env", nargs="*", default=[], help="name=VAR=VALUE extra env for a gateway variant")
ap.add_argument("--secs", type=int, default=8)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--conns", type=int, default=64)
ap.add_argument("--no-refs", action="store_true")
a = ap.parse_args()
tmp = tempfile.mkdtemp(prefix="redis-ab-")
redis = lib.Redis(tmp)
bins = dict(b.split("=", 1) for b in a.bins)
sim = lib.Sim(list(bins.values())[0], tmp, "sim", run.SIM_KEY, 50, 150)
url, body = run.pick_page(sim)
print(f"page {url} {len(body)} bytes", flush=True)
team = {"bench": run.TOKEN}
targets = {}
envs = {}
for e in a.env:
    n, kv = e.split("=", 1); k, v = kv.split("=", 1); envs.setdefault(n, {})[k] = v
for name, d in bins.items():
    old = dict(os.environ)
    os.environ.update(envs.get(name, {}))
    targets[name] = lib.Gateway(d, tmp, f"gw-{name}", sim, team, memory_max_bytes=0, redis_url=redis.url)
    os.environ.clear(); os.environ.update(old)
if not a.no_refs:
    targets["nginx"] = lib.Nginx(tmp, "hit", sim)
    targets["varnish"] = lib.Varnish(tmp, "hit", sim)
headers = {"X-API-Key": run.TOKEN}
for name, t in targets.items():
    for _ in range(3):
        st, h, b = lib.get(t.base + url, headers=headers)
    assert st == 200 and len(b) == len(body), (name, st)
res = {n: [] for n in targets}
for rnd in range(a.rounds):
    for name, t in targets.items():
        pids = tree(t.proc.pid)
        rpids = [redis.proc.pid] if name not in ("nginx", "varnish") else []
        c0, r0, k0 = cpu_of(pids), cpu_of(rpids), cpu_of(pids, (12,))
        w0 = os.times()
        r = lib.wrk(t.base + url, a.conns, a.secs, headers)
        w1 = os.times()
        c1, r1, k1 = cpu_of(pids), cpu_of(rpids), cpu_of(pids, (12,))
        n = r["rps"] * a.secs
        wrk_cpu = (w1.children_user + w1.children_system) - (w0.children_user + w0.children_system)
        row = dict(rps=r["rps"], p50=r["p50"], p99=r["p99"], bad=r["non2xx"] + r["errors"],
                   us_server=(c1 - c0) / n * 1e6, us_sys=(k1 - k0) / n * 1e6, us_redis=(r1 - r0) / n * 1e6, us_wrk=wrk_cpu / n * 1e6)
        res[name].append(row)
        print(f"round {rnd} {name}: {r['rps']:.0f} req/s p50 {r['p50']} p99 {r['p99']} ms bad {row['bad']} "
              f"cpu/req: server {row['us_server']:.1f} us (sys {row['us_sys']:.1f}), redis {row['us_redis']:.1f} us, wrk {row['us_wrk']:.1f} us", flush=True)
med = lambda xs: sorted(xs)[len(xs) // 2]
ng = med([r["rps"] for r in res["nginx"]]) if "nginx" in res else None
print(f"\n| target | req/s (median of {a.rounds}) | vs nginx | p99 ms | CPU us/req server (of it kernel) | redis | wrk | rounds |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for n, rs in res.items():
    rps = med([r["rps"] for r in rs])
    print(f"| {n} | {rps:.0f} | {rps / ng:.2f}× | {med([r['p99'] for r in rs])} | {med([r['us_server'] for r in rs]):.1f} ({med([r['us_sys'] for r in rs]):.1f}) | "
          f"{med([r['us_redis'] for r in rs]):.1f} | {med([r['us_wrk'] for r in rs]):.1f} | {[round(r['rps']) for r in rs]} |" if ng else n)
for t in targets.values():
    lib.stop(t.proc)
lib.stop(sim.proc); lib.stop(redis.proc)
json.dump(res, open(os.path.join(tmp, "res.json"), "w"))
