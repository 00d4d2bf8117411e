"""Process and measurement helpers for the benchmark harness (bench/run.py).

Everything here binds to 127.0.0.1 only, starts children in their own
process group and kills exactly those groups at exit; every wait is bounded.
`Options` and `Phase` are what every phase of bench/run.py takes.
"""

from __future__ import annotations

import atexit
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field, fields
from typing import Callable

CHILDREN = []


def _cleanup():
    for p in reversed(CHILDREN):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + 10
    for p in CHILDREN:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


atexit.register(_cleanup)
signal.signal(signal.SIGTERM, lambda *_: (_cleanup(), os._exit(143)))


def spawn(cmd, log_path, env=None, stdout=None):
    """Starts a child in its own process group, stderr (and stdout unless
    piped) to `log_path`."""
    log = open(log_path, "ab")
    p = subprocess.Popen(
        cmd,
        stdout=stdout if stdout is not None else log,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    CHILDREN.append(p)
    return p


def stop(p):
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, timeout=30, headers=None):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=2) as r:
                r.read()
                return
        except Exception as e:  # noqa: BLE001 - any failure means "not yet"
            last = e
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s: {last}")


def wait_port(port, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"port {port} did not open within {timeout}s")


def sha256_hex(s):
    return hashlib.sha256(s.encode()).hexdigest()


def get(url, headers=None, timeout=30, method="GET", body=None):
    """One request; returns (status, headers dict lowercased, body bytes)."""
    req = urllib.request.Request(url, headers=headers or {}, method=method, data=body)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def get_json(url, **kw):
    status, _, body = get(url, **kw)
    if status != 200:
        raise RuntimeError(f"{url}: {status} {body[:200]!r}")
    return json.loads(body)


# --- the simulator -----------------------------------------------------------


class Sim:
    def __init__(self, bin_dir, tmp, name, api_key, latency_ms, jitter_ms, rpm=0, rate_window=None):
        """`rpm`: the simulator's own rate limit (0: none). `rate_window`:
        "strict" (at most `rpm` calls in any 60 s) or "bucket"; None: the
        simulator's default."""
        cmd = [
            os.path.join(bin_dir, "permit-api-sim"),
            "--listen", "127.0.0.1:0",
            "--api-key", api_key,
            "--requests-per-minute", str(rpm),
            "--latency-ms", str(latency_ms),
            "--latency-jitter-ms", str(jitter_ms),
        ]
        if rate_window:
            cmd += ["--rate-window", rate_window]
        self.proc = spawn(cmd, os.path.join(tmp, f"{name}.log"), stdout=subprocess.PIPE)
        line = _readline_with_timeout(self.proc.stdout, 30)
        self.addr = line.strip().split()[-1].replace("http://", "")
        self.base = f"http://{self.addr}"
        self.api_key = api_key
        wait_http(self.base + "/_sim/stats")

    def stats(self):
        return get_json(self.base + "/_sim/stats")

    def reset(self):
        get(self.base + "/_sim/reset", method="POST", body=b"")

    def samples(self):
        return get_json(self.base + "/_sim/samples")


def _readline_with_timeout(stream, timeout):
    out = {}

    def read():
        out["line"] = stream.readline().decode()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    if "line" not in out or not out["line"]:
        raise RuntimeError("child printed no address line")
    return out["line"]


# --- the gateway -------------------------------------------------------------


def builds(specs):
    """Command-line builds `name=DIR[,KEY=VALUE...]` as (name, DIR, env):
    each DIR holds `permit-gateway` and `permit-api-sim`; the KEY=VALUEs are
    environment its gateways get, so one binary runs as two targets
    (`percore=DIR,PERMIT_GATEWAY_SERVER__RUNTIME=per_core`)."""
    out = []
    for spec in specs:
        name, rest = spec.split("=", 1)
        bin_dir, *pairs = rest.split(",")
        out.append((name, bin_dir, dict(p.split("=", 1) for p in pairs)))
    return out


