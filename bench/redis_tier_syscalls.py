"""Syscalls and context switches per request (`perf stat` on the server's
processes, and on redis-server, while `wrk -t2 -c64` runs): the gateway
with the Redis tier only, with L1, nginx and Varnish.

    python3 bench/redis_tier_syscalls.py BIN_DIR
"""
import os, sys, tempfile, subprocess, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib, run
tmp = tempfile.mkdtemp(prefix="redis-sysc-")
redis = lib.Redis(tmp)
bin_dir = sys.argv[1]
sim = lib.Sim(bin_dir, tmp, "sim", run.SIM_KEY, 50, 150)
url, body = run.pick_page(sim)
team = {"bench": run.TOKEN}
T = {"gateway_redis_l2": lib.Gateway(bin_dir, tmp, "gw", sim, team, memory_max_bytes=0, redis_url=redis.url),
     "gateway_l1": lib.Gateway(bin_dir, tmp, "gw1", sim, team),
     "nginx": lib.Nginx(tmp, "hit", sim), "varnish": lib.Varnish(tmp, "hit", sim)}
headers = {"X-API-Key": run.TOKEN}
def tree(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    res = [pid]
    for c in out: res += tree(int(c))
    return res
EV = "raw_syscalls:sys_enter,context-switches,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex"
for name, t in T.items():
    for _ in range(3): lib.get(t.base + url, headers=headers)
    pids = tree(t.proc.pid)
    if name == "gateway_redis_l2": pids.append(redis.proc.pid)
    res = {}
    def w(): res["r"] = lib.wrk(t.base + url, 64, 6, headers)
    th = threading.Thread(target=w); th.start()
    time.sleep(1)
    p1 = subprocess.Popen(["perf", "stat", "-x,", "-e", EV, "-p", ",".join(map(str, [p for p in pids if p != redis.proc.pid])), "--", "sleep", "4"], stderr=subprocess.PIPE, text=True)
    p2 = subprocess.Popen(["perf", "stat", "-x,", "-e", EV, "-p", str(redis.proc.pid), "--", "sleep", "4"], stderr=subprocess.PIPE, text=True) if name == "gateway_redis_l2" else None
    # requests in those 4 s, from wrk's rate over its 6 s
    o1 = p1.communicate()[1]; o2 = p2.communicate()[1] if p2 else ""
    th.join()
    reqs = res["r"]["rps"] * 4
    print(f"== {name}: {res['r']['rps']:.0f} req/s")
    for label, o in (("server", o1), ("redis", o2)):
        for line in o.splitlines():
            parts = line.split(",")
            if len(parts) > 3 and parts[0].replace('.', '').isdigit():
                print(f"   {label:7s} {parts[2]:35s} {float(parts[0]) / reqs:6.2f} /req")
for t in T.values(): lib.stop(t.proc)
lib.stop(sim.proc); lib.stop(redis.proc)
