"""A structure-aware mutation fuzzer for fuseboxd's public gRPC protocol.

It starts from valid sessions (layouts, IR kernels, field transfers,
launches, syncs, Cancel, session options) and mutates them: integers at
the edges of their types and beyond them (raw varints appended to the
encoded message, which a decoder must take as the field's last value),
sizes, offsets, shapes, indices and chunk offsets that disagree, wrong
field ids, repeated fields truncated or duplicated, IR statements naming
operands, blocks and SNodes that do not exist, and random bytes on every
method path. Everything goes over grpcio on raw method paths (bytes both
ways), as any tenant could send it.

Two tenants share the server (a tenants file): "victim" holds a session
whose field has a known pattern and a kernel; "fuzz" sends the cases and
sometimes names the victim's session id. After every batch of cases the
harness checks that the server still says SERVING, that the victim's field
is byte for byte unchanged and its kernel still computes, and that the
server's log holds no sanitizer report or dead worker.

The oracle for one case: the call either succeeds or fails with a status
from ALLOWED and a message; a case built to be malformed (must_fail) must
fail. UNAVAILABLE, UNKNOWN, INTERNAL, DATA_LOSS and a client-side deadline
are findings (a dropped connection, a crash, a worker that died, a hang).

Used by tests/security/test_proto_fuzz.py (fixed seed, a few hundred
cases) and by hand for long runs:

  FB_BUILD_DIR=build FB_PYGEN=build/pygen /usr/bin/python3 \\
      tests/security/protofuzz.py --cases 20000 --seed 1 --isolation thread
"""
import hashlib
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.environ.get("FB_PYGEN", ""))
import fusebox_pb2 as pb  # noqa: E402
import health_pb2  # noqa: E402

BUILD = os.environ.get("FB_BUILD_DIR", "build")
FUSEBOXD = os.path.join(BUILD, "server", "fuseboxd")
CALL_TIMEOUT = 30.0
TRACE = bool(os.environ.get("FB_FUZZ_TRACE"))

SC = grpc.StatusCode
# statuses a hostile request may get; anything else is a finding
# (UNIMPLEMENTED is gRPC's code for a method path or a backend this server
# does not serve, e.g. a CUDA session on a CPU-only fuseboxd: not unfinished work)
ALLOWED = {SC.INVALID_ARGUMENT, SC.NOT_FOUND, SC.RESOURCE_EXHAUSTED, SC.OUT_OF_RANGE,
           SC.FAILED_PRECONDITION, SC.PERMISSION_DENIED, SC.UNIMPLEMENTED, SC.ABORTED,
           SC.ALREADY_EXISTS, SC.CANCELLED}
# what the log must never hold
LOG_BAD = re.compile(r"AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|"
                     r"runtime error:|worker died|SIGSEGV|SIGABRT|SIGBUS|"
                     r"Assertion .* failed|stack-overflow|heap-buffer-overflow")

SERVICE = "/fusebox.v1.Fusebox/"
METHODS = ["CreateSession", "CloseSession", "Cancel", "RegisterKernels", "Session",
           "WriteField", "ReadField", "GetInfo", "GetStats", "DescribeSource"]

EDGES = [0, 1, -1, 2, 3, 7, 8, 255, 256, 4095, 4096, 65535, 65536, 2**31 - 1, -2**31, 2**31,
         2**32 - 1, 2**32, 2**32 + 1, 2**48, 2**56, 2**63 - 1, -2**63, 2**64 - 1, 2**64 - 2]

OPS = ["const", "arg", "cast", "select", "add", "sub", "mul", "div", "rem", "floordiv",
       "floormod", "min", "max", "pow", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "and",
       "or", "xor", "shl", "shr", "not", "neg", "abs", "sqrt", "rsqrt", "sin", "cos", "tan",
       "asin", "acos", "atan", "exp", "log", "floor", "ceil", "round", "alloca", "lload",
       "lstore", "load", "store", "atomic_add", "atomic_sub", "atomic_min", "atomic_max",
       "atomic_and", "atomic_or", "atomic_xor", "is_active", "activate", "deactivate",
       "append", "length", "assume_unique", "if", "while", "range_for", "par_for",
       "struct_for", "break", "continue", "loop_index", "ret", "rand",
       # internal ones, always refused
       "gtmp_load", "gtmp_store", "clear_list", "listgen", "gc", "store_na", "rand_seq",
       # not ops
       "", "bogus", "add\x00x", "x" * 300]


# ---------------------------------------------------------------- wire bytes

def varint(v):
    v &= 2**64 - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def tag(no, wt):
    return varint(no << 3 | wt)


def ldelim(no, data):
    return tag(no, 2) + varint(len(data)) + data


# ---------------------------------------------------------------- IR by hand

def snode(kind, parent, name="", axes=0, size=(1, 1, 1, 1), chunk=0, type=pb.T_VOID):
    return pb.SNode(kind=kind, name=name, parent=parent, axes=axes, size=list(size),
                    chunk=chunk, type=type)


def stmt(op, type=pb.T_VOID, args=(), imm=0, snode_id=-1, body=-1, orelse=-1):
    return pb.Stmt(op=op, type=type, snode=snode_id, args=list(args), imm=imm & (2**64 - 1),
                   body=body, orelse=orelse)


def kernel(name, stmts, params=(), blocks=None, ret=pb.T_VOID):
    blocks = blocks if blocks is not None else [list(range(len(stmts)))]
    return pb.Kernel(name=name, params=list(params), ret=ret, stmts=stmts,
                     blocks=[pb.Block(ids=b) for b in blocks])


class Base:
    """A valid layout, the ids of its places (with element type and index
    count) and valid kernels for it, each with the args a launch takes."""

    def __init__(self, layout, places, kernels):
        self.layout, self.places, self.kernels = layout, places, kernels

    def field_bytes(self, fid):
        n = 1
        node = self.layout.nodes[fid]
        while node.parent >= 0:
            node = self.layout.nodes[node.parent]
            for a in range(4):
                if node.axes >> a & 1:
                    n *= node.size[a]
        return n * TYPE_BYTES[self.layout.nodes[fid].type]


TYPE_BYTES = {pb.T_BOOL: 1, pb.T_I32: 4, pb.T_I64: 8, pb.T_U32: 4, pb.T_U64: 8, pb.T_F32: 4,
              pb.T_F64: 8}


def k_poke(place, t=pb.T_I32, nidx=1):
    """poke(i.., v) { place[i..] = v }"""
    st = [stmt("arg", pb.T_I32, imm=a) for a in range(nidx)] + [stmt("arg", t, imm=nidx)]
    st.append(stmt("store", args=list(range(nidx + 1)), snode_id=place))
    return kernel("poke", st, params=[pb.T_I32] * nidx + [t]), [pb.T_I32] * nidx + [t]


def k_get(place, t=pb.T_I32, nidx=1):
    """get(i..) -> t { return place[i..] }"""
    st = [stmt("arg", pb.T_I32, imm=a) for a in range(nidx)]
    st.append(stmt("load", t, args=list(range(nidx)), snode_id=place))
    st.append(stmt("ret", args=[nidx]))
    return kernel("get", st, params=[pb.T_I32] * nidx, ret=t), [pb.T_I32] * nidx


def k_fill(place, n):
    """fill(v) { for i in 0..n: place[i] = v + i }"""
    st = [stmt("arg", pb.T_I32, imm=0), stmt("const", pb.T_I32, imm=0),
          stmt("const", pb.T_I32, imm=n), stmt("range_for", args=[1, 2], body=1),
          stmt("loop_index", pb.T_I32, args=[3], imm=0), stmt("add", pb.T_I32, args=[0, 4]),
          stmt("store", args=[4, 5], snode_id=place)]
    return kernel("fill", st, params=[pb.T_I32], blocks=[[0, 1, 2, 3], [4, 5, 6]]), [pb.T_I32]