class Gateway:
    """`permit-gateway serve` on fixed free loopback ports chosen now."""

    def __init__(self, bin_dir, tmp, name, sim, teams, memory_max_bytes=268435456,
                 redis_url=None, level="warn", log_to=None, prefix=None, ledger="file",
                 cache_lines=(), tls=None, env=None, upstream_lines=("requests_per_minute = 1000000",),
                 extra_lines=()):
        """`prefix`: the Redis key prefix (replicas sharing a cache share
        one; default per gateway). `ledger`: "file" or "redis". `cache_lines`:
        extra `[cache]` keys. `tls`: (cert PEM path, key PEM path) for the
        team listener, which then speaks only TLS (`base` is https). `env`:
        more environment (`PERMIT_GATEWAY_SERVER__RUNTIME=per_core`).
        `upstream_lines`: the `[upstream]` keys besides its URL (by default
        a rate so high that the fair scheduler never throttles a benchmark).
        `extra_lines`: written after the teams (more `[[teams]]` with their
        `[[teams.tokens]]`, for a config `teams`' one token each cannot say)."""
        self.port, self.admin_port = free_port(), free_port()
        lines = [
            "[server]",
            f'listen = "127.0.0.1:{self.port}"',
            f'admin_listen = "127.0.0.1:{self.admin_port}"',
        ]
        if tls:
            lines += [f'tls_cert_file = "{tls[0]}"', f'tls_key_file = "{tls[1]}"']
        lines += [
            "[upstream]",
            f'base_url = "{sim.base}"',
            *upstream_lines,
            "[cache]",
            f"memory_max_bytes = {memory_max_bytes}",
        ]
        if redis_url:
            lines += [f'redis_url = "{redis_url}"', f'redis_key_prefix = "{prefix or f"pgw-{name}:"}"']
        lines += list(cache_lines)
        lines += [
            "[quota]",
            f'store = "{ledger}"',
            f'path = "{tmp}/ledger-{name}"',
            "[log]",
            'format = "json"',
            f'level = "{level}"',
        ]
        for team, token in teams.items():
            lines += [
                "[[teams]]",
                f'name = "{team}"',
                f'token_sha256 = "{sha256_hex(token)}"',
                # A real budget, so reserve/settle run on every miss.
                "credit_limit = 1000000000",
            ]
        lines += list(extra_lines)
        self.config = os.path.join(tmp, f"gateway-{name}.toml")
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")
        env = dict(os.environ, PERMIT_GATEWAY_UPSTREAM__API_KEY=sim.api_key, **(env or {}))
        self.proc = spawn(
            [os.path.join(bin_dir, "permit-gateway"), "serve", "--config", self.config],
            log_to or os.path.join(tmp, f"gateway-{name}.log"),
            env=env,
        )
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.admin = f"http://127.0.0.1:{self.admin_port}"
        wait_http(self.admin + "/healthz")
        wait_port(self.port)

    def metrics(self):
        _, _, body = get(self.admin + "/metrics")
        out = {}
        for line in body.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
        return out


