"""Connections to fuseboxd: :func:`connect` and :class:`Client`.

With no address, :func:`connect` starts a private fuseboxd on a unix socket
in a fresh temporary folder, as the ``fusebox`` command line does, and
stops it when the client is closed.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import grpc

from fusebox import _proto
from fusebox._proto import pb
from fusebox.errors import Error, from_rpc

#: Largest message either side accepts; field transfers are chunked under it
#: (FB_CLIENT_MAX_MESSAGE_BYTES of include/fusebox/limits.h; tests/test_lists.py).
MAX_MESSAGE_BYTES = 4 << 20
#: Seconds a unary call may take before it fails with DEADLINE_EXCEEDED.
DEFAULT_TIMEOUT = 120.0
START_TIMEOUT = 60.0

TlsArg = Union[None, bool, bytes, str, Mapping[str, Union[str, bytes]], grpc.ChannelCredentials]


@dataclass
class ServerInfo:
    """What GetInfo answers."""
    version: str
    backend: str
    cores: int
    max_sessions: int
    session_memory_limit: int
    max_message_bytes: int
    listen: List[str]
    uptime_s: float
    #: the replica that answered (fuseboxd --replica-name, else its host name)
    replica: str = ""
    #: whether it is draining (refusing new sessions)
    draining: bool = False


def find_fuseboxd() -> str:
    """The fuseboxd binary a private server is started from.

    Looked for in this order: $FUSEBOXD; beside the package (an install that
    ships it); a build folder of the checkout the package lies in
    (build*/server/fuseboxd); PATH. Raises :class:`FileNotFoundError`
    naming every place looked at when there is none.
    """
    env = os.environ.get("FUSEBOXD")
    if env:
        if os.access(env, os.X_OK):
            return env
        raise FileNotFoundError(f"$FUSEBOXD is {env!r}, which is not an executable file")
    here = os.path.dirname(os.path.abspath(__file__))
    tried = []
    cands = [os.path.join(here, "bin", "fuseboxd"), os.path.join(here, "fuseboxd")]
    root = os.path.dirname(os.path.dirname(here))  # python/fusebox -> checkout
    try:
        builds = sorted(d for d in os.listdir(root) if d.startswith("build"))
    except OSError:
        builds = []
    cands += [os.path.join(root, d, "server", "fuseboxd") for d in builds]
    for c in cands:
        tried.append(c)
        if os.access(c, os.X_OK):
            return c
    p = shutil.which("fuseboxd")
    if p:
        return p
    raise FileNotFoundError(
        "fusebox.connect(): no fuseboxd to start (looked at $FUSEBOXD, "
        + ", ".join(tried) + " and PATH); build Fusebox (cmake --build build), install "
        "fuseboxd, or pass connect(address=...) of a running server")


def _code_cache_args(server_args: Sequence[str]) -> list:
    """A private server's compile cache on disk (docs/code-cache.md):
    $FUSEBOX_CODE_CACHE_DIR when set (empty: none), else
    $XDG_CACHE_HOME/fusebox, else ~/.cache/fusebox; none when server_args
    name one."""
    if any(a == "--code-cache-dir" or a.startswith("--code-cache-dir=") for a in server_args):
        return []
    env = os.environ.get("FUSEBOX_CODE_CACHE_DIR")
    if env is not None:
        return ["--code-cache-dir", env] if env else []
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg.startswith("/"):
        try:
            os.makedirs(xdg, mode=0o700, exist_ok=True)
        except OSError:
            return []
        return ["--code-cache-dir", os.path.join(xdg, "fusebox")]
    home = os.path.expanduser("~")
    if not home.startswith("/"):
        return []
    try:
        os.makedirs(os.path.join(home, ".cache"), mode=0o700, exist_ok=True)
    except OSError:
        return []
    return ["--code-cache-dir", os.path.join(home, ".cache", "fusebox")]


class _Daemon:
    """A private fuseboxd child, on a unix socket in a new temporary folder
    (or on listen), ready when it says so (--ready-fd tells its address)."""

    def __init__(self, exe: str, extra_args: Sequence[str] = (), listen: Optional[str] = None):
        self.dir = tempfile.mkdtemp(prefix="fusebox-py-")
        self.sock = os.path.join(self.dir, "fuseboxd.sock")
        self.address = listen or "unix:" + self.sock
        # its log goes to a file: a pipe nobody reads would fill and stop it
        self.log = open(os.path.join(self.dir, "fuseboxd.log"), "w+b")
        rfd, wfd = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [exe, "--listen", self.address, "--ready-fd", str(wfd), *extra_args],
                pass_fds=(wfd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=self.log)
        except OSError as e:
            os.close(rfd)
            os.close(wfd)
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise Error(f"cannot start {exe}: {e}") from e
        os.close(wfd)
        line = self._ready_line(rfd)
        os.close(rfd)
        if not line:
            err = self.stop()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise Error(f"{exe} did not start serving on {self.address} (exit status "
                        f"{self.proc.returncode}): {err.strip()[-2000:]}")
        if listen:
            self.address = line.strip()  # a port 0 became a port

    @staticmethod
    def _ready_line(fd: int) -> str:
        import select
        buf = b""
        end = time.monotonic() + START_TIMEOUT
        while b"\n" not in buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return ""
            chunk = os.read(fd, 4096)
            if not chunk:
                return ""
            buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    def stop(self, timeout: float = 30.0) -> str:
        """SIGTERM (graceful), SIGKILL after timeout; returns its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        err = b""
        if not self.log.closed:
            self.log.seek(0)
            err = self.log.read()
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return err.decode(errors="replace")


