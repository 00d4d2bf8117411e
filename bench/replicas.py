"""Phase `replicas` of bench/run.py (`--only replicas`; bench/cluster.sh runs
it alone): one gateway against two and three on ONE standalone redis-server,
and one against three on a 3-primary + 3-replica Redis Cluster (issue 19).

Every gateway has the Redis L2, the leases, the Redis ledger and the shared
upstream rate on Redis; the replicas of a setup share one key prefix (one
cache, one ledger). Every setup gets the SAME total offered load, split over
its replicas: the same wrk clients (`-t1` each, default six) for every setup,
client j on replica j mod n, all started at once, req/s summed.

  hit, L1 on   one cached ~6 KB page, each replica promotes it into its
               memory tier (the steady state), 64 connections in all;
  hit, L1 off  `memory_max_bytes = 0`: every hit is a Redis GET (the
               "Redis-tier hit"), 64 connections in all;
  miss         every request a distinct search (run.MISS_LUA; disjoint
               walks per replica), 8 connections in all; then, with two or
               three replicas, a short herd: every replica walks the SAME
               searches at once. After each run the simulator's log must
               show one upstream request per distinct search (no replica
               bought what another was buying or had bought).

Rounds interleave the setups; the table shows the median of rounds.
"""

import os
import statistics
import subprocess
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import lib

# The kernel's CFS weight of nice 0..9 (sched_prio_to_weight).
NICE_WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137)

SETUPS = (("standalone x1", "redis", 1), ("standalone x2", "redis", 2), ("standalone x3", "redis", 3),
          ("cluster x1", "cluster", 1), ("cluster x3", "cluster", 3))
FLAVOURS = (("hit_l1", "hits, L1 on (each replica serves from its memory tier)"),
            ("hit_redis", "hits, L1 off (`memory_max_bytes = 0`: every hit one Redis GET)"),
            ("miss", "misses (lease, rate, reserve, settle, cache SET; distinct searches)"))


class Cluster:
    """Six redis-servers on free loopback ports joined by redis-cli."""

    def __init__(self, tmp, nodes=6):
        self.ports = [lib.free_port() for _ in range(nodes)]
        self.pids = []
        for port in self.ports:
            d = os.path.join(tmp, f"cluster-{port}")
            os.makedirs(d)
            p = lib.spawn(["redis-server", "--bind", "127.0.0.1", "--port", str(port),
                           "--cluster-port", str(lib.free_port()), "--cluster-enabled", "yes",
                           "--cluster-config-file", "nodes.conf", "--save", "",
                           "--appendonly", "yes", "--repl-diskless-sync-delay", "0", "--dir", d],
                          os.path.join(d, "redis.log"))
            self.pids.append(p.pid)
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


def one_share(pids, busy=None):
    """Gives `pids` together the CPU share of one process.

    Every child runs in its own session (lib.spawn), so with autogroup
    scheduling (Linux's default for desktop and VM kernels) each gets its
    own CPU share: three gateways would get three shares of the 2 cores
    against the wrk clients', Redis' and the simulator's one each, and
    "three replicas scale" would only measure that. Their autogroups get the
    nice level whose weight, times the `busy` count (default all), is
    closest to one nice-0 share. Returns False where the kernel has no
    autogroups to adjust."""
    busy = busy or len(pids)
    nice = min(range(len(NICE_WEIGHTS)), key=lambda n: abs(busy * NICE_WEIGHTS[n] - NICE_WEIGHTS[0]))
    try:
        for pid in pids:
            with open(f"/proc/{pid}/autogroup", "w") as f:
                f.write(str(nice))
    except OSError:
        return False
    return True


def hit_url(sim):
    s = sim.samples()
    q = urllib.parse.urlencode([("geo_id", s["state"]), ("permit_from", s["permit_from"]),
                                ("permit_to", s["permit_to"]), ("size", 5)])
    return "/v2/permits/search?" + q


def split(total, n):
    """`total` connections over `n` clients, as even as integers allow."""
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def setups(args, tmp, sim, urls, memory_max_bytes, token):
    """Every setup's gateways; `urls`: "redis"/"cluster" → Redis URL. With
    `--replica-cpu-share setup`, the replicas of a setup share one CPU
    share (see one_share)."""
    tag = "l1off" if memory_max_bytes == 0 else "l1on"
    out = {}
    for name, backend, n in SETUPS:
        slug = f"{tag}-{backend}{n}"
        out[name] = [lib.Gateway(args.bin_dir, tmp, f"{slug}-{i}", sim, {"bench": token},
                                 memory_max_bytes=memory_max_bytes, redis_url=urls[backend],
                                 prefix=f"{slug}:", ledger="redis")
                     for i in range(n)]
        if args.replica_cpu_share == "setup":
            one_share([g.proc.pid for g in out[name]])
    return out


