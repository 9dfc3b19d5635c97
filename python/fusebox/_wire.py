"""FieldChunk on the wire, by hand, so that field bytes are copied once.

grpcio hands a deserializer the received message as ``bytes`` and takes
``bytes`` from a serializer. Going through the generated ``FieldChunk``
class would copy the data again (into the message, and out of it); these
two functions instead take the data as a ``memoryview`` of the received
bytes, and build an outgoing message with one join of the header and a
``memoryview`` of the caller's array. The encoding is protobuf's (field
numbers of ``FieldChunk`` in proto/fusebox.proto): the tests check both
against the generated class.
"""
from __future__ import annotations

from typing import Optional, Tuple

from fusebox.errors import Error

# FieldChunk: 1 session_id (string), 2 field (int32), 3 offset (uint64),
# 4 total_bytes (uint64), 5 data (bytes)
_LEN, _VARINT, _I64, _I32 = 2, 0, 1, 5


def _varint(x: int) -> bytes:
    if x < 0:
        x += 1 << 64  # int32/int64 negatives: ten bytes, two's complement
    out = bytearray()
    while True:
        b = x & 0x7F
        x >>= 7
        if x:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_chunk(data: memoryview, offset: int, session_id: str = "", field: int = 0,
                 total_bytes: int = 0) -> bytes:
    """A serialized FieldChunk holding data (a byte memoryview), made with
    a single copy of data."""
    head = bytearray()
    if session_id:
        sid = session_id.encode()
        head += b"\x0a" + _varint(len(sid)) + sid
    if field:
        head += b"\x10" + _varint(field)
    if offset:
        head += b"\x18" + _varint(offset)
    if total_bytes:
        head += b"\x20" + _varint(total_bytes)
    if not data.nbytes:
        return bytes(head)
    head += b"\x2a" + _varint(data.nbytes)
    return b"".join((head, data))


def _read_varint(b: memoryview, at: int) -> Tuple[int, int]:
    x = shift = 0
    while True:
        if at >= len(b) or shift > 63:
            raise Error("ReadField: a malformed FieldChunk (a varint runs off its end)")
        c = b[at]
        at += 1
        x |= (c & 0x7F) << shift
        if not c & 0x80:
            return x & ((1 << 64) - 1), at
        shift += 7


def decode_chunk(raw: bytes) -> Tuple[int, int, memoryview]:
    """(offset, total_bytes, data) of a serialized FieldChunk; data is a
    memoryview of raw (no copy). Raises :class:`fusebox.Error` when raw
    is not a FieldChunk."""
    b = memoryview(raw)
    at, offset, total = 0, 0, 0
    data: Optional[memoryview] = None
    while at < len(b):
        key, at = _read_varint(b, at)
        num, wt = key >> 3, key & 7
        if wt == _VARINT:
            v, at = _read_varint(b, at)
            if num == 3:
                offset = v
            elif num == 4:
                total = v
        elif wt == _LEN:
            n, at = _read_varint(b, at)
            if at + n > len(b):
                raise Error("ReadField: a malformed FieldChunk (a field runs off its end)")
            if num == 5:
                data = b[at:at + n]
            at += n
        elif wt == _I64:
            at += 8
        elif wt == _I32:
            at += 4
        else:
            raise Error(f"ReadField: a malformed FieldChunk (wire type {wt})")
    if at != len(b):
        raise Error("ReadField: a malformed FieldChunk (truncated)")
    return offset, total, data if data is not None else memoryview(b"")
