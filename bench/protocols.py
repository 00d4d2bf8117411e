"""Phases `h2` and `tls` of bench/run.py (issue 19): the hit comparison of
phase 1 over HTTP/2 cleartext and over TLS, measured with h2load.

- h2: h2c with prior knowledge (h2load's default for http:// URLs) against
  the gateway, nginx (`listen … http2;` on a plain port: nginx 1.22 speaks
  only HTTP/2 there) and the hyper ceiling; the gateway and the ceiling sniff
  the HTTP/2 preface (hyper-util's auto builder) on their one port.
- tls: one self-signed certificate (openssl, in the run's tmp dir) for the
  gateway (rustls, `[server] tls_cert_file/tls_key_file`) and nginx (OpenSSL,
  `listen … ssl http2;`), h2 by ALPN and HTTP/1.1 over TLS (`h2load --h1`).

Every target answers the same ~6 KB page (run.pick_page), checked 200 and
`X-Cache: HIT` over the measured protocol (curl) before measuring; h2load's
flags are the same for every target, rounds interleaved, median of rounds;
any failed, errored or non-2xx request is reported.
"""

import os
import re
import subprocess

import lib

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def _ms(text):
    m = re.match(r"([\d.]+)(us|ms|s)$", text)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def h2load_flags(args, h1):
    # HTTP/1.1 gets no pipelining (-m1: one request in flight per
    # connection, as wrk and browsers); HTTP/2 ten streams per connection.
    streams = 1 if h1 else args.h2_streams
    flags = ["-t2", f"-c{args.h2_conns}", f"-m{streams}", "-D", str(args.h2_secs), "--warm-up-time", "1"]
    return flags + (["--h1"] if h1 else [])


def h2load(args, url, token, h1=False):
    """One h2load run; returns req/s, mean/max request time (ms), the bad
    request counts and the negotiated protocol."""
    cmd = ["h2load", *h2load_flags(args, h1), "-H", f"X-API-Key: {token}", url]
    # A failed run shows in its counts (bad), not as an exception.
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.h2_secs + 60, check=False).stdout
    r = {"rps": 0.0, "mean": None, "max": None, "failed": None, "errored": None, "timeout": None,
         "non2xx": None, "protocol": None, "tls": None, "cipher": None}
    m = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    if m:
        r["rps"] = float(m.group(1))
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                  r"(\d+) errored, (\d+) timeout", out)
    if m:
        r["failed"], r["errored"], r["timeout"] = int(m.group(5)), int(m.group(6)), int(m.group(7))
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if m:
        r["non2xx"] = sum(int(x) for x in m.groups()[1:])
    m = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)
    if m:
        r["max"], r["mean"] = _ms(m.group(2)), _ms(m.group(3))
    for key, pattern in (("protocol", r"Application protocol: (\S+)"), ("tls", r"TLS Protocol: (\S+)"),
                         ("cipher", r"Cipher: (\S+)")):
        m = re.search(pattern, out)
        if m:
            r[key] = m.group(1)
    # A run that did nothing (or whose output did not parse) is bad too.
    r["bad"] = sum(r[k] if r[k] is not None else 1 for k in ("failed", "errored", "timeout", "non2xx"))
    r["bad"] += 0 if r["rps"] > 0 else 1
    if r["bad"]:
        r["raw"] = out[-1500:]
    return r


def curl_hit(url, token, mode, cacert=None):
    """GETs `url` three times (the first may fill the cache) with curl in
    `mode` ("h2c", "h2" or "h1"); returns (HTTP version, status, X-Cache,
    body bytes) of the last."""
    flags = {"h2c": ["--http2-prior-knowledge"], "h2": ["--http2"], "h1": ["--http1.1"]}[mode]
    if cacert:
        flags += ["--cacert", cacert]
    for _ in range(3):
        p = subprocess.run(["curl", "-sS", "--max-time", "30", *flags, "-H", f"X-API-Key: {token}",
                            "-D", "-", "-o", "/dev/null", "-w", "\\nbytes=%{size_download}\\n", url],
                           capture_output=True, text=True, timeout=60, check=False)
    head = p.stdout.splitlines()
    status_line = head[0].split() if head else ["?", "?"]
    xcache = next((ln.split(":", 1)[1].strip() for ln in head if ln.lower().startswith("x-cache:")), None)
    size = next((int(ln[6:]) for ln in head if ln.startswith("bytes=")), 0)
    return status_line[0], status_line[1], xcache, size


