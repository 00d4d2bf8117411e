"""Phase 5 of bench/run.py: the search → click-through replay (issue 16,
`replay.generate_clicks`) against no cache, nginx `proxy_cache`, the
gateway with `cache.record_reuse = false` and the gateway with it on (the
default), the simulator's counters reset between targets."""

import time
import urllib.parse

import lib
import replay


def clicks(p):
    """The phase (`p`: a lib.Phase): its results."""
    args, tmp, redis, log, sim_key, app_tokens = p.opts, p.tmp, p.redis, p.log, p.sim_key, p.app_tokens
    sim = lib.Sim(args.bin_dir, tmp, "sim-clicks", sim_key, 50, 150)
    samples = sim.samples()
    # Ids no search of the workload shows (it searches the small state's
    # places): the big state's, asked before the counters are reset (so no
    # target pays for them).
    q = (f"/v2/permits/search?geo_id={samples['big_state']}&permit_from={samples['permit_from']}"
         f"&permit_to={samples['permit_to']}&size=100")
    key = {"X-API-Key": sim_key}
    first = lib.get_json(sim.base + q, headers=key)
    second = lib.get_json(sim.base + q + "&cursor=" + urllib.parse.quote(first["next_cursor"]), headers=key)
    cold = [r["id"] for r in first["items"] + second["items"]]
    ticks, styles = replay.generate_clicks(args.seed, samples)
    out = {"workload": replay.summary(ticks), "seed": args.seed, "targets": {}}
    apps = ["search_ui", "mobile", "reports"]
    tokens = {a: app_tokens[a] for a in apps}
    nginx = lib.Nginx(tmp, "clicks", sim)
    off = lib.Gateway(args.bin_dir, tmp, "clicks-off", sim, tokens, redis_url=redis.url,
                      cache_lines=["record_reuse = false"])
    on = lib.Gateway(args.bin_dir, tmp, "clicks-on", sim, tokens, redis_url=redis.url)
    for name, base, toks in (("no cache", sim.base, {a: sim_key for a in apps}),
                             ("nginx proxy_cache", nginx.base, {a: sim_key for a in apps}),
                             ("gateway, record reuse off", off.base, tokens),
                             ("gateway, record reuse on", on.base, tokens)):
        sim.reset()
        started = time.time()
        client = replay.run(ticks, styles, base, toks, cold_ids=cold)
        st = sim.stats()
        out["targets"][name] = {"credits": st["credits_total"], "upstream_requests": st["requests_total"],
                                "client": client, "secs": round(time.time() - started, 1)}
        log(f"  clicks {name}: {st['credits_total']} credits, {st['requests_total']} upstream requests, "
            f"{client}")
    m = on.metrics()
    out["records"] = {src: m.get(f'gateway_cache_records_total{{route="permits_by_id",source="{src}"}}', 0)
                      for src in ("cache", "absent", "upstream")}
    for p in (on.proc, off.proc, nginx.proc, sim.proc):
        lib.stop(p)
    return out


def table(cl):
    w = cl["workload"]
    L = [f"### Credits — search → click-through replay (seed {cl['seed']}): {w['actions']} requests in "
         f"{w['ticks']} ticks, {w['lookups']} of them id lookups, simulator latency 50–200 ms", "",
         "| target | credits charged | upstream requests | credits vs no cache | credits vs nginx | "
         "client statuses | wall s |", "|---|---:|---:|---:|---:|---|---:|"]
    T = cl["targets"]
    base_c, ng_c = T["no cache"]["credits"], T["nginx proxy_cache"]["credits"]
    for name, t in T.items():
        L.append(f"| {name} | {t['credits']} | {t['upstream_requests']} | {t['credits'] / base_c:.2f}× | "
                 f"{t['credits'] / ng_c:.2f}× | {t['client']['statuses']} | {t['secs']} |")
    r = cl["records"]
    L += ["", f"Record reuse on: lookup ids answered from held records {r['cache']:.0f}, from held absences "
          f"{r['absent']:.0f}, bought {r['upstream']:.0f} (`gateway_cache_records_total`).", ""]
    return "\n".join(L) + "\n"
