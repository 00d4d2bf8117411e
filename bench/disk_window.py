"""Issue 37's credit benchmarks: what a restart costs, and what sliding
monthly-metrics windows cost.

1. restart: the seeded replay (bench/replay.py) against the embedded default
   (no Redis, file ledger) in one run, and split at tick 60 (no pagination
   walk spans it) with the gateway stopped by SIGTERM, or killed by SIGKILL,
   and started again on the same config and data volume in between; the
   same split with `cache.disk = "off"` is what a restart cost before.
2. window: dashboards of several geographies showing the last 12 months
   (and a second one the last 6), moved one month at a time for a year,
   against no cache, nginx `proxy_cache`, the gateway before issue 37
   (`cache.month_reuse = false`: monthly windows cached as exact queries,
   what every release before did) and the gateway.

Credits are the simulator's, so any build measures them (debug included):

    python3 bench/disk_window.py --bin-dir target/debug [--only restart window]
"""

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import lib  # noqa: E402
import replay  # noqa: E402

SIM_KEY = "bench-upstream-key"
APPS = ["dashboard", "search_ui", "export", "mobile", "reports"]
APP_TOKENS = {a: f"pgw_bench_{a}_token" for a in APPS}
SPLIT = 60


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def gateway(args, tmp, name, sim, cache_lines=()):
    """A gateway whose disk tier has a file of its own (the default would be
    `cache.redb` beside the ledger: one folder for every gateway here)."""
    lines = [f'disk_path = "{tmp}/cache-{name}.redb"', *cache_lines]
    return lib.Gateway(args.bin_dir, tmp, name, sim, APP_TOKENS, cache_lines=lines)


def stop(gw, signal_name):
    if signal_name == "KILL":
        os.killpg(gw.proc.pid, 9)
        gw.proc.wait(timeout=30)
    else:
        lib.stop(gw.proc)


def restart(args, tmp):
    sim = lib.Sim(args.bin_dir, tmp, "sim-restart", SIM_KEY, 50, 150)
    ticks, styles = replay.generate(args.seed, sim.samples())
    out = {"workload": replay.summary(ticks), "seed": args.seed, "split_at_tick": SPLIT, "runs": {}}
    runs = [("no restart", None, ()), ("SIGTERM at tick 60", "TERM", ()), ("SIGKILL at tick 60", "KILL", ()),
            ("SIGTERM at tick 60, disk tier off (before)", "TERM", ('disk = "off"',))]
    for i, (label, sig, lines) in enumerate(runs):
        sim.reset()
        name = f"restart{i}"
        gw = gateway(args, tmp, name, sim, lines)
        started = time.time()
        if sig is None:
            client = [replay.run(ticks, styles, gw.base, APP_TOKENS)]
        else:
            client = [replay.run(ticks[:SPLIT], styles, gw.base, APP_TOKENS)]
            stop(gw, sig)
            gw = gateway(args, tmp, name, sim, lines)
            client.append(replay.run(ticks[SPLIT:], styles, gw.base, APP_TOKENS))
        m = gw.metrics()
        saved_disk = sum(v for k, v in m.items()
                         if k.startswith("gateway_credits_saved_total") and 'reason="disk"' in k)
        st = sim.stats()
        out["runs"][label] = {"credits": st["credits_total"], "upstream_requests": st["requests_total"],
                              "saved_disk": saved_disk, "client": client,
                              "secs": round(time.time() - started, 1)}
        log(f"  {label}: {st['credits_total']} credits, {st['requests_total']} upstream requests, "
            f"{saved_disk:.0f} saved from disk")
        lib.stop(gw.proc)
    lib.stop(sim.proc)
    return out


def month_add(d, n):
    y, m = divmod(d.month - 1 + n, 12)
    return datetime.date(d.year + y, m + 1, 1)


def window_url(kind, geo, start, months, tag="all", property_type="all"):
    end = month_add(start, months) - datetime.timedelta(days=1)
    return (f"/v2/{kind}/{geo}/metrics/monthly?metric_from={start}&metric_to={end}"
            f"&property_type={property_type}&tag={tag}")


