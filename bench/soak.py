"""A longer soak (issue 9): `python3 bench/soak.py --bin-dir target/release --minutes 10`.

Runs the release gateway (Redis L2, file ledger) in front of the simulator
(20–60 ms latency) for the given time under wrk: 16 connections on one hot
page (hits) and 4 connections of distinct queries (misses), in one-minute
slices. Samples the gateway's RSS after every slice and checks at the end:
no 5xx and no socket errors, RSS levelled off (the last slice within 20 % +
16 MiB of the first), and the team's ledger equals what the simulator
charged. Loopback only; every wrk run and the whole soak are time-bounded.
"""

import argparse
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib  # noqa: E402
from run import MISS_LUA, SIM_KEY, TOKEN  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--minutes", type=int, default=10)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="pgw-soak-")
    redis = lib.Redis(tmp)
    sim = lib.Sim(args.bin_dir, tmp, "sim-soak", SIM_KEY, 20, 40)
    gw = lib.Gateway(args.bin_dir, tmp, "soak", sim, {"soak": TOKEN}, redis_url=redis.url,
                     memory_max_bytes=32 * 1024 * 1024)
    s = sim.samples()
    hot = (f"{gw.base}/v2/permits/search?geo_id={s['state']}&permit_from={s['permit_from']}"
           f"&permit_to={s['permit_to']}&size=5")
    script = os.path.join(tmp, "miss.lua")
    with open(script, "w") as f:
        f.write(MISS_LUA)
    headers = {"X-API-Key": TOKEN}
    samples, bad, served = [], 0, 0
    for minute in range(args.minutes):
        results = {}

        def misses():
            env = {"MISS_OFFSET": str(minute * 200000), "MISS_GEO": s["big_state"]}
            results["miss"] = lib.wrk(gw.base + "/", 4, 60, headers, threads=1, script=script, env=env)

        t = threading.Thread(target=misses)
        t.start()
        results["hit"] = lib.wrk(hot, 16, 60, headers, threads=1)
        t.join()
        rss, _ = lib.rss(gw.proc.pid)
        samples.append(rss)
        for r in results.values():
            bad += r["non2xx"] + r["errors"]
            served += int(r["rps"] * 60)
        print(f"minute {minute + 1}: hits {results['hit']['rps']:.0f}/s, misses {results['miss']['rps']:.0f}/s,"
              f" RSS {rss / 2**20:.1f} MiB, bad {bad}", flush=True)
    _, _, body = lib.get(gw.base + "/v2/usage", headers=headers)
    import json
    ledger = json.loads(body)["credits_used"]
    charged = sim.stats()["credits_total"]
    for p in (gw.proc, sim.proc):
        lib.stop(p)
    first, last = samples[0], samples[-1]
    ok = bad == 0 and last <= first * 1.2 + 16 * 2**20 and ledger == charged
    print(f"soak: ~{served} requests in {args.minutes} min; non-2xx/errors {bad}; RSS {first / 2**20:.1f} → "
          f"{last / 2**20:.1f} MiB; ledger {ledger} vs simulator {charged}: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
