"""The protocol fuzzer (protofuzz.py) in a bounded, deterministic run, and
the regressions for what it found.

Each fuzz run: a fixed seed, a few hundred mutated requests from two
tenants' worth of valid sessions, against a real fuseboxd under process
and under thread isolation. Every malformed request must get an error
status from the expected set with a message (no dropped connection, no
INTERNAL, no crash); a request built to be malformed (another tenant's
session, a field that does not exist, chunks that disagree) must not
succeed; after every batch the server is SERVING, the victim tenant's
field is byte for byte unchanged and its kernel still computes; the log
holds no sanitizer report or dead worker; the server exits 0 on SIGTERM
(no leak under AddressSanitizer)."""
import tempfile

import pytest

import protofuzz as pf
from protofuzz import pb

# (isolation, seed, cases): about 400 cases in all (more counted: the
# valid requests each batch starts from), well under a minute
RUNS = [("process", 7, 120), ("thread", 11, 250)]


@pytest.fixture
def daemon(request):
    made = []

    def make(isolation):
        tmp = tempfile.TemporaryDirectory(prefix="fbfuzz-")
        d = pf.Daemon(tmp.name, isolation)
        made.append((d, tmp))
        return d

    yield make
    for d, tmp in made:
        rc = d.stop()
        text = open(d.logpath, errors="replace").read()
        tmp.cleanup()
        assert rc == 0, f"fuseboxd exited with {rc}:\n" + text[-20000:]
        m = pf.LOG_BAD.search(text)
        assert not m, f"the log has {m.group(0)!r}:\n" + text[-20000:]


@pytest.mark.parametrize("isolation,seed,cases", RUNS)
def test_proto_fuzz(daemon, isolation, seed, cases):
    d = daemon(isolation)
    f = pf.Fuzzer(d, seed)
    try:
        f.run(cases)
    except pf.Finding as e:
        pytest.fail(f"{e}\n" + d.logtext()[-20000:])
    finally:
        f.close()
    assert f.findings == []
    assert f.cases >= cases
    # the run reached past the decoders: sessions, kernels and transfers
    # were taken as well as refused
    ok = {w for (w, code) in f.by_what if code == "OK"}
    assert {"create valid", "register valid", "WriteField", "ReadField"} <= ok, f.by_what
    refused = {w for (w, code) in f.by_what if code != "OK"}
    assert {"RegisterKernels", "WriteField", "CreateSession"} <= refused, f.by_what


def test_field_chunk_without_data(daemon):
    """A FieldChunk with no data (protobuf leaves out empty bytes: a header
    chunk naming session, field and total) went to the full parser with a
    NULL data pointer, and fuseboxd passed it to memcpy: UBSan stopped the
    server. Found by the fuzzer. Header chunks are legitimate: the write
    takes them, at the start and between data chunks."""
    d = daemon("thread")
    w = pf.Wire(d, "fuzz")
    base = pf.BASES[0]
    sid = w.create(base.layout).value
    n = base.field_bytes(2)
    data = bytes((i * 13) % 251 for i in range(n))
    chunks = [pb.FieldChunk(session_id=sid, field=2, offset=0, total_bytes=n),
              pb.FieldChunk(offset=0, data=data[:100]),
              pb.FieldChunk(offset=100),
              pb.FieldChunk(offset=100, data=data[100:])]
    o = w.client_stream("WriteField", [c.SerializeToString() for c in chunks])
    assert o.ok, o
    assert w.read(sid, 2).value == data
    # an empty chunk at the wrong offset is still refused
    chunks[2].offset = 99
    o = w.client_stream("WriteField", [c.SerializeToString() for c in chunks])
    assert o.code == pf.SC.INVALID_ARGUMENT and "does not continue" in o.details, o
    assert d.health() == pf.health_pb2.HealthCheckResponse.SERVING
