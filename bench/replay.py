"""A seeded replay of a realistic day of traffic from several internal apps.

`generate(seed, samples)` builds the same list of ticks for every target;
`run(ticks, base_url, tokens)` plays it: the actions of one tick are sent
concurrently (a dashboard refreshing in several browsers at once is one
tick), ticks one after the other. What real clients do and a plain cache
cannot see through:

- queries drawn from a Zipf distribution over a universe of logical queries
  (a few are asked all the time, most rarely);
- each app (client library) writes the same logical query its own way:
  parameter order, explicit defaults (`size=50`, `include_count=false`),
  boolean spellings (`0`, `False`, `no`), order of set filters;
- pagination walks following `next_cursor`, started by several apps on the
  same export;
- bursts of identical concurrent requests (dashboards refreshing together).

A second workload, `generate_clicks`, is the search → click-through pattern
(issue 16): apps search, show a list, then look up (`/v2/permits?id=`) ids
the user clicks: mostly ids they saw in an earlier search, sometimes ids
they never searched for (from a pool asked once before the run), now and
then an id the upstream does not know.

Run alone to print the workload summary: `python3 bench/replay.py`.
"""

import json
import random
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import lib

TAGS = ["solar", "hvac", "roofing", "heat_pump", "new_construction", "electrical"]
STATUSES = ["final", "in_review", "inactive", "active"]
PROPERTY = ["residential", "commercial", "industrial"]


class Style:
    """How one client library writes a query."""

    def __init__(self, rng, name):
        self.name = name
        self.shuffle_seed = rng.randrange(1 << 30)
        self.explicit_size = rng.random() < 0.5
        self.explicit_count = rng.random() < 0.5
        self.false_spelling = rng.choice(["false", "False", "0", "no", "off"])
        self.reverse_sets = rng.random() < 0.5
        self.cursor_first = rng.random() < 0.5

    def render(self, path, params, paged=True, counted=True, cursor=None):
        """`params`: list of (name, value) of the logical query, set filters
        as repeated names."""
        singles = [(k, v) for k, v in params if k not in ("permit_tags", "permit_status", "property_type")]
        sets = [(k, v) for k, v in params if (k, v) not in singles]
        if self.reverse_sets:
            sets = list(reversed(sets))
        if paged and self.explicit_size and not any(k == "size" for k, _ in singles):
            singles.append(("size", "50"))
        if counted and self.explicit_count:
            singles.append(("include_count", self.false_spelling))
        random.Random(self.shuffle_seed + len(path)).shuffle(singles)
        out = singles + sets
        if cursor is not None:
            out = [("cursor", cursor)] + out if self.cursor_first else out + [("cursor", cursor)]
        return path + "?" + urllib.parse.urlencode(out)


def zipf_pick(rng, n, s=1.1):
    weights = [1.0 / (i + 1) ** s for i in range(n)]
    return rng.choices(range(n), weights=weights, k=1)[0]


def universe(rng, samples, n):
    """`n` logical permit searches, most popular first."""
    geos = [samples["state"], samples["county_geo_id"], samples["city_geo_id"], samples["jurisdiction_geo_id"],
            samples["zip"]]
    years = ["2019", "2020", "2021", "2022", "2023", "2024"]
    seen, out = set(), []
    while len(out) < n:
        geo = rng.choice(geos)
        y = rng.choice(years)
        params = [("geo_id", geo), ("permit_from", f"{y}-01-01"), ("permit_to", f"{y}-12-31")]
        if rng.random() < 0.4:
            for t in sorted(rng.sample(TAGS, rng.choice([1, 2]))):
                params.append(("permit_tags", t))
        if rng.random() < 0.3:
            for s in sorted(rng.sample(STATUSES, 2)):
                params.append(("permit_status", s))
        if rng.random() < 0.2:
            params.append(("size", rng.choice(["10", "25", "100"])))
        key = tuple(params)
        if key not in seen:
            seen.add(key)
            out.append(params)
    return out


def generate(seed, samples):
    """The workload: a list of ticks, each a list of actions (dicts)."""
    rng = random.Random(seed)
    apps = ["dashboard", "search_ui", "export", "mobile", "reports"]
    styles = {a: Style(rng, a) for a in apps}
    searches = universe(rng, samples, 150)
    panels = searches[:6]  # the dashboard shows the most popular ones
    big = samples["big_state"]
    full = [("permit_from", samples["permit_from"]), ("permit_to", samples["permit_to"])]
    contractor = samples["contractor_id"]
    ticks = []
    walk_id = 0
    for t in range(120):
        tick = []
        # Dashboards: every 10 ticks, 4 browsers refresh 6 panels at once.
        if t % 10 == 0:
            for viewer in range(4):
                for p in panels:
                    tick.append({"app": "dashboard", "url": styles["dashboard"].render("/v2/permits/search", p)})
        # Interactive search from three apps, Zipf over the universe.
        for app in ("search_ui", "mobile", "reports"):
            for _ in range(rng.choice([1, 2, 3])):
                q = searches[zipf_pick(rng, len(searches))]
                tick.append({"app": app, "url": styles[app].render("/v2/permits/search", q)})
        # Contractor pages, a few distinct ones.
        if t % 4 == 1:
            app = rng.choice(["search_ui", "mobile"])
            size = rng.choice(["10", "20"])
            tick.append({"app": app, "url": styles[app].render(
                f"/v2/contractors/{contractor}/permits", [("size", size)])})
        # Exports: a pagination walk of a big region, started by two apps.
        if t % 30 == 5:
            walk_id += 1
            year = ["2022", "2023", "2024", "2021"][walk_id % 4]
            base = [("geo_id", big), ("permit_from", f"{year}-01-01"), ("permit_to", f"{year}-06-30"),
                    ("size", "100")]
            for app in ("export", "reports"):
                tick.append({"app": app, "walk": f"{app}-{walk_id}", "path": "/v2/permits/search",
                             "params": base, "page": 0})
        # Walk continuations: one page per tick for 6 pages.
        for w in range(1, walk_id + 1):
            started = 5 + 30 * (w - 1)
            page = t - started
            if 1 <= page <= 5:
                for app in ("export", "reports"):
                    tick.append({"app": app, "walk": f"{app}-{w}", "path": "/v2/permits/search",
                                 "params": None, "page": page})
        # A whole-dataset count now and then, the same from every app.
        if t % 20 == 7:
            for app in ("reports", "search_ui"):
                tick.append({"app": app, "url": styles[app].render(
                    "/v2/permits/search", [("geo_id", samples["state"]), *full, ("size", "1")])})
        ticks.append(tick)
    return ticks, styles