def k_sum(place):
    """sum() -> i32 { s = 0; struct_for i over place: s += place[i] }"""
    st = [stmt("alloca", pb.T_I32), stmt("const", pb.T_I32, imm=0),
          stmt("lstore", args=[0, 1]), stmt("struct_for", snode_id=place, body=1),
          stmt("loop_index", pb.T_I32, args=[3], imm=0),
          stmt("load", pb.T_I32, args=[4], snode_id=place),
          stmt("lload", pb.T_I32, args=[0]), stmt("add", pb.T_I32, args=[5, 6]),
          stmt("lstore", args=[0, 7]), stmt("lload", pb.T_I32, args=[0]),
          stmt("ret", args=[9])]
    return (kernel("sum", st, ret=pb.T_I32, blocks=[[0, 1, 2, 3, 9, 10], [4, 5, 6, 7, 8]]), [])


def k_atomic(place):
    """bump(i, v) { atomic_add place[i], v; if place[i] > 100: deactivate }"""
    st = [stmt("arg", pb.T_I32, imm=0), stmt("arg", pb.T_I32, imm=1),
          stmt("atomic_add", pb.T_I32, args=[0, 1], snode_id=place),
          stmt("is_active", pb.T_BOOL, args=[0], snode_id=place),
          stmt("if", args=[3], body=1),
          stmt("rand", pb.T_F32, imm=3), stmt("cast", pb.T_I32, args=[5]),
          stmt("min", pb.T_I32, args=[6, 1])]
    return (kernel("bump", st, params=[pb.T_I32, pb.T_I32], blocks=[[0, 1, 2, 3, 4], [5, 6, 7]]),
            [pb.T_I32, pb.T_I32])


def k_append(dyn_place, lenode):
    """push(i, v) { append d[i], v; n = length(i) }"""
    st = [stmt("arg", pb.T_I32, imm=0), stmt("arg", pb.T_I32, imm=1),
          stmt("append", pb.T_I32, args=[0, 1], snode_id=dyn_place),
          stmt("length", pb.T_I32, args=[0], snode_id=lenode), stmt("ret", args=[3])]
    return kernel("push", st, params=[pb.T_I32, pb.T_I32], ret=pb.T_I32), [pb.T_I32, pb.T_I32]


def bases():
    out = []
    # dense(i: 64) { a: i32 }, dense(i: 8) { b: f64 }
    lay = pb.Layout(nodes=[snode(pb.SN_ROOT, -1), snode(pb.SN_DENSE, 0, axes=1, size=(64, 1, 1, 1)),
                           snode(pb.SN_PLACE, 1, name="a", type=pb.T_I32),
                           snode(pb.SN_DENSE, 0, axes=1, size=(8, 1, 1, 1)),
                           snode(pb.SN_PLACE, 3, name="b", type=pb.T_F64)])
    out.append(Base(lay, {2: (pb.T_I32, 1), 4: (pb.T_F64, 1)},
                    [k_poke(2), k_get(2), k_fill(2, 64), k_sum(2), k_atomic(2),
                     k_poke(4, pb.T_F64), k_get(4, pb.T_F64)]))
    # dense(ij: 4, 16) { m: u32 }
    lay = pb.Layout(nodes=[snode(pb.SN_ROOT, -1),
                           snode(pb.SN_DENSE, 0, axes=3, size=(4, 16, 1, 1)),
                           snode(pb.SN_PLACE, 1, name="m", type=pb.T_U32)])
    out.append(Base(lay, {2: (pb.T_U32, 2)}, [k_poke(2, pb.T_U32, 2), k_get(2, pb.T_U32, 2)]))
    # pointer(i: 16) > dense(i: 4) { s: i32 }   (sparse)
    lay = pb.Layout(nodes=[snode(pb.SN_ROOT, -1),
                           snode(pb.SN_POINTER, 0, name="blk", axes=1, size=(16, 1, 1, 1)),
                           snode(pb.SN_DENSE, 1, axes=1, size=(4, 1, 1, 1)),
                           snode(pb.SN_PLACE, 2, name="s", type=pb.T_I32)])
    out.append(Base(lay, {3: (pb.T_I32, 1)}, [k_poke(3), k_get(3), k_sum(3), k_atomic(3)]))
    # bitmasked(i: 8) > dynamic(j: 32, chunk 4) { d: i32 }
    lay = pb.Layout(nodes=[snode(pb.SN_ROOT, -1),
                           snode(pb.SN_BITMASKED, 0, axes=1, size=(8, 1, 1, 1)),
                           snode(pb.SN_DYNAMIC, 1, name="dl", axes=2, size=(1, 32, 1, 1), chunk=4),
                           snode(pb.SN_PLACE, 2, name="d", type=pb.T_I32)])
    out.append(Base(lay, {3: (pb.T_I32, 2)}, [k_append(3, 3), k_get(3, pb.T_I32, 2)]))
    return out


BASES = bases()


# ---------------------------------------------------------------- mutation

def _int_range(fd):
    t = fd.type
    F = fd.__class__
    if t in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32, F.TYPE_ENUM):
        return -2**31, 2**31 - 1
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return 0, 2**32 - 1
    if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return -2**63, 2**63 - 1
    if t in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return 0, 2**64 - 1
    return None


def coerce(fd, v):
    """v wrapped into the field's type (two's complement)."""
    lo, hi = _int_range(fd)
    bits = (hi - lo).bit_length()
    v &= (1 << bits) - 1
    if lo < 0 and v > hi:
        v -= 1 << bits
    return v


class Mutator:
    def __init__(self, rng):
        self.r = rng

    def edge(self):
        r = self.r
        v = r.choice(EDGES)
        if r.random() < 0.2:
            v += r.choice((-1, 1))
        return v

    def junk(self, n=None):
        n = self.r.randrange(0, 64) if n is None else n
        return bytes(self.r.randrange(256) for _ in range(n))

    def mutate_scalar(self, msg, fd):
        r = self.r
        F = fd.__class__
        if fd.type == F.TYPE_STRING:
            return r.choice(["", "\x00", "x" * r.randrange(1, 200), "é" * 3, "%s%n",
                             getattr(msg, fd.name) + "x", getattr(msg, fd.name)[:1]])
        if fd.type == F.TYPE_BYTES:
            cur = getattr(msg, fd.name)
            return r.choice([b"", self.junk(), cur + self.junk(r.randrange(1, 9)),
                             cur[:max(0, len(cur) - r.randrange(1, 9))], cur * 2])
        if fd.type == F.TYPE_BOOL:
            return not getattr(msg, fd.name)
        if fd.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
            return r.choice([0.0, -1.0, 1e300, float("nan"), float("inf")])
        if fd.type == F.TYPE_ENUM:
            return coerce(fd, r.choice([-1, 8, 99, 2**31 - 1, r.randrange(8)]))
        if fd.type == F.TYPE_MESSAGE:
            return None
        return coerce(fd, self.edge())

    def mutate(self, msg, depth=0):
        """One mutation somewhere in msg (in place)."""
        r = self.r
        fields = list(msg.DESCRIPTOR.fields)
        if not fields:
            return
        fd = r.choice(fields)
        F = fd.__class__
        is_rep = fd.label == F.LABEL_REPEATED
        is_map = is_rep and fd.message_type is not None and \
            fd.message_type.GetOptions().map_entry
        if is_map:
            m = getattr(msg, fd.name)
            key = r.choice(["listgen", "demote", "fusion", "dse", "", "nope", "x" * 100])
            try:
                m[key] = r.random() < 0.5
            except (TypeError, ValueError):
                pass
            return
        if is_rep:
            seq = getattr(msg, fd.name)
            choice = r.randrange(6)
            if fd.type == F.TYPE_MESSAGE:
                if len(seq) and choice < 3 and depth < 4:
                    self.mutate(seq[r.randrange(len(seq))], depth + 1)
                elif len(seq) and choice == 3:
                    del seq[r.randrange(len(seq)):]  # truncate
                elif len(seq) and choice == 4:
                    seq.add().CopyFrom(seq[r.randrange(len(seq))])  # duplicate
                else:
                    seq.add()  # an empty element
                return
            if len(seq) and choice < 2:
                i = r.randrange(len(seq))
                v = self.mutate_scalar(msg, fd) if fd.type not in (F.TYPE_STRING, F.TYPE_BYTES) \
                    else seq[i]
                seq[i] = v
            elif len(seq) and choice == 2:
                del seq[r.randrange(len(seq)):]
            elif len(seq) and choice == 3:
                seq.append(seq[r.randrange(len(seq))])
            elif fd.type not in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE):
                seq.append(coerce(fd, self.edge()) if fd.type != F.TYPE_ENUM else
                           r.randrange(-1, 10))
            return
        if fd.type == F.TYPE_MESSAGE:
            sub = getattr(msg, fd.name)
            if r.random() < 0.15:
                msg.ClearField(fd.name)
            elif depth < 4:
                self.mutate(sub, depth + 1)
            return
        v = self.mutate_scalar(msg, fd)
        try:
            setattr(msg, fd.name, v)
        except (TypeError, ValueError):
            pass

    def raw_tail(self, msg):
        """Bytes to append to msg's encoding: a top-level field given a raw
        varint of any 64 bits (a decoder keeps the last value), or with a
        wire type other than its own, or a field number nothing uses."""
        r = self.r
        fields = list(msg.DESCRIPTOR.fields)
        k = r.randrange(4)
        if k == 0 and fields:
            fd = r.choice(fields)
            return tag(fd.number, 0) + varint(r.choice(EDGES))
        if k == 1 and fields:
            fd = r.choice(fields)
            return tag(fd.number, r.choice((0, 1, 2, 5))) + self.junk(r.randrange(0, 10))
        if k == 2:
            return ldelim(r.choice((15, 99, 536870911)), self.junk(5))
        return self.junk(r.randrange(1, 12))

    def mangle(self, data):
        """Random byte edits on an encoding."""
        r = self.r
        b = bytearray(data)
        for _ in range(r.randrange(1, 4)):
            k = r.randrange(5)
            if k == 0 and b:
                b[r.randrange(len(b))] ^= 1 << r.randrange(8)
            elif k == 1 and b:
                del b[r.randrange(len(b)):]
            elif k == 2:
                i = r.randrange(len(b) + 1)
                b[i:i] = self.junk(r.randrange(1, 6))
            elif k == 3 and b:
                i = r.randrange(len(b))
                b[i] = r.choice((0, 0x7F, 0x80, 0xFF))
            else:
                b += b[:r.randrange(len(b) + 1)]
        return bytes(b)


