"""Instructions per L1 hit (callgrind) of several builds, at several log
levels, in one run: the A/B behind each hit-path change in BENCHMARKS.md.

    python3 bench/instr_ab.py --levels warn,info before=DIR after=DIR[,KEY=VALUE...] [...]
    python3 bench/instr_ab.py --levels warn --files before=DIR after=DIR

`--files` also lists the files of `src/` whose functions the hits ran
(callgrind_annotate over the same dump, every function with a cost): how
many files an L1 hit crosses.

Each DIR holds `permit-gateway` and `permit-api-sim` (copy them out of
target/ per build: the target dir is rewritten by the next build);
KEY=VALUEs are environment for that build's gateway (`lib.builds`). Same
page, load and counting as `bench/instructions.py` (wrk -t1 -c8, 4 s).
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import instructions as ins  # noqa: E402
import lib  # noqa: E402
import run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--levels", default="warn,info", help="log levels, comma-separated (info: access log on)")
    ap.add_argument("--secs", type=int, default=4)
    ap.add_argument("--files", action="store_true", help="also count the files of src/ a hit crosses")
    ap.add_argument("builds", nargs="+", help="name=DIR")
    args = ap.parse_args()
    builds = lib.builds(args.builds)
    tmp = tempfile.mkdtemp(prefix="pgw-instr-ab-")
    sim = lib.Sim(builds[0][1], tmp, "sim", run.SIM_KEY, 0, 0)
    url, _ = run.pick_page(sim)
    headers = {"X-API-Key": run.TOKEN}
    for level in args.levels.split(","):
        for name, bin_dir, env in builds:
            tag = f"{name}-{level}"
            wrap = ins.wrapped_bin_dir(bin_dir, tmp, tag)
            gw = lib.Gateway(wrap, tmp, tag, sim, {"bench": run.TOKEN}, level=level, env=env)
            for _ in range(3):
                status, _, _ = lib.get(gw.base + url, headers=headers, timeout=60)
            assert status == 200, (name, status)
            total, done = ins.count(gw.proc.pid, gw.base + url, headers, args.secs, 8, os.path.join(tmp, f"cg-{tag}.*"))
            print(f"{name:10s} {level:5s} {total / max(done, 1):8.0f} instructions per hit ({done} requests)", flush=True)
            if args.files:
                files = ins.src_files(os.path.join(tmp, f"cg-{tag}.*"))
                print(f"{name:10s} {level:5s} {len(files):8d} files of src/ crossed: {' '.join(files)}", flush=True)
            lib.stop(gw.proc)
    lib.stop(sim.proc)


if __name__ == "__main__":
    main()
