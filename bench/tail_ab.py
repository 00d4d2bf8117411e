"""Latency at a fixed rate, A/B, with the scheduler's view: oha `-q RATE
--latency-correction -c 64` against nginx `proxy_cache`, the hyper ceiling
(the control: no work) and gateway builds or environments, interleaved
round by round; per run the p50/p99/p99.9 and the target's context
switches per 1,000 requests (voluntary: it waited for work or a lock;
involuntary: the kernel took its core away), from /proc.

    python3 bench/tail_ab.py --fraction 0.5 --rounds 4 --secs 8 \\
        gateway=DIR gateway_1_worker=DIR:TOKIO_WORKER_THREADS=1

The rate is `--fraction` of nginx's max (wrk -c64, 5 s, measured first).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import latency  # noqa: E402
import lib  # noqa: E402
import run  # noqa: E402


def switches(pids):
    """(voluntary, involuntary) context switches of every thread of `pids`."""
    vol = invol = 0
    for pid in pids:
        for status in glob.glob(f"/proc/{pid}/task/*/status"):
            try:
                with open(status) as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches"):
                            vol += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches"):
                            invol += int(line.split()[1])
            except OSError:
                pass
    return vol, invol


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--secs", type=int, default=8)
    ap.add_argument("builds", nargs="+", help="name=DIR[:VAR=VALUE,...] (environment of that gateway)")
    args = ap.parse_args()
    oha = latency.oha_binary()
    if not oha:
        sys.exit("tail_ab.py needs oha (cargo install oha)")
    tmp = tempfile.mkdtemp(prefix="pgw-tail-")
    builds = []
    for b in args.builds:
        name, rest = b.split("=", 1)
        bin_dir, _, env = rest.partition(":")
        builds.append((name, bin_dir, dict(kv.split("=", 1) for kv in env.split(",") if kv)))
    sim = lib.Sim(builds[0][1], tmp, "sim", run.SIM_KEY, 50, 150)
    url, body = run.pick_page(sim)
    body_file = os.path.join(tmp, "page.json")
    with open(body_file, "wb") as f:
        f.write(body)
    headers = {"X-API-Key": run.TOKEN}
    targets = {"nginx": lib.Nginx(tmp, "tail", sim), "ceiling": lib.Ceiling(builds[0][1], tmp, body_file)}
    for name, bin_dir, env in builds:
        saved = dict(os.environ)
        os.environ.update(env)
        targets[name] = lib.Gateway(bin_dir, tmp, name, sim, {"bench": run.TOKEN})
        os.environ.clear()
        os.environ.update(saved)
    for name, t in targets.items():
        for _ in range(3):
            status, _, _ = lib.get(t.base + url, headers=headers)
        assert status == 200, (name, status)
    nginx_max = lib.wrk(targets["nginx"].base + url, 64, 5, headers)["rps"]
    rate = round(nginx_max * args.fraction)
    print(f"nginx max {nginx_max:.0f} req/s; offering {rate} ({args.fraction:.0%})", flush=True)
    sched = latency.Schedule(tmp=tmp, token=run.TOKEN, secs=args.secs, warmup=2, conns=64)
    res = {name: [] for name in targets}
    for k in range(args.rounds):
        for name, t in targets.items():
            pids = [str(t.proc.pid)]
            if name == "nginx":
                pids = subprocess.run(["pgrep", "-f", "nginx: worker"], capture_output=True, text=True).stdout.split()
            before = switches(pids)
            r = latency.run_oha(oha, sched, f"{name}-{k}", t.base + url, rate)
            after = switches(pids)
            n = max(r["requests"], 1)
            r["voluntary_per_1k"] = (after[0] - before[0]) * 1000 / n
            r["involuntary_per_1k"] = (after[1] - before[1]) * 1000 / n
            res[name].append(r)
            print(f"round {k} {name:16s} achieved {r['achieved']:.0f} p50 {r['p50']:.2f} p99 {r['p99']:.2f} "
                  f"p99.9 {r['p999']:.2f} ms, non-2xx {r['non2xx']}, oha CPU {r['gen_cpu']:.2f}, switches per 1k "
                  f"requests: voluntary {r['voluntary_per_1k']:.1f} involuntary {r['involuntary_per_1k']:.1f}",
                  flush=True)
    out = os.path.join(tmp, "tail.json")
    with open(out, "w") as f:
        json.dump({"rate": rate, "nginx_max": nginx_max, "results": res}, f)
    print("raw:", out)
    for t in targets.values():
        lib.stop(t.proc)
    lib.stop(sim.proc)


if __name__ == "__main__":
    main()