# ---------------------------------------------------------------- the server

def sha(token):
    return hashlib.sha256(token.encode()).hexdigest()


class Daemon:
    """fuseboxd on a unix socket (or 127.0.0.1:0) with a tenants file of
    two tenants, victim and fuzz; its log (stdout and stderr) in a file."""

    def __init__(self, tmp, isolation="process", tcp=False, args=()):
        self.tok = {"victim": "victim-" + os.urandom(8).hex(), "fuzz": "fuzz-" + os.urandom(8).hex()}
        tenants = {"tenants": [{"name": n, "token_sha256": [sha(t)],
                                "limits": {"max_sessions": 64}} for n, t in self.tok.items()]}
        tpath = os.path.join(tmp, "tenants.json")
        with open(tpath, "w") as f:
            json.dump(tenants, f)
        self.logpath = os.path.join(tmp, "fuseboxd.log")
        self.log = open(self.logpath, "w+")
        addr = "127.0.0.1:0" if tcp else "unix:" + os.path.join(tmp, "fuseboxd.sock")
        r, w = os.pipe()
        env = dict(os.environ)
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        self.proc = subprocess.Popen(
            [FUSEBOXD, "--listen", addr, "--backend", "cpu", "--shutdown-grace-s", "5",
             "--isolation", isolation, "--tenants", tpath, "--ready-fd", str(w),
             "--session-memory-limit", "64M", "--kernel-timeout-s", "5",
             "--max-kernel-statements", "2000", *args],
            stdout=self.log, stderr=subprocess.STDOUT, pass_fds=(w,), env=env)
        os.close(w)
        with os.fdopen(r) as f:
            self.address = f.readline().strip()
        if not self.address:
            self.proc.wait(timeout=60)
            raise AssertionError("fuseboxd did not start:\n" + self.logtext())
        self.channel = grpc.insecure_channel(self.address, options=[
            ("grpc.max_receive_message_length", 64 << 20)])

    def md(self, who):
        return [("authorization", "Bearer " + self.tok[who])]

    def logtext(self):
        self.log.flush()
        with open(self.logpath, errors="replace") as f:
            return f.read()

    def health(self):
        call = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        return call(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT).status

    def stop(self):
        """SIGTERM; the exit status (0 expected: under ASan, no leak)."""
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return "did not stop on SIGTERM"
        self.log.close()
        return self.proc.returncode


# ---------------------------------------------------------------- calls

class Outcome:
    def __init__(self, code=None, details="", value=None):
        self.code, self.details, self.value = code, details, value

    @property
    def ok(self):
        return self.code is None

    def __repr__(self):
        return "OK" if self.ok else f"{self.code.name}: {self.details[:200]}"


class Wire:
    """Raw calls on the method paths: bytes in, bytes out."""

    def __init__(self, d, who):
        self.d, self.md = d, d.md(who)

    def unary(self, method, data):
        call = self.d.channel.unary_unary(SERVICE + method)
        try:
            return Outcome(value=call(data, timeout=CALL_TIMEOUT, metadata=self.md))
        except grpc.RpcError as e:
            return Outcome(e.code(), e.details() or "")

    def client_stream(self, method, msgs):
        call = self.d.channel.stream_unary(SERVICE + method)
        try:
            return Outcome(value=call(iter(msgs), timeout=CALL_TIMEOUT, metadata=self.md))
        except grpc.RpcError as e:
            return Outcome(e.code(), e.details() or "")

    def server_stream(self, method, data):
        call = self.d.channel.unary_stream(SERVICE + method)
        out = []
        try:
            for m in call(data, timeout=CALL_TIMEOUT, metadata=self.md):
                out.append(m)
            return Outcome(value=out)
        except grpc.RpcError as e:
            return Outcome(e.code(), e.details() or "", value=out)

    def create(self, layout, **opts):
        o = self.unary("CreateSession", pb.CreateSessionRequest(
            options=pb.SessionOptions(**opts), layout=layout).SerializeToString())
        if o.ok:
            o.value = pb.CreateSessionResponse.FromString(o.value).session_id
        return o

    def register(self, sid, kernels):
        o = self.unary("RegisterKernels", pb.RegisterKernelsRequest(
            session_id=sid, kernels=kernels).SerializeToString())
        if o.ok:
            o.value = list(pb.RegisterKernelsResponse.FromString(o.value).kernel_ids)
        return o

    def write(self, sid, field, data):
        return self.client_stream("WriteField", [pb.FieldChunk(
            session_id=sid, field=field, offset=0, total_bytes=len(data),
            data=data).SerializeToString()])

    def read(self, sid, field):
        o = self.server_stream("ReadField", pb.ReadFieldRequest(
            session_id=sid, field=field).SerializeToString())
        if o.ok:
            o.value = b"".join(pb.FieldChunk.FromString(m).data for m in o.value)
        return o


class Stream:
    """A Session stream on raw bytes fed from a queue, read by a thread:
    a test sends messages and waits for SyncResults with a bound."""

    def __init__(self, wire, first, timeout=CALL_TIMEOUT * 4):
        self.q = queue.Queue()
        self.q.put(first)
        call = wire.d.channel.stream_stream(SERVICE + "Session")
        self.it = call(iter(self.q.get, None), timeout=timeout, metadata=wire.md)
        self.results = queue.Queue()
        self.end = None  # Outcome once the stream ended
        self.t = threading.Thread(target=self._reader, daemon=True)
        self.t.start()

    def _reader(self):
        try:
            for m in self.it:
                self.results.put(m)
            self.end = Outcome()
        except grpc.RpcError as e:
            self.end = Outcome(e.code(), e.details() or "")
        self.results.put(None)

    def send(self, data):
        self.q.put(data)

    def wait(self, timeout=CALL_TIMEOUT):
        """The next SessionResponse (parsed), or None when the stream ended;
        raises TimeoutError when neither comes in time."""
        try:
            m = self.results.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("no SyncResult and no end of the Session stream in %.0f s" % timeout)
        if m is None:
            self.results.put(None)
            return None
        return pb.SessionResponse.FromString(m)

    def close(self, timeout=CALL_TIMEOUT):
        self.q.put(None)
        self.t.join(timeout)
        return not self.t.is_alive()

    def cancel(self):
        self.it.cancel()
        self.t.join(CALL_TIMEOUT)