def check_hit(name, url, token, mode, body_len, cacert=None):
    version, status, xcache, size = curl_hit(url, token, mode, cacert)
    want = "HTTP/1.1" if mode == "h1" else "HTTP/2"
    if (version, status, xcache, size) != (want, "200", "HIT", body_len):
        raise RuntimeError(f"{name} over {mode}: {version} {status} X-Cache {xcache}, {size} bytes "
                           f"(want {want} 200 HIT {body_len})")


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def rounds(args, runs, log, label):
    """`runs`: {target: (url, token, h1)}; interleaved rounds; the median."""
    got = {n: [] for n in runs}
    for rnd in range(args.rounds):
        for name, (url, token, h1) in runs.items():
            r = h2load(args, url, token, h1)
            log(f"  {label} round {rnd} {name}: {r['rps']:.0f} req/s mean {r['mean']} max {r['max']} ms "
                f"bad {r['bad']} ({r['protocol']}{', ' + str(r['tls']) if r['tls'] else ''})")
            got[name].append(r)
    out = {}
    for name, rs in got.items():
        out[name] = {
            "rps": median([r["rps"] for r in rs]), "mean": median([r["mean"] for r in rs]),
            "max": median([r["max"] for r in rs]), "rps_rounds": [round(r["rps"]) for r in rs],
            "bad": sum(r["bad"] for r in rs), "protocol": rs[-1]["protocol"], "tls": rs[-1]["tls"],
            "cipher": rs[-1]["cipher"], "raw_bad": [r["raw"] for r in rs if r.get("raw")][:1],
        }
    return out


def _page(args, tmp, name, sim_key, pick_page):
    sim = lib.Sim(args.bin_dir, tmp, f"sim-{name}", sim_key, 50, 150)
    url, body = pick_page(sim)
    body_file = os.path.join(tmp, f"page-{name}.json")
    with open(body_file, "wb") as f:
        f.write(body)
    return sim, url, body, body_file


# nginx closes a connection after 1000 requests (`keepalive_requests`, which
# also bounds HTTP/2 since 1.19.7); h2load does not open a new one, so its
# clients would stop after 1000 requests each. The gateway has no such limit.
NGINX_KEEPALIVE = ["keepalive_requests 100000000;"]


def h2(p):
    """h2c: gateway, nginx, ceiling (`p`: a lib.Phase)."""
    args, tmp, log, sim_key, token, pick_page = p.opts, p.tmp, p.log, p.sim_key, p.token, p.pick_page
    sim, url, body, body_file = _page(args, tmp, "h2", sim_key, pick_page)
    h2c_port = lib.free_port()
    targets = {
        "gateway": lib.Gateway(args.bin_dir, tmp, "h2", sim, {"bench": token}),
        "nginx": lib.Nginx(tmp, "h2", sim, server_lines=[f"listen 127.0.0.1:{h2c_port} http2;", *NGINX_KEEPALIVE]),
        "ceiling": lib.Ceiling(args.bin_dir, tmp, body_file),
    }
    lib.wait_port(h2c_port)
    bases = {"gateway": targets["gateway"].base, "nginx": f"http://127.0.0.1:{h2c_port}",
             "ceiling": targets["ceiling"].base}
    for name in targets:
        check_hit(name, bases[name] + url, token, "h2c", len(body))
    res = rounds(args, {n: (b + url, token, False) for n, b in bases.items()}, log, "h2c")
    for t in targets.values():
        lib.stop(t.proc)
    lib.stop(sim.proc)
    return {"url": url, "body_bytes": len(body), "flags": " ".join(h2load_flags(args, False)),
            "rounds": args.rounds, "results": res}


