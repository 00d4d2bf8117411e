"""Issue 61's benchmark: a month of a dashboard team's mornings while the
vendor publishes a data release every 7 days, time compressed.

Each compressed day (`--day-secs`, default 4 s = 24 h) the dashboard is
opened once, at a seeded time in the first quarter of the day (09:00 to
15:00), and asks the same set of answers: permit searches, a contractor
search, monthly metrics of a county and a city, and three permits by id.
On days 7, 14, 21 and 28 the simulator publishes a new release
(`POST /_sim/release`: every permit's job value is revised, so every one of
these answers changes) at a seeded time of the morning. Route TTLs are
one compressed day (`cache.route_ttl_secs`), nginx's `proxy_cache_valid`
likewise. Each target has a simulator of its own and all run at once:

- nginx `proxy_cache`, 1-day validity;
- the gateway with route TTLs only (`cache.release_poll_secs = 0`: 0.2.0);
- the gateway, default freshness (`"ttl"`: a newer release outdates older
  answers), release read every second (a compressed 6 h: the shortest poll
  this compression allows; the default, 300 s, is 5 minutes);
- the gateway, `cache.freshness = "release"` (max age 30 compressed days).

An answer is stale when the release changed it (a different body of the
same request is served before the next release) and its body is one served
before the release; "stale for at most" is the longest time between a
release and a stale answer served after it, in compressed hours. Calls are the simulator's data calls
(`/v2/meta/release` reads are counted apart). Credits are the simulator's,
so any build measures them:

    python3 bench/release.py --bin-dir target/debug
"""

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import lib  # noqa: E402

SIM_KEY = "bench-upstream-key"
TOKEN = "pgw_bench_dashboard_token"
DAYS = 30
RELEASE_DAYS = (7, 14, 21, 28)
ROUTES = ("permits_search", "contractors_search", "county_metrics_monthly", "city_metrics_monthly",
          "permits_by_id")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def dashboard(sim):
    """The dashboard's answers (paths), and three permit ids read from a
    first page (the simulator's stats are reset after)."""
    s = sim.samples()
    win = f"permit_from={s['permit_from']}&permit_to={s['permit_to']}"
    urls = [
        f"/v2/permits/search?geo_id={s['state']}&{win}&size=10",
        f"/v2/permits/search?geo_id={s['state']}&{win}&size=25",
        f"/v2/permits/search?geo_id={s['big_state']}&permit_from=2022-01-01&permit_to=2022-12-31&size=10",
        f"/v2/permits/search?geo_id={s['big_state']}&permit_from=2023-01-01&permit_to=2023-12-31&size=10",
        f"/v2/contractors/search?geo_id={s['state']}&{win}&size=10",
        f"/v2/counties/{s['county_geo_id']}/metrics/monthly?metric_from=2022-01-01&metric_to=2022-12-31"
        "&property_type=all&tag=all",
        f"/v2/cities/{s['city_geo_id']}/metrics/monthly?metric_from=2022-01-01&metric_to=2022-12-31"
        "&property_type=all&tag=all",
    ]
    _, _, body = lib.get(sim.base + f"/v2/permits/search?geo_id={s['big_state']}&{win}&size=3",
                         headers={"X-API-Key": SIM_KEY})
    ids = [i["id"] for i in json.loads(body)["items"]]
    urls += [f"/v2/permits?id={i}" for i in ids]
    return urls


def schedule(seed, day_secs):
    """(offset in seconds, kind) of every event of the month, in order."""
    rng = random.Random(seed)
    events = []
    for day in range(DAYS):
        if day in RELEASE_DAYS:
            events.append((day * day_secs + rng.uniform(0, day_secs / 4), "release"))
        events.append((day * day_secs + rng.uniform(0, day_secs / 4), "open"))
    return sorted(events)


