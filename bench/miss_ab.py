"""The miss path of several builds side by side: what a miss adds over the
upstream (p50, p99) and misses per second, with the file ledger (L1 on,
no Redis): the A/B behind the miss rows of BENCHMARKS.md (issues 30, 35).

    python3 bench/miss_ab.py [--rounds 8] [--secs 4] [--conns 1 8] name=DIR name=DIR [...]

Each DIR holds `permit-gateway` (and the first, `permit-api-sim`): copy
them out of target/ per build, the target dir is rewritten by the next
build. One simulator (latency 0) and every build's gateway are up at once,
so a round sees the same machine for all; each round runs the simulator
asked directly, then every gateway, in an order that rotates per round.
The load is run.py's miss phase (bench/run.py --only miss): wrk -t1, every
request a distinct permit search of 5 records (never cached, so each one
reserves, calls the upstream and settles). Added = a run's p50 (p99) less
the same round's direct p50 (p99); per build the median over the rounds,
and the median of its paired difference to the first build.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib  # noqa: E402
import run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--secs", type=int, default=4, help="seconds per wrk run")
    ap.add_argument("--conns", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--out", help="write the raw numbers here (JSON)")
    ap.add_argument("builds", nargs="+", help="name=DIR")
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.builds]
    tmp = tempfile.mkdtemp(prefix="pgw-miss-ab-")
    sim = lib.Sim(builds[0][1], tmp, "sim", run.SIM_KEY, 0, 0)
    geo = sim.samples()["state"]
    script = os.path.join(tmp, "miss.lua")
    with open(script, "w") as f:
        f.write(run.MISS_LUA)
    team = {"bench": run.TOKEN}
    gws = {name: lib.Gateway(d, tmp, f"miss-{name}", sim, team) for name, d in builds}
    targets = [("direct", sim.base, run.SIM_KEY)] + [(n, g.base, run.TOKEN) for n, g in gws.items()]
    raw = {c: {name: [] for name, _, _ in targets} for c in args.conns}
    offset = 0
    for conns in args.conns:
        for rnd in range(args.rounds):
            # The simulator alone first (the round's baseline), then the
            # gateways, each round starting with the next one.
            k = rnd % len(builds)
            order = [targets[0]] + targets[1 + k:] + targets[1:1 + k]
            for name, base, key in order:
                offset += 40000
                r = lib.wrk(base + "/", conns, args.secs, {"X-API-Key": key}, threads=1, script=script,
                            env={"MISS_OFFSET": str(offset), "MISS_GEO": geo})
                bad = r["non2xx"] + r["errors"]
                print(f"c{conns} round {rnd} {name:>10}: {r['rps']:7.0f} req/s p50 {r['p50']:.3f} "
                      f"p99 {r['p99']:.3f} ms{f' BAD {bad}' if bad else ''}", flush=True)
                r.pop("raw")
                raw[conns][name].append(r)
    for g in gws.values():
        lib.stop(g.proc)
    lib.stop(sim.proc)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(raw, f, indent=1)
    first = builds[0][0]
    print()
    print("| conns | build | req/s | direct p50 ms | added p50 ms | added p99 ms | "
          f"paired − {first}, p50 / p99 ms | bad |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for conns, runs in raw.items():
        direct = runs["direct"]
        for name, _ in builds:
            rs = runs[name]
            a50 = [r["p50"] - d["p50"] for r, d in zip(rs, direct)]
            a99 = [r["p99"] - d["p99"] for r, d in zip(rs, direct)]
            if name == first:
                paired = ""
            else:
                f = runs[first]
                p50 = statistics.median(r["p50"] - x["p50"] for r, x in zip(rs, f))
                p99 = statistics.median(r["p99"] - x["p99"] for r, x in zip(rs, f))
                paired = f"{p50:+.2f} / {p99:+.2f}"
            bad = sum(r["non2xx"] + r["errors"] for r in rs)
            print(f"| {conns} | {name} | {statistics.median(r['rps'] for r in rs):.0f} | "
                  f"{statistics.median(d['p50'] for d in direct):.2f} | {statistics.median(a50):+.2f} | "
                  f"{statistics.median(a99):+.2f} | {paired} | {bad} |")


if __name__ == "__main__":
    main()
