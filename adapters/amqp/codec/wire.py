"""Wire primitives: short and long strings, field tables and field arrays.

Field value types are RabbitMQ's (https://www.rabbitmq.com/amqp-0-9-1-errata, and what
rabbit_binary_parser accepts), which differ from the 0-9-1 spec's own table:

    t bool (octet, non-zero is true)   b int8    B uint8    s int16   u uint16
    I int32    i uint32    l int64    L int64 (decoded like 'l', as RabbitMQ does; never encoded)
    f float32  d float64   D decimal (scale octet + uint32)   T timestamp (uint64 seconds)
    S long string   x byte array   A array   F table   V void

('s' is a signed 16-bit integer, not the spec's short string; the spec's 'U'/'L'/'l' meanings
are not used.) Decoded values are plain Python: bool, int, float, Decimal, str (an 'S' value
that is not valid UTF-8 stays bytes, as pika and pamqp do), bytes ('x'), list, dict, None, and
`Timestamp` (an int subclass) for 'T' so that re-encoding keeps the type. Encoding picks the
type from the Python value: bool 't', int 'I' if it fits 32 bits else 'l', float 'd', Decimal
'D', str 'S', bytes/bytearray 'x', dict 'F', list/tuple 'A', None 'V', Timestamp or datetime
'T'; wrap a value in `Typed(tag, value)` to force any other tag.

Table keys and short strings are decoded with "surrogateescape" where RabbitMQ does not check
UTF-8, so any bytes round-trip unchanged (`encode_shortstr` uses the same error handler).

Decoders take `(buf, pos, end)` and return `(value, new_pos)`; they raise ValueError (or let
IndexError / struct.error escape) on malformed input; the method decoder turns those into
502 SYNTAX_ERROR.

`encode_table` and `decode_table` are compiled (`_encode_speedups.pyx` and `_decode_speedups.pyx`,
hand-written because the `headers` table is on the per-message hot path; built by `uv sync` where
there is a C compiler) unless `GATEWAY_PURE_PYTHON=1`; `py_encode_table` and `py_decode_table` are the
pure-Python reference they match (same bytes, equal values, the same errors: anything off the compiled
fast path is handed to them). The pure functions call only pure functions, so the reference is wholly
pure. `encode_speedups` and `decode_speedups` here (None for pure Python) serve the whole codec: the
encoding side (properties, encoder) and the decoding side (properties, decoder).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

from runtime.speedups import load as load_speedups

_unpack_b = struct.Struct(">b").unpack_from
_unpack_h = struct.Struct(">h").unpack_from
_unpack_H = struct.Struct(">H").unpack_from
_unpack_i = struct.Struct(">i").unpack_from
_unpack_I = struct.Struct(">I").unpack_from
_unpack_q = struct.Struct(">q").unpack_from
_unpack_Q = struct.Struct(">Q").unpack_from
_unpack_f = struct.Struct(">f").unpack_from
_unpack_d = struct.Struct(">d").unpack_from
_unpack_BI = struct.Struct(">BI").unpack_from

pack_H = struct.Struct(">H").pack
pack_I = struct.Struct(">I").pack
pack_Q = struct.Struct(">Q").pack

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class Timestamp(int):
    """A 'T' field value: seconds since the epoch (an int that re-encodes as a timestamp)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Timestamp({int(self)})"


class Typed(NamedTuple):
    """A field value with an explicit type tag, for encoding: Typed("b", -1), Typed("f", 1.5)."""

    tag: str
    value: Any


# --- strings ----------------------------------------------------------------------------------------


def encode_shortstr(s: str | bytes) -> bytes:
    """Length octet + bytes; ValueError above 255 bytes."""
    raw = s.encode("utf-8", "surrogateescape") if type(s) is str else bytes(s)
    if len(raw) > 255:
        raise ValueError(f"short string of {len(raw)} bytes (more than 255)")
    return bytes((len(raw),)) + raw


def encode_longstr(s: str | bytes) -> bytes:
    raw = s.encode("utf-8", "surrogateescape") if type(s) is str else bytes(s)
    return pack_I(len(raw)) + raw


def decode_shortstr(buf: bytes, p: int, end: int) -> tuple[str, int]:
    n = buf[p]
    q = p + 1 + n
    if q > end:
        raise ValueError("short string runs past the end")
    return buf[p + 1 : q].decode("utf-8", "surrogateescape"), q


def decode_longstr(buf: bytes, p: int, end: int) -> tuple[bytes, int]:
    q = p + 4 + _unpack_I(buf, p)[0]
    if q > end:
        raise ValueError("long string runs past the end")
    return buf[p + 4 : q], q


# --- field tables and arrays: decoding ------------------------------------------------------------------


def decode_table(buf: bytes, p: int, end: int) -> tuple[dict[str, Any], int]:
    """A field table (4-byte length, then name/value pairs) starting at p."""
    stop = p + 4 + _unpack_I(buf, p)[0]
    if stop > end:
        raise ValueError("field table runs past the end")
    return _table(buf, p + 4, stop), stop


