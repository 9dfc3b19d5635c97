#!/usr/bin/python3
"""Transport flood: how much memory do gRPC's buffers of received messages,
not yet whole, make fuseboxd hold?

Starts fuseboxd (CPU backend, a unix socket in a temporary folder, the
tests' victim session beside it) and opens --conns HTTP/2 connections by
hand (tests/security/h2raw.py), each with --streams calls on --path whose
message is --length bytes (default max_message_bytes - 64); every byte but
the last is sent, as far as the server's flow-control windows let within
--wait seconds a stream, and the calls are held open. gRPC keeps what
arrived of a message until it is whole, and fuseboxd never sees it.

Prints fuseboxd's VmRSS and VmHWM (MiB) before and after, how many bytes
the server took, how the calls ended, and whether the victim's field and
the health service are unharmed. A measurement, not a test. Run from the
repository root after a build:

  /usr/bin/python3 bench/transport_flood.py --build build-rel --conns 4 --streams 8
  /usr/bin/python3 bench/transport_flood.py --build build-rel --path /fusebox.v1.Fusebox/Nope

Uses only the Python standard library for the attack, and grpcio with the
fixtures of tests/security/conftest.py for the server and the victim."""
import argparse
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build", help="the build folder (default build)")
    p.add_argument("--conns", type=int, default=4)
    p.add_argument("--streams", type=int, default=8, help="calls a connection")
    p.add_argument("--path", default="/fusebox.v1.Fusebox/RegisterKernels")
    p.add_argument("--max-message", default="4M", help="--max-message-bytes (default 4M)")
    p.add_argument("--length", type=int, default=0,
                   help="a message's length (default max_message_bytes - 64)")
    p.add_argument("--wait", type=float, default=3.0, help="seconds a stream may stall")
    p.add_argument("--hold", type=float, default=1.0, help="seconds to hold at the end")
    p.add_argument("server_args", nargs="*", help="more fuseboxd options (after --)")
    return p.parse_args()


def _bytes(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def flood(sock, conns, streams, path, length, wait):
    """(connections, [(conn, stream id, bytes sent)]) of the attack."""
    import h2raw
    cs = [h2raw.Conn(sock) for _ in range(conns)]
    body = b"\x00" * (length - 1)
    calls = []
    mu = threading.Lock()

    def one(c):
        for _ in range(streams):
            sid = c.open(path, length)
            sent_all = c.send(sid, body, deadline=time.monotonic() + wait)
            with mu:
                calls.append((c, sid, len(body) if sent_all else -1))

    ts = [threading.Thread(target=one, args=(c,)) for c in cs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return cs, calls


def victim(srv, when):
    """The victim's field and the health service, tried up to 5 times."""
    import grpc
    from conftest import VICTIM_BYTES
    fails = []
    for _ in range(5):
        try:
            ok = srv.client.read_field(srv.victim, 2) == VICTIM_BYTES
            print(f"{when}: victim's field unchanged: {ok}, health {srv.client.health()}"
                  f" (after {len(fails)} failures: {fails})")
            return
        except grpc.RpcError as e:
            fails.append(f"{e.code().name}: {e.details()}")
            time.sleep(0.2)
    print(f"{when}: the victim failed 5 times: {fails}")


def main():
    a = parse_args()
    os.environ["FB_BUILD_DIR"] = a.build
    os.environ["FB_PYGEN"] = os.path.join(a.build, "pygen")
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "security"))
    from conftest import Server
    from test_memory_budget import _kib, _status

    maxmsg = _bytes(a.max_message)
    length = a.length or maxmsg - 64

    def mem(pid):
        st = _status(pid)
        return _kib(st, "VmRSS") // 1024, _kib(st, "VmHWM") // 1024

    tmp = tempfile.TemporaryDirectory(prefix="tflood-")
    srv = Server(tmp.name, ("--max-message-bytes", str(maxmsg), *a.server_args))
    try:
        rss0, hwm0 = mem(srv.proc.pid)
        print(f"before: VmRSS {rss0} MiB, VmHWM {hwm0} MiB")
        t0 = time.monotonic()
        cs, calls = flood(srv.sock, a.conns, a.streams, a.path, length, a.wait)
        took = time.monotonic() - t0
        time.sleep(a.hold)
        rss, hwm = mem(srv.proc.pid)
        whole = sum(1 for _, _, n in calls if n > 0)
        states = {}
        for c, sid, _ in calls:
            s = c.state(sid)
            states[s] = states.get(s, 0) + 1
        print(f"{a.conns} connections x {a.streams} calls on {a.path}, messages of "
              f"{length} bytes: {whole} of {len(calls)} sent but their last byte in "
              f"{took:.1f} s ({whole * (length - 1) / (1 << 20):.0f} MiB); calls now: {states}")
        print(f"after: VmRSS {rss} MiB (+{rss - rss0}), VmHWM {hwm} MiB (+{hwm - hwm0})")
        victim(srv, "during the attack")
        for c in cs:
            c.close()
        time.sleep(0.5)
        rss, hwm = mem(srv.proc.pid)
        print(f"after closing: VmRSS {rss} MiB, VmHWM {hwm} MiB")
        victim(srv, "after it")
    finally:
        srv.stop()
        tmp.cleanup()


if __name__ == "__main__":
    main()