# ---------------------------------------------------------------- the fuzzer

class Finding(Exception):
    pass


class Fuzzer:
    def __init__(self, d, seed, log=None):
        self.d = d
        self.r = random.Random(seed)
        self.mu = Mutator(self.r)
        self.fz = Wire(d, "fuzz")
        self.vw = Wire(d, "victim")
        self.log = log or (lambda s: None)
        self.cases = 0
        self.errors_by_code = {}
        self.findings = []
        self.by_what = {}
        self.samples = {}
        self._victim()

    # -- the victim tenant
    def _victim(self):
        base = BASES[0]
        o = self.vw.create(base.layout)
        assert o.ok, o
        self.victim = o.value
        self.vpat = bytes((i * 37 + 11) % 256 for i in range(base.field_bytes(2)))
        o = self.vw.write(self.victim, 2, self.vpat)
        assert o.ok, o
        o = self.vw.register(self.victim, [base.kernels[1][0]])  # get(i) -> i32
        assert o.ok, o
        self.vget = o.value[0]
        # the victim's stream lives as long as the run (each wait on it is bounded)
        self.vstream = Stream(self.vw, pb.SessionRequest(session_id=self.victim).SerializeToString(),
                              timeout=None)
        self.vsync = 0

    def check(self, where=""):
        """The server alive and SERVING, the victim's field unchanged and its
        kernel computing, no sanitizer report in the log."""
        if self.d.proc.poll() is not None:
            raise Finding(f"fuseboxd died ({self.d.proc.returncode}) {where}")
        if self.d.health() != health_pb2.HealthCheckResponse.SERVING:
            raise Finding(f"not SERVING {where}")
        o = self.vw.read(self.victim, 2)
        if not o.ok or o.value != self.vpat:
            raise Finding(f"the victim's field changed or is unreadable {where}: {o}")
        self.vsync += 1
        i = self.r.randrange(64)
        self.vstream.send(pb.SessionRequest(launches=[pb.Launch(
            kernel=self.vget, args=[pb.Value(type=pb.T_I32, i=i)])],
            sync=self.vsync).SerializeToString())
        res = self.vstream.wait()
        want = int.from_bytes(self.vpat[4 * i:4 * i + 4], "little", signed=True)
        if res is None or list(res.sync.errors) or [x.value.i for x in res.sync.returns] != [want]:
            raise Finding(f"the victim's kernel no longer computes {where}: {res} "
                          f"{self.vstream.end}")
        m = LOG_BAD.search(self.d.logtext())
        if m:
            raise Finding(f"the log has {m.group(0)!r} {where}")

    # -- one outcome
    def judge(self, what, o, must_fail=False):
        self.cases += 1
        key = (what, "OK" if o.ok else o.code.name)
        self.by_what[key] = self.by_what.get(key, 0) + 1
        if not o.ok and len(self.samples.setdefault(key, [])) < 3:
            self.samples[key].append(o.details[:160])
        if o.ok:
            if must_fail:
                self.findings.append(f"{what}: a malformed request was accepted")
                self.log(f"FINDING {what}: accepted")
            return o
        self.errors_by_code[o.code.name] = self.errors_by_code.get(o.code.name, 0) + 1
        # the server's own deadlines (kernel_timeout_s) name the kernel; a
        # bare "Deadline Exceeded" is the client's: the server hung
        server_deadline = o.code == SC.DEADLINE_EXCEEDED and o.details != "Deadline Exceeded"
        if o.code not in ALLOWED and not server_deadline:
            raise Finding(f"{what}: {o.code.name}: {o.details}")
        if not o.details:
            raise Finding(f"{what}: {o.code.name} without a message")
        return o

    # -- a session of the fuzz tenant, made valid
    def session(self, base):
        r = self.r
        opts = dict(mode=r.choice(["sync", "async"]))
        if r.random() < 0.3:
            opts["max_fuse_per_task"] = r.choice([1, 2, 64, 256])
        if r.random() < 0.2:
            opts["flush_every"] = r.choice([-1, 1, 3])
        o = self.judge("create valid", self.fz.create(base.layout, **opts))
        if not o.ok:
            raise Finding(f"a valid CreateSession failed: {o}")
        sid = o.value
        o = self.judge("register valid", self.fz.register(sid, [k for k, _ in base.kernels]))
        if not o.ok:
            raise Finding(f"a valid RegisterKernels failed: {o}")
        return sid, list(zip(o.value, [t for _, t in base.kernels]))

    def batch(self, ncases):
        """One session of the fuzz tenant and ncases mutated requests on it."""
        r = self.r
        base = r.choice(BASES)
        sid, kids = self.session(base)
        st = Stream(self.fz, pb.SessionRequest(session_id=sid).SerializeToString())
        ctx = dict(base=base, sid=sid, kids=list(kids), stream=st, sync=0, launches=0)
        try:
            for _ in range(ncases):
                if st.end is not None and not st.end.ok:
                    # the stream ended (a refused message ends it): a new one
                    self.judge("stream end", st.end)
                    sid, kids = self.session(base)
                    st = Stream(self.fz, pb.SessionRequest(session_id=sid).SerializeToString())
                    ctx.update(sid=sid, kids=list(kids), stream=st, sync=0, launches=0)
                act = r.choices(ACTIONS, weights=[w for _, w in ACTIONS])[0][0]
                if TRACE:
                    self.log(f"case {self.cases}: {act.__name__}")
                act(self, ctx)
        finally:
            st = ctx["stream"]
            if not st.close():
                raise Finding("a Session stream did not end after its client half-closed")
            if st.end is not None and not st.end.ok:
                self.judge("stream end", st.end)

    def run(self, total, per_batch=25, deadline=None):
        start = time.monotonic()
        n = 0
        while n < total:
            if deadline and time.monotonic() > deadline:
                break
            before = self.cases
            self.batch(min(per_batch, total - n))
            n += per_batch
            self.check(f"after case {self.cases}")
            self.log(f"{self.cases} cases, {time.monotonic() - start:.0f} s, "
                     f"{self.errors_by_code} (+{self.cases - before})")
        return self.cases

    def close(self):
        self.vstream.close()


# ---------------------------------------------------------------- actions

def pick_sid(f, ctx):
    """Mostly the session's id; sometimes a mangled one or the victim's,
    which must be refused (PERMISSION_DENIED: another tenant's)."""
    r = f.r
    x = r.random()
    if x < 0.75:
        return ctx["sid"], False
    if x < 0.85:
        return f.victim, True
    return r.choice(["", ctx["sid"][:-1], ctx["sid"] + "0", "0" * 32, ctx["sid"].upper(),
                     "\xff" * 32, ctx["sid"][:16]]), True


def a_create(f, ctx):
    r = f.r
    base = r.choice(BASES)
    req = pb.CreateSessionRequest(options=pb.SessionOptions(mode="sync"), layout=base.layout)
    if r.random() < 0.1:
        req.source.text = r.choice(["layout { dense(i: 8) { place x: i32 } }",
                                    "field x: i32[8]\nkernel k() { x[0] = 1 }", "junk {"])
    for _ in range(r.randrange(1, 4)):
        f.mu.mutate(req)
    data = req.SerializeToString()
    if r.random() < 0.3:
        data += f.mu.raw_tail(req)
    if r.random() < 0.15:
        data = f.mu.mangle(data)
    o = f.judge("CreateSession", f.fz.unary("CreateSession", data))
    if o.ok:
        # a session it made: close it (an unattached one is reaped later)
        try:
            sid = pb.CreateSessionResponse.FromString(o.value).session_id
        except Exception:
            raise Finding("CreateSession answered bytes that are no CreateSessionResponse")
        f.judge("CloseSession", f.fz.unary("CloseSession", pb.CloseSessionRequest(
            session_id=sid).SerializeToString()))


