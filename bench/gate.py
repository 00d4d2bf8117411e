"""Issue 58: the rate gate at saturation, many apps.

One seeded stream of requests from ~20 app tokens of five teams, replayed
open-loop (each request sent at its scheduled time whatever became of the
earlier ones; latency measured from that time) at 1×, 5× and 20× the
upstream's call rate (1× = 120 requests a minute, 2 a second), against:

- `gateway-bulk`: the release gateway at 120 calls a minute, the bulk
  team's app tokens marked `class = "bulk"`;
- `gateway-equal`: the same gateway and teams, no class;
- `nginx`: nginx `proxy_cache` (bench/lib.py's config: `$request_uri` key,
  cache lock) with the upstream key;
- `direct`: the clients straight to the simulator with the upstream key.

Each run has a fresh simulator (120 calls in any 60 s, `--rate-window
strict`; 100–300 ms a call) and a fresh gateway or nginx. The stream
(`--seed`; the same for every target at one rate):

- interactive apps (60 % of requests):
  - dashboards (20 %): four dashboards of four panels each (monthly metrics
    of counties and cities over 12, 6 or 3 months, one permit search of the
    last three months), refreshed by their viewers all panels at once; the
    window slides one month every `--secs`/3 seconds (dashboard by dashboard);
    dashboards share panels, each app spells them its own way;
  - list pages (25 %): permit searches from a Zipf universe
    (bench/replay.py's), page size 10/25/50/100 by app, each app's spelling
    (`replay.Style`: parameter order, explicit defaults, boolean spellings);
  - search, then details (15 %): a search (size 10 or 25), then one to
    three id lookups (`/v2/permits?id=`, one to five ids from the top of
    its results) 2–8 s later. The results are learnt before the run from an
    unlimited simulator of the same seed, so every target gets the same
    lookups whatever it answered to the search;
- a bulk team (40 %): exports (permit searches of size 100, one county or
  city a month at a time; two apps walk the same slices) and id lookups of
  20–50 ids from a pool of 2,000.

Per target and rate, interactive and bulk apps apart: requests, answered
200, 429, other statuses, no answer (the client's `--timeout`), p50/p95/p99
of the answered (ms), the share of 429s that came within 1 s of the request's
time, the share of requests whose final status came after their deadline
(`upstream.max_queue_wait_secs` + 1 s; no answer counts as late); and per
target: upstream calls and the simulator's 429s among them, credits billed,
answers (200) per upstream call.

    python3 bench/gate.py --secs 60 --rates 1,5,20 [--targets gateway-bulk,gateway-equal,nginx,direct]
                          [--gateway DIR_OR_BINARY] [--seed 58] [--burst N] [--prefer-wait N]

`--gateway` is the release `permit-gateway` (or a folder holding it and
`permit-api-sim`); default `target/release`. Raw results go to `--out`
(JSON). `python3 bench/gate.py --summary` prints the stream only (no runs).
"""

import argparse
import datetime
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import lib  # noqa: E402
import replay  # noqa: E402
from disk_window import SIM_KEY, geographies, month_add  # noqa: E402

UPSTREAM_RPM = 120
LATENCY_MS, JITTER_MS = 100, 200
TARGETS = ["gateway-bulk", "gateway-equal", "nginx", "direct"]

# team -> (weight, [apps]); the bulk team's apps are the bulk class.
BULK_TEAM = "warehouse"
TEAMS = {
    "ops": (1, ["wall", "exec", "alerts"]),
    "web": (1, ["site", "search", "admin", "partner"]),
    "mobile": (1, ["ios", "android", "tablet"]),
    "analytics": (1, ["notebooks", "reports", "bi", "finance", "sales"]),
    BULK_TEAM: (1, ["etl", "export", "sync", "backfill", "ml"]),
}
APP_TEAM = {app: team for team, (_, apps) in TEAMS.items() for app in apps}
TOKENS = {app: f"pgw_gate_{team}_{app}_token" for app, team in APP_TEAM.items()}

