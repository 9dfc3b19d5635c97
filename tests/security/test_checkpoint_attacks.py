"""Attacks on checkpoints (Checkpoint, Restore, ListCheckpoints,
FetchCheckpoint; docs/security.md "Checkpoints") through the public
protocol of a real fuseboxd: a tampered, truncated or foreign-key upload,
another tenant's checkpoint, hostile names and symlinks, an upload past the
quota, a checkpoint that would pass the memory budget. Each is refused with
a clear message, leaves no session behind, and the server stays SERVING
with another tenant's field unharmed."""
import os
import time

import grpc
import pytest

from conftest import RPC_TIMEOUT, dense_layout, expect_error, pb
from test_fair_share import metrics, values
from test_tls_tenants import daemons, sha, tenant_client  # noqa: F401 (a fixture)

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
MIB = 1 << 20
PATTERN = bytes((i * 13 + 5) % 256 for i in range(4 * 1024))
WORKER_64K = ("--worker-memory-bytes", "64K")


class Ck:
    """The checkpoint RPCs by hand on a client's channel."""

    def __init__(self, client):
        ch = client.channel
        self.c = client
        self._ckpt = ch.unary_stream("/fusebox.v1.Fusebox/Checkpoint",
                                     request_serializer=pb.CheckpointRequest.SerializeToString,
                                     response_deserializer=pb.CheckpointChunk.FromString)
        self._fetch = ch.unary_stream(
            "/fusebox.v1.Fusebox/FetchCheckpoint",
            request_serializer=pb.FetchCheckpointRequest.SerializeToString,
            response_deserializer=pb.CheckpointChunk.FromString)
        self._list = ch.unary_unary("/fusebox.v1.Fusebox/ListCheckpoints",
                                    request_serializer=pb.ListCheckpointsRequest.SerializeToString,
                                    response_deserializer=pb.CheckpointList.FromString)
        self._restore = ch.stream_unary("/fusebox.v1.Fusebox/Restore",
                                        request_serializer=pb.CheckpointChunk.SerializeToString,
                                        response_deserializer=pb.RestoreResponse.FromString)

    def to_client(self, sid):
        return b"".join(m.data for m in self._ckpt(pb.CheckpointRequest(session_id=sid),
                                                   timeout=RPC_TIMEOUT))

    def to_server(self, sid):
        names = [m.name for m in self._ckpt(pb.CheckpointRequest(session_id=sid, to_server=True),
                                            timeout=RPC_TIMEOUT)]
        assert len(names) == 1 and names[0], names
        return names[0]

    def fetch(self, name):
        return b"".join(m.data for m in self._fetch(pb.FetchCheckpointRequest(name=name),
                                                    timeout=RPC_TIMEOUT))

    def names(self):
        return [e.name for e in self._list(pb.ListCheckpointsRequest(), timeout=RPC_TIMEOUT)
                .checkpoints]

    def upload(self, data, chunk=MIB, memory_limit=0):
        def chunks():
            opts = pb.SessionOptions(memory_limit=memory_limit)
            for off in range(0, max(len(data), 1), chunk):
                yield pb.CheckpointChunk(offset=off, data=data[off:off + chunk],
                                         options=opts if off == 0 else None)
        return self._restore(chunks(), timeout=RPC_TIMEOUT)

    def by_name(self, name):
        return self._restore(iter([pb.CheckpointChunk(name=name)]), timeout=RPC_TIMEOUT)


def key_args(tmp_path, tag="k"):
    return ("--checkpoint-key", str(tmp_path / (tag + ".key")), "--checkpoint-key-create",
            "--checkpoint-dir", str(tmp_path / (tag + "-dir")))


def patterned(client):
    sid = client.new_session(dense_layout(1024))
    assert client.write_field(sid, 2, PATTERN) == len(PATTERN)
    return sid


def staging_freed(client):
    deadline = time.monotonic() + 30
    while client.stats().memory.staging_bytes >= MIB:
        assert time.monotonic() < deadline, "the staging buffers were not freed"
        time.sleep(0.05)


def live_sessions(client):
    return len(client.stats().sessions)


def sessions_back_to(client, n):
    """The live sessions are n again within 30 s: a restore refused by the
    engine in its new worker (a changed byte in the fields, which the
    restore checks against the manifest as it reads them) answers first
    and ends its session just after."""
    deadline = time.monotonic() + 30
    while live_sessions(client) != n:
        assert time.monotonic() < deadline, \
            f"{live_sessions(client)} sessions live, {n} expected: a refused restore stayed"
        time.sleep(0.05)