def bad_kernel(f, base):
    """A valid kernel of base, mutated in its IR."""
    r = f.r
    k = pb.Kernel()
    k.CopyFrom(r.choice(base.kernels)[0])
    n = len(k.stmts)
    nn = len(base.layout.nodes)
    for _ in range(1 if r.random() < 0.5 else r.randrange(1, 4)):
        n = len(k.stmts)
        if r.random() < 0.5 and n:
            semantic_mutation(f, k, base)
            continue
        x = r.randrange(10)
        s = k.stmts[r.randrange(n)] if n else k.stmts.add()
        if x == 0 and s.args:
            s.args[r.randrange(len(s.args))] = r.choice([-1, n, n + 1, 2**31 - 1, -2**31,
                                                         r.randrange(n)])
        elif x == 1:
            s.snode = r.choice([-1, 0, 1, nn - 1, nn, nn + 5, 2**31 - 1, -2**31, 4096])
        elif x == 2:
            s.body = r.choice([-1, 0, 1, len(k.blocks), 2**31 - 1, -2])
            s.orelse = r.choice([-1, 0, 1, len(k.blocks)])
        elif x == 3:
            s.op = r.choice(OPS)
        elif x == 4:
            s.type = r.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, -1, 99])
        elif x == 5:
            s.imm = r.choice([0, 1, 4, 7, 8, 2**31, 2**63, 2**64 - 1])
        elif x == 6 and k.blocks:
            b = k.blocks[r.randrange(len(k.blocks))]
            y = r.randrange(4)
            if y == 0:
                b.ids.append(r.choice([0, n - 1, n, -1, 2**31 - 1]))
            elif y == 1 and b.ids:
                del b.ids[r.randrange(len(b.ids))]
            elif y == 2:
                k.blocks.add().ids.extend([r.randrange(max(n, 1)) for _ in range(3)])
            else:
                b.ids.extend(list(b.ids))
        elif x == 7:
            del s.args[r.randrange(len(s.args) + 1):]
            if r.random() < 0.5:
                s.args.extend([r.randrange(max(n, 1))] * r.randrange(1, 9))
        elif x == 8:
            if r.random() < 0.5:
                k.params.append(r.choice([0, 1, 2, 7, 8, 99]))
            elif k.params:
                del k.params[-1]
            k.ret = r.choice([0, 2, 6, 8, 42])
        else:
            f.mu.mutate(k)
    return k


def semantic_mutation(f, k, base):
    """A change that keeps every id in range (so the conversion takes the
    kernel) and breaks or bends its meaning: for the verifier, lowering,
    the optimizer and code generation."""
    r = f.r
    n = len(k.stmts)
    s = k.stmts[r.randrange(n)]
    x = r.randrange(8)
    places = list(base.places)
    if x == 0 and s.args:
        s.args[r.randrange(len(s.args))] = r.randrange(n)  # another operand
    elif x == 1:
        s.snode = r.randrange(len(base.layout.nodes))  # another SNode, maybe a container
    elif x == 2:
        s.type = r.randrange(8)
    elif x == 3:
        same = {"add": "sub", "sub": "mul", "mul": "div", "div": "rem", "rem": "shl",
                "shl": "shr", "store": "atomic_max", "atomic_add": "atomic_xor",
                "load": "is_active", "is_active": "length", "range_for": "par_for",
                "par_for": "struct_for", "struct_for": "range_for", "lstore": "store",
                "lload": "load", "if": "while", "append": "store", "arg": "const",
                "const": "rand", "ret": "break", "loop_index": "arg", "min": "pow"}
        s.op = same.get(s.op, r.choice(OPS[:70]))
    elif x == 4:
        s.imm = r.choice([0, 1, 2, 3, 4, 2**31 - 1, 2**32 - 1, 2**63, 2**64 - 1,
                          0x7FF8000000000000])
    elif x == 5 and places:
        # a store of the wrong width or to a field of another shape
        p = r.choice(places)
        k.stmts.add().CopyFrom(stmt("store", args=[r.randrange(n)] * r.randrange(0, 4),
                                    snode_id=p))
        if not k.blocks:
            k.blocks.add()
        k.blocks[0].ids.append(n)
    elif x == 6:
        # a statement in two blocks, or its own body
        if len(k.blocks) > 1:
            k.blocks[r.randrange(len(k.blocks))].ids.append(r.randrange(n))
        else:
            s.body = 0
    else:
        k.params[:] = [r.randrange(1, 8) for _ in range(r.randrange(0, 4))]


def a_register(f, ctx):
    r = f.r
    sid, foreign = pick_sid(f, ctx)
    ks = [bad_kernel(f, ctx["base"]) for _ in range(r.randrange(1, 3))]
    if r.random() < 0.3:
        ks.append(r.choice(ctx["base"].kernels)[0])
    req = pb.RegisterKernelsRequest(session_id=sid, kernels=ks)
    if r.random() < 0.08:
        req.source.text = "kernel k() { }"
        req.instances.add(kernel=r.choice(["k", "", "nope"]), fields=["a", "zz"][:r.randrange(3)])
    data = req.SerializeToString()
    if r.random() < 0.2:
        data += f.mu.raw_tail(req)
    if r.random() < 0.1:
        data = f.mu.mangle(data)
    o = f.judge("RegisterKernels", f.fz.unary("RegisterKernels", data), must_fail=foreign)
    if o.ok:
        try:
            ids = list(pb.RegisterKernelsResponse.FromString(o.value).kernel_ids)
        except Exception:
            raise Finding("RegisterKernels answered no RegisterKernelsResponse")
        ctx["kids"] = (ctx["kids"] + [(i, list(k.params)) for i, k in zip(ids, ks)])[-32:]


def a_write(f, ctx):
    """WriteField with chunks that disagree with each other or the field."""
    r = f.r
    base = ctx["base"]
    sid, foreign = pick_sid(f, ctx)
    nn = len(base.layout.nodes)
    field = r.choice(list(base.places))
    n = base.field_bytes(field)
    bad = foreign
    if r.random() < 0.3:
        field = r.choice([-1, 0, 1, nn, nn + 1, 2**31 - 1, -2**31, 4096] +
                         [i for i in range(nn) if i not in base.places])
        bad = True
    total = n
    if r.random() < 0.3:
        total = r.choice([0, n - 1, n + 1, 2 * n, 2**63, 2**64 - 1, 2**32 + n])
        bad = bad or total != n
    data = bytes(r.randrange(256) for _ in range(n))
    cuts = sorted(r.sample(range(1, n), min(n - 1, r.randrange(0, 4)))) if n > 1 else []
    pieces, at = [], 0
    for c in cuts + [n]:
        pieces.append([at, data[at:c]])
        at = c
    if r.random() < 0.4 and pieces:
        p = pieces[r.randrange(len(pieces))]
        y = r.randrange(5)
        if y == 0:
            p[0] = r.choice([p[0] + 1, max(p[0] - 1, 0) if p[0] else 1, 2**64 - 1, 2**63, n])
        elif y == 1:
            p[1] = p[1][:-1] if len(p[1]) > 1 else p[1] + b"x"
        elif y == 2:
            pieces.append(list(p))  # a duplicate chunk at the end
        elif y == 3:
            del pieces[-1]  # stops short
        else:
            pieces.reverse()
            if len(pieces) < 2:
                p[0] += 1
        bad = True
    msgs = []
    for i, (off, d) in enumerate(pieces):
        ch = pb.FieldChunk(offset=off, data=d)
        if i == 0:
            ch.session_id = sid
            ch.field = coerce_i32(field)
            ch.total_bytes = total & (2**64 - 1)
        elif r.random() < 0.1:
            ch.field = coerce_i32(r.choice([field, field + 1, -1]))
            bad = bad or ch.field not in (0, field)
        msgs.append(ch.SerializeToString())
    if r.random() < 0.1 and msgs:
        i = r.randrange(len(msgs))
        msgs[i] = f.mu.mangle(msgs[i])
        bad = None  # may or may not still be valid
    o = f.judge("WriteField", f.fz.client_stream("WriteField", msgs), must_fail=bool(bad))
    if o.ok and bad is False:
        # a good write: the data reads back
        ro = f.judge("ReadField after write", f.fz.read(sid, field))
        if ro.ok and ro.value != data:
            raise Finding(f"field {field} reads back other bytes than were written")