# Shares of the stream (requests).
SHARE = {"bulk": 0.40, "dashboard": 0.20, "list": 0.25, "details": 0.15}
DASHBOARDS = {"wall": [0, 1, 2, 7], "exec": [0, 3, 4, 7], "bi": [1, 3, 5, 6], "finance": [2, 4, 5, 6]}
LIST_SIZE = {"site": "25", "search": "50", "admin": "50", "partner": "10", "ios": "10", "android": "10",
             "tablet": "25", "notebooks": "50", "reports": "50"}
ZIPF = 1.3  # of list pages and sessions' searches over the universe
SESSION_APPS = ["site", "search", "ios", "android", "tablet", "alerts", "sales"]
# app -> its export's first geography: each export walks the geographies, a
# month of one a request, from 2016-01 + 24 months × this; two apps (backfill
# and ml) walk the same slices.
EXPORTS = {"etl": 0, "export": 1, "sync": 2, "backfill": 3, "ml": 3}
LOOKUP_APPS = ["etl", "sync", "ml", "export"]


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the stream ------------------------------------------------------------------


class World:
    """What the stream is drawn from, learnt from an unlimited simulator of
    the same seed as the runs' (no latency, no rate limit)."""

    def __init__(self, sim, seed):
        rng = random.Random(seed)
        self.sim = sim
        self.samples = sim.samples()
        self.geos = geographies(sim, 3)  # [(counties|cities, geo)], rows in every month of 2021-2023
        self.styles = {app: replay.Style(rng, app) for app in APP_TEAM}
        self.searches = replay.universe(rng, self.samples, 40)
        self._results = {}
        self.panels = self._panels()
        self.clickable = self._clickable()
        self.ids = self._ids(2000)

    def _panels(self):
        """Eight panel definitions: (kind, metric kind, geo, months, tag);
        the last one a permit search of the last three months."""
        g = self.geos
        metric = [(0, 12, "all"), (1, 6, "solar"), (2, 3, "all"), (3, 12, "solar"), (4, 6, "all"), (5, 3, "solar"),
                  (0, 6, "solar")]
        out = [("metrics", g[i % len(g)][0], g[i % len(g)][1], months, tag) for i, months, tag in metric]
        return out + [("search", None, g[1 % len(g)][1], 3, None)]

    def _clickable(self):
        """The searches whose results a user can click (5 or more at size
        10): the first step of a session."""
        out = []
        for q in self.searches:
            q = [p for p in q if p[0] != "size"] + [("size", "10")]
            if len(self.result_ids("/v2/permits/search?" + urllib.parse.urlencode(q))) >= 5:
                out.append(q[:-1])
        return out

    def _ids(self, n):
        s, ids, cursor = self.samples, [], None
        while len(ids) < n:
            q = [("geo_id", s["big_state"]), ("permit_from", "2022-01-01"), ("permit_to", "2024-12-31"),
                 ("size", 100)]
            if cursor:
                q.append(("cursor", cursor))
            page = self.get("/v2/permits/search?" + urllib.parse.urlencode(q))
            ids += [item["id"] for item in page["items"]]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return ids[:n]

    def get(self, url):
        return lib.get_json(self.sim.base + url, headers={"X-API-Key": SIM_KEY})

    def result_ids(self, url):
        if url not in self._results:
            self._results[url] = [item["id"] for item in self.get(url).get("items", [])]
        return self._results[url]


def panel_url(world, app, panel, now_month):
    """A panel's query when the dashboard's last month is `now_month`."""
    kind, what, geo, months, tag = panel
    start = month_add(now_month, 1 - months)
    end = month_add(now_month, 1) - datetime.timedelta(days=1)
    style = world.styles[app]
    if kind == "search":
        return style.render("/v2/permits/search", [("geo_id", geo), ("permit_from", str(start)),
                                                   ("permit_to", str(end)), ("size", "10")])
    params = [("metric_from", str(start)), ("metric_to", str(end)), ("property_type", "all"), ("tag", tag)]
    return style.render(f"/v2/{what}/{geo}/metrics/monthly", params, paged=False, counted=False)


