"""Hostile field chunks on WriteField, sent as raw bytes through a running
fuseboxd: chunks that leave a gap, overlap, run past the field, name another
session or field, lie about total_bytes, stop short, or are no FieldChunk at
all are refused INVALID_ARGUMENT naming the problem; a legitimate transfer
encoded with the data field first (not as Fusebox peers write it, so the
server parses the whole message rather than its head) arrives byte for
byte. After each, the session still takes a write and the other tenant is
unharmed (server.assert_unharmed)."""
import grpc

from conftest import RPC_TIMEOUT, dense_layout, expect_error, pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT
FIELD = 2  # dense_layout's place
N = 256 * 4  # its bytes: 256 i32


def _varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _len_field(no, data):
    return _varint(no << 3 | 2) + _varint(len(data)) + data


def _int_field(no, v):
    return _varint(no << 3) + _varint(v)


def chunk(sid, offset, data, total=N, field=FIELD, data_first=False):
    """A FieldChunk's bytes; data_first puts field 5 before the others."""
    head = (_len_field(1, sid.encode()) if sid else b"") + _int_field(2, field) + \
        _int_field(3, offset) + _int_field(4, total)
    body = _len_field(5, data)
    return body + head if data_first else head + body


def _write(client, chunks):
    call = client.channel.stream_unary(
        "/fusebox.v1.Fusebox/WriteField",
        response_deserializer=lambda b: b)  # raw bytes both ways
    return call(iter(chunks), timeout=RPC_TIMEOUT)


def test_write_field_hostile_chunks(server):
    c = server.client
    sid = c.new_session(dense_layout(256))
    half = bytes(512)
    cases = [
        ("a gap", [chunk(sid, 0, half), chunk("", 600, bytes(100))], "does not continue"),
        ("an overlap", [chunk(sid, 0, half), chunk("", 256, half)], "does not continue"),
        ("past the field", [chunk(sid, 0, bytes(N + 8))], "does not continue"),
        ("past the field later", [chunk(sid, 0, half), chunk("", 512, bytes(600))],
         "does not continue"),
        ("another session's id", [chunk(sid, 0, half), chunk(server.victim, 512, half)],
         "does not continue"),
        ("another field", [chunk(sid, 0, half), chunk("", 512, half, field=1)],
         "does not continue"),
        ("a false total", [chunk(sid, 0, half, total=N * 2)], "total_bytes says"),
        ("stopping short", [chunk(sid, 0, half)], "ended after 512 of 1024 bytes"),
        ("no FieldChunk", [b"\x2a\x09xy"], "malformed FieldChunk"),
        ("no FieldChunk later", [chunk(sid, 0, half), b"\x18\x07\x2a\x09xy"],
         "malformed FieldChunk"),
        ("data first, then a gap", [chunk(sid, 0, half, data_first=True),
                                    chunk("", 513, bytes(511), data_first=True)],
         "does not continue"),
    ]
    for what, chunks, words in cases:
        details = expect_error(lambda: _write(c, chunks), INVALID, words)
        assert "WriteField" in details or "malformed" in details, (what, details)
    # the refusals staged nothing for good: the session takes a whole write
    data = bytes((i * 7) % 256 for i in range(N))
    _write(c, [chunk(sid, 0, data[:300]), chunk("", 300, data[300:])])
    assert c.read_field(sid, FIELD) == data
    server.assert_unharmed()


def test_write_field_data_first(server):
    """Chunks with the data field first, and a mix of both orders, slice
    boundaries anywhere: the whole-message parse takes them as the head
    parse does."""
    c = server.client
    sid = c.new_session(dense_layout(256))
    data = bytes((i * 13 + 5) % 256 for i in range(N))
    _write(c, [chunk(sid, 0, data[:1], data_first=True),
               chunk("", 1, data[1:700], data_first=True),
               chunk("", 700, data[700:])])
    assert c.read_field(sid, FIELD) == data
    server.assert_unharmed()


def test_write_field_sizes_that_do_not_add_up(server):
    """Sizes and offsets that do not add up, as protobuf messages: a total
    that is not the field's (2^64-1 too), a first chunk past the start,
    offsets that wrap (2^63, 2^64-32), a chunk longer than the field, data
    after the field is whole. Each is INVALID_ARGUMENT naming the problem and
    the field keeps what it held (a refused write stages nothing it could
    apply)."""
    c = server.client
    sid = c.new_session(dense_layout(16))
    good = bytes(range(64))
    assert c.write_field(sid, 2, good) == 64

    def chunk(offset, data, total=64, field=2, session=sid):
        return pb.FieldChunk(session_id=session, field=field, offset=offset & (2**64 - 1),
                             total_bytes=total & (2**64 - 1), data=data)

    def write(*chunks):
        return c._write(iter(chunks), timeout=RPC_TIMEOUT)

    attacks = [
        ((chunk(0, b"x" * 64, total=2**64 - 1),), "total_bytes says 18446744073709551615"),
        ((chunk(0, b"x" * 64, total=65),), "holds 64 bytes"),
        ((chunk(8, b"x" * 56),), "does not continue"),
        ((chunk(2**63, b"x" * 8),), "does not continue"),
        ((chunk(0, b"x" * 32), chunk(2**64 - 32, b"x" * 32)), "does not continue"),
        ((chunk(0, b"x" * 65),), "does not continue"),
        ((chunk(0, b"x" * 64), chunk(64, b"y")), "does not continue"),  # after the whole
    ]
    for chunks, words in attacks:
        expect_error(lambda: write(*chunks), INVALID, words)
        assert c.read_field(sid, 2) == good
    server.assert_unharmed()