def generate_clicks(seed, samples):
    """The click-through workload: searches that remember the ids they
    showed (`label`), and lookups of some of them in later ticks."""
    rng = random.Random(seed)
    apps = ["search_ui", "mobile", "reports"]
    styles = {a: Style(rng, a) for a in apps}
    searches = universe(rng, samples, 60)
    ticks, labels = [], []
    for t in range(100):
        tick, before = [], len(labels)
        # Clicks are on lists shown in earlier ticks (this tick's run concurrently).
        shown = labels[max(0, before - 12):before]
        for app in apps:
            if rng.random() < 0.6:
                q = [p for p in searches[zipf_pick(rng, len(searches))] if p[0] != "size"]
                q.append(("size", rng.choice(["10", "25"])))
                label = f"s{t}-{app}"
                tick.append({"app": app, "label": label, "url": styles[app].render("/v2/permits/search", q)})
                labels.append(label)
            if shown and rng.random() < 0.8:
                # Places in the list as fractions: lists differ in length.
                picks = [rng.random() for _ in range(1 if rng.random() < 0.6 else rng.choice([2, 3, 5]))]
                cold = rng.sample(range(200), rng.choice([1, 2])) if rng.random() < 0.25 else []
                tick.append({"app": app, "lookup": {"from": rng.choice(shown), "picks": picks, "cold": cold,
                                                    "unknown": rng.random() < 0.1}})
        ticks.append(tick)
    return ticks, styles


def lookup_url(action, seen, cold_ids):
    """The lookup of an action, once the ids of its search are known;
    `None` when none of its picks exist (the same on every target)."""
    lk = action["lookup"]
    shown = seen.get(lk["from"], [])
    ids = list(dict.fromkeys(shown[int(f * len(shown))] for f in lk["picks"])) if shown else []
    ids += [cold_ids[i] for i in lk["cold"] if i < len(cold_ids)]
    if lk["unknown"]:
        ids.append("ffffffffffffffff")
    if not ids:
        return None
    return "/v2/permits?" + urllib.parse.urlencode([("id", i) for i in ids])


def run(ticks, styles, base_url, tokens, timeout=60, cold_ids=()):
    """Plays the ticks against `base_url`; returns client-side counts."""
    walks = {}  # walk id -> (params, next cursor or None when done)
    seen = {}  # search label -> the ids it showed
    lock = threading.Lock()
    statuses, cache = {}, {}
    sent = 0

    def one(action):
        app = action["app"]
        style = styles[app]
        if "walk" in action:
            with lock:
                if action["page"] == 0:
                    walks[action["walk"]] = (action["params"], None)
                    params, cursor = action["params"], None
                else:
                    params, cursor = walks.get(action["walk"], (None, None))
                    if params is None or cursor is None:
                        return None  # the walk ended early: the same for every target
            url = style.render(action["path"], params, cursor=cursor)
        elif "lookup" in action:
            with lock:
                url = lookup_url(action, seen, cold_ids)
            if url is None:
                return None
        else:
            url = action["url"]
        status, headers, body = lib.get(base_url + url, headers={"X-API-Key": tokens[app]}, timeout=timeout)
        if "walk" in action and status == 200:
            nxt = json.loads(body).get("next_cursor")
            with lock:
                walks[action["walk"]] = (walks[action["walk"]][0], nxt)
        if "label" in action and status == 200:
            with lock:
                seen[action["label"]] = [r["id"] for r in json.loads(body).get("items", [])]
        return status, headers.get("x-cache", "-")

    with ThreadPoolExecutor(max_workers=32) as pool:
        for tick in ticks:
            for r in pool.map(one, tick):
                if r is None:
                    continue
                sent += 1
                statuses[r[0]] = statuses.get(r[0], 0) + 1
                cache[r[1]] = cache.get(r[1], 0) + 1
    return {"sent": sent, "statuses": statuses, "x_cache": cache}


def summary(ticks):
    n = sum(len(t) for t in ticks)
    urls = [a["url"] for t in ticks for a in t if "url" in a]
    walks = len({a["walk"] for t in ticks for a in t if "walk" in a})
    lookups = sum(1 for t in ticks for a in t if "lookup" in a)
    return {"ticks": len(ticks), "actions": n, "distinct_literal_urls": len(set(urls)), "walks": walks,
            "lookups": lookups, "widest_tick": max(len(t) for t in ticks)}


if __name__ == "__main__":
    fake = {"state": "DE", "county_geo_id": "c1", "city_geo_id": "x1", "jurisdiction_geo_id": "j1", "zip": "19701",
            "big_state": "CA", "permit_from": "2000-01-01", "permit_to": "2025-12-31", "contractor_id": "k1"}
    ticks, _ = generate(8, fake)
    print(summary(ticks))
    ticks, _ = generate_clicks(8, fake)
    print("clicks:", summary(ticks))