def _credentials(tls: TlsArg) -> Optional[grpc.ChannelCredentials]:
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    if isinstance(tls, (str, bytes)):
        return grpc.ssl_channel_credentials(root_certificates=_pem(tls))
    if isinstance(tls, Mapping):
        bad = sorted(set(tls) - {"ca", "cert", "key"})
        if bad:
            raise TypeError(f"tls: unknown key '{bad[0]}' (give ca, and cert with key for a "
                            "client certificate)")
        if ("cert" in tls) != ("key" in tls):
            raise TypeError("tls: a client certificate needs both cert and key")
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(tls["ca"]) if tls.get("ca") else None,
            private_key=_pem(tls["key"]) if "key" in tls else None,
            certificate_chain=_pem(tls["cert"]) if "cert" in tls else None)
    raise TypeError("tls must be None, True, a CA bundle (bytes or a file name), a dict of "
                    "ca/cert/key or grpc.ChannelCredentials, not " + type(tls).__name__)


def _pem(x: Union[str, bytes]) -> bytes:
    """PEM bytes as given, or read from a file name."""
    if isinstance(x, bytes):
        return x
    with open(x, "rb") as f:
        return f.read()


class Client:
    """A connection to one fuseboxd. Use :func:`connect` to make one.

    A client is a context manager; closing it closes its sessions and stops
    the private server it started, if any. A client and its sessions are
    meant for one thread at a time.
    """

    def __init__(self, address: Union[str, Sequence[str]], token: Optional[str] = None,
                 tls: TlsArg = None, daemon: Optional[_Daemon] = None,
                 timeout: float = DEFAULT_TIMEOUT):
        #: every address given (one, or the replicas of a list): a session
        #: moves among them when its replica drains (docs/python.md)
        self.addresses: List[str] = _addresses(address)
        #: the address new sessions try first (the first that answered)
        self.address = self.addresses[0]
        self.timeout = timeout
        self._daemon = daemon
        self._opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                      ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        self._creds = _credentials(tls)
        self._channel = self._open_channel(self.address)
        self._metadata = (("authorization", "Bearer " + token),) if token else None
        self._stub = _proto.Stub(self._channel)
        self._more: Dict[str, Any] = {}  # the other addresses' (channel, stub), made when used
        self._sessions: "list[Any]" = []
        self.closed = False

    def _open_channel(self, address: str) -> grpc.Channel:
        return (grpc.secure_channel(address, self._creds, options=self._opts) if self._creds
                else grpc.insecure_channel(address, options=self._opts))

    def _stub_of(self, address: str) -> Any:
        """The stub of one of the client's addresses (its own channel)."""
        if address == self.address:
            return self._stub
        if address not in self._more:
            ch = self._open_channel(address)
            self._more[address] = (ch, _proto.Stub(ch))
        return self._more[address][1]

    def _others(self, address: str) -> List[str]:
        """The addresses after address in the list, in order, wrapping."""
        i = self.addresses.index(address) if address in self.addresses else -1
        return [self.addresses[(i + 1 + k) % len(self.addresses)]
                for k in range(len(self.addresses)) if (i + 1 + k) % len(self.addresses) != i]

    # -- plumbing
    def _call(self, method: str, req: Any, timeout: Optional[float] = None) -> Any:
        if self.closed:
            raise Error("the client is closed")
        try:
            return getattr(self._stub, method)(req, timeout=self.timeout if timeout is None else timeout,
                                               metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc(method, e) from None

    # -- the server
    def ready(self, timeout: float = 5.0) -> bool:
        """Whether the server answers its health check with SERVING
        (``grpc.health.v1.Health/Check``), like Triton's
        ``is_server_ready``. False when it cannot be reached or is not
        serving (a server shutting down, for instance); never raises for
        those."""
        if self.closed:
            return False
        check = self._channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            # HealthCheckRequest{service: ""} is empty on the wire; the
            # answer is HealthCheckResponse{status}, SERVING = 1: b"\x08\x01"
            r = check(b"", timeout=timeout, metadata=self._metadata)
        except grpc.RpcError:
            return False
        return r == b"\x08\x01"

    def info(self, timeout: Optional[float] = None) -> ServerInfo:
        """The server's version, backend and limits (GetInfo)."""
        r = self._call("GetInfo", pb.InfoRequest(), timeout)
        return ServerInfo(r.version, r.backend, r.cores, r.max_sessions,
                          r.session_memory_limit, r.max_message_bytes, list(r.listen),
                          r.uptime_s, r.replica, r.draining)

    def stats(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """The server's counters and its sessions (GetStats) as a dict."""
        from google.protobuf.json_format import MessageToDict
        r = self._call("GetStats", pb.StatsRequest(), timeout)
        return MessageToDict(r, preserving_proto_field_name=True)

    def describe(self, source: str, params: Optional[Mapping[str, Any]] = None,
                 filename: str = "", timeout: Optional[float] = None) -> Any:
        """Parse source on the server and return its fields and kernels
        (a :class:`fusebox.session.Program`) without making a session.
        Raises :class:`ServerError` (INVALID_ARGUMENT, file:line:col) when
        it does not parse; its warnings (``Program.warnings``) are emitted
        as :class:`fusebox.LayoutWarning`."""
        from fusebox.session import Program, _source_pb
        prog = Program(self._call("DescribeSource", _source_pb(source, params, filename), timeout))
        prog._warn(2)  # each warning (fusebox.LayoutWarning), at the caller
        return prog

    def session(self, source: Optional[str] = None, *, file: Optional[str] = None,
                params: Optional[Mapping[str, Any]] = None, mode: str = "",
                backend: str = "", passes: Union[None, Mapping[str, bool], Sequence[str]] = None,
                flush_every: int = 0, max_fuse_per_task: int = 0, compile_threads: int = 0,
                seed: int = 0, memory_limit: int = 0, filename: str = "",
                batch: int = 1024, timeout: Optional[float] = None) -> Any:
        """Open a session on a ``.fbk`` program.

        Args:
            source: the program text (or give ``file``).
            file: a ``.fbk`` file to read the program from.
            params: values for ``${NAME}`` in the program text.
            mode: "sync" or "async" ("" = the server's default, sync).
            backend: "", "auto", "cpu" or "cuda".
            passes: optimizer passes of async mode, as {"fusion": False, ...}
                or the list of those to enable (listgen, demote, fusion, dse).
            flush_every: async: flush after this many pending tasks (0 =
                default, negative = never).
            seed: seed of rand().
            memory_limit: bytes of field storage (0 = the server's limit).
            batch: launches sent to the server in one message at most.
            timeout: seconds :meth:`Session.sync` (and a kernel that returns
                a value) waits by default; None waits as long as it takes.
                Other calls use the client's timeout.

        Returns a :class:`fusebox.Session`, also a context manager.
        """
        from fusebox.session import Session
        if file is not None:
            if source is not None:
                raise TypeError("session(): give source or file, not both")
            with open(file) as f:
                source = f.read()
            filename = filename or os.path.basename(file)
        if source is None:
            raise TypeError("session(): the program's source (or file=) is required")
        s = Session(self, source, params=params, filename=filename, mode=mode, backend=backend,
                    passes=passes, flush_every=flush_every, max_fuse_per_task=max_fuse_per_task,
                    compile_threads=compile_threads, seed=seed, memory_limit=memory_limit,
                    batch=batch, timeout=timeout)
        self._sessions.append(s)
        return s

    # -- checkpoints (docs/python.md "Checkpoints")
    def restore(self, path: Optional[str] = None, *, name: Optional[str] = None,
                memory_limit: int = 0, chunk_bytes: int = 1 << 20,
                timeout: Optional[float] = None) -> Any:
        """A session from a checkpoint: a file on this side (path, made by
        :meth:`Session.checkpoint`), uploaded in chunks, or one the server
        keeps (name, from :meth:`checkpoints` or ``checkpoint(on_server=True)``).
        The server checks its seal, owner, version and quotas before a
        session exists. Returns the :class:`fusebox.Session`, its kernels
        bound as they were; it continues exactly where the checkpoint was."""
        from fusebox.session import Session
        if (path is None) == (name is None):
            raise TypeError("restore(): give a path or a name")
        opts = pb.SessionOptions(memory_limit=memory_limit)

        def chunks() -> Any:
            if name is not None:
                yield pb.CheckpointChunk(name=name, options=opts)
                return
            with open(path, "rb") as f:
                off = 0
                while True:
                    b = f.read(chunk_bytes)
                    if not b and off:
                        return
                    yield pb.CheckpointChunk(offset=off, data=b, options=opts if not off else None)
                    if not b:
                        return
                    off += len(b)

        # the new session's routing key, sent on the Restore already (a
        # proxy hashing on it keeps the session's calls on that replica)
        route = secrets.token_hex(16)
        md = tuple(self._metadata or ()) + (("fusebox-route", route),)
        try:
            r, call = self._stub.Restore.with_call(chunks(), timeout=timeout, metadata=md)
        except grpc.RpcError as e:
            raise from_rpc("Restore", e) from None
        replica = dict(call.initial_metadata() or ()).get("fusebox-replica", "")
        s = Session._restored(self, r, route, md, replica)
        self._sessions.append(s)
        return s

    def checkpoints(self, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        """The caller's checkpoints the server keeps, newest first:
        [{"name", "bytes", "age_s"}]."""
        r = self._call("ListCheckpoints", pb.ListCheckpointsRequest(), timeout)
        return [{"name": c.name, "bytes": c.bytes, "age_s": c.age_s} for c in r.checkpoints]

    def fetch_checkpoint(self, name: str, path: str, timeout: Optional[float] = None) -> str:
        """Copy a checkpoint the server keeps into the file path."""
        from fusebox.session import _write_chunks
        try:
            stream = self._stub.FetchCheckpoint(pb.FetchCheckpointRequest(name=name),
                                                timeout=timeout, metadata=self._metadata)
            return _write_chunks(stream, path)
        except grpc.RpcError as e:
            raise from_rpc("FetchCheckpoint", e) from None

    def close(self) -> None:
        """Close every session, the channel and a private server."""
        if self.closed:
            return
        for s in list(self._sessions):
            try:
                s.close()
            except Error:
                pass
        self.closed = True
        self._channel.close()
        for ch, _ in self._more.values():
            ch.close()
        if self._daemon is not None:
            self._daemon.stop()
            self._daemon = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self.closed and self._daemon is not None:
                self.close()
        except Exception:
            pass


def _addresses(address: Union[str, Sequence[str]]) -> List[str]:
    """The addresses of connect(): one, a list, or a comma-separated list."""
    if isinstance(address, str):
        out = [a.strip() for a in address.split(",")]
    elif isinstance(address, (list, tuple)):
        out = [a.strip() if isinstance(a, str) else a for a in address]
    else:
        raise TypeError("address must be a str or a list of str, not " + type(address).__name__)
    for a in out:
        if not isinstance(a, str) or not a:
            raise ValueError(f"address list {address!r}: every address must be a non-empty "
                             "\"host:port\" or \"unix:PATH\"")
    if len(set(out)) != len(out):
        raise ValueError(f"address list {address!r} names an address twice")
    return out


def connect(address: Union[None, str, Sequence[str]] = None, token: Optional[str] = None,
            tls: TlsArg = None,
            *, fuseboxd: Optional[str] = None, server_args: Sequence[str] = (),
            timeout: float = DEFAULT_TIMEOUT) -> Client:
    """Connect to fuseboxd.

    Args:
        address: "host:port" or "unix:PATH" of a running server. None starts
            a private fuseboxd on a unix socket (found by
            :func:`find_fuseboxd`, or the ``fuseboxd`` path given) that
            lives until the client is closed. A list of addresses (or one
            string of them separated by commas) names several replicas:
            sessions open on the first that answers (the next when one is
            draining or unreachable), and a session whose replica drains
            moves to the next by itself (docs/python.md, "Several
            replicas"). One address of a proxy in front of replicas moves
            sessions too, with a new routing key.
        token: sent as "authorization: Bearer TOKEN" on every call.
        tls: None (plaintext), True (system roots), a CA bundle (bytes, or
            a file name), a dict ``{"ca": ..., "cert": ..., "key": ...}``
            (files or bytes; cert and key for mTLS) or
            ``grpc.ChannelCredentials``.
        server_args: extra flags for a private server.
        timeout: seconds each call may take (a field transfer as a whole);
            past it the call raises :class:`fusebox.DeadlineExceededError`
            (gRPC DEADLINE_EXCEEDED). Each method also takes its own.

    The server is asked for its info at once, so a wrong address fails
    here with :class:`ConnectionLostError`.
    """
    daemon = None
    if address is None:
        exe = fuseboxd or find_fuseboxd()
        try:  # --private: one user's daemon, no shared server's warnings (fuseboxd --help)
            daemon = _Daemon(exe, ["--private", *_code_cache_args(server_args), *server_args])
        except Error as e:
            if "--private" not in str(e):
                raise
            daemon = _Daemon(exe, server_args)  # a fuseboxd older than --private
        address = daemon.address
    elif fuseboxd is not None or server_args:
        raise TypeError("connect(): fuseboxd and server_args are for a private server "
                        "(address=None)")
    c = Client(address, token=token, tls=tls, daemon=daemon, timeout=timeout)
    try:
        for i, a in enumerate(c.addresses):
            try:
                c._stub_of(a).GetInfo(pb.InfoRequest(), timeout=min(timeout, 30.0),
                                      metadata=c._metadata)
            except grpc.RpcError as e:
                if i + 1 < len(c.addresses) and e.code() == grpc.StatusCode.UNAVAILABLE:
                    continue  # that replica is down: the next
                raise from_rpc("GetInfo", e) from None
            if a != c.address:  # new sessions start on the first that answers
                c._more[c.address] = (c._channel, c._stub)
                c._channel, c._stub = c._more.pop(a)
                c.address = a
            break
    except BaseException:
        c.close()  # and a private server with it
        raise
    return c
