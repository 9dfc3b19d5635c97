"""A slowloris attacker for test_metrics_slowloris.py, run as a process of
its own (so that the test's probes never wait on it for Python's lock):

    python3 slowloris.py PORT N RECONNECT SECONDS TICK

opens N connections to 127.0.0.1:PORT (loopback only), each sending the
start of a GET, then one byte of a header that never ends every TICK
seconds. A connection the server ends is noted with how long it lived (from
its connect, which precedes the server's accept) and, with RECONNECT 1,
opened again on the next tick. After SECONDS it prints JSON: "lives" (of
the connections the server ended), "ages" (of those still open), "opened"."""
import json
import select
import socket
import sys
import time


def main(port, n, reconnect, seconds, tick):
    opened = 0
    live = {}  # socket -> when it connected
    lives = []

    def connect():
        nonlocal opened
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.setblocking(False)
        live[s] = time.monotonic()
        opened += 1
        try:
            s.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        except OSError:
            pass  # already ended: the next round notes it

    def ended(s):
        lives.append(time.monotonic() - live.pop(s))
        s.close()

    for _ in range(n):
        connect()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        readable, _, _ = select.select(list(live), [], [], tick) if live else ([], [], [])
        if not live:
            time.sleep(tick)
        for s in readable:  # the server never answers: readable means its end
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:
                ended(s)
        for s in list(live):
            try:
                s.send(b"a")
            except OSError:
                ended(s)
        while reconnect and len(live) < n and time.monotonic() < end:
            connect()
    now = time.monotonic()
    ages = [now - t for t in live.values()]
    for s in live:
        s.close()
    print(json.dumps({"lives": lives, "ages": ages, "opened": opened}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4]),
         float(sys.argv[5]))
