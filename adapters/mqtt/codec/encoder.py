"""Encoders: `encode(packet, version)` for every packet, plus dedicated fast paths for the hot ones.

Version rules when encoding: properties, reason codes and 5.0-only subscription options are dropped
for 3.1/3.1.1 (a message from a 5.0 publisher delivered to a 3.1.1 subscriber loses its properties,
as the protocol requires); 5.0 SUBACK reason codes >= 0x80 become 0x80 for 3.1.1; AUTH cannot be
encoded for 3.1.1. For CONNECT the version is taken from `Connect.protocol_level`. The short forms
of 5.0 are used where allowed: PUBACK/PUBREC/PUBREL/PUBCOMP with reason 0 and no properties are 4
bytes, DISCONNECT and AUTH with reason 0 and no properties are 2 bytes.

`encode_publish` is compiled (`_speedups.pyx`, built by `uv sync` where there is a C compiler) unless
`GATEWAY_PURE_PYTHON=1`; `py_encode_publish` is the pure-Python reference it matches byte for byte.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from runtime.speedups import load as load_speedups

from .constants import MQTT_3_1, MQTT_5, PROTOCOL_NAMES, PacketType
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from .properties import WILL, check_allowed, encode_properties
from .wire import encode_bin, encode_str, encode_vbi, pack_H

PINGREQ = b"\xc0\x00"
PINGRESP = b"\xd0\x00"
DISCONNECT_V3 = b"\xe0\x00"  # also the 5.0 short form: Normal disconnection, no properties

_pack_BBH = struct.Struct(">BBH").pack
_VBI = [encode_vbi(n) for n in range(16384)]
_NO_PROPS = b"\x00"


def _header(first: int, rl: int) -> bytes:
    return bytes((first,)) + (_VBI[rl] if rl < 16384 else encode_vbi(rl))


# --- hot path ----------------------------------------------------------------------------------------


def encode_publish(
    topic: str | bytes,
    payload: bytes,
    qos: int = 0,
    packet_id: int | None = None,
    retain: bool = False,
    dup: bool = False,
    version: int = 4,
    properties: dict[Any, Any] | None = None,
) -> bytes:
    """Encode a PUBLISH. `topic` may be pre-encoded UTF-8 bytes (saves the encode on fan-out)."""
    t = topic.encode("utf-8") if type(topic) is str else topic
    tl = len(t)
    if tl > 0xFFFF:
        raise ValueError("topic longer than 65535 bytes")
    first = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
    if qos:
        if not packet_id or packet_id > 0xFFFF or qos > 2:
            raise ValueError(f"invalid QoS {qos} / packet id {packet_id} (QoS > 0 needs an id in 1..65535)")
        if version == MQTT_5:
            props = encode_properties(properties) if properties else _NO_PROPS
            rl = 4 + tl + len(props) + len(payload)
            return b"".join(
                (
                    _header(first, rl) if rl >= 128 else bytes((first, rl)),
                    pack_H(tl),
                    t,
                    pack_H(packet_id),
                    props,
                    payload,
                )
            )
        rl = 4 + tl + len(payload)
        head = _header(first, rl) if rl >= 128 else bytes((first, rl))
        return b"".join((head, pack_H(tl), t, pack_H(packet_id), payload))
    if qos < 0 or qos > 2:
        raise ValueError(f"invalid QoS {qos}")
    if version == MQTT_5:
        props = encode_properties(properties) if properties else _NO_PROPS
        rl = 2 + tl + len(props) + len(payload)
        return b"".join((_header(first, rl), pack_H(tl), t, props, payload))
    rl = 2 + tl + len(payload)
    return b"".join((_header(first, rl), pack_H(tl), t, payload))


def _encode_ack(first: int, packet_id: int, reason_code: int, version: int, properties: Any) -> bytes:
    if version == MQTT_5 and (reason_code or properties):
        if not properties:
            return bytes((first, 3)) + pack_H(packet_id) + bytes((reason_code,))
        props = encode_properties(properties)
        rl = 3 + len(props)
        return _header(first, rl) + pack_H(packet_id) + bytes((reason_code,)) + props
    return _pack_BBH(first, 2, packet_id)


def encode_puback(packet_id: int, reason_code: int = 0, version: int = 4, properties: Any = None) -> bytes:
    if not properties and not reason_code:
        return _pack_BBH(0x40, 2, packet_id)
    return _encode_ack(0x40, packet_id, reason_code, version, properties)


def encode_pubrec(packet_id: int, reason_code: int = 0, version: int = 4, properties: Any = None) -> bytes:
    return _encode_ack(0x50, packet_id, reason_code, version, properties)


def encode_pubrel(packet_id: int, reason_code: int = 0, version: int = 4, properties: Any = None) -> bytes:
    return _encode_ack(0x62, packet_id, reason_code, version, properties)


def encode_pubcomp(packet_id: int, reason_code: int = 0, version: int = 4, properties: Any = None) -> bytes:
    return _encode_ack(0x70, packet_id, reason_code, version, properties)


# --- the others ----------------------------------------------------------------------------------------


def encode_connack(
    session_present: bool = False, reason_code: int = 0, version: int = 4, properties: Any = None
) -> bytes:
    """CONNACK. `reason_code` is the 5.0 reason code, or for 3.1/3.1.1 the return code (0..5);
    `constants.connack_code` converts a 5.0 reason into a 3.1.1 return code."""
    flags = 1 if session_present and version != MQTT_3_1 else 0
    if version == MQTT_5:
        check_allowed(properties, PacketType.CONNACK)
        props = encode_properties(properties)
        return _header(0x20, 2 + len(props)) + bytes((flags, reason_code)) + props
    return bytes((0x20, 2, flags, reason_code))


def encode_suback(packet_id: int, reason_codes: list[int], version: int = 4, properties: Any = None) -> bytes:
    if version == MQTT_5:
        props = encode_properties(properties)
        body = pack_H(packet_id) + props + bytes(reason_codes)
    else:
        body = pack_H(packet_id) + bytes(rc if rc < 0x80 else 0x80 for rc in reason_codes)
    return _header(0x90, len(body)) + body


def encode_unsuback(
    packet_id: int, reason_codes: list[int] | None = None, version: int = 4, properties: Any = None
) -> bytes:
    if version == MQTT_5:
        body = pack_H(packet_id) + encode_properties(properties) + bytes(reason_codes or ())
        return _header(0xB0, len(body)) + body
    return _pack_BBH(0xB0, 2, packet_id)


def encode_disconnect(reason_code: int = 0, version: int = 4, properties: Any = None) -> bytes:
    if version != MQTT_5 or (not reason_code and not properties):
        return DISCONNECT_V3
    if not properties:
        return bytes((0xE0, 1, reason_code))
    props = encode_properties(properties)
    return _header(0xE0, 1 + len(props)) + bytes((reason_code,)) + props


def encode_auth(reason_code: int = 0, version: int = 5, properties: Any = None) -> bytes:
    if version != MQTT_5:
        raise ValueError("AUTH exists only in MQTT 5.0")
    if not reason_code and not properties:
        return b"\xf0\x00"
    props = encode_properties(properties)
    return _header(0xF0, 1 + len(props)) + bytes((reason_code,)) + props


def encode_connect(p: Connect) -> bytes:
    level = p.protocol_level
    name = p.protocol_name if p.protocol_name is not None else PROTOCOL_NAMES.get(level, "MQTT")
    v5 = level == MQTT_5
    flags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if p.username is not None:
        flags |= 0x80
    if p.password is not None:
        flags |= 0x40
    parts = [encode_str(name), bytes((level, flags)), pack_H(p.keep_alive)]
    if v5:
        check_allowed(p.properties, PacketType.CONNECT)
        parts.append(encode_properties(p.properties))
    parts.append(encode_str(p.client_id))
    if will is not None:
        if v5:
            check_allowed(will.properties, WILL)
            parts.append(encode_properties(will.properties))
        parts.append(encode_str(will.topic))
        parts.append(encode_bin(will.payload))
    if p.username is not None:
        parts.append(encode_str(p.username))
    if p.password is not None:
        parts.append(encode_bin(p.password))
    body = b"".join(parts)
    return _header(0x10, len(body)) + body


def encode_subscribe(p: Subscribe, version: int = 4) -> bytes:
    parts = [pack_H(p.packet_id)]
    v5 = version == MQTT_5
    if v5:
        check_allowed(p.properties, PacketType.SUBSCRIBE)
        parts.append(encode_properties(p.properties))
    for s in p.subscriptions:
        parts.append(encode_str(s.topic_filter))
        opts = s.qos
        if v5:
            opts |= (4 if s.no_local else 0) | (8 if s.retain_as_published else 0) | (s.retain_handling << 4)
        parts.append(bytes((opts,)))
    body = b"".join(parts)
    return _header(0x82, len(body)) + body


def encode_unsubscribe(p: Unsubscribe, version: int = 4) -> bytes:
    parts = [pack_H(p.packet_id)]
    if version == MQTT_5:
        parts.append(encode_properties(p.properties))
    parts.extend(encode_str(f) for f in p.topic_filters)
    body = b"".join(parts)
    return _header(0xA2, len(body)) + body


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Connect: lambda p, v: encode_connect(p),
    Connack: lambda p, v: encode_connack(p.session_present, p.reason_code, v, p.properties),
    Publish: lambda p, v: encode_publish(
        p.topic, p.payload, p.qos, p.packet_id, p.retain, p.dup, v, p.properties
    ),
    Puback: lambda p, v: encode_puback(p.packet_id, p.reason_code, v, p.properties),
    Pubrec: lambda p, v: encode_pubrec(p.packet_id, p.reason_code, v, p.properties),
    Pubrel: lambda p, v: encode_pubrel(p.packet_id, p.reason_code, v, p.properties),
    Pubcomp: lambda p, v: encode_pubcomp(p.packet_id, p.reason_code, v, p.properties),
    Subscribe: encode_subscribe,
    Suback: lambda p, v: encode_suback(p.packet_id, p.reason_codes, v, p.properties),
    Unsubscribe: encode_unsubscribe,
    Unsuback: lambda p, v: encode_unsuback(p.packet_id, p.reason_codes, v, p.properties),
    Pingreq: lambda p, v: PINGREQ,
    Pingresp: lambda p, v: PINGRESP,
    Disconnect: lambda p, v: encode_disconnect(p.reason_code, v, p.properties),
    Auth: lambda p, v: encode_auth(p.reason_code, v, p.properties),
}


def encode(packet: Any, version: int = 4) -> bytes:
    """Encode any packet dataclass for protocol level `version` (3, 4 or 5)."""
    try:
        enc = _ENCODERS[type(packet)]
    except KeyError:
        raise TypeError(f"not an MQTT packet: {packet!r}") from None
    return enc(packet, version)


py_encode_publish = encode_publish
speedups = load_speedups("adapters.mqtt.codec._speedups")
if speedups is not None:
    speedups.bind(py_encode_publish)
    encode_publish = speedups.encode_publish  # noqa: F811 - the compiled twin of the above