def geographies(sim, n):
    """`n` counties and `n` cities with rows in every month of 2021-2023."""
    s = sim.samples()
    headers = {"X-API-Key": SIM_KEY}
    _, _, body = lib.get(f"{sim.base}/v2/permits/search?geo_id={s['big_state']}&permit_from=2021-01-01"
                         f"&permit_to=2023-12-31&size=100", headers=headers)
    counties, cities = [], []
    for item in json.loads(body)["items"]:
        ids = item.get("geo_ids", {})
        for kind, pool, key in (("counties", counties, "county_id"), ("cities", cities, "city_id")):
            geo = ids.get(key)
            if not geo or geo in pool or len(pool) >= n:
                continue
            status, _, b = lib.get(sim.base + window_url(kind, geo, datetime.date(2021, 1, 1), 36) + "&size=100",
                                   headers=headers)
            if status == 200 and len(json.loads(b)["items"]) >= 30:
                pool.append(geo)
    return [("counties", g) for g in counties] + [("cities", g) for g in cities]


def window(args, tmp):
    sim = lib.Sim(args.bin_dir, tmp, "sim-window", SIM_KEY, 20, 30)
    geos = geographies(sim, args.geos)
    start = datetime.date(2021, 1, 1)
    requests = []
    for step in range(args.steps):
        for kind, geo in geos:
            requests.append(("dashboard", window_url(kind, geo, month_add(start, step), 12)))
            requests.append(("reports", window_url(kind, geo, month_add(start, step + 6), 6)))
    out = {"geographies": len(geos), "steps": args.steps, "requests": len(requests), "targets": {}}
    nginx = lib.Nginx(tmp, "window", sim)
    before = gateway(args, tmp, "window-before", sim, ("month_reuse = false",))
    gw = gateway(args, tmp, "window", sim)
    sim_tokens = {a: SIM_KEY for a in APPS}
    for name, base, tokens in (("no cache", sim.base, sim_tokens), ("nginx proxy_cache", nginx.base, sim_tokens),
                               ("gateway before (month_reuse = false)", before.base, APP_TOKENS),
                               ("gateway", gw.base, APP_TOKENS)):
        sim.reset()
        statuses = {}
        for app, url in requests:
            status, _, _ = lib.get(base + url, headers={"X-API-Key": tokens[app]})
            statuses[status] = statuses.get(status, 0) + 1
        st = sim.stats()
        out["targets"][name] = {"credits": st["credits_total"], "upstream_requests": st["requests_total"],
                                "statuses": statuses}
        log(f"  {name}: {st['credits_total']} credits, {st['requests_total']} upstream requests, {statuses}")
    for p in (gw.proc, before.proc, nginx.proc, sim.proc):
        lib.stop(p)
    return out


def table(res):
    L = []
    if "restart" in res:
        r = res["restart"]
        w = r["workload"]
        L.append(f"#### Seeded replay (seed {r['seed']}, {w['actions']} requests in {w['ticks']} ticks), "
                 f"embedded default, restarted at tick {r['split_at_tick']}")
        L.append("")
        L.append("| run | credits | upstream requests | credits saved from disk |")
        L.append("|---|---:|---:|---:|")
        for label, x in r["runs"].items():
            L.append(f"| {label} | {x['credits']} | {x['upstream_requests']} | {x['saved_disk']:.0f} |")
        L.append("")
    if "window" in res:
        r = res["window"]
        L.append(f"#### Sliding monthly windows: {r['geographies']} geographies × {r['steps']} monthly moves × "
                 f"2 dashboards (12 and 6 months) = {r['requests']} requests")
        L.append("")
        L.append("| target | credits | upstream requests | vs nginx |")
        L.append("|---|---:|---:|---:|")
        ng = r["targets"]["nginx proxy_cache"]["credits"]
        for name, x in r["targets"].items():
            L.append(f"| {name} | {x['credits']} | {x['upstream_requests']} | {x['credits'] / ng:.2f}× |")
        L.append("")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--geos", type=int, default=3, help="counties, and as many cities")
    ap.add_argument("--steps", type=int, default=12, help="monthly moves of the windows")
    ap.add_argument("--only", nargs="*", choices=["restart", "window"], default=["restart", "window"])
    ap.add_argument("--out", default=os.path.join(HERE, "results", "disk_window.json"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pgw-disk-window-")
    log(f"work dir {tmp}")
    res = {}
    if "restart" in args.only:
        log("restart")
        res["restart"] = restart(args, tmp)
    if "window" in args.only:
        log("window")
        res["window"] = window(args, tmp)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(table(res))


if __name__ == "__main__":
    main()
