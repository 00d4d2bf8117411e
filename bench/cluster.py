"""Redis Cluster against standalone Redis, side by side in one run
(bench/cluster.sh builds, then calls this).

Three setups on one simulator, each with the cache's L2, the leases, the
Redis ledger and the shared upstream rate on Redis:
  standalone x1   one gateway on one redis-server;
  cluster x1      one gateway on a 3-primary + 3-replica Redis Cluster
                  (the cost per request of the cluster client: same load);
  cluster x3      three gateways on that cluster, load spread over them.

Two loads, wrk with identical flags per gateway, interleaved rounds, the
median of rounds (a setup's throughput is the sum over its gateways):
  hit   one cached ~6 KB page with the in-process cache off, so every hit
        is a Redis GET (the L1 would hide Redis entirely);
  miss  every request a distinct search (lease, rate script, reserve,
        settle, cache SET: about six Redis round trips each).
Writes bench/results/cluster.md and cluster.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib  # noqa: E402
from run import MISS_LUA, SIM_KEY, TOKEN, log  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class Cluster:
    """Six redis-servers on free loopback ports joined by redis-cli."""

    def __init__(self, tmp, nodes=6):
        self.ports = [lib.free_port() for _ in range(nodes)]
        for port in self.ports:
            d = os.path.join(tmp, f"cluster-{port}")
            os.makedirs(d)
            lib.spawn(["redis-server", "--bind", "127.0.0.1", "--port", str(port),
                       "--cluster-port", str(lib.free_port()), "--cluster-enabled", "yes",
                       "--cluster-config-file", "nodes.conf", "--save", "",
                       "--appendonly", "yes", "--repl-diskless-sync-delay", "0", "--dir", d],
                      os.path.join(d, "redis.log"))
            lib.wait_port(port)
        subprocess.run(["redis-cli", "--cluster", "create",
                        *[f"127.0.0.1:{p}" for p in self.ports],
                        "--cluster-replicas", "1", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        deadline = time.time() + 30
        while not all("cluster_state:ok" in self.cli(p, "CLUSTER", "INFO") for p in self.ports):
            if time.time() > deadline:
                raise RuntimeError("the cluster never reached cluster_state:ok")
            time.sleep(0.1)
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:3])

    @staticmethod
    def cli(port, *args):
        return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                              text=True, timeout=30).stdout


def hit_url(sim):
    s = sim.samples()
    q = urllib.parse.urlencode([("geo_id", s["state"]), ("permit_from", s["permit_from"]),
                                ("permit_to", s["permit_to"]), ("size", 5)])
    return "/v2/permits/search?" + q


def setups(args, tmp, sim, standalone, cluster, memory_max_bytes):
    team = {"bench": TOKEN}

    def gw(name, url, prefix):
        return lib.Gateway(args.bin_dir, tmp, name, sim, team, memory_max_bytes=memory_max_bytes,
                           redis_url=url, prefix=prefix, ledger="redis")

    tag = "l1off" if memory_max_bytes == 0 else "l1on"
    return {
        "standalone x1": [gw(f"sa-{tag}", standalone.url, f"sa-{tag}:")],
        "cluster x1": [gw(f"c1-{tag}", cluster.url, f"c1-{tag}:")],
        "cluster x3": [gw(f"c3-{tag}-{i}", cluster.url, f"c3-{tag}:") for i in range(3)],
    }


def measure(targets, load, args, tmp, sim):
    """Runs `load` ("hit" or "miss") on every setup, rounds interleaved."""
    script = os.path.join(tmp, "miss.lua")
    with open(script, "w") as f:
        f.write(MISS_LUA)
    geo = sim.samples()["state"]
    url = hit_url(sim)
    runs = {name: [] for name in targets}
    offset = 0
    for rnd in range(args.rounds):
        for name, gws in targets.items():
            jobs = []
            for g in gws:
                offset += 100000
                if load == "hit":
                    jobs.append((g.base + url, {}, None))
                else:
                    jobs.append((g.base + "/", {"MISS_OFFSET": str(offset), "MISS_GEO": geo}, script))
            conns = args.hit_conns if load == "hit" else args.miss_conns
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                rs = list(pool.map(lambda j: lib.wrk(j[0], conns, args.secs, {"X-API-Key": TOKEN},
                                                     threads=1, script=j[2], env=j[1]), jobs))
            total = sum(r["rps"] for r in rs)
            p50 = statistics.median([r["p50"] for r in rs if r["p50"] is not None] or [0])
            p99 = max([r["p99"] for r in rs if r["p99"] is not None] or [0])
            bad = sum(r["non2xx"] + r["errors"] for r in rs)
            log(f"  {load} round {rnd} {name}: {total:.0f} req/s p50 {p50:.2f} p99 {p99:.2f} ms bad {bad}")
            runs[name].append({"rps": total, "p50": p50, "p99": p99, "bad": bad})
    return {name: {"rps": statistics.median([r["rps"] for r in rs]),
                   "p50": statistics.median([r["p50"] for r in rs]),
                   "p99": statistics.median([r["p99"] for r in rs]),
                   "bad": sum(r["bad"] for r in rs)}
            for name, rs in runs.items()}


def table(res, args):
    md = ["# Redis Cluster vs standalone Redis", "",
          f"bench/cluster.sh: {args.secs} s per wrk run, {args.rounds} rounds (median), "
          f"hit {args.hit_conns} / miss {args.miss_conns} connections per gateway, "
          f"{os.cpu_count()} CPUs shared by every process (gateways, Redis nodes, "
          "simulator, wrk). Indicative: the machine was shared with other work. "
          "cluster x3 runs three wrk clients (three times the connections) and "
          "adds their req/s; its p50 is the median of the three, its p99 the worst.", ""]
    for load, what in (("hit", "hits, in-process cache off (each hit is one Redis GET)"),
                       ("miss", "misses (lease, rate, reserve, settle, cache SET)")):
        md += [f"## {what}", "", "| setup | req/s | p50 ms | p99 ms | non-2xx |", "|---|---|---|---|---|"]
        for name, r in res[load].items():
            md.append(f"| {name} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['bad']} |")
        base, c1 = res[load]["standalone x1"], res[load]["cluster x1"]
        md += ["", f"Cluster client cost per request (cluster x1 − standalone x1, p50): "
                   f"{c1['p50'] - base['p50']:+.2f} ms.", ""]
    return "\n".join(md) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--secs", type=int, default=int(os.environ.get("BENCH_SECS", "5")))
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "2")))
    ap.add_argument("--hit-conns", type=int, default=16)
    ap.add_argument("--miss-conns", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="pgw-bench-cluster-")
    log(f"work dir {tmp}")
    started = time.time()
    sim = lib.Sim(args.bin_dir, tmp, "sim", SIM_KEY, 0, 0)
    standalone = lib.Redis(tmp)
    cluster = Cluster(tmp)
    res = {}
    for load, memory in (("hit", 0), ("miss", 268435456)):
        log(f"{load} path")
        targets = setups(args, tmp, sim, standalone, cluster, memory)
        if load == "hit":
            for gws in targets.values():
                for g in gws:
                    for _ in range(2):
                        status, h, _ = lib.get(g.base + hit_url(sim), headers={"X-API-Key": TOKEN})
                    assert status == 200 and h.get("x-cache") == "HIT", (status, h)
        res[load] = measure(targets, load, args, tmp, sim)
        for gws in targets.values():
            for g in gws:
                lib.stop(g.proc)
    res["took_secs"] = round(time.time() - started)
    with open(os.path.join(args.out, "cluster.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = table(res, args) + f"\nWhole run: {res['took_secs']} s.\n"
    with open(os.path.join(args.out, "cluster.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
