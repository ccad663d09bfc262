"""SUBSCRIBE, UNSUBSCRIBE and their acks: the bodies of the subscription packets, decoded in one
pass as decoder.py's other packets are (`v5`: the connection speaks MQTT 5.0; `strict`: the strict
UTF-8 checks of wire.py). Topic filters are validated as in topics.py."""

from __future__ import annotations

from typing import Any

from .constants import VALID_REASON_CODES, VALID_SUBACK_V3, ReasonCode
from .errors import MQTTCodecError
from .packets import Suback, Subscribe, Subscription, Unsuback, Unsubscribe
from .properties import decode_properties
from .topics import SHARE_PREFIX, validate_topic_filter
from .wire import decode_str, malformed, protocol_error, reason_code


def _filter(buf: bytes, p: int, end: int, strict: bool) -> tuple[str, int]:
    filt, p = decode_str(buf, p, end, "topic filter", strict)
    if not validate_topic_filter(filt):
        raise MQTTCodecError(ReasonCode.TOPIC_FILTER_INVALID, f"invalid topic filter {filt!r}")
    return filt, p


def decode_subscribe(buf: bytes, p: int, end: int, v5: bool, strict: bool) -> Subscribe:
    if end - p < 2:
        raise malformed("SUBSCRIBE without a packet identifier")
    pid = (buf[p] << 8) | buf[p + 1]
    p += 2
    if not pid:
        raise protocol_error("SUBSCRIBE with packet identifier 0")
    props: dict[Any, Any] = {}
    if v5:
        props, p = decode_properties(buf, p, end, 8, strict)
    subs = []
    while p < end:
        filt, p = _filter(buf, p, end, strict)
        if p >= end:
            raise malformed("subscription without its options byte")
        o = buf[p]
        p += 1
        qos = o & 3
        if qos == 3:
            raise malformed("subscription with QoS 3")
        if v5:
            if o & 0xC0:
                raise malformed("subscription options reserved bits are set")
            rh = (o >> 4) & 3
            if rh == 3:
                raise protocol_error("retain handling 3")
            no_local = bool(o & 4)
            if no_local and filt.startswith(SHARE_PREFIX):
                raise protocol_error("No Local on a shared subscription")
            subs.append(Subscription(filt, qos, no_local, bool(o & 8), rh))
        else:
            if o & 0xFC:
                raise malformed("requested QoS byte has reserved bits set")
            subs.append(Subscription(filt, qos))
    if not subs:
        raise protocol_error("SUBSCRIBE without any subscription")
    return Subscribe(pid, subs, props)


def decode_unsubscribe(buf: bytes, p: int, end: int, v5: bool, strict: bool) -> Unsubscribe:
    if end - p < 2:
        raise malformed("UNSUBSCRIBE without a packet identifier")
    pid = (buf[p] << 8) | buf[p + 1]
    p += 2
    if not pid:
        raise protocol_error("UNSUBSCRIBE with packet identifier 0")
    props: dict[Any, Any] = {}
    if v5:
        props, p = decode_properties(buf, p, end, 10, strict)
    filters = []
    while p < end:
        filt, p = _filter(buf, p, end, strict)
        filters.append(filt)
    if not filters:
        raise protocol_error("UNSUBSCRIBE without any topic filter")
    return Unsubscribe(pid, filters, props)


def decode_suback(buf: bytes, p: int, end: int, v5: bool, strict: bool) -> Suback:
    if end - p < 2:
        raise malformed("SUBACK without a packet identifier")
    pid = (buf[p] << 8) | buf[p + 1]
    p += 2
    props: dict[Any, Any] = {}
    if v5:
        props, p = decode_properties(buf, p, end, 9, strict)
        valid = VALID_REASON_CODES[9]
    else:
        valid = VALID_SUBACK_V3
    codes = list(buf[p:end])
    for c in codes:
        if c not in valid:
            raise protocol_error(f"SUBACK code 0x{c:02X} is not valid")
    return Suback(pid, codes, props)


def decode_unsuback(buf: bytes, p: int, end: int, v5: bool, strict: bool) -> Unsuback:
    if end - p < 2:
        raise malformed("UNSUBACK without a packet identifier")
    pid = (buf[p] << 8) | buf[p + 1]
    p += 2
    if not v5:
        if p != end:
            raise malformed("UNSUBACK with a remaining length other than 2")
        return Unsuback(pid)
    props, p = decode_properties(buf, p, end, 11, strict)
    codes = list(buf[p:end])
    for c in codes:
        reason_code(11, c)
    return Unsuback(pid, codes, props)
