"""A bounded reader of protobuf's wire format: the gate's way to look inside a gRPC message before anything is built.

Why not protobuf's own parser: it materialises every element of every repeated field first — a refused 4 MB
ModelInferRequest of 2M empty inputs cost the gate ≈ 400 MB while it was parsed (issue 84). Reading the wire
format field by field lets the caller count as it goes and stop at the first field over its limit, so a refused
message costs what was read up to there; values are memoryview slices of the message, never copies.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, I64, LEN, I32 = 0, 1, 2, 5  # the wire types a proto3 message uses (3 and 4, groups, are refused)
MAX_VARINT_BYTES = 10


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message (or use a wire type proto3 messages never do)."""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(MAX_VARINT_BYTES):
        if pos + i >= len(buf):
            raise WireError("a varint runs past the end of the message")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + i + 1
        shift += 7
    raise WireError("a varint longer than 10 bytes")


def fields(message: bytes | memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """Each top-level field in order as (field number, wire type, value): an int for VARINT, a memoryview slice
    for LEN, I64 and I32 (little-endian bytes). Lazy: a caller that stops early has read nothing beyond."""
    buf = memoryview(message)
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if kind == VARINT:
            value, pos = _varint(buf, pos)
            yield number, kind, value
            continue
        if kind == LEN:
            size, pos = _varint(buf, pos)
        elif kind in (I64, I32):
            size = 8 if kind == I64 else 4
        else:
            raise WireError(f"wire type {kind} (groups are not used by these messages)")
        if pos + size > len(buf):
            raise WireError("a field runs past the end of the message")
        yield number, kind, buf[pos : pos + size]
        pos += size


def signed64(value: int) -> int:
    """An int64 field's varint as the signed value it encodes (two's complement in 64 bits)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def packed_varints(data: memoryview, most: int) -> list[int]:
    """A packed repeated varint field's values; WireError beyond `most` of them."""
    values: list[int] = []
    pos = 0
    while pos < len(data):
        if len(values) == most:
            raise WireError(f"more than {most} values")
        value, pos = _varint(data, pos)
        values.append(value)
    return values


def double(data: memoryview) -> float:
    return struct.unpack("<d", data)[0]


def text(data: memoryview, what: str) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(f"{what} is not valid UTF-8") from None


def encode_len_field(number: int, payload: bytes) -> bytes:
    """One length-delimited field: how the gate wraps Triton's answer into a stream response without parsing it."""
    return _encode_varint(number << 3 | LEN) + _encode_varint(len(payload)) + payload


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
