"""HTTP/2 by hand, as any tenant could write it: enough of the protocol to
open gRPC calls on a fuseboxd unix socket and send a message's bytes but
its last, so that gRPC's transport holds what arrived while the server
waits for the rest (a stock gRPC client sends a message only whole).

Frames are written within the flow-control windows the server grants; a
reader answers SETTINGS and PING, and follows WINDOW_UPDATE, RST_STREAM and
GOAWAY. Over TLS too (tls: an ssl.SSLContext; ALPN "h2" as gRPC asks):
then the reader reads only under the connection's lock, one TLS record at
a time, as OpenSSL's connection state is not for two threads at once.
Used by test_transport_buffers.py and test_h2_abuse.py."""
import select
import socket
import struct
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
FRAME = 16384  # the default SETTINGS_MAX_FRAME_SIZE


def _frame(ftype, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + \
        struct.pack(">I", stream) + payload


def _hpack_len(n):
    """An HPACK string length (7-bit prefix, no Huffman)."""
    if n < 127:
        return bytes([n])
    out = bytearray([127])
    n -= 127
    while n >= 128:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def _headers(path, token=None, scheme="http"):
    out = bytearray()
    hs = [(":method", "POST"), (":scheme", scheme), (":path", path), (":authority", "localhost"),
          ("content-type", "application/grpc"), ("te", "trailers")]
    if token is not None:
        hs.append(("authorization", "Bearer " + token))
    for k, v in hs:
        out += b"\x00" + _hpack_len(len(k)) + k.encode() + _hpack_len(len(v)) + v.encode()
    return bytes(out)


def connect(where, timeout=30, tls=None):
    """A socket to a unix socket path, or to 'HOST:PORT' where HOST is a
    loopback address (127.0.0.1, [::1]): these tests talk to nothing else.
    tls: an ssl.SSLContext to wrap it in (server name "localhost")."""
    if where.startswith("/"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(where)
        return sock
    host, _, port = where.rpartition(":")
    host = host.strip("[]")
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise ValueError(f"h2raw talks to loopback only, not {host!r}")
    fam = socket.AF_INET6 if host == "::1" else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect((host if host != "localhost" else "127.0.0.1", int(port)))
    if tls is not None:
        tls.set_alpn_protocols(["h2"])
        sock = tls.wrap_socket(sock, server_hostname="localhost")
    return sock


class Conn:
    """One HTTP/2 connection to a unix socket path or a loopback HOST:PORT;
    token: sent as 'authorization: Bearer TOKEN' on every call; tls: an
    ssl.SSLContext (HOST:PORT only)."""

    def __init__(self, path, token=None, tls=None):
        self.token = token
        self.tls = tls is not None
        self.scheme = "https" if self.tls else "http"
        self.sock = connect(path, tls=tls)
        self.mu = threading.Condition()
        self.conn_window = 65535
        self.init_window = 65535
        self.windows = {}  # stream id -> what the server lets us send
        self.dead = set()  # streams the server reset or answered
        self.goaway = False
        self.closed = False
        self.next_id = 1
        self.sock.sendall(PREFACE + _frame(SETTINGS, 0, 0))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _recv_some(self, n):
        if not self.tls:
            return self.sock.recv(n)
        while True:  # TLS: wait outside the lock, read under it
            if not self.sock.pending():
                select.select([self.sock], [], [], 0.05)
            with self.mu:
                if self.closed:
                    return b""
                if self.sock.pending() or select.select([self.sock], [], [], 0)[0]:
                    return self.sock.recv(n)

    def _recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            b = self._recv_some(n - len(buf))
            if not b:
                raise EOFError
            buf += b
        return bytes(buf)

    def _send(self, data):
        with self.mu:
            try:
                self.sock.sendall(data)
            except OSError:  # the server closed the connection
                self.closed = True

    def _read(self):
        try:
            while True:
                h = self._recv(9)
                n = int.from_bytes(h[:3], "big")
                ftype, flags, sid = h[3], h[4], struct.unpack(">I", h[5:9])[0] & 0x7FFFFFFF
                p = self._recv(n) if n else b""
                with self.mu:
                    if ftype == SETTINGS and not flags & ACK:
                        for i in range(0, len(p) - 5, 6):
                            k, v = struct.unpack(">HI", p[i:i + 6])
                            if k == 4:  # INITIAL_WINDOW_SIZE
                                for s in self.windows:
                                    self.windows[s] += v - self.init_window
                                self.init_window = v
                        self.sock.sendall(_frame(SETTINGS, ACK, 0))
                    elif ftype == PING and not flags & ACK:
                        self.sock.sendall(_frame(PING, ACK, 0, p))
                    elif ftype == WINDOW_UPDATE:
                        inc = struct.unpack(">I", p)[0] & 0x7FFFFFFF
                        if sid == 0:
                            self.conn_window += inc
                        elif sid in self.windows:
                            self.windows[sid] += inc
                    elif ftype == RST_STREAM:
                        self.dead.add(sid)
                    elif ftype == HEADERS and flags & END_STREAM:
                        self.dead.add(sid)  # trailers: the server answered
                    elif ftype == GOAWAY:
                        self.goaway = True
                    self.mu.notify_all()
        except (OSError, EOFError, ValueError):  # ValueError: the socket closed under it
            with self.mu:
                self.closed = True
                self.mu.notify_all()

    def open(self, path, length):
        """A call on path whose message will be length bytes: its HEADERS
        and the message's 5-byte prefix. Returns the stream id."""
        sid = self.next_id
        self.next_id += 2
        with self.mu:
            self.windows[sid] = self.init_window
        self._send(_frame(HEADERS, END_HEADERS, sid, _headers(path, self.token, self.scheme)))
        self.send(sid, b"\x00" + struct.pack(">I", length))
        return sid

    def send(self, sid, data, deadline=None):
        """data on the stream as the windows allow; False where the stream
        ended, the connection went or deadline passed first."""
        off = 0
        while off < len(data):
            with self.mu:
                while True:
                    if sid in self.dead or self.closed or self.goaway:
                        return False
                    room = min(self.conn_window, self.windows[sid], FRAME)
                    if room > 0:
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self.mu.wait(0.05 if left is None else min(left, 0.05))
                n = min(room, len(data) - off)
                self.conn_window -= n
                self.windows[sid] -= n
                try:
                    self.sock.sendall(_frame(DATA, 0, sid, data[off:off + n]))
                except OSError:  # the server closed the connection
                    self.closed = True
                    return False
            off += n
        return True

    def rapid_reset(self, path, n):
        """n calls on path, each HEADERS then at once RST_STREAM (CANCEL),
        written together (CVE-2023-44487). Returns the bytes written, or 0
        where the server had closed the connection."""
        block = _headers(path, self.token, self.scheme)
        out = bytearray()
        for _ in range(n):
            sid = self.next_id
            self.next_id += 2
            out += _frame(HEADERS, END_HEADERS, sid, block)
            out += _frame(RST_STREAM, 0, sid, struct.pack(">I", 8))  # CANCEL
        with self.mu:
            if self.closed or self.goaway:
                return 0
        self._send(bytes(out))
        return 0 if self.closed else len(out)

    def flood(self, path, n):
        """n calls on path whose HEADERS come and nothing else: streams held
        open. Returns their stream ids (none once the connection closed)."""
        block = _headers(path, self.token, self.scheme)
        out, sids = bytearray(), []
        for _ in range(n):
            sid = self.next_id
            self.next_id += 2
            sids.append(sid)
            out += _frame(HEADERS, END_HEADERS, sid, block)
        with self.mu:
            if self.closed or self.goaway:
                return []
        self._send(bytes(out))
        return [] if self.closed else sids

    def state(self, sid):
        with self.mu:
            return "ended" if sid in self.dead else "closed" if self.closed else \
                "goaway" if self.goaway else "open"

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.reader.join(5)
