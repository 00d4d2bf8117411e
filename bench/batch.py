"""Many apps looking up ids, at 1× to 20× the upstream's call rate: what
the org's ~120 calls a minute answer when id lookups of many requests share
one upstream call (`upstream.batch_window_ms`) and when each is a call of
its own (the build before batching).

    python3 bench/batch.py before=DIR after=DIR [--secs 10] [--rates 1,2,5,10,20]

Each DIR holds `permit-gateway` and `permit-api-sim`. For each rate and
build (interleaved, each on a fresh simulator and gateway, so every id is
new): the simulator at 120 calls a minute with 100–150 ms of latency, the
gateway at 120 calls a minute with two teams, and an open-loop load of
single-id lookups (`/v2/permits?id=…`, each id asked once, the teams taking
turns) at `rate × 2` lookups a second for `--secs`. Latency is measured from
when each lookup was due, not when a worker got to it (no coordinated
omission). Reports, per run: lookups answered 200, refused 429, other
statuses, upstream calls, answers per upstream call, p50/p99 of the answered.
"""

import argparse
import os
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib  # noqa: E402
import run  # noqa: E402

TEAMS = {"web": "tok-batch-web-0001", "jobs": "tok-batch-jobs-0002"}
UPSTREAM_RPM = 120


def known_ids(bin_dir, tmp, n):
    """`n` permit ids of the simulator's dataset (the same seed in every
    simulator), learnt from one without a rate limit."""
    sim = lib.Sim(bin_dir, tmp, "sim-ids", run.SIM_KEY, 0, 0)
    s = sim.samples()
    ids, cursor = [], None
    while len(ids) < n:
        q = [("geo_id", s["state"]), ("permit_from", s["permit_from"]), ("permit_to", s["permit_to"]), ("size", 100)]
        if cursor:
            q.append(("cursor", cursor))
        page = lib.get_json(sim.base + "/v2/permits/search?" + urllib.parse.urlencode(q),
                            headers={"X-API-Key": run.SIM_KEY})
        ids += [item["id"] for item in page["items"]]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    lib.stop(sim.proc)
    assert len(ids) >= n, f"the sample state has {len(ids)} permits, {n} wanted"
    return ids[:n]


def one_run(bin_dir, tmp, name, ids, per_sec, secs):
    sim = lib.Sim(bin_dir, tmp, f"sim-{name}", run.SIM_KEY, 100, 50, rpm=UPSTREAM_RPM)
    # A disk tier of its own: a file shared with an earlier run would hold
    # the ids that run bought.
    gw = lib.Gateway(bin_dir, tmp, name, sim, TEAMS,
                     upstream_lines=(f"requests_per_minute = {UPSTREAM_RPM}",),
                     cache_lines=(f'disk_path = "{tmp}/cache-{name}.redb"',))
    calls_before = sim.stats()["requests_total"]
    n = int(per_sec * secs)
    tokens = list(TEAMS.values())
    results = [None] * n
    start = time.monotonic() + 0.2

    def lookup(i):
        due = start + i / per_sec
        status, _, _ = lib.get(f"{gw.base}/v2/permits?id={ids[i]}", headers={"X-API-Key": tokens[i % 2]},
                               timeout=60)
        results[i] = (status, time.monotonic() - due)

    with ThreadPoolExecutor(max_workers=512) as pool:
        for i in range(n):
            delay = start + i / per_sec - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(lookup, i)
    calls = sim.stats()["requests_total"] - calls_before
    lib.stop(gw.proc)
    lib.stop(sim.proc)
    ok = sorted(t for s, t in results if s == 200)
    refused = sum(1 for s, _ in results if s == 429)
    other = sum(1 for s, _ in results if s not in (200, 429))
    pct = lambda p: ok[min(len(ok) - 1, int(p * len(ok)))] * 1000 if ok else float("nan")
    return {"lookups": n, "ok": len(ok), "refused": refused, "other": other, "calls": calls,
            "per_call": len(ok) / calls if calls else float("nan"), "p50": pct(0.50), "p99": pct(0.99)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=float, default=10)
    ap.add_argument("--rates", default="1,2,5,10,20", help="multiples of the upstream's call rate")
    ap.add_argument("builds", nargs="+", help="name=DIR")
    args = ap.parse_args()
    builds = lib.builds(args.builds)
    tmp = tempfile.mkdtemp(prefix="pgw-batch-")
    rates = [float(r) for r in args.rates.split(",")]
    per_sec = {r: r * UPSTREAM_RPM / 60 for r in rates}
    ids = known_ids(builds[0][1], tmp, int(max(per_sec.values()) * args.secs))
    print("| rate | build | lookups | answered 200 | 429 | other | upstream calls | answers per call | p50 ms | p99 ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rates:
        for name, bin_dir, _ in builds:
            res = one_run(bin_dir, tmp, f"{name}-{r:g}x", ids, per_sec[r], args.secs)
            print(f"| {r:g}× ({per_sec[r]:g}/s) | {name} | {res['lookups']} | {res['ok']} | {res['refused']} | "
                  f"{res['other']} | {res['calls']} | {res['per_call']:.1f} | {res['p50']:.0f} | {res['p99']:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
