#!/usr/bin/env python3
"""CPU a one-connection HTTP/2 flood costs the gateway, and how long until it
is closed (issue 60, point 1; issue 50, point 4).

Starts the simulator and the gateway (binaries from --bin-dir, by default
target/release: `cargo build --release -p permit-gateway -p permit-api-sim`),
then, one after the other, opens one anonymous h2c connection per flood and
writes its frames as fast as it can for up to --secs seconds or until the
gateway closes the connection. Prints, per flood, the time from the first
frame to the close (the socket's EOF or reset), the frames written until the
writer saw it, the GOAWAY code received, and the gateway's CPU (user +
system, /proc/<pid>/stat) from the first frame to 0.5 s after the close.

    python3 bench/frame_floods.py [--bin-dir target/release] [--secs 6]

Floods: PING, unsolicited PING ACK, an unknown type (0xfa), GOAWAY, empty
DATA, CONTINUATION, and an HPACK bomb (a 4,000-byte header inserted once,
then header blocks of 16,000 one-byte references to it, each on a new
stream).
"""
import argparse, os, socket, struct, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import lib  # noqa: E402
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_int(first, n, value):
    mask = (1 << n) - 1
    if value < mask:
        return bytes([first | value])
    out = [first | mask]
    value -= mask
    while value >= 128:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_str(s):
    return hpack_int(0, 7, len(s)) + s


def floods():
    get = bytes([0x82, 0x86]) + hpack_int(0, 4, 4) + hpack_str(b"/v2/meta/release") + hpack_int(0, 4, 1) + hpack_str(b"gw")
    insert = get + hpack_int(0x40, 6, 0) + hpack_str(b"x-bomb") + hpack_str(b"b" * 4000)
    refs = bytes([0x80 | 62]) * 16000
    bomb = lambda i: b"".join(frame(1, 5, 3 + 2 * (4 * i + k), refs) for k in range(4))
    pings = lambda flags: (lambda i: b"".join(frame(6, flags, 0, struct.pack(">Q", i * 100 + k)) for k in range(100)))
    same = lambda f: (lambda i: f * 100)
    return [
        ("PING", b"", pings(0)),
        ("unsolicited PING ACK", b"", pings(1)),
        ("unknown type 0xfa", b"", same(frame(0xFA, 0, 0, b"\0" * 8))),
        ("GOAWAY", b"", same(frame(7, 0, 0, b"\0" * 8))),
        ("empty DATA", frame(1, 4, 1, get), same(frame(0, 0, 1))),
        ("CONTINUATION", frame(1, 0, 1, get), same(frame(9, 0, 1, b""))),
        ("HPACK bomb", frame(1, 5, 1, insert), bomb),
    ]


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def goaway_codes(data):
    codes, at = [], 0
    while at + 9 <= len(data):
        n = int.from_bytes(data[at:at + 3], "big")
        if data[at + 3] == 7 and at + 17 <= len(data):
            codes.append(int.from_bytes(data[at + 13:at + 17], "big"))
        at += 9 + n
    return codes


def run_flood(host, port, pid, name, hello, batch, secs):
    s = socket.create_connection((host, port))
    got, closed = bytearray(), []

    def reader():
        while True:
            try:
                b = s.recv(65536)
            except OSError:
                b = b""
            if not b:
                closed.append(time.time())
                return
            got.extend(b)

    cpu0, t0 = cpu_s(pid), time.time()
    s.sendall(PREFACE + frame(4, 0, 0) + hello)
    threading.Thread(target=reader, daemon=True).start()
    sent, i = 0, 0
    while time.time() - t0 < secs and not closed:
        try:
            s.sendall(batch(i))
        except OSError:
            break
        sent, i = sent + (4 if name == "HPACK bomb" else 100), i + 1
    while not closed and time.time() - t0 < secs + 5:
        time.sleep(0.01)
    end = closed[0] if closed else None
    time.sleep(0.5)
    cpu = cpu_s(pid) - cpu0
    s.close()
    took = f"{(end - t0) * 1000:.1f} ms" if end else f"not closed in {secs} s"
    print(f"{name:22} closed after {took:>16}; {sent:>8} frames written until the writer saw it; "
          f"GOAWAY {goaway_codes(bytes(got))}; gateway CPU {cpu:.2f} s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"))
    ap.add_argument("--secs", type=float, default=6.0)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    sim = lib.Sim(a.bin_dir, tmp, "sim", "sim-upstream-key", latency_ms=0, jitter_ms=0)
    # Anonymous floods: no team is needed.
    gw = lib.Gateway(a.bin_dir, tmp, "gateway", sim, teams={})
    print(f"gateway {a.bin_dir}; floods of up to {a.secs:.0f} s, one connection each (logs in {tmp})")
    for name, hello, batch in floods():
        run_flood("127.0.0.1", gw.port, gw.proc.pid, name, hello, batch, a.secs)


if __name__ == "__main__":
    main()
