"""The serialized `ReceiveMessageResponse{message}` of one delivery, encoded by hand.

Why by hand: every received message costs one of these, on the event loop that also runs grpc.
Filling protobuf objects field by field (`convert.fill_proto`) and serializing them costs about
8 µs per message; writing the wire format straight from the store's message, with the encodings
of values that repeat from message to message (topic, tag, hosts, the seconds of timestamps)
kept, costs less. The bytes parse to the same message: `tests/adapters/grpc/test_delivery_bytes.py`
compares them with what `fill_proto` builds, for every kind of message.

`delivery_response` is compiled (`_speedups.pyx`: one allocation, the MD5 digest and the fields written
in C) where the extension is built, unless `GATEWAY_PURE_PYTHON=1`; this module chooses, once, at import.
The pure-Python function stays the reference and the fallback (`py_delivery_response`): the compiled one
gives the same bytes and errors (`tests/adapters/grpc/test_delivery_bytes_speedups.py`).

Wire format facts used (protobuf encoding): a field starts with the varint key
`(number << 3) | wire_type`; integers are varints (wire type 0), negative int32/int64 as
10-byte two's complement; strings, bytes, nested messages and map entries are length-delimited
(wire type 2). Fields are written in field-number order, as protobuf's serializer does."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from adapters.grpc.convert import (
    HIDDEN_PROPERTIES,
    PROP_CHECK_IMMUNITY,
    PROP_TRACE_CONTEXT,
    proto_type,
    split_properties,
)
from adapters.grpc.generated import definition_pb2 as d
from messaging_processor import Delivery, Message
from messaging_processor.properties import P_USER_PROPERTIES
from runtime.speedups import load as load_speedups

_SMALL = tuple(bytes((i,)) for i in range(128))
_MD5 = hashlib.md5
_CACHE_LIMIT = 4096  # entries per cache of repeated values; a full cache starts over


def _varint(n: int) -> bytes:
    if n < 0x80:
        if n >= 0:
            return _SMALL[n]
        n += 1 << 64
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = []
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(key: bytes, value: bytes) -> bytes:
    """A length-delimited field: key, length, value."""
    n = len(value)
    return key + (_SMALL[n] if n < 0x80 else _varint(n)) + value


def _string_field(key: bytes, value: str) -> bytes:
    return _field(key, value.encode())


class _Repeated(dict):
    """Encoded fields of values that repeat (a topic, a tag, a host): `cache[value]`."""

    def __init__(self, encode: Callable[[Any], bytes]) -> None:
        super().__init__()
        self.encode = encode

    def __missing__(self, value: str | int) -> bytes:
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        enc = self[value] = self.encode(value)
        return enc


# SystemProperties field keys.
_BORN_TIMESTAMP = b"\x3a"
_STORE_TIMESTAMP = b"\x4a"
_DELIVERY_TIMESTAMP = b"\x5a"
_RECEIPT_HANDLE = b"\x62"
_QUEUE_OFFSET = b"\x70"  # varint
_DELIVERY_ATTEMPT = b"\x80\x01"  # field 16, varint
_TRACE_CONTEXT = b"\x92\x01"  # field 18
_ORPHANED_RECOVERY = b"\x9a\x01"  # field 19, a Duration
# Digest{type: MD5, checksum: 32 hex digits} (field 4), then body_encoding IDENTITY (field 5).
_DIGEST_HEAD = bytes((0x22, 36, 0x08, d.MD5, 0x12, 32))
_IDENTITY = bytes((0x28, d.IDENTITY))

_tags = _Repeated(lambda v: _string_field(b"\x0a", v))
_message_types = {t: bytes((0x30, t)) for t in d.MessageType.values()}
_born_hosts = _Repeated(lambda v: _string_field(b"\x42", v))
_store_hosts = _Repeated(lambda v: _string_field(b"\x52", v))
_queue_ids = _Repeated(lambda v: b"\x68" + _varint(v) if v else b"")
_groups = _Repeated(lambda v: _string_field(b"\x8a\x01", v))
# Message.topic = Resource{name}; an empty name still sends an (empty) Resource.
_topics = _Repeated(lambda v: _field(b"\x0a", _string_field(b"\x12", v) if v else b""))
_seconds = _Repeated(lambda v: b"\x08" + _varint(v) if v else b"")
# Timestamp.nanos of each whole millisecond.
_NANOS = (b"",) + tuple(b"\x10" + _varint(ms * 1_000_000) for ms in range(1, 1000))


def _timestamp(key: bytes, ms: int) -> bytes:
    """A `google.protobuf.Timestamp` field for epoch milliseconds (zero fields left out)."""
    seconds, rest = divmod(ms, 1000)
    return _field(key, _seconds[seconds] + _NANOS[rest])


def delivery_response(dl: Delivery, store_host: str = "") -> bytes:
    """`ReceiveMessageResponse(message=...)` serialized: the message `fill_proto` fills in."""
    m = dl.message
    body = m.body
    sp = [
        _tags[m.tag] if m.tag else b"",
        b"".join([_string_field(b"\x12", k) for k in m.keys]) if m.keys else b"",
        _string_field(b"\x1a", m.message_id) if m.message_id else b"",
        _DIGEST_HEAD,
        _MD5(body).hexdigest().upper().encode(),
        _IDENTITY,
        _message_types[proto_type(m)],
        _timestamp(_BORN_TIMESTAMP, m.born_timestamp),
        _born_hosts[m.born_host] if m.born_host else b"",
        _timestamp(_STORE_TIMESTAMP, m.store_timestamp) if m.store_timestamp else b"",
        _store_hosts[m.store_host or store_host] if m.store_host or store_host else b"",
        _timestamp(_DELIVERY_TIMESTAMP, m.deliver_at) if m.deliver_at else b"",
        _string_field(_RECEIPT_HANDLE, dl.receipt_handle),
        _queue_ids[m.queue_id],
        _QUEUE_OFFSET,
        _varint(m.queue_offset),
        _DELIVERY_ATTEMPT,
        _varint(dl.delivery_attempt),
        _groups[m.message_group] if m.message_group else b"",
    ]
    user = _properties(m, sp)
    sysprops = b"".join(sp)
    n = len(sysprops)
    msg = b"".join(
        (
            _topics[m.topic],
            user,
            b"\x1a",
            _SMALL[n] if n < 0x80 else _varint(n),
            sysprops,
            _field(b"\x22", body) if body else b"",
        )
    )
    return _field(b"\x12", msg)


def _properties(m: Message, sp: list[bytes]) -> bytes:
    """User properties as map entries (returned); the trace context and the system properties kept
    among the properties are appended to `sp`."""
    user, trace, recovery = split_properties(m.properties) if m.properties else ((), None, None)
    if trace is not None:
        sp.append(_string_field(_TRACE_CONTEXT, trace))
    if recovery is not None:
        sp.append(_field(_ORPHANED_RECOVERY, b"\x08" + _varint(recovery) if recovery else b""))
    return b"".join([_field(b"\x12", _string_field(b"\x0a", k) + _string_field(b"\x12", v)) for k, v in user])


def bind_speedups(module: ModuleType) -> None:
    """Hand the compiled encoder the pure function (its fallback), the helpers and constants it uses."""
    module.bind(
        py_delivery_response,
        proto_type,
        split_properties,
        _message_types,
        HIDDEN_PROPERTIES,
        PROP_TRACE_CONTEXT,
        PROP_CHECK_IMMUNITY,
        P_USER_PROPERTIES,
        _DIGEST_HEAD,
        _IDENTITY,
        _MD5,
    )


py_delivery_response = delivery_response
SPEEDUPS_API = 2  # the `bind` and rules `_speedups.pyx` must have (`API`): an older build is not used
speedups = load_speedups("adapters.grpc._speedups")
if speedups is not None and getattr(speedups, "API", 1) != SPEEDUPS_API:
    speedups = None  # (built from an older .pyx: `make install` rebuilds it; until then pure Python)
if speedups is not None:
    bind_speedups(speedups)
    delivery_response = speedups.delivery_response  # noqa: F811 - the compiled twin of the above