def rss(pid):
    """(total RSS, anonymous RSS) in bytes, from smaps_rollup."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[0].endswith(":"):
                fields[parts[0][:-1]] = int(parts[1]) * 1024
    return fields.get("Rss", 0), fields.get("Anonymous", 0)


# --- nginx, redis, the ceiling ---------------------------------------------

NGINX_CONF = """
worker_processes {workers};
daemon off;
user root;
pid {tmp}/nginx-{name}.pid;
error_log {tmp}/nginx-{name}.error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-{name}-body;
    proxy_temp_path {tmp}/nginx-{name}-proxy;
    fastcgi_temp_path {tmp}/nginx-{name}-fastcgi;
    uwsgi_temp_path {tmp}/nginx-{name}-uwsgi;
    scgi_temp_path {tmp}/nginx-{name}-scgi;
    proxy_cache_path {tmp}/nginx-{name}-cache levels=1:2 keys_zone=permits:64m max_size=1g inactive=1d use_temp_path=off;
    upstream sim {{ server {sim}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        {server_lines}
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-API-Key "{api_key}";
            proxy_cache permits;
            proxy_cache_key $request_uri;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 30s;
            proxy_cache_valid 200 1d;
            # A plain cache in front of an API that says nothing about caching.
            proxy_ignore_headers Cache-Control Expires Set-Cookie Vary;
            add_header X-Cache $upstream_cache_status;
        }}
    }}
}}
"""


class Nginx:
    def __init__(self, tmp, name, sim, workers=2, server_lines=(), access_log=False):
        """`server_lines`: extra directives in the `server` block (more
        `listen`s, certificates). `access_log`: nginx's default access log
        (one line a request, to a file) instead of none."""
        self.port = free_port()
        conf = os.path.join(tmp, f"nginx-{name}.conf")
        text = NGINX_CONF.format(tmp=tmp, name=name, sim=sim.addr, api_key=sim.api_key,
                                 port=self.port, workers=workers,
                                 server_lines="\n        ".join(server_lines))
        if access_log:
            text = text.replace("access_log off;", f"access_log {tmp}/nginx-{name}.access.log;")
        with open(conf, "w") as f:
            f.write(text)
        self.proc = spawn(["nginx", "-c", conf, "-p", tmp], os.path.join(tmp, f"nginx-{name}.log"))
        self.base = f"http://127.0.0.1:{self.port}"
        wait_port(self.port)


class Redis:
    def __init__(self, tmp):
        self.port = free_port()
        self.proc = spawn(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", tmp],
            os.path.join(tmp, "redis.log"),
        )
        self.url = f"redis://127.0.0.1:{self.port}"
        wait_port(self.port)

    def cli(self, *args):
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True,
                              text=True, timeout=30).stdout

    def count(self, pattern):
        n, cursor = 0, "0"
        while True:
            out = self.cli("--raw", "SCAN", cursor, "MATCH", pattern, "COUNT", "1000").split("\n")
            cursor = out[0].strip()
            n += len([k for k in out[1:] if k.strip()])
            if cursor == "0":
                return n


class Ceiling:
    def __init__(self, bin_dir, tmp, body_file):
        self.proc = spawn([os.path.join(bin_dir, "bench-ceiling"), "127.0.0.1:0", body_file],
                          os.path.join(tmp, "ceiling.log"), stdout=subprocess.PIPE)
        self.addr = _readline_with_timeout(self.proc.stdout, 30).strip()
        self.base = f"http://{self.addr}"
        wait_port(int(self.addr.rsplit(":", 1)[1]))


# --- wrk ------------------------------------------------------------------

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text):
    m = re.match(r"([\d.]+)(us|ms|s|m)$", text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def wrk(url, conns, secs, headers, threads=2, script=None, env=None):
    """Runs wrk; returns dict(rps, p50, p90, p99 in ms, errors, non2xx)."""
    cmd = ["wrk", f"-t{min(threads, conns)}", f"-c{conns}", f"-d{secs}s", "--latency", "--timeout", "5s"]
    for k, v in headers.items():
        cmd += ["-H", f"{k}: {v}"]
    if script:
        cmd += ["-s", script]
    cmd.append(url)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 60,
                         env=dict(os.environ, **(env or {}))).stdout
    res = {"rps": 0.0, "p50": None, "p90": None, "p99": None, "errors": 0, "non2xx": 0, "raw": out}
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m:
        res["rps"] = float(m.group(1))
    for pct in ("50", "90", "99"):
        m = re.search(rf"^\s+{pct}%\s+(\S+)", out, re.M)
        if m:
            res["p" + pct] = _ms(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if m:
        res["non2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        res["errors"] = sum(int(x) for x in m.groups())
    return res


# --- varnish -----------------------------------------------------------------

VARNISH_VCL = """vcl 4.1;

backend sim {{
    .host = "{sim_host}";
    .port = "{sim_port}";
}}

