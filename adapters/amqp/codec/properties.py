"""The 14 basic content properties: property flags word(s) followed by the present values.

Flags are bits 15..2 of the first flags word, in the order of the `BasicProperties` fields; bit 0
says another flags word follows (basic has no property there, so further words must be 0 apart
from their own continuation bit). Short strings are decoded with "surrogateescape" (RabbitMQ does
not check their UTF-8), `headers` is a field table, `timestamp` an int (seconds).

`encode_properties` and `decode_properties` are compiled (`_encode_speedups.pyx` and
`_decode_speedups.pyx`, hand-written because they run once per message on the hot path; built by
`uv sync` where there is a C compiler) unless `GATEWAY_PURE_PYTHON=1`; `py_encode_properties` and
`py_decode_properties` are the pure-Python reference they match (same bytes, equal values, the same
errors: anything off the compiled fast path is handed to them).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from .wire import (
    _table,
    _unpack_I,
    _unpack_Q,
    decode_speedups,
    encode_speedups,
    pack_H,
    pack_Q,
    py_encode_table,
)


@dataclass(slots=True)
class BasicProperties:
    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None  # 1 transient, 2 persistent
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None  # per-message TTL in ms, as a decimal string
    message_id: str | None = None
    timestamp: int | None = None  # seconds since the epoch
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None  # deprecated (reserved) in 0-9-1


PROPERTY_NAMES = tuple(f.name for f in fields(BasicProperties))
EMPTY_PROPERTIES = b"\x00\x00"  # flags word with no property


def decode_properties(buf: bytes, p: int = 0, end: int | None = None) -> BasicProperties:
    """Decode flags word(s) + property list from buf[p:end]; ValueError if malformed."""
    if end is None:
        end = len(buf)
    try:
        flags = (buf[p] << 8) | buf[p + 1]
        p += 2
        if flags & 1:
            while True:
                more = (buf[p] << 8) | buf[p + 1]
                p += 2
                if more & 0xFFFE:
                    raise ValueError("property flag set beyond the 14 basic properties")
                if not more & 1:
                    break
        # Unrolled on purpose (hot path): one test per flag, values in locals, one constructor call.
        ct = ce = hd = dm = pr = ci = rt = ex = mi = ts = ty = ui = ai = ci2 = None
        if flags & 0xFF00:
            if flags & 0x8000:
                q = p + 1 + buf[p]
                ct = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q
            if flags & 0x4000:
                q = p + 1 + buf[p]
                ce = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q
            if flags & 0x2000:
                q = p + 4 + _unpack_I(buf, p)[0]
                if q > end:
                    raise ValueError("headers table runs past the end")
                hd = _table(buf, p + 4, q)
                p = q
            if flags & 0x1000:
                dm = buf[p]
                p += 1
            if flags & 0x0800:
                pr = buf[p]
                p += 1
            if flags & 0x0400:
                q = p + 1 + buf[p]
                ci = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q
            if flags & 0x0200:
                q = p + 1 + buf[p]
                rt = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q
            if flags & 0x0100:
                q = p + 1 + buf[p]
                ex = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q
        if flags & 0x00FC:
            if flags & 0x0080:
                q = p + 1 + buf[p]
                mi = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q
            if flags & 0x0040:
                ts = _unpack_Q(buf, p)[0]
                p += 8
            if flags & 0x0020:
                q = p + 1 + buf[p]
                ty = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q
            if flags & 0x0010:
                q = p + 1 + buf[p]
                ui = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q
            if flags & 0x0008:
                q = p + 1 + buf[p]
                ai = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q
            if flags & 0x0004:
                q = p + 1 + buf[p]
                ci2 = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q
    except (IndexError, struct.error):
        raise ValueError("property list runs past the end") from None
    if p != end:
        raise ValueError("property list runs past the end" if p > end else "bytes after the property list")
    return BasicProperties(ct, ce, hd, dm, pr, ci, rt, ex, mi, ts, ty, ui, ai, ci2)


def _short(value: str | bytes, name: str) -> bytes:
    raw = value.encode("utf-8", "surrogateescape") if type(value) is str else bytes(value)
    if len(raw) > 255:
        raise ValueError(f"{name} of {len(raw)} bytes (more than 255)")
    return bytes((len(raw),)) + raw


def encode_properties(props: BasicProperties | None) -> bytes:
    """Flags word + property list (EMPTY_PROPERTIES for None or no property set)."""
    if props is None:
        return EMPTY_PROPERTIES
    # Unrolled on purpose (hot path when the server builds properties itself).
    flags = 0
    out: list[bytes] = [b""]
    v: Any = props.content_type
    if v is not None:
        flags = 0x8000
        out.append(_short(v, "content_type"))
    v = props.content_encoding
    if v is not None:
        flags |= 0x4000
        out.append(_short(v, "content_encoding"))
    v = props.headers
    if v is not None:
        flags |= 0x2000
        out.append(py_encode_table(v))
    v = props.delivery_mode
    if v is not None:
        flags |= 0x1000
        out.append(bytes((v,)))
    v = props.priority
    if v is not None:
        flags |= 0x0800
        out.append(bytes((v,)))
    v = props.correlation_id
    if v is not None:
        flags |= 0x0400
        out.append(_short(v, "correlation_id"))
    v = props.reply_to
    if v is not None:
        flags |= 0x0200
        out.append(_short(v, "reply_to"))
    v = props.expiration
    if v is not None:
        flags |= 0x0100
        out.append(_short(v, "expiration"))
    v = props.message_id
    if v is not None:
        flags |= 0x0080
        out.append(_short(v, "message_id"))
    v = props.timestamp
    if v is not None:
        flags |= 0x0040
        out.append(pack_Q(int(v.timestamp()) if isinstance(v, datetime) else v))
    v = props.type
    if v is not None:
        flags |= 0x0020
        out.append(_short(v, "type"))
    v = props.user_id
    if v is not None:
        flags |= 0x0010
        out.append(_short(v, "user_id"))
    v = props.app_id
    if v is not None:
        flags |= 0x0008
        out.append(_short(v, "app_id"))
    v = props.cluster_id
    if v is not None:
        flags |= 0x0004
        out.append(_short(v, "cluster_id"))
    if not flags:
        return EMPTY_PROPERTIES
    out[0] = pack_H(flags)
    return b"".join(out)


py_encode_properties = encode_properties
py_decode_properties = decode_properties
if encode_speedups is not None:
    encode_speedups.bind_properties(BasicProperties, EMPTY_PROPERTIES, datetime, py_encode_properties)
    encode_properties = encode_speedups.encode_properties  # noqa: F811 - the compiled twin of the above
if decode_speedups is not None:
    decode_speedups.bind_properties(BasicProperties, py_decode_properties)
    decode_properties = decode_speedups.decode_properties  # noqa: F811 - the compiled twin of the above