def coerce_i32(v):
    v &= 2**32 - 1
    return v - 2**32 if v >= 2**31 else v


def a_read(f, ctx):
    r = f.r
    base = ctx["base"]
    sid, foreign = pick_sid(f, ctx)
    nn = len(base.layout.nodes)
    req = pb.ReadFieldRequest(session_id=sid, field=r.choice(list(base.places)),
                              chunk_bytes=r.choice([0, 1, 3, 64, 4096, 2**32 - 1]),
                              active=r.random() < 0.3)
    bad = foreign
    if r.random() < 0.3:
        req.field = r.choice([-1, 0, nn, 2**31 - 1, -2**31] +
                             [i for i in range(nn) if i not in base.places])
        bad = bad or req.field not in base.places
    data = req.SerializeToString()
    if r.random() < 0.2:
        data += f.mu.raw_tail(req)
        bad = None if not foreign else True
    if r.random() < 0.1:
        data = f.mu.mangle(data)
        bad = None if not foreign else True
    o = f.judge("ReadField", f.fz.server_stream("ReadField", data), must_fail=bool(bad))
    if o.ok:
        for m in o.value:
            try:
                pb.FieldChunk.FromString(m)
            except Exception:
                raise Finding("ReadField answered bytes that are no FieldChunk")


def bad_value(f, t):
    r = f.r
    v = pb.Value(type=t)
    x = r.randrange(6)
    if x == 0:
        v.type = r.choice([0, 8, 99, -1])
    elif x == 1:
        v.i = coerce_i64(f.mu.edge())
    elif x == 2:
        v.u = f.mu.edge() & (2**64 - 1)
    elif x == 3:
        v.f_bits = r.choice([0x7FF8000000000001, 0xFFF0000000000000, 0x47EFFFFFE0000000,
                             2**64 - 1])
    else:
        v.i = r.randrange(-4, 70)
    return v


def coerce_i64(v):
    v &= 2**64 - 1
    return v - 2**64 if v >= 2**63 else v


def a_launch(f, ctx):
    """Launches with wrong kernel ids, argument counts, types and values,
    flushes and a sync; the SyncResult must come (or the stream end with
    an error status)."""
    r = f.r
    st = ctx["stream"]
    launches = []
    for _ in range(r.randrange(1, 12)):
        ki = r.randrange(len(ctx["kids"]) + 1)
        if ki < len(ctx["kids"]):
            kid, types = ctx["kids"][ki]
            types = [t if t in TYPE_BYTES else pb.T_I32 for t in types]
        else:
            kid = r.choice([-1, len(ctx["kids"]) + 5, 2**31 - 1, -2**31, 4096])
            types = []
        args = [pb.Value(type=t, i=r.randrange(-2, 66)) if t != pb.T_F64 else
                pb.Value(type=t, f_bits=0x3FF0000000000000) for t in types]
        if r.random() < 0.4:
            y = r.randrange(4)
            if y == 0 and args:
                args[r.randrange(len(args))] = bad_value(f, r.choice(types))
            elif y == 1 and args:
                del args[r.randrange(len(args)):]
            elif y == 2:
                args += [bad_value(f, pb.T_I32) for _ in range(r.randrange(1, 20))]
            else:
                for a in args:
                    a.type = r.randrange(0, 9)
        launches.append(pb.Launch(kernel=kid, args=args))
    if r.random() < 0.1:
        launches = launches * r.randrange(2, 40)  # many at once
    ctx["sync"] += 1
    ctx["launches"] += len(launches)
    req = pb.SessionRequest(launches=launches, flush=r.random() < 0.3, sync=ctx["sync"])
    if r.random() < 0.1:
        # a Cancel racing the launches, maybe ahead of them
        st.send(pb.SessionRequest(launches=launches, flush=True).SerializeToString())
        ctx["launches"] += len(launches)
        f.judge("Cancel racing", f.fz.unary("Cancel", pb.CancelRequest(
            session_id=ctx["sid"], through_launch=ctx["launches"] + r.choice([0, 1, 100])
        ).SerializeToString()))
    if r.random() < 0.05:
        req.session_id = r.choice([ctx["sid"], f.victim, "nope"])
    data = req.SerializeToString()
    mangled = False
    if r.random() < 0.08:
        data = f.mu.mangle(data)
        mangled = True
    elif r.random() < 0.1:
        data += f.mu.raw_tail(req)
        mangled = True
    f.cases += 1
    st.send(data)
    if mangled:
        # the sync may be gone or changed: a clean sync of its own follows,
        # with an id that no mangled one is likely to have
        ctx["sync"] += 1 << 40
        st.send(pb.SessionRequest(sync=ctx["sync"]).SerializeToString())
    while True:
        try:
            res = st.wait()
        except TimeoutError as e:
            raise Finding(f"launch batch: {e}")
        if res is None:
            f.cases -= 1
            f.judge("Session", st.end)
            return
        if res.sync.sync_id == ctx["sync"]:
            return
        # else the answer to an earlier mangled message's sync (its id may
        # have been changed by the mangling): skip it


ARITH2 = ["add", "sub", "mul", "div", "rem", "floordiv", "floormod", "min", "max", "pow",
          "atan2", "and", "or", "xor", "shl", "shr", "eq", "lt"]
ARITH1 = ["neg", "abs", "not", "sqrt", "rsqrt", "exp", "log", "floor", "ceil", "round"]
INT_T = [pb.T_I32, pb.T_I64, pb.T_U32, pb.T_U64]
FLOAT_T = [pb.T_F32, pb.T_F64]
EDGE_BITS = {pb.T_I32: [0, 1, -1, -2**31, 2**31 - 1, 31, 32, 33, -32],
             pb.T_I64: [0, 1, -1, -2**63, 2**63 - 1, 63, 64, 65, -64],
             pb.T_U32: [0, 1, 2**32 - 1, 2**31, 32, 33],
             pb.T_U64: [0, 1, 2**64 - 1, 2**63, 64, 65]}
F_BITS = [0, 0x8000000000000000, 0x7FF8000000000000, 0x7FF0000000000000, 0xFFF0000000000000,
          0x41E0000000000000, 0xC1E0000000000000, 0x43E0000000000000, 0xC3E0000000000000,
          0x7FEFFFFFFFFFFFFF, 0x0000000000000001, 0x3FF0000000000000]


def edge_value(f, t):
    r = f.r
    if t in FLOAT_T:
        return pb.Value(type=t, f_bits=r.choice(F_BITS))
    v = r.choice(EDGE_BITS[t])
    if t in (pb.T_U32, pb.T_U64):
        return pb.Value(type=t, u=v)
    return pb.Value(type=t, i=v)


def imm_of(v):
    if v.type in FLOAT_T:
        return v.f_bits
    return (v.u if v.type in (pb.T_U32, pb.T_U64) else v.i) & (2**64 - 1)