def test_restore_control(make_server, tmp_path):
    """The control: an untouched checkpoint restores with the field intact."""
    server = make_server(*key_args(tmp_path))
    c, ck = server.client, Ck(server.client)
    data = ck.to_client(patterned(c))
    r = ck.upload(data)
    assert c.read_field(r.session_id, 2) == PATTERN
    r2 = ck.by_name(ck.to_server(r.session_id))
    assert c.read_field(r2.session_id, 2) == PATTERN
    server.assert_unharmed()


def test_metrics_count_checkpoints(make_server, tmp_path):
    """/metrics: checkpoints written, restored, refused, and their bytes."""
    server = make_server("--metrics-listen", "127.0.0.1:0", *key_args(tmp_path))
    c, ck = server.client, Ck(server.client)
    sid = patterned(c)
    data = ck.to_client(sid)
    name = ck.to_server(sid)
    ck.upload(data)
    expect_error(lambda: ck.upload(data[:-1]), INVALID, "truncated")
    expect_error(lambda: ck.fetch("../" + name), INVALID, "not a checkpoint name")
    v = values(metrics(server))
    assert v["fusebox_checkpoints_written_total"] == 2
    assert v["fusebox_checkpoints_restored_total"] == 1
    assert v["fusebox_checkpoints_refused_total"] == 2
    on_disk = os.path.getsize(tmp_path / "k-dir" / "anonymous" / name)
    assert v["fusebox_checkpoint_written_bytes_total"] == len(data) + on_disk
    assert v["fusebox_checkpoint_uploaded_bytes_total"] == len(data)
    server.assert_unharmed()