def self_signed(tmp):
    """One P-256 certificate for 127.0.0.1/localhost, valid two days."""
    cert, key = os.path.join(tmp, "tls-cert.pem"), os.path.join(tmp, "tls-key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=30)
    return cert, key


def tls(p):
    """TLS: gateway (rustls) and nginx (OpenSSL), h2 by ALPN and HTTP/1.1
    (`p`: a lib.Phase)."""
    args, tmp, log, sim_key, token, pick_page = p.opts, p.tmp, p.log, p.sim_key, p.token, p.pick_page
    sim, url, body, _ = _page(args, tmp, "tls", sim_key, pick_page)
    cert, key = self_signed(tmp)
    tls_port = lib.free_port()
    gw = lib.Gateway(args.bin_dir, tmp, "tls", sim, {"bench": token}, tls=(cert, key))
    nginx = lib.Nginx(tmp, "tls", sim, server_lines=[
        f"listen 127.0.0.1:{tls_port} ssl http2;", f"ssl_certificate {cert};", f"ssl_certificate_key {key};",
        "ssl_protocols TLSv1.2 TLSv1.3;", "ssl_session_cache shared:SSL:1m;", *NGINX_KEEPALIVE])
    lib.wait_port(tls_port)
    bases = {"gateway": gw.base, "nginx": f"https://127.0.0.1:{tls_port}"}
    out = {"url": url, "body_bytes": len(body), "rounds": args.rounds, "results": {}, "flags": {}}
    for mode, h1 in (("h2", False), ("h1", True)):
        for name, base in bases.items():
            check_hit(name, base + url, token, mode, len(body), cacert=cert)
        out["flags"][mode] = " ".join(h2load_flags(args, h1))
        out["results"][mode] = rounds(args, {n: (b + url, token, h1) for n, b in bases.items()}, log,
                                      f"tls {mode}")
    for proc in (gw.proc, nginx.proc, sim.proc):
        lib.stop(proc)
    return out


def fmt(x):
    return "-" if x is None else (f"{x:.2f}" if x < 10 else f"{x:.1f}")


def _row(name, r, ng, ce=None, negotiated=False):
    bad = f" ({r['bad']} bad)" if r["bad"] else ""
    cols = [f"{name}{bad}", f"{r['rps']:.0f}", fmt(r["mean"]), fmt(r["max"]), f"{r['rps'] / ng:.2f}×"]
    if ce:
        cols.append(f"{r['rps'] / ce:.2f}×")
    if negotiated:
        cols.append(f"{r['tls']} {r['cipher']} {r['protocol']}")
    return "| " + " | ".join(cols + [str(r["rps_rounds"])]) + " |"


def table(res):
    L = []
    h = res.get("h2")
    if h:
        R = h["results"]
        L += [(f"### HTTP/2 cleartext (h2c, prior knowledge) — `{h['url']}` ({h['body_bytes']} bytes), "
               f"`h2load {h['flags']}`, median of {h['rounds']} interleaved rounds"), "",
              "| target | req/s | mean ms | max ms | req/s vs nginx | req/s vs ceiling | rounds req/s |",
              "|---|---:|---:|---:|---:|---:|---|"]
        for name in ("gateway", "nginx", "ceiling"):
            L.append(_row(name, R[name], R["nginx"]["rps"], R["ceiling"]["rps"]))
        L.append("")
    t = res.get("tls")
    if t:
        L += [(f"### TLS — one self-signed P-256 certificate, gateway (rustls) vs nginx (OpenSSL), "
               f"`{t['url']}` ({t['body_bytes']} bytes), median of {t['rounds']} interleaved rounds"), ""]
        for mode, label in (("h2", "HTTP/2 (ALPN h2)"), ("h1", "HTTP/1.1 over TLS")):
            R = t["results"][mode]
            L += [f"{label}, `h2load {t['flags'][mode]}`:", "",
                  "| target | req/s | mean ms | max ms | req/s vs nginx | negotiated | rounds req/s |",
                  "|---|---:|---:|---:|---:|---|---|"]
            for name in ("gateway", "nginx"):
                L.append(_row(name, R[name], R["nginx"]["rps"], negotiated=True))
            L.append("")
    return "\n".join(L) + "\n" if L else ""