def poisson(rng, rate, secs):
    t, out = 0.0, []
    if rate <= 0:
        return out
    while True:
        t += rng.expovariate(rate)
        if t >= secs:
            return out
        out.append(t)


def stream(world, seed, mult, secs):
    """The requests of one run: dicts (t, app, cls, kind, url, key), by t.
    `key` is the logical query (spelling aside), for the summary."""
    rate = mult * UPSTREAM_RPM / 60
    rng = random.Random(f"{seed}-{mult:g}-{secs:g}")
    out = []

    def add(t, app, kind, url, key):
        out.append({"t": t, "app": app, "cls": "bulk" if APP_TEAM[app] == BULK_TEAM else "interactive",
                    "kind": kind, "url": url, "key": key})

    # Dashboards: a refresh asks all four panels at once.
    slide = max(5.0, secs / 3)
    first = datetime.date(2023, 6, 1)
    dash_apps = list(DASHBOARDS)
    for t in poisson(rng, rate * SHARE["dashboard"] / 4, secs):
        app = rng.choice(dash_apps)
        # Dashboards slide at different moments.
        step = int((t + slide * dash_apps.index(app) / len(dash_apps)) // slide)
        now = month_add(first, step)
        for i in DASHBOARDS[app]:
            add(t, app, "dashboard", panel_url(world, app, world.panels[i], now), ("panel", i, str(now)))
    # List pages.
    list_apps = list(LIST_SIZE)
    for t in poisson(rng, rate * SHARE["list"], secs):
        app = rng.choice(list_apps)
        q = [p for p in world.searches[replay.zipf_pick(rng, len(world.searches), ZIPF)] if p[0] != "size"]
        q.append(("size", LIST_SIZE[app]))
        add(t, app, "list", world.styles[app].render("/v2/permits/search", q), ("search", tuple(q)))
    # Search, then details: three requests a session on average.
    for t in poisson(rng, rate * SHARE["details"] / 3, secs):
        app = rng.choice(SESSION_APPS)
        q = list(world.clickable[replay.zipf_pick(rng, len(world.clickable), ZIPF)])
        q.append(("size", rng.choice(["10", "25"])))
        url = world.styles[app].render("/v2/permits/search", q)
        add(t, app, "search", url, ("search", tuple(q)))
        shown = world.result_ids(url)
        at = t
        for _ in range(rng.choice([1, 2, 3])):
            at += rng.uniform(2, 8)
            if at >= secs or not shown:
                break
            k = 1 if rng.random() < 0.7 else rng.randint(2, 5)
            ids = list(dict.fromkeys(shown[min(len(shown) - 1, int(rng.random() ** 2 * len(shown)))]
                                     for _ in range(k)))
            add(at, app, "details", "/v2/permits?" + urllib.parse.urlencode([("id", i) for i in ids]),
                ("ids", tuple(sorted(ids))))
    # The bulk team: exports, a month of one geography a request, and big lookups.
    export_next = {app: 0 for app in EXPORTS}
    for t in poisson(rng, rate * SHARE["bulk"], secs):
        if rng.random() < 0.6:
            app = rng.choice(list(EXPORTS))
            k = export_next[app]
            export_next[app] += 1
            _, geo = world.geos[(EXPORTS[app] + k) % len(world.geos)]
            month = month_add(datetime.date(2016, 1, 1), 24 * min(EXPORTS[app], 3) + k // len(world.geos))
            end = month_add(month, 1) - datetime.timedelta(days=1)
            q = [("geo_id", geo), ("permit_from", str(month)), ("permit_to", str(end)), ("size", "100")]
            add(t, app, "export", world.styles[app].render("/v2/permits/search", q), ("search", tuple(q)))
        else:
            app = rng.choice(LOOKUP_APPS)
            ids = rng.sample(world.ids, rng.randint(20, 50))
            add(t, app, "lookup", "/v2/permits?" + urllib.parse.urlencode([("id", i) for i in ids]),
                ("ids", tuple(sorted(ids))))
    out.sort(key=lambda r: r["t"])
    return out


def summary(reqs, secs):
    """Requests and distinct logical queries per class and kind."""
    rows = {}
    for r in reqs:
        for k in ((r["cls"], "all"), (r["cls"], r["kind"])):
            x = rows.setdefault(k, {"requests": 0, "literal": set(), "logical": set()})
            x["requests"] += 1
            x["literal"].add(r["url"])
            x["logical"].add(r["key"])
    return {f"{c}/{k}": {"requests": x["requests"], "distinct_literal": len(x["literal"]),
                         "distinct_logical": len(x["logical"])} for (c, k), x in sorted(rows.items())}


# --- the runs ----------------------------------------------------------------------


def team_lines(bulk, weights):
    lines = []
    for team, (weight, apps) in TEAMS.items():
        lines += ["[[teams]]", f'name = "{team}"', "credit_limit = 1000000000",
                  f"weight = {weights.get(team, weight)}"]
        for app in apps:
            lines += ["[[teams.tokens]]", f'name = "{app}"', f'token_sha256 = "{lib.sha256_hex(TOKENS[app])}"']
            if bulk and team == BULK_TEAM:
                lines.append('class = "bulk"')
    return lines


def start_target(target, gw_dir, tmp, name, sim, args):
    """(base URL, {app: token}, process or None, gateway or None)."""
    if target == "direct":
        return sim.base, {app: SIM_KEY for app in APP_TEAM}, None, None
    if target == "nginx":
        ng = lib.Nginx(tmp, name, sim)
        return ng.base, {app: SIM_KEY for app in APP_TEAM}, ng.proc, None
    upstream = [f"requests_per_minute = {UPSTREAM_RPM}", f"max_queue_wait_secs = {args.max_queue_wait}"]
    if args.burst:
        upstream.append(f"burst = {args.burst}")
    gw = lib.Gateway(gw_dir, tmp, name, sim, {}, upstream_lines=upstream,
                     cache_lines=(f'disk_path = "{tmp}/cache-{name}.redb"',),
                     extra_lines=team_lines(target == "gateway-bulk", args.weights))
    return gw.base, TOKENS, gw.proc, gw


def one_request(base, token, r, start, timeout, prefer_wait):
    due = start + r["t"]
    headers = {"X-API-Key": token}
    if prefer_wait is not None and r["cls"] == "interactive":
        headers["Prefer"] = f"wait={prefer_wait}"
    left = due + timeout - time.monotonic()
    status = None
    try:
        if left > 0:
            status, _, _ = lib.get(base + r["url"], headers=headers, timeout=left)
    except (TimeoutError, OSError, urllib.error.URLError) as e:
        reason = getattr(e, "reason", e)
        status = None if isinstance(reason, TimeoutError) or "timed out" in str(reason) else 0
    took = time.monotonic() - due
    if took > timeout:
        status = None
    return status, took


def one_run(target, gw_dir, sim_dir, tmp, name, reqs, args):
    sim = lib.Sim(sim_dir, tmp, f"sim-{name}", SIM_KEY, LATENCY_MS, JITTER_MS, rpm=UPSTREAM_RPM,
                  rate_window="strict")
    base, tokens, proc, gw = start_target(target, gw_dir, tmp, name, sim, args)
    before = sim.stats()
    rate = max(1.0, len(reqs) / args.secs)
    results = [None] * len(reqs)
    start = time.monotonic() + 0.5

    def send(i):
        r = reqs[i]
        results[i] = one_request(base, tokens[r["app"]], r, start, args.timeout, args.prefer_wait)

    workers = int(min(3000, rate * (args.timeout + 2) + 64))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, r in enumerate(reqs):
            delay = start + r["t"] - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(send, i)
    after = sim.stats()
    extra = {}
    if gw is not None:
        m = gw.metrics()
        spent = {}
        for k, v in m.items():
            if k.startswith("gateway_credits_spent_total{"):
                team = k.split('team="', 1)[1].split('"', 1)[0]
                spent[team] = spent.get(team, 0) + v
        extra["gateway_credits_spent_by_team"] = spent
    if proc is not None:
        lib.stop(proc)
    lib.stop(sim.proc)
    calls = after["requests_total"] - before["requests_total"]
    sim_429 = after["by_status"].get("429", 0) - before["by_status"].get("429", 0)
    credits = after["credits_total"] - before["credits_total"]
    out = {"calls": calls, "sim_429": sim_429, "credits": credits, **extra, "classes": {}}
    for cls in ("interactive", "bulk"):
        mine = [(reqs[i], res) for i, res in enumerate(results) if reqs[i]["cls"] == cls]
        out["classes"][cls] = stats([res for _, res in mine], args)
        out["classes"][cls]["by_kind"] = {}
        for kind in sorted({r["kind"] for r, _ in mine}):
            out["classes"][cls]["by_kind"][kind] = stats([res for r, res in mine if r["kind"] == kind], args)
    ok = sum(c["ok"] for c in out["classes"].values())
    out["ok"] = ok
    out["per_call"] = ok / calls if calls else float("nan")
    return out


def pct(xs, p):
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000 if xs else float("nan")


def stats(results, args):
    deadline = args.max_queue_wait + 1
    ok = sorted(t for s, t in results if s == 200)
    refused = [t for s, t in results if s == 429]
    return {
        "requests": len(results),
        "ok": len(ok),
        "r429": len(refused),
        "other": sum(1 for s, _ in results if s not in (200, 429, None)),
        "no_answer": sum(1 for s, _ in results if s is None),
        "p50": pct(ok, 0.50), "p95": pct(ok, 0.95), "p99": pct(ok, 0.99),
        "r429_within_1s": sum(1 for t in refused if t <= 1.0),
        "late": sum(1 for s, t in results if s is None or t > deadline),
    }


# --- the tables ----------------------------------------------------------------------


def n(x):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.0f}"


def share(a, b):
    return "–" if not b else f"{100 * a / b:.0f} %"


def tables(res, rates):
    L = ["| rate | target | apps | requests | answered 200 | 429 | other | no answer | p50 ms | p95 ms | p99 ms "
         "| 429s within 1 s | past deadline |",
         "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rates:
        for target, x in res[f"{r:g}"].items():
            for cls, c in x["classes"].items():
                L.append(f"| {r:g}× ({r * 2:g}/s) | {target} | {cls} | {c['requests']} | {c['ok']} "
                         f"({share(c['ok'], c['requests'])}) | {c['r429']} | {c['other']} | {c['no_answer']} | "
                         f"{n(c['p50'])} | {n(c['p95'])} | {n(c['p99'])} | {share(c['r429_within_1s'], c['r429'])} | "
                         f"{share(c['late'], c['requests'])} |")
    L += ["", "| rate | target | upstream calls | of them 429 | credits billed | answers 200 | answers per call "
              "| vs nginx | answers per call not refused |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rates:
        ng = res[f"{r:g}"].get("nginx")
        for target, x in res[f"{r:g}"].items():
            vs = f"{x['per_call'] / ng['per_call']:.2f}×" if ng and ng["per_call"] else "–"
            served = x["calls"] - x["sim_429"]
            L.append(f"| {r:g}× | {target} | {x['calls']} | {x['sim_429']} | {x['credits']:,} | {x['ok']} | "
                     f"{x['per_call']:.2f} | {vs} | {x['ok'] / served if served else float('nan'):.2f} |")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--secs", type=float, default=60, help="length of each run's stream")
    ap.add_argument("--rates", default="1,5,20", help="multiples of the upstream's 120 calls a minute")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--gateway", default=os.path.join(HERE, "..", "target", "release"),
                    help="the permit-gateway binary, or a folder with it and permit-api-sim")
    ap.add_argument("--sim", default=None, help="folder of permit-api-sim (default: the gateway's)")
    ap.add_argument("--seed", type=int, default=58)
    ap.add_argument("--timeout", type=float, default=30, help="client timeout from the request's time (s)")
    ap.add_argument("--max-queue-wait", type=int, default=10, help="the gateway's upstream.max_queue_wait_secs")
    ap.add_argument("--burst", type=int, default=None, help="the gateway's upstream.burst (unset: the window)")
    ap.add_argument("--weight", action="append", default=[], help="TEAM=N, a team's weight (default 1)")
    ap.add_argument("--prefer-wait", type=int, default=None, help="interactive requests send Prefer: wait=N")
    ap.add_argument("--out", default=None, help="raw JSON (default: in the work dir)")
    ap.add_argument("--summary", action="store_true", help="print the stream's make-up only")
    args = ap.parse_args()
    args.weights = {k: int(v) for k, v in (w.split("=", 1) for w in args.weight)}
    gw = os.path.abspath(args.gateway)
    bin_dir = gw if os.path.isdir(gw) else os.path.dirname(gw)
    sim_dir = os.path.abspath(args.sim) if args.sim else bin_dir
    for d, b in ((bin_dir, "permit-gateway"), (sim_dir, "permit-api-sim")):
        if not os.path.exists(os.path.join(d, b)):
            ap.error(f"no {b} in {d} (cargo build --release -p permit-gateway -p permit-api-sim, or --gateway/--sim)")
    rates = [float(r) for r in args.rates.split(",")]
    targets = args.targets.split(",")
    for t in targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t!r}: one of {','.join(TARGETS)}")
    tmp = tempfile.mkdtemp(prefix="pgw-gate-")
    log(f"work dir {tmp}")
    resolver = lib.Sim(sim_dir, tmp, "sim-resolver", SIM_KEY, 0, 0)
    world = World(resolver, args.seed)
    streams = {r: stream(world, args.seed, r, args.secs) for r in rates}
    lib.stop(resolver.proc)
    res = {"args": {k: v for k, v in vars(args).items()}, "workload": {}, "runs": {}}
    for r in rates:
        res["workload"][f"{r:g}"] = summary(streams[r], args.secs)
        log(f"{r:g}×: {len(streams[r])} requests in {args.secs:g} s: "
            + json.dumps({k: v for k, v in res["workload"][f"{r:g}"].items()}))
    if args.summary:
        print(json.dumps(res["workload"], indent=1))
        return
    for r in rates:
        res["runs"][f"{r:g}"] = {}
        for target in targets:
            began = time.time()
            x = one_run(target, bin_dir, sim_dir, tmp, f"{target}-{r:g}x", streams[r], args)
            x["wall_secs"] = round(time.time() - began, 1)
            res["runs"][f"{r:g}"][target] = x
            i, b = x["classes"]["interactive"], x["classes"]["bulk"]
            log(f"  {r:g}× {target}: interactive {i['ok']}/{i['requests']} p95 {n(i['p95'])} ms, "
                f"bulk {b['ok']}/{b['requests']}, {x['calls']} calls, {x['credits']} credits "
                f"({x['wall_secs']} s)")
    out = args.out or os.path.join(tmp, "gate.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    log(f"raw results: {out}")
    print(tables(res["runs"], rates))


if __name__ == "__main__":
    main()