def run_target(name, args, tmp, events, out):
    sim = lib.Sim(args.bin_dir, tmp, f"sim-{name}", SIM_KEY, 20, 10)
    urls = dashboard(sim)
    ttl = args.day_secs
    ttls = ["[cache.route_ttl_secs]"] + [f"{r} = {ttl}" for r in ROUTES]
    if name == "nginx":
        conf = lib.NGINX_CONF
        lib.NGINX_CONF = conf.replace("proxy_cache_valid 200 1d;", f"proxy_cache_valid 200 {ttl}s;")
        target = lib.Nginx(tmp, "release", sim)
        lib.NGINX_CONF = conf
        base, token = target.base, SIM_KEY
    else:
        lines = {
            "ttl-only": ["release_poll_secs = 0"],
            "fresher": ["release_poll_secs = 1"],
            "release": ["release_poll_secs = 1", 'freshness = "release"',
                        f"release_max_age_secs = {30 * args.day_secs}"],
        }[name]
        target = lib.Gateway(args.bin_dir, tmp, f"release-{name}", sim, {"dashboard": TOKEN},
                             cache_lines=lines + ttls)
        base, token = target.base, TOKEN
    sim.reset()
    served = {u: [] for u in urls}
    releases = []
    start = time.time() + 1
    for offset, kind in events:
        time.sleep(max(0.0, start + offset - time.time()))
        if kind == "release":
            releases.append((time.time(), sim.stats()))
            lib.get(sim.base + "/_sim/release", method="POST", body=b"{}")
            continue
        for url in urls:
            status, _, body = lib.get(base + url, headers={"X-API-Key": token})
            if status == 200:
                served[url].append((time.time(), hashlib.sha256(body).hexdigest()))
    st = sim.stats()
    release_reads = st["by_path"].get("/v2/meta/release", 0)
    stale_answers, waves = 0, []
    for i, (at, before) in enumerate(releases):
        until = releases[i + 1][0] if i + 1 < len(releases) else float("inf")
        end = releases[i + 1][1] if i + 1 < len(releases) else st
        stale_h = 0.0
        for url, answers in served.items():
            old = {h for t, h in answers if t < at}
            period = [(t, h) for t, h in answers if at <= t < until]
            if not any(h not in old for _, h in period):
                continue  # this answer did not change with the release
            for t, h in period:
                if h in old:
                    stale_answers += 1
                    stale_h = max(stale_h, (t - at) / args.day_secs * 24)
        reads = end["by_path"].get("/v2/meta/release", 0) - before["by_path"].get("/v2/meta/release", 0)
        waves.append({"stale_h": round(stale_h, 1),
                      "data_calls": end["requests_total"] - before["requests_total"] - reads,
                      "credits": end["credits_total"] - before["credits_total"]})
    saved_release = 0.0
    if name != "nginx":
        saved_release = sum(v for k, v in target.metrics().items()
                            if k.startswith("gateway_credits_saved_total") and 'reason="release"' in k)
    out[name] = {
        "credits": st["credits_total"],
        "data_calls": st["requests_total"] - release_reads,
        "release_reads": release_reads,
        "stale_answers": stale_answers,
        "stale_for_at_most_h": [w["stale_h"] for w in waves],
        "per_release_period": waves,
        "saved_release": saved_release,
        "answers": DAYS * len(urls),
    }
    log(f"  {name}: {out[name]}")
    lib.stop(target.proc)
    lib.stop(sim.proc)


LABELS = {
    "nginx": "nginx `proxy_cache`, 1-day validity",
    "ttl-only": "gateway, route TTLs only (`release_poll_secs = 0`, as 0.2.0)",
    "fresher": "gateway, default (`freshness = \"ttl\"`, release read)",
    "release": "gateway, `freshness = \"release\"`",
}


def waves(x):
    return " / ".join(f"{w['data_calls']}/{w['credits']}" for w in x["per_release_period"])


def table(res, args):
    L = [f"#### A month of mornings ({DAYS} days of {args.day_secs} s, releases on days "
         f"{', '.join(map(str, RELEASE_DAYS))}, {res['answers']} answers asked, seed {args.seed})", "",
         "| target | credits | data calls | release reads | stale answers | stale for at most, after each "
         "release (compressed h) | data calls / credits from a release to the next | credits saved, "
         "`reason=\"release\"` |",
         "|---|---:|---:|---:|---:|---|---|---:|"]
    for name in ("nginx", "ttl-only", "fresher", "release"):
        x = res["targets"][name]
        L.append(f"| {LABELS[name]} | {x['credits']} | {x['data_calls']} | {x['release_reads']} | "
                 f"{x['stale_answers']} | {' / '.join(str(h) for h in x['stale_for_at_most_h'])} | "
                 f"{waves(x)} | "
                 f"{x['saved_release']:.0f} |")
    L.append("")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--seed", type=int, default=61)
    ap.add_argument("--day-secs", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "data_release.json"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pgw-release-")
    log(f"work dir {tmp}")
    events = schedule(args.seed, args.day_secs)
    targets = {}
    threads = [threading.Thread(target=run_target, args=(n, args, tmp, events, targets))
               for n in ("nginx", "ttl-only", "fresher", "release")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    answers = next(iter(targets.values()))["answers"] if targets else 0
    res = {"targets": targets, "answers": answers, "day_secs": args.day_secs, "seed": args.seed}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(table(res, args))


if __name__ == "__main__":
    main()