def a_arith(f, ctx):
    """Arithmetic at the edges of its types: INT_MIN / -1, x % 0,
    shifts by the width and more, float to int casts of NaN, infinities and
    values out of range; once on launch arguments (the JIT code) and once
    on constants (what the optimizer folds in fuseboxd itself)."""
    r = f.r
    t = r.choice(INT_T + FLOAT_T)
    unary = r.random() < 0.3
    op = r.choice(ARITH1 if unary else ARITH2)
    cast_to = r.choice(INT_T + FLOAT_T + [pb.T_BOOL]) if r.random() < 0.3 else None
    vals = [edge_value(f, t) for _ in range(1 if unary else 2)]
    rt = pb.T_BOOL if op in ("eq", "lt") else t
    consts = r.random() < 0.5
    if consts:
        st = [stmt("const", t, imm=imm_of(v)) for v in vals]
        params, args = [], []
    else:
        st = [stmt("arg", t, imm=i) for i in range(len(vals))]
        params, args = [t] * len(vals), vals
    st.append(stmt(op, rt, args=list(range(len(vals)))))
    if cast_to is not None:
        st.append(stmt("cast", cast_to, args=[len(st) - 1]))
        rt = cast_to
    st.append(stmt("ret", args=[len(st) - 1]))
    k = kernel("arith", st, params=params, ret=rt)
    o = f.judge("arith register", f.fz.register(ctx["sid"], [k]))
    if not o.ok:
        return
    ctx["sync"] += 1
    ctx["launches"] += 1
    f.cases += 1
    st_ = ctx["stream"]
    st_.send(pb.SessionRequest(launches=[pb.Launch(kernel=o.value[0], args=args)],
                               sync=ctx["sync"]).SerializeToString())
    try:
        res = st_.wait()
    except TimeoutError as e:
        raise Finding(f"arith launch: {e}")
    if res is None:
        f.cases -= 1
        f.judge("Session", st_.end)
        return
    if res.sync.errors:
        f.judge("arith launch", Outcome(SC.INVALID_ARGUMENT, res.sync.errors[0].message))
    else:
        f.judge("arith launch", Outcome())


def random_layout(r):
    """A random tree of containers of every kind with places under them;
    mostly valid (small sizes), sometimes not. Returns the layout and, per
    place, (id, type, path of container ids from the top)."""
    nodes = [snode(pb.SN_ROOT, -1)]
    conts = [0]
    paths = {0: []}
    for _ in range(r.randrange(1, 5)):
        parent = r.choice(conts)
        kind = r.choice([pb.SN_DENSE, pb.SN_DENSE, pb.SN_BITMASKED, pb.SN_POINTER,
                         pb.SN_DYNAMIC])
        if kind == pb.SN_DYNAMIC:
            axes = 1 << r.randrange(4)
        else:
            axes = r.randrange(1, 16)
        size = [r.choice([1, 2, 3, 4, 8]) if axes >> a & 1 else 1 for a in range(4)]
        chunk = 0
        if kind == pb.SN_DYNAMIC:
            a = axes.bit_length() - 1
            size[a] = r.choice([4, 8, 16])
            chunk = r.choice([1, 2, size[a]])
        if r.random() < 0.1:
            size[r.randrange(4)] = r.choice([0, -1, 2**31, 2**20])
        nodes.append(snode(kind, parent, axes=axes, size=size, chunk=chunk,
                           name=r.choice(["", "c%d" % len(nodes)])))
        paths[len(nodes) - 1] = paths[parent] + [len(nodes) - 1]
        conts.append(len(nodes) - 1)
    places = []
    leaves = [c for c in conts[1:] if not any(n.parent == c for n in nodes)]
    extra = [r.choice(conts[1:]) for _ in range(r.randrange(0, 2))]
    for i, parent in enumerate(leaves + extra if r.random() < 0.9 else extra or leaves):
        t = r.choice([pb.T_I32, pb.T_I64, pb.T_U32, pb.T_F32, pb.T_F64, pb.T_BOOL])
        nodes.append(snode(pb.SN_PLACE, parent, name="p%d" % i, type=t))
        places.append((len(nodes) - 1, t, paths[parent]))
    return pb.Layout(nodes=nodes), places


def place_shape(layout, path):
    """The extent of each axis the place's containers split, in axis
    order; and whether a dynamic container is among them."""
    ext = [1, 1, 1, 1]
    used = 0
    dyn = False
    for c in path:
        n = layout.nodes[c]
        used |= n.axes
        dyn = dyn or n.kind == pb.SN_DYNAMIC
        for a in range(4):
            if n.axes >> a & 1:
                ext[a] *= n.size[a]
    return [ext[a] for a in range(4) if used >> a & 1], dyn


def f32_round(bits):
    """The f64 bits of the f32 nearest to the f64 of these bits (as the
    server narrows a launch argument); out of f32 range: infinity."""
    import struct
    x = struct.unpack("<d", struct.pack("<Q", bits))[0]
    try:
        y = struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        y = float("inf") if x > 0 else float("-inf")
    return struct.unpack("<Q", struct.pack("<d", y))[0]


def a_layout(f, ctx):
    """A session of a random layout (every container kind, nested): pokes
    and gets at indices in and off the field, whole-field transfers, the
    activity mask, a struct_for; an in-range store must read back."""
    r = f.r
    layout, places = random_layout(r)
    mode = r.choice(["sync", "async"])
    o = f.judge("layout create", f.fz.create(layout, mode=mode))
    if not o.ok:
        return
    sid = o.value
    ks, meta = [], []
    for pid, t, path in places:
        shape, dyn = place_shape(layout, path)
        k1, _ = k_poke(pid, t, len(shape))
        k2, _ = k_get(pid, t, len(shape))
        ks += [k1, k2]
        meta.append((pid, t, shape, dyn))
        if dyn and t == pb.T_I32 and len(shape) >= 1:
            k3, _ = k_append(pid, pid)
            # append and length take one index fewer (not the dynamic axis)
            k3.params[:] = [pb.T_I32] * (len(shape) - 1) + [pb.T_I32]
            st = [stmt("arg", pb.T_I32, imm=a) for a in range(len(shape))]
            st += [stmt("append", pb.T_I32, args=list(range(len(shape))), snode_id=pid),
                   stmt("length", pb.T_I32, args=list(range(len(shape) - 1)), snode_id=pid),
                   stmt("ret", args=[len(shape) + 1])]
            ks.append(kernel("push", st, params=[pb.T_I32] * len(shape), ret=pb.T_I32))
    if meta and meta[0][1] == pb.T_I32 and len(meta[0][2]) == 1:
        ks.append(k_sum(meta[0][0])[0])
    reg = f.judge("layout register", f.fz.register(sid, ks))
    st = Stream(f.fz, pb.SessionRequest(session_id=sid).SerializeToString())
    try:
        for pid, t, shape, dyn in meta:
            cells = 1
            for e in shape:
                cells *= e
            if cells > 1 << 16:
                # whole-field transfers of a big sparse field take seconds in
                # a sanitizer build (a cell at a time): not what is fuzzed here
                continue
            ro = f.judge("layout read", f.fz.read(sid, pid))
            if ro.ok and r.random() < 0.7:
                data = bytes(r.randrange(256) for _ in range(len(ro.value)))
                if t == pb.T_BOOL:
                    data = bytes(b & 1 for b in data)
                f.judge("layout write", f.fz.write(sid, pid, data))
            f.judge("layout active", f.fz.server_stream("ReadField", pb.ReadFieldRequest(
                session_id=sid, field=pid, active=True).SerializeToString()))
        if not reg.ok:
            return
        ids = reg.value
        launches, expect = [], []
        ki = 0
        for pid, t, shape, dyn in meta:
            poke, get = ids[ki], ids[ki + 1]
            ki += 2 + (1 if dyn and t == pb.T_I32 and len(shape) >= 1 else 0)
            for _ in range(r.randrange(1, 6)):
                inside = r.random() < 0.7
                idx = [r.randrange(e) if inside else r.choice([-1, e, 2**31 - 1, -2**31])
                       for e in shape]
                inside = inside or all(0 <= i < e for i, e in zip(idx, shape))
                v = edge_value(f, t) if t != pb.T_BOOL else pb.Value(type=t, i=1)
                args = [pb.Value(type=pb.T_I32, i=i) for i in idx]
                launches.append(pb.Launch(kernel=poke, args=args + [v]))
                launches.append(pb.Launch(kernel=get, args=args))
                if inside and not dyn:
                    expect.append((len(launches), t, v))
        launches += [pb.Launch(kernel=k, args=[pb.Value(type=pb.T_I32, i=r.randrange(-1, 9))
                                               for _ in range(r.randrange(0, 3))])
                     for k in ids[ki:]]
        f.cases += 1
        st.send(pb.SessionRequest(launches=launches, sync=1).SerializeToString())
        try:
            res = st.wait()
        except TimeoutError as e:
            raise Finding(f"layout launches: {e}")
        if res is None:
            f.cases -= 1
            f.judge("Session", st.end)
            return
        rets = {x.seq: x.value for x in res.sync.returns}
        errs = {x.seq for x in res.sync.errors}
        for seq, t, v in expect:
            if seq in errs or seq - 1 in errs:
                continue
            got = rets.get(seq)
            want = imm_of(v) if t not in FLOAT_T else v.f_bits
            if t == pb.T_F32:
                want = f32_round(v.f_bits)
            have = None if got is None else (got.f_bits if t in FLOAT_T else imm_of(got))
            if t == pb.T_I32:
                want &= 2**32 - 1
                have = None if have is None else have & (2**32 - 1)
            if t == pb.T_U32:
                want &= 2**32 - 1
            nan = t in FLOAT_T and (want & 0x7FF0000000000000) == 0x7FF0000000000000 and \
                want & 0xFFFFFFFFFFFFF
            if have != want and not nan and t != pb.T_BOOL:
                raise Finding(f"layout {layout}: launch {seq} read {have!r}, stored {want!r} "
                              f"({pb.ScalarType.Name(t)}); errors {res.sync.errors}")
        f.judge("layout launches", Outcome() if not res.sync.errors else
                Outcome(SC.INVALID_ARGUMENT, res.sync.errors[0].message))
    finally:
        st.close()
        if st.end is not None and not st.end.ok:
            f.judge("layout stream end", st.end)