def test_tampered_truncated_and_foreign_uploads(make_server, tmp_path):
    server = make_server(*key_args(tmp_path))
    other = make_server(*key_args(tmp_path, "other"))  # another server key
    c, ck = server.client, Ck(server.client)
    data = ck.to_client(patterned(c))
    before = live_sessions(c)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    expect_error(lambda: ck.upload(bytes(flipped)), INVALID,
                 "the checkpoint was modified or was written with another server key")
    # a flip in the seal's MAC near the end reads as tampering too
    flipped = bytearray(data)
    flipped[-40] ^= 1
    expect_error(lambda: ck.upload(bytes(flipped)), INVALID, "modified")
    for cut in (len(data) - 1, len(data) // 2, 7):
        expect_error(lambda: ck.upload(data[:cut]), INVALID, "truncated")
    expect_error(lambda: ck.upload(b""), INVALID, "Restore")
    expect_error(lambda: ck.upload(b"not a checkpoint at all" * 10), INVALID,
                 "not a Fusebox checkpoint")
    # chunks out of order
    def gap():
        yield pb.CheckpointChunk(offset=0, data=data[:100])
        yield pb.CheckpointChunk(offset=200, data=data[200:300])
    expect_error(lambda: ck._restore(gap(), timeout=RPC_TIMEOUT), INVALID,
                 "does not continue the upload")
    expect_error(lambda: Ck(other.client).upload(data), INVALID, "another server key")
    # no half-made session anywhere
    sessions_back_to(c, before)
    server.assert_unharmed()
    other.assert_unharmed()


def test_another_tenants_checkpoint(daemons, tmp_path):  # noqa: F811 (the fixture)
    toks = {n: "tok-%s-" % n + os.urandom(8).hex() for n in ("a", "b")}
    spec = [{"name": n, "token_sha256": [sha(t)]} for n, t in toks.items()]
    d = daemons("unix", list(key_args(tmp_path)), tenants=spec)
    a, b = (tenant_client(d.address, toks[n]) for n in ("a", "b"))
    cka, ckb = Ck(a), Ck(b)
    sid = patterned(a)
    name = cka.to_server(sid)
    data = cka.to_client(sid)
    assert cka.names() == [name] and ckb.names() == []
    expect_error(lambda: ckb.fetch(name), NOT_FOUND, "no checkpoint")
    expect_error(lambda: ckb.by_name(name), NOT_FOUND, "no checkpoint")
    expect_error(lambda: ckb.upload(data), INVALID, "the checkpoint belongs to another tenant")
    assert len(b.stats().sessions) == 0
    # a's own is whole
    assert cka.fetch(name)[:8] == data[:8]
    assert a.read_field(cka.upload(data).session_id, 2) == PATTERN
    for c in (a, b):
        c.close()


BAD_NAME = "not a checkpoint name this server gave"
HOSTILE = {"../x": BAD_NAME, "/etc/passwd": BAD_NAME, "..": BAD_NAME,
           "0123abcd-1.fbck/../../k.key": BAD_NAME, "a" * 5000: BAD_NAME,
           ".tmp-0123abcd-1.fbck": BAD_NAME, "0123ABCD-1.fbck": BAD_NAME,
           "0123abcd-.fbck": BAD_NAME, "0123abcd-1.fbck\x00": "no checkpoint"}


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_hostile_names(make_server, tmp_path, isolation):
    server = make_server("--isolation", isolation, *key_args(tmp_path))
    ck = Ck(server.client)
    ck.to_server(patterned(server.client))
    before = live_sessions(server.client)
    for name, words in HOSTILE.items():
        code = INVALID if words == BAD_NAME else NOT_FOUND
        expect_error(lambda: ck.fetch(name), code, words)
        expect_error(lambda: ck.by_name(name), code, words)
    expect_error(lambda: ck.fetch(""), INVALID, BAD_NAME)
    assert live_sessions(server.client) == before
    server.assert_unharmed()


def test_symlink_in_the_directory(make_server, tmp_path):
    """A symlink with a name the server could have given (planted by
    someone with access to the disk) is never followed."""
    server = make_server(*key_args(tmp_path))
    ck = Ck(server.client)
    real = ck.to_server(patterned(server.client))
    tdir = tmp_path / "k-dir" / "anonymous"
    assert (tdir / real).is_file()
    os.symlink(str(tmp_path / "k.key"), str(tdir / "0123abcd-1.fbck"))
    os.symlink(real, str(tdir / "0123abcd-2.fbck"))
    for n in ("0123abcd-1.fbck", "0123abcd-2.fbck"):
        expect_error(lambda: ck.fetch(n), NOT_FOUND, "no checkpoint")
        expect_error(lambda: ck.by_name(n), NOT_FOUND, "no checkpoint")
    assert ck.names() == [real]
    server.assert_unharmed()


def test_upload_past_the_quota(make_server, tmp_path):
    """An upload larger than any checkpoint of a session this server allows
    is cut off at the bound, before it is checked or staged further."""
    server = make_server("--session-memory-limit", "1M", *key_args(tmp_path))
    ck = Ck(server.client)
    before = live_sessions(server.client)
    junk = bytes(70 * MIB)
    expect_error(lambda: ck.upload(junk, chunk=4 * MIB - 4096), EXHAUSTED,
                 "the most a checkpoint on this server may take")
    # asking for a larger session memory limit does not widen the bound
    expect_error(lambda: ck.upload(junk, chunk=4 * MIB - 4096, memory_limit=1 << 40), EXHAUSTED,
                 "the most a checkpoint")
    assert live_sessions(server.client) == before
    assert server.client.stats().memory.staging_bytes < MIB
    server.assert_unharmed()


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_checkpoint_past_the_memory_budget(make_server, tmp_path, isolation):
    """A checkpoint streamed to the client is staged in the memory budget:
    one that would pass it is refused, naming the budget, and the session
    goes on; one into the directory (not staged) still works."""
    server = make_server("--memory-budget", "20M", "--isolation", isolation, *WORKER_64K,
                         *key_args(tmp_path))
    c, ck = server.client, Ck(server.client)
    field = PATTERN * (8 * MIB // len(PATTERN))
    big = [c.new_session(dense_layout(2 * MIB))]  # 8 MiB
    c.write_field(big[0], 2, field)
    staging_freed(c)  # the write's staging counts too: gone before the second session
    big.append(c.new_session(dense_layout(2 * MIB)))
    expect_error(lambda: ck.to_client(big[0]), EXHAUSTED, "memory budget",
                 "Checkpoint of session")
    assert c.stats().memory.staging_bytes < MIB  # nothing of it stays counted
    c.close_session(pb.CloseSessionRequest(session_id=big[1]), timeout=RPC_TIMEOUT)
    assert c.read_field(big[0], 2) == field  # the session went on
    staging_freed(c)
    name = ck.to_server(big[0])
    assert ck.names() == [name]
    assert c.stats().memory.staging_bytes < MIB
    server.assert_unharmed()