def warm(targets, url, token):
    """Buys the page once per setup, then checks every replica answers HIT
    (from its memory tier, or from Redis with L1 off)."""
    for name, gws in targets.items():
        for g in gws:
            for _ in range(2):
                status, h, _ = lib.get(g.base + url, headers={"X-API-Key": token})
            if status != 200 or h.get("x-cache") != "HIT":
                raise RuntimeError(f"{name} {g.base}: {status} X-Cache {h.get('x-cache')}")


def upstream_count(sim, timeout=10):
    """(upstream requests, distinct queries among them) once no call is in
    flight any more: a gateway finishes an upstream call whose client went
    away at the end of a wrk run."""
    deadline, last = time.time() + timeout, -1
    while time.time() < deadline:
        n = sim.stats()["requests_total"]
        if n == last:
            break
        last = n
        time.sleep(0.3)
    entries = lib.get_json(sim.base + "/_sim/log")
    return last, len({(e["path"], e["query"]) for e in entries})


@dataclass
class Walk:
    """What every load run of the phase shares."""
    # The hit page.
    url: str
    # The miss walk's area and wrk script (run.MISS_LUA).
    geo: str
    script: str
    token: str
    # wrk processes (-t1) per run, the same for every setup.
    clients: int


def one_run(gws, walk, load, conns, secs, offset, herd=False):
    """All replicas of one setup under load at once; one result row.

    The load generator is the same for every setup: `clients` wrk processes
    (`-t1`, `conns` split over them), client j on replica j mod n, so that
    one replica does not get one wrk thread where three get three. Misses:
    every client walks its own searches, or with `herd` the clients of
    different replicas walk the same ones at once."""
    url, geo, script, token, clients = walk.url, walk.geo, walk.script, walk.token, walk.clients
    n = len(gws)
    jobs = []
    for j, c in enumerate(split(conns, clients)):
        g = gws[j % n]
        if load == "miss":
            walk = j // n if herd else j
            env = {"MISS_OFFSET": str(offset + walk * 100_000), "MISS_GEO": geo}
            jobs.append((g.base + "/", c, env, script))
        else:
            jobs.append((g.base + url, c, None, None))
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        rs = list(pool.map(lambda j: lib.wrk(j[0], j[1], secs, {"X-API-Key": token}, threads=1,
                                             script=j[3], env=j[2]), jobs))
    return {"rps": sum(r["rps"] for r in rs),
            "p50": statistics.median([r["p50"] for r in rs if r["p50"] is not None] or [0]),
            "p99": max([r["p99"] for r in rs if r["p99"] is not None] or [0]),
            "bad": sum(r["non2xx"] + r["errors"] for r in rs),
            "per_replica": [round(sum(r["rps"] for r in rs[i::n])) for i in range(n)]}


def measure(p, targets, load, sim, script):
    """`load` ("hit_l1", "hit_redis" or "miss") on every setup, rounds
    interleaved; for misses, upstream requests against distinct queries."""
    args, log = p.opts, p.log
    walk = Walk(url=hit_url(sim), geo=sim.samples()["state"], script=script, token=p.token,
                clients=args.replica_clients)
    conns = args.replica_hit_conns if load.startswith("hit") else args.replica_miss_conns
    runs = {name: [] for name in targets}
    upstream = {name: {"requests": 0, "distinct": 0} for name in targets}
    offset = 0
    for rnd in range(args.rounds):
        for name, gws in targets.items():
            offset += 1_000_000
            if load == "miss":
                sim.reset()
            r = one_run(gws, walk, load, conns, args.replica_secs, offset)
            if load == "miss":
                requests, distinct = upstream_count(sim)
                upstream[name]["requests"] += requests
                upstream[name]["distinct"] += distinct
            log(f"  replicas {load} round {rnd} {name}: {r['rps']:.0f} req/s {r['per_replica']} "
                f"p50 {r['p50']:.2f} p99 {r['p99']:.2f} ms bad {r['bad']}")
            runs[name].append(r)
    if load == "miss":
        herd(p, targets, sim, walk, offset, upstream)
    out = {}
    for name, rs in runs.items():
        out[name] = {"rps": statistics.median([r["rps"] for r in rs]),
                     "p50": statistics.median([r["p50"] for r in rs]),
                     "p99": statistics.median([r["p99"] for r in rs]),
                     "bad": sum(r["bad"] for r in rs),
                     "rps_rounds": [round(r["rps"]) for r in rs]}
        if load == "miss":
            out[name]["upstream"] = upstream[name]
    return out