def decode_array(buf: bytes, p: int, end: int) -> tuple[list[Any], int]:
    """A field array (4-byte length, then tagged values) starting at p."""
    stop = p + 4 + _unpack_I(buf, p)[0]
    if stop > end:
        raise ValueError("field array runs past the end")
    return _array(buf, p + 4, stop), stop


def _table(buf: bytes, p: int, stop: int) -> dict[str, Any]:
    table: dict[str, Any] = {}
    while p < stop:
        q = p + 1 + buf[p]
        if q >= stop:
            raise ValueError("field table entry without a value")
        key = buf[p + 1 : q].decode("utf-8", "surrogateescape")
        tag = buf[q]
        p = q + 1
        # the usual header types inline, the others through _READERS
        if tag == 83:  # S
            q = p + 4 + _unpack_I(buf, p)[0]
            raw = buf[p + 4 : q]
            try:
                value: Any = raw.decode()
            except UnicodeDecodeError:
                value = raw
            p = q
        elif tag == 73:  # I
            value = _unpack_i(buf, p)[0]
            p += 4
        elif tag == 116:  # t
            value = buf[p] != 0
            p += 1
        else:
            reader = _READERS.get(tag)
            if reader is None:
                raise ValueError(f"unknown field type {chr(tag)!r}")
            value, p = reader(buf, p, stop)
        if p > stop:
            raise ValueError("field value runs past the end of its table")
        table[key] = value
    return table


def _array(buf: bytes, p: int, stop: int) -> list[Any]:
    items = []
    append = items.append
    while p < stop:
        reader = _READERS.get(buf[p])
        if reader is None:
            raise ValueError(f"unknown field type {chr(buf[p])!r}")
        value, p = reader(buf, p + 1, stop)
        if p > stop:
            raise ValueError("field value runs past the end of its array")
        append(value)
    return items


def _read_S(buf: bytes, p: int, stop: int) -> tuple[Any, int]:
    q = p + 4 + _unpack_I(buf, p)[0]
    raw = buf[p + 4 : q]
    try:
        return raw.decode(), q
    except UnicodeDecodeError:
        return raw, q


def _read_x(buf: bytes, p: int, stop: int) -> tuple[Any, int]:
    q = p + 4 + _unpack_I(buf, p)[0]
    return buf[p + 4 : q], q


def _read_F(buf: bytes, p: int, stop: int) -> tuple[Any, int]:
    return py_decode_table(buf, p, stop)


def _read_A(buf: bytes, p: int, stop: int) -> tuple[Any, int]:
    return decode_array(buf, p, stop)


def _read_D(buf: bytes, p: int, stop: int) -> tuple[Any, int]:
    scale, raw = _unpack_BI(buf, p)
    return Decimal(raw).scaleb(-scale), p + 5


def _fixed(unpack: Any, width: int, convert: Any = None) -> Any:
    if convert is None:

        def read(buf: bytes, p: int, stop: int) -> tuple[Any, int]:
            return unpack(buf, p)[0], p + width

    else:

        def read(buf: bytes, p: int, stop: int) -> tuple[Any, int]:
            return convert(unpack(buf, p)[0]), p + width

    return read


def _read_t(buf: bytes, p: int, stop: int) -> tuple[Any, int]:
    return buf[p] != 0, p + 1


def _read_B(buf: bytes, p: int, stop: int) -> tuple[Any, int]:
    return buf[p], p + 1


def _read_V(buf: bytes, p: int, stop: int) -> tuple[Any, int]:
    return None, p


_READERS: dict[int, Any] = {
    ord("S"): _read_S,
    ord("t"): _read_t,
    ord("b"): _fixed(_unpack_b, 1),
    ord("B"): _read_B,
    ord("s"): _fixed(_unpack_h, 2),
    ord("u"): _fixed(_unpack_H, 2),
    ord("I"): _fixed(_unpack_i, 4),
    ord("i"): _fixed(_unpack_I, 4),
    ord("l"): _fixed(_unpack_q, 8),
    ord("L"): _fixed(_unpack_q, 8),
    ord("f"): _fixed(_unpack_f, 4),
    ord("d"): _fixed(_unpack_d, 8),
    ord("D"): _read_D,
    ord("T"): _fixed(_unpack_Q, 8, Timestamp),
    ord("x"): _read_x,
    ord("A"): _read_A,
    ord("F"): _read_F,
    ord("V"): _read_V,
}

FIELD_TYPES = frozenset(chr(t) for t in _READERS)

# --- field tables and arrays: encoding ------------------------------------------------------------------