sub vcl_recv {{
    if (req.method != "GET" && req.method != "HEAD") {{
        return (pass);
    }}
    # A plain cache in front of an API that says nothing about caching: the
    # client's cookies and Cache-Control do not decide anything.
    unset req.http.Cookie;
    unset req.http.Cache-Control;
    return (hash);
}}

sub vcl_hash {{
    hash_data(req.url);
    return (lookup);
}}

sub vcl_backend_fetch {{
    set bereq.http.X-API-Key = "{api_key}";
}}

sub vcl_backend_response {{
    unset beresp.http.Set-Cookie;
    unset beresp.http.Cache-Control;
    unset beresp.http.Expires;
    unset beresp.http.Vary;
    if (beresp.status == 200) {{
        set beresp.ttl = 1d;
        set beresp.uncacheable = false;
    }}
    return (deliver);
}}

sub vcl_deliver {{
    if (obj.hits > 0) {{
        set resp.http.X-Cache = "HIT";
    }} else {{
        set resp.http.X-Cache = "MISS";
    }}
}}
"""


class Varnish:
    """varnishd in the foreground with its own work dir, malloc storage and
    the VCL above: the second hit reference next to nginx (issue 19).
    Backend connections are kept alive (varnish's default)."""

    def __init__(self, tmp, name, sim, storage="malloc,256m"):
        self.port = free_port()
        host, port = sim.addr.rsplit(":", 1)
        vcl = os.path.join(tmp, f"varnish-{name}.vcl")
        with open(vcl, "w") as f:
            f.write(VARNISH_VCL.format(sim_host=host, sim_port=port, api_key=sim.api_key))
        workdir = os.path.join(tmp, f"varnish-{name}")
        os.makedirs(workdir, exist_ok=True)
        # `-j none`: no privilege separation, so the child can read the
        # run's private temp dir; `-T none`: no management port.
        self.proc = spawn(["varnishd", "-F", "-j", "none", "-T", "none", "-n", workdir,
                           "-a", f"127.0.0.1:{self.port}", "-f", vcl, "-s", storage],
                          os.path.join(tmp, f"varnish-{name}.log"))
        self.base = f"http://127.0.0.1:{self.port}"
        wait_port(self.port, timeout=60)


# --- what a phase takes --------------------------------------------------------


@dataclass
class Options:
    """bench/run.py's command line, typed (`run.py --help` says what each is)."""
    bin_dir: str
    secs: int
    rounds: int
    conns: list[int]
    seed: int
    mem_entries: int
    mem_cap: int
    out: str
    replica_secs: int
    replica_herd_secs: int
    replica_clients: int
    replica_cpu_share: str
    replica_hit_conns: int
    replica_miss_conns: int
    latency_secs: int
    latency_warmup: int
    latency_rates: list[float]
    latency_conns: int
    h2_secs: int
    h2_conns: int
    h2_streams: int
    only: list[str]

    @classmethod
    def from_args(cls, args) -> Options:
        """From argparse's namespace (which may hold more than the phases use)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


@dataclass
class Phase:
    """Everything one phase of bench/run.py needs, in one object."""
    opts: Options
    # The run's work dir: configs, logs, scripts, certificates.
    tmp: str
    log: Callable[..., None]
    # The simulator's upstream key.
    sim_key: str
    # The gateway token of the one-team phases.
    token: str
    # Each app's gateway token (credits, clicks).
    app_tokens: dict[str, str]
    # The wrk script of distinct searches (miss, replicas).
    miss_lua: str
    # The ~6 KB hit page every hit comparison uses: sim -> (path?query, body).
    pick_page: Callable[[Sim], tuple[str, bytes]]
    # The hit phase's result (latency sizes its rates by nginx's max), and
    # whether it ran in this invocation rather than coming from latest.json.
    hit: dict | None = None
    ran_hit: bool = False
    _redis: Redis | None = field(default=None, init=False, repr=False)

    @property
    def redis(self) -> Redis:
        """The shared standalone redis-server, started on first use: a phase
        that needs none (`--only memory`) runs without redis-server."""
        if self._redis is None:
            self._redis = Redis(self.tmp)
        return self._redis