def a_cancel(f, ctx):
    r = f.r
    sid, foreign = pick_sid(f, ctx)
    req = pb.CancelRequest(session_id=sid,
                           through_launch=r.choice([0, 1, 5, 2**24, 2**24 + 1, 2**32,
                                                    2**63, 2**64 - 1]))
    bad = foreign or req.through_launch > 2**24 + 200
    data = req.SerializeToString()
    if r.random() < 0.2:
        data = f.mu.mangle(data)
        bad = None if not foreign else True
    f.judge("Cancel", f.fz.unary("Cancel", data), must_fail=bool(bad) and not f.victim == "")


def a_misc(f, ctx):
    """GetInfo, GetStats (of the victim's session too), DescribeSource."""
    r = f.r
    x = r.randrange(3)
    if x == 0:
        req = pb.StatsRequest(session_id=r.choice(["", ctx["sid"], f.victim, "nope"]))
        data = req.SerializeToString()
        if r.random() < 0.3:
            data = f.mu.mangle(data)
        o = f.judge("GetStats", f.fz.unary("GetStats", data))
        if o.ok and f.victim[:8].encode() in o.value:
            raise Finding("GetStats showed the other tenant's session tag")
    elif x == 1:
        f.judge("GetInfo", f.fz.unary("GetInfo", f.mu.mangle(b"") if r.random() < 0.5 else b""))
    else:
        src = pb.Source(text=r.choice([
            "layout {\n  dense(i: 8) {\n    place x: i32\n  }\n}\n",
            "field x: i32[${N}]\nkernel k(v: i32) { for i in x { x[i] = v } }",
            "field a: f32[4, 4]\nkernel t() -> f32 { return a[0, 0] }"]),
            params={"N": r.choice(["8", "-1", "99999999999", "0", "x"])})
        for _ in range(r.randrange(0, 3)):
            f.mu.mutate(src)
        f.judge("DescribeSource", f.fz.unary("DescribeSource", src.SerializeToString()))


def a_raw(f, ctx):
    """Random or mangled bytes on any method path (not Session: that is
    a_launch's), and unknown paths."""
    r = f.r
    method = r.choice(METHODS + ["Nope", "CreateSession/x"])
    if method == "Session":
        method = "GetStats"
    data = r.choice([f.mu.junk(), f.mu.mangle(pb.CreateSessionRequest(
        layout=ctx["base"].layout).SerializeToString()), b"\x0a\xff\xff\xff\xff\x0f",
        ldelim(1, ctx["sid"].encode()) + f.mu.junk(8)])
    if method in ("WriteField",):
        o = f.fz.client_stream(method, [data] * r.randrange(1, 3))
    elif method == "ReadField":
        o = f.fz.server_stream(method, data)
    else:
        o = f.fz.unary(method, data)
    f.judge("raw " + method, o)


def a_options(f, ctx):
    """CreateSession with its options mutated (a valid layout)."""
    r = f.r
    o = pb.SessionOptions(mode=r.choice(["sync", "async", "", "both"]),
                          backend=r.choice(["", "cpu", "auto", "cuda", "tpu"]))
    for _ in range(r.randrange(1, 4)):
        f.mu.mutate(o)
    req = pb.CreateSessionRequest(options=o, layout=ctx["base"].layout)
    data = req.SerializeToString()
    if r.random() < 0.3:
        data += ldelim(1, f.mu.raw_tail(o))  # options given twice: merged
    res = f.judge("CreateSession options", f.fz.unary("CreateSession", data))
    if res.ok:
        sid = pb.CreateSessionResponse.FromString(res.value).session_id
        f.judge("CloseSession", f.fz.unary("CloseSession", pb.CloseSessionRequest(
            session_id=sid).SerializeToString()))


def a_close_other(f, ctx):
    """CloseSession of the victim's (refused) or a made-up session."""
    sid = f.r.choice([f.victim, "", "0" * 32, f.victim[:31]])
    f.judge("CloseSession", f.fz.unary("CloseSession", pb.CloseSessionRequest(
        session_id=sid).SerializeToString()), must_fail=True)


ACTIONS = [(a_layout, 8), (a_arith, 10), (a_create, 12), (a_register, 20), (a_write, 16), (a_read, 10), (a_launch, 22),
           (a_cancel, 5), (a_misc, 5), (a_raw, 6), (a_options, 6), (a_close_other, 2)]


# ---------------------------------------------------------------- by hand

def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--isolation", default="process")
    ap.add_argument("--tcp", action="store_true", help="listen on 127.0.0.1:0, not a unix socket")
    ap.add_argument("--seconds", type=float, default=0, help="stop after this long")
    a = ap.parse_args(argv)
    # SIGTERM ends the run like ^C: the server is stopped and the summary printed
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with tempfile.TemporaryDirectory(prefix="fbfuzz-") as tmp:
        d = Daemon(tmp, a.isolation, a.tcp)
        t0 = time.monotonic()
        f = Fuzzer(d, a.seed, log=lambda s: print(s, flush=True))
        status = 0
        try:
            f.run(a.cases, deadline=t0 + a.seconds if a.seconds else None)
        except Finding as e:
            print("FINDING:", e)
            status = 1
            import shutil
            shutil.copy(d.logpath, f"/tmp/protofuzz-{a.seed}-{a.isolation}.log")
            print(f"the server's log: /tmp/protofuzz-{a.seed}-{a.isolation}.log")
        finally:
            f.close()
            rc = d.stop()
            text = open(d.logpath, errors="replace").read()
            m = LOG_BAD.search(text)
            if rc != 0 or m:
                print(f"fuseboxd exit {rc}; log:\n" + text[-20000:])
                status = 1
            print(f"{f.cases} cases in {time.monotonic() - t0:.0f} s (seed {a.seed}, "
                  f"{a.isolation}); errors {f.errors_by_code}; findings {f.findings}")
            if f.findings:
                status = 1
            for k in sorted(f.by_what):
                print(f"  {k[0]:28} {k[1]:20} {f.by_what[k]:6}  {f.samples.get(k, [''])[:2]}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