def encode_table(table: Mapping[str, Any] | None) -> bytes:
    """A field table with its 4-byte length prefix (None or {} give an empty table)."""
    if not table:
        return b"\x00\x00\x00\x00"
    out: list[bytes] = []
    for key, value in table.items():
        k = key.encode("utf-8", "surrogateescape") if type(key) is str else bytes(key)
        if len(k) > 255:
            raise ValueError(f"field table key of {len(k)} bytes (more than 255)")
        out.append(bytes((len(k),)))
        out.append(k)
        _encode_value(value, out)
    body = b"".join(out)
    return pack_I(len(body)) + body


def encode_array(items: list[Any] | tuple[Any, ...]) -> bytes:
    """A field array with its 4-byte length prefix."""
    out: list[bytes] = []
    for value in items:
        _encode_value(value, out)
    body = b"".join(out)
    return pack_I(len(body)) + body


def _encode_int(value: int, out: list[bytes]) -> None:
    if _INT32_MIN <= value <= _INT32_MAX:
        out.append(b"I" + struct.pack(">i", value))
    elif _INT64_MIN <= value <= _INT64_MAX:
        out.append(b"l" + struct.pack(">q", value))
    else:
        raise ValueError(f"integer {value} does not fit a signed 64-bit field")


def _encode_decimal(value: Decimal) -> bytes:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"decimal {value} is not finite")
    raw = int("".join(map(str, digits)) or "0")
    if exponent > 0:
        raw *= 10**exponent
        exponent = 0
    if sign or raw > 0xFFFFFFFF or -exponent > 255:
        raise ValueError(f"decimal {value} does not fit an AMQP decimal (scale octet + uint32)")
    return struct.pack(">BI", -exponent, raw)


def _encode_value(value: Any, out: list[bytes]) -> None:
    t = type(value)
    if t is str:
        raw = value.encode("utf-8", "surrogateescape")
        out.append(b"S" + pack_I(len(raw)))
        out.append(raw)
    elif t is bool:
        out.append(b"t\x01" if value else b"t\x00")
    elif t is int:
        _encode_int(value, out)
    elif t is Timestamp:
        out.append(b"T" + pack_Q(value))
    elif t is bytes or t is bytearray or t is memoryview:
        out.append(b"x" + pack_I(len(value)))
        out.append(bytes(value))
    elif value is None:
        out.append(b"V")
    elif t is Typed:
        _encode_typed(value.tag, value.value, out)
    elif isinstance(value, Mapping):
        out.append(b"F" + py_encode_table(value))
    elif t is list or t is tuple:
        out.append(b"A" + encode_array(value))
    elif t is float:
        out.append(b"d" + struct.pack(">d", value))
    elif isinstance(value, Decimal):
        out.append(b"D" + _encode_decimal(value))
    elif isinstance(value, datetime):
        out.append(b"T" + pack_Q(int(value.timestamp())))
    elif isinstance(value, bool):
        out.append(b"t\x01" if value else b"t\x00")
    elif isinstance(value, int):
        _encode_int(int(value), out)
    elif isinstance(value, str):
        _encode_value(str(value), out)
    else:
        raise TypeError(f"cannot encode {t.__name__} {value!r} as an AMQP field value")


_TYPED_FORMATS = {
    "b": ">b",
    "B": ">B",
    "s": ">h",
    "u": ">H",
    "I": ">i",
    "i": ">I",
    "l": ">q",
    "L": ">q",
    "f": ">f",
    "d": ">d",
    "T": ">Q",
}


def _encode_typed(tag: str, value: Any, out: list[bytes]) -> None:
    fmt = _TYPED_FORMATS.get(tag)
    if fmt is not None:
        if tag == "T" and isinstance(value, datetime):
            value = int(value.timestamp())
        try:
            out.append(tag.encode() + struct.pack(fmt, value))
        except struct.error as e:
            raise ValueError(f"{value!r} does not fit field type {tag!r}: {e}") from None
    elif tag == "t":
        out.append(b"t\x01" if value else b"t\x00")
    elif tag == "S" or tag == "x":
        raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
        out.append(tag.encode() + pack_I(len(raw)))
        out.append(raw)
    elif tag == "D":
        out.append(b"D" + _encode_decimal(Decimal(value)))
    elif tag == "F":
        out.append(b"F" + py_encode_table(value))
    elif tag == "A":
        out.append(b"A" + encode_array(value))
    elif tag == "V":
        out.append(b"V")
    else:
        raise ValueError(f"unknown field type {tag!r}")


# --- the compiled twins ---------------------------------------------------------------------------------


py_encode_table = encode_table
py_decode_table = decode_table
encode_speedups = load_speedups("adapters.amqp.codec._encode_speedups")
decode_speedups = load_speedups("adapters.amqp.codec._decode_speedups")
if encode_speedups is not None:
    encode_speedups.bind_wire(Timestamp, py_encode_table)
    encode_table = encode_speedups.encode_table  # noqa: F811 - the compiled twin of the above
if decode_speedups is not None:
    decode_speedups.bind_wire(Timestamp, Decimal, py_decode_table)
    decode_table = decode_speedups.decode_table  # noqa: F811 - the compiled twin of the above
