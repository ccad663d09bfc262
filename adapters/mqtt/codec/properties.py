"""MQTT 5.0 properties (spec 2.2.2): identifiers, types, where each may appear, decode and encode.

Properties are carried as a plain dict keyed by `PropertyId`. Two properties may repeat and are
kept as lists in wire order: USER_PROPERTY (a list of `(name, value)` string pairs) and
SUBSCRIPTION_IDENTIFIER (a list of ints; it may repeat only in a server-to-client PUBLISH, and
holds exactly one item in SUBSCRIBE). Every other property is a scalar (int, str or bytes).

Decoding rules: an identifier that is unknown or not allowed in the packet is a Malformed Packet
(0x81), as spec 2.2.2.2 says ("A Control Packet which contains an Identifier which is not valid for
its packet type ... is a Malformed Packet"); a property that appears twice where it may appear only
once, or a value outside its range (a byte flag other than 0/1, a zero Receive Maximum, Maximum
Packet Size or Subscription Identifier, a Response Topic that is not a valid topic name) is a
Protocol Error (0x82). A malformed value (ill-formed UTF-8, a field running past the property
length) is Malformed.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from .constants import PacketType
from .wire import (
    decode_bin,
    decode_str,
    decode_vbi,
    encode_bin,
    encode_str,
    encode_vbi,
    malformed,
    pack_H,
    pack_I,
    protocol_error,
)


class PropertyId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class PropertyType(IntEnum):
    BYTE = 1
    TWO_BYTE_INT = 2
    FOUR_BYTE_INT = 3
    VARIABLE_BYTE_INT = 4
    UTF8_STRING = 5
    BINARY = 6
    UTF8_STRING_PAIR = 7


#: Pseudo packet type for the Will Properties inside CONNECT.
WILL = 16

P = PropertyId
T = PropertyType
_C, _CA, _PU, _PA, _PREC, _PREL, _PCOMP = (
    PacketType.CONNECT,
    PacketType.CONNACK,
    PacketType.PUBLISH,
    PacketType.PUBACK,
    PacketType.PUBREC,
    PacketType.PUBREL,
    PacketType.PUBCOMP,
)
_S, _SA, _U, _UA, _D, _A = (
    PacketType.SUBSCRIBE,
    PacketType.SUBACK,
    PacketType.UNSUBSCRIBE,
    PacketType.UNSUBACK,
    PacketType.DISCONNECT,
    PacketType.AUTH,
)

#: id -> (type, packets where it is allowed)  (spec table 2-4)
PROPERTY_SPEC: dict[int, tuple[PropertyType, frozenset[int]]] = {
    P.PAYLOAD_FORMAT_INDICATOR: (T.BYTE, frozenset({_PU, WILL})),
    P.MESSAGE_EXPIRY_INTERVAL: (T.FOUR_BYTE_INT, frozenset({_PU, WILL})),
    P.CONTENT_TYPE: (T.UTF8_STRING, frozenset({_PU, WILL})),
    P.RESPONSE_TOPIC: (T.UTF8_STRING, frozenset({_PU, WILL})),
    P.CORRELATION_DATA: (T.BINARY, frozenset({_PU, WILL})),
    P.SUBSCRIPTION_IDENTIFIER: (T.VARIABLE_BYTE_INT, frozenset({_PU, _S})),
    P.SESSION_EXPIRY_INTERVAL: (T.FOUR_BYTE_INT, frozenset({_C, _CA, _D})),
    P.ASSIGNED_CLIENT_IDENTIFIER: (T.UTF8_STRING, frozenset({_CA})),
    P.SERVER_KEEP_ALIVE: (T.TWO_BYTE_INT, frozenset({_CA})),
    P.AUTHENTICATION_METHOD: (T.UTF8_STRING, frozenset({_C, _CA, _A})),
    P.AUTHENTICATION_DATA: (T.BINARY, frozenset({_C, _CA, _A})),
    P.REQUEST_PROBLEM_INFORMATION: (T.BYTE, frozenset({_C})),
    P.WILL_DELAY_INTERVAL: (T.FOUR_BYTE_INT, frozenset({WILL})),
    P.REQUEST_RESPONSE_INFORMATION: (T.BYTE, frozenset({_C})),
    P.RESPONSE_INFORMATION: (T.UTF8_STRING, frozenset({_CA})),
    P.SERVER_REFERENCE: (T.UTF8_STRING, frozenset({_CA, _D})),
    P.REASON_STRING: (T.UTF8_STRING, frozenset({_CA, _PA, _PREC, _PREL, _PCOMP, _SA, _UA, _D, _A})),
    P.RECEIVE_MAXIMUM: (T.TWO_BYTE_INT, frozenset({_C, _CA})),
    P.TOPIC_ALIAS_MAXIMUM: (T.TWO_BYTE_INT, frozenset({_C, _CA})),
    P.TOPIC_ALIAS: (T.TWO_BYTE_INT, frozenset({_PU})),
    P.MAXIMUM_QOS: (T.BYTE, frozenset({_CA})),
    P.RETAIN_AVAILABLE: (T.BYTE, frozenset({_CA})),
    P.USER_PROPERTY: (
        T.UTF8_STRING_PAIR,
        frozenset({_C, _CA, _PU, WILL, _PA, _PREC, _PREL, _PCOMP, _S, _SA, _U, _UA, _D, _A}),
    ),
    P.MAXIMUM_PACKET_SIZE: (T.FOUR_BYTE_INT, frozenset({_C, _CA})),
    P.WILDCARD_SUBSCRIPTION_AVAILABLE: (T.BYTE, frozenset({_CA})),
    P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (T.BYTE, frozenset({_CA})),
    P.SHARED_SUBSCRIPTION_AVAILABLE: (T.BYTE, frozenset({_CA})),
}

#: packet type (or WILL) -> ids allowed there
ALLOWED: dict[int, frozenset[int]] = {
    pt: frozenset(pid for pid, (_, where) in PROPERTY_SPEC.items() if pt in where)
    for pt in [*PacketType, WILL]
}

# Fast tables indexed by the identifier byte.
_TYPE: list[int] = [0] * 256
_ENUM: list[Any] = [None] * 256
for _pid, (_t, _) in PROPERTY_SPEC.items():
    _TYPE[_pid] = _t
    _ENUM[_pid] = PropertyId(_pid)

# Byte-valued properties that are flags (0 or 1).
_FLAGS = frozenset(
    {
        P.PAYLOAD_FORMAT_INDICATOR,
        P.REQUEST_PROBLEM_INFORMATION,
        P.REQUEST_RESPONSE_INFORMATION,
        P.MAXIMUM_QOS,
        P.RETAIN_AVAILABLE,
        P.WILDCARD_SUBSCRIPTION_AVAILABLE,
        P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        P.SHARED_SUBSCRIPTION_AVAILABLE,
    }
)
# Integer properties for which 0 is a Protocol Error.
_NONZERO = frozenset({P.RECEIVE_MAXIMUM, P.MAXIMUM_PACKET_SIZE, P.SUBSCRIPTION_IDENTIFIER})

_USER = P.USER_PROPERTY
_SUBID = P.SUBSCRIPTION_IDENTIFIER
_RESPONSE_TOPIC = P.RESPONSE_TOPIC


def decode_properties(
    buf: bytes, pos: int, end: int, packet_type: int, strict: bool = False
) -> tuple[dict[PropertyId, Any], int]:
    """Decode a property block (its length VBI included) starting at `pos`; return (props, new pos)."""
    if pos >= end:
        raise malformed("missing property length")
    plen = buf[pos]
    if plen < 0x80:
        pos += 1
    else:
        plen, pos = decode_vbi(buf, pos, end)
    stop = pos + plen
    if stop > end:
        raise malformed("properties run past the end of the packet")
    props: dict[PropertyId, Any] = {}
    if not plen:
        return props, pos
    allowed = ALLOWED[packet_type]
    while pos < stop:
        pid = buf[pos]
        pos += 1
        if pid not in allowed:
            if pid < 0x80 and _ENUM[pid] is not None:
                raise malformed(f"property {_ENUM[pid].name} is not allowed in {_packet_name(packet_type)}")
            raise malformed(f"unknown property identifier 0x{pid:02X}")
        key = _ENUM[pid]
        t = _TYPE[pid]
        if t == 1:  # byte
            if pos >= stop:
                raise malformed(f"truncated {key.name}")
            value: Any = buf[pos]
            pos += 1
            if value > 1 and pid in _FLAGS:
                raise protocol_error(f"{key.name} must be 0 or 1, got {value}")
        elif t == 2:
            if pos + 2 > stop:
                raise malformed(f"truncated {key.name}")
            value = (buf[pos] << 8) | buf[pos + 1]
            pos += 2
        elif t == 3:
            if pos + 4 > stop:
                raise malformed(f"truncated {key.name}")
            value = int.from_bytes(buf[pos : pos + 4], "big")
            pos += 4
        elif t == 4:
            value, pos = decode_vbi(buf, pos, stop)
        elif t == 5:
            value, pos = decode_str(buf, pos, stop, key.name, strict)
            if pid == _RESPONSE_TOPIC and (not value or "+" in value or "#" in value):
                raise protocol_error(f"Response Topic {value!r} is not a valid topic name")
        elif t == 6:
            value, pos = decode_bin(buf, pos, stop, key.name)
        else:  # string pair
            name, pos = decode_str(buf, pos, stop, "user property name", strict)
            val, pos = decode_str(buf, pos, stop, "user property value", strict)
            lst = props.get(key)
            if lst is None:
                props[key] = [(name, val)]
            else:
                lst.append((name, val))
            continue
        if not value and pid in _NONZERO:
            raise protocol_error(f"{key.name} must not be 0")
        if pid == _SUBID:
            lst = props.get(key)
            if lst is None:
                props[key] = [value]
            elif packet_type == PacketType.PUBLISH:
                lst.append(value)
            else:
                raise protocol_error("SUBSCRIPTION_IDENTIFIER appears more than once")
            continue
        if key in props:
            raise protocol_error(f"{key.name} appears more than once")
        props[key] = value
    if pos != stop:
        raise malformed("property overruns the property length")
    return props, pos


def _packet_name(pt: int) -> str:
    return "Will Properties" if pt == WILL else PacketType(pt).name


def _encode_value(pid: int, t: int, value: Any) -> bytes:
    if t == 1:
        return bytes((pid, value))
    if t == 2:
        return bytes((pid,)) + pack_H(value)
    if t == 3:
        return bytes((pid,)) + pack_I(value)
    if t == 4:
        return bytes((pid,)) + encode_vbi(value)
    if t == 5:
        return bytes((pid,)) + encode_str(value)
    if t == 6:
        return bytes((pid,)) + encode_bin(value)
    name, val = value
    return bytes((pid,)) + encode_str(name) + encode_str(val)


def encode_properties(props: dict[Any, Any] | None) -> bytes:
    """Encode a property dict into a property block (length VBI included). Order is the dict's."""
    if not props:
        return b"\x00"
    parts = []
    for pid, value in props.items():
        t = _TYPE[pid] if 0 < pid < 256 else 0
        if not t:
            raise ValueError(f"unknown property identifier {pid!r}")
        if pid in (_USER, _SUBID):
            if isinstance(value, int | tuple):
                value = [value]
            for v in value:
                parts.append(_encode_value(pid, t, v))
        else:
            parts.append(_encode_value(pid, t, value))
    body = b"".join(parts)
    return encode_vbi(len(body)) + body


def check_allowed(props: dict[Any, Any] | None, packet_type: int) -> None:
    """Raise ValueError if `props` holds a property not allowed in `packet_type` (for encoders)."""
    if props:
        allowed = ALLOWED[packet_type]
        for pid in props:
            if pid not in allowed:
                raise ValueError(f"property {pid!r} is not allowed in {_packet_name(packet_type)}")