def herd(p, targets, sim, walk, offset, upstream):
    """The cross-replica check, into `upstream`: the same searches asked of
    every replica at once must still be bought once each."""
    args, log = p.opts, p.log
    for name, gws in targets.items():
        if len(gws) < 2:
            continue
        offset += 1_000_000
        sim.reset()
        r = one_run(gws, walk, "miss", args.replica_miss_conns, args.replica_herd_secs, offset, herd=True)
        requests, distinct = upstream_count(sim)
        upstream[name]["herd"] = {"requests": requests, "distinct": distinct, "rps": round(r["rps"]),
                                  "bad": r["bad"]}
        log(f"  replicas miss herd {name}: {r['rps']:.0f} req/s, {requests} upstream requests for "
            f"{distinct} distinct searches, bad {r['bad']}")


def replicas(p):
    """The phase (`p`: a lib.Phase): returns its results (and the knobs it
    ran with, for the table)."""
    args, tmp, redis, log, sim_key, token, miss_lua = p.opts, p.tmp, p.redis, p.log, p.sim_key, p.token, p.miss_lua
    started = time.time()
    sim = lib.Sim(args.bin_dir, tmp, "sim-replicas", sim_key, 0, 0)
    cluster = Cluster(tmp)
    log(f"  cluster up in {time.time() - started:.1f} s")
    # The cluster's three primaries (the replicas only copy) together get
    # the standalone server's one share, as the replicas of a setup do.
    shared = args.replica_cpu_share == "setup" and one_share(cluster.pids, busy=3)
    urls = {"redis": redis.url, "cluster": cluster.url}
    script = os.path.join(tmp, "replicas-miss.lua")
    with open(script, "w") as f:
        f.write(miss_lua)
    out = {"cpu_share": "setup" if shared else "process", "secs": args.replica_secs, "herd_secs": args.replica_herd_secs, "rounds": args.rounds,
           "clients": args.replica_clients,
           "hit_conns": args.replica_hit_conns,
           "miss_conns": args.replica_miss_conns, "cpus": os.cpu_count()}
    for memory, loads in ((0, ("hit_redis",)), (268435456, ("hit_l1", "miss"))):
        targets = setups(args, tmp, sim, urls, memory, token)
        warm(targets, hit_url(sim), token)
        for load in loads:
            out[load] = measure(p, targets, load, sim, script)
        for gws in targets.values():
            for g in gws:
                lib.stop(g.proc)
    for port in cluster.ports:
        Cluster.cli(port, "SHUTDOWN", "NOSAVE")
    lib.stop(sim.proc)
    out["took_secs"] = round(time.time() - started)
    return out


SHARES = {
    "setup": "the replicas of a setup, and the cluster's primaries, together get the CPU share of one "
             "process (autogroup nice levels: 3 for two, 5 for three), so more replicas do not mean more "
             "CPU.",
    "process": "every replica and Redis node has its own CPU share (autogroup scheduling), so more "
               "replicas also take more of the CPU from the wrk clients.",
}


def bought(u):
    if not u:
        return "-"
    twice = "" if u["requests"] == u["distinct"] else " **bought twice**"
    bad = f" ({u['bad']} bad)" if u.get("bad") else ""
    return f"{u['requests']} / {u['distinct']}{twice}{bad}"


def table(res):
    L = ["### Replicas — one, two and three gateways on one Redis, one and three on a 3 + 3 Redis Cluster",
         "",
         f"The same load generator for every setup: {res['clients']} `wrk -t1` clients run at once, client j "
         f"on replica j mod n, req/s summed; hits at {res['hit_conns']} connections in all, misses at "
         f"{res['miss_conns']}; "
         f"{res['secs']} s per run, median of {res['rounds']} interleaved rounds; p50 is the median of "
         f"the clients' p50, p99 the worst client's. Misses: the last column is a "
         f"{res['herd_secs']} s herd (the clients of "
         f"every replica walk the same searches at once). Every process (gateways, Redis, simulator, wrk) "
         f"shares the machine's {res['cpus']} CPUs; {SHARES[res.get('cpu_share', 'process')]} "
         f"Phase took {res['took_secs']} s.", ""]
    for load, what in FLAVOURS:
        R = res[load]
        base = R["standalone x1"]["rps"]
        miss = load == "miss"
        L += [f"#### {what[0].upper()}{what[1:]}", "",
              "| setup | req/s | vs standalone x1 | p50 ms | p99 ms | bad | rounds req/s |"
              + (" upstream requests / distinct searches | herd: upstream / distinct |" if miss else ""),
              "|---|---:|---:|---:|---:|---:|---|" + ("---:|---:|" if miss else "")]
        for name, r in R.items():
            row = (f"| {name} | {r['rps']:.0f} | {r['rps'] / base:.2f}× | {r['p50']:.2f} | {r['p99']:.2f} | "
                   f"{r['bad']} | {r['rps_rounds']} |")
            if miss:
                row += f" {bought(r['upstream'])} | {bought(r['upstream'].get('herd'))} |"
            L.append(row)
        L.append("")
    return "\n".join(L) + "\n"
