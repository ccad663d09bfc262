"""MQTT <-> store message mapping (see docs/mqtt.md).

A PUBLISH to `devices/42/telemetry` becomes a store Message on store topic `devices` (the first
level, sanitized) with the full path and the MQTT attributes in properties:

    mqtt.topic             full topic path
    mqtt.qos               "0" | "1" | "2" (QoS as published)
    mqtt.retain            "1" when published with the retain flag (absent otherwise)
    mqtt.content_type      5.0 Content Type
    mqtt.response_topic    5.0 Response Topic
    mqtt.correlation_data  5.0 Correlation Data, base64
    mqtt.payload_format    5.0 Payload Format Indicator ("0" bytes / "1" UTF-8)
    mqtt.expiry_at         5.0 Message Expiry Interval as an absolute epoch ms deadline
    mqtt.user_properties   5.0 User Properties, a JSON list of [name, value] pairs exactly as
                           published (order and repeated names kept, `traceparent` included):
                           5.0 subscribers get this very list (MQTT-3.3.2-17)
    mqtt.client_id         the publisher's client id, only while it has a No Local subscription
    traceparent            the value of the first User Property `traceparent` (a copy: the W3C trace
                           context other protocols deliver and the processor traces)

Store topic names allow `[%|A-Za-z0-9_.-]`, at most 127 characters, and no leading `%` for
producers: the first levels `$SYS` and `$events` are the gateway's own topics `%SYS%` and
`%EVENTS%` (docs/system-topics.md), which clients read but may not publish to; every character
of the first level outside `[A-Za-z0-9_.-]` becomes `_`, an empty first level (`/a/b`) becomes
`_`, and the result is cut to 127 characters. Distinct first levels may so share a store topic;
delivery matches the full path, so subscribers never see the other's messages.

A message that entered through another protocol (no `mqtt.topic`) is presented with topic path
`<store topic>` or `<store topic>/<tag>` when it has a tag, QoS 1 (capped by the subscription), and
its application properties as User Properties (a RocketMQ producer's user properties, the
`traceparent` its client sent: messaging_processor/properties.py `application_pairs`). No trace
context the gateway derived or made is ever added.
"""

from __future__ import annotations

import base64
import json
import time

from messaging_processor import Message
from messaging_processor.client_events import EVENTS_TOPIC
from messaging_processor.dispatch import DISPATCHED_FROM
from messaging_processor.properties import (
    P_CONTENT_TYPE,
    P_CORRELATION,
    P_EXPIRY_AT,
    P_PATH,
    P_QOS,
    P_USER_PROPERTIES,
    application_pairs,
)
from messaging_processor.trace_context import TRACEPARENT

from .codec import PropertyId

P_TOPIC = P_PATH  # (the shared names: messaging_processor/properties.py)
P_RETAIN = "mqtt.retain"
P_RESPONSE_TOPIC = "mqtt.response_topic"
P_PAYLOAD_FORMAT = "mqtt.payload_format"
P_USER = P_USER_PROPERTIES
P_CLIENT = "mqtt.client_id"

MAX_STORE_TOPIC = 127
SYS_TOPIC = "%SYS%"  # `$SYS/...`: the broker's status topics (sys_topics.py)
# first levels that are the gateway's own topics: clients read them, only the gateway writes them
RESERVED_LEVELS = {"$SYS": SYS_TOPIC, "$events": EVENTS_TOPIC}
_OK = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_store_topic_cache: dict[str, str] = {}

_QOS_STR = ("0", "1", "2")


def store_topic_of_level(level: str) -> str:
    """The store topic for a first topic level (sanitized, see the module docstring; `$SYS` and
    `$events` are the gateway's own `%` topics, docs/system-topics.md)."""
    t = _store_topic_cache.get(level)
    if t is None:
        t = (
            RESERVED_LEVELS.get(level)
            or "".join(c if c in _OK else "_" for c in level)[:MAX_STORE_TOPIC]
            or "_"
        )
        if len(_store_topic_cache) < 100_000:
            _store_topic_cache[level] = t
    return t


_path_topic_cache: dict[str, str] = {}


def store_topic(path: str) -> str:
    """The store topic of a full MQTT topic path."""
    t = _path_topic_cache.get(path)
    if t is None:
        i = path.find("/")
        t = store_topic_of_level(path if i < 0 else path[:i])
        if len(_path_topic_cache) < 100_000:
            _path_topic_cache[path] = t
    return t


def to_message(path: str, payload: bytes, qos: int, retain: bool, props: dict | None) -> Message:
    """A store Message for a PUBLISH (or a will)."""
    p = {P_TOPIC: path, P_QOS: _QOS_STR[qos]}
    if retain:
        p[P_RETAIN] = "1"
    if props:
        v = props.get(PropertyId.CONTENT_TYPE)
        if v is not None:
            p[P_CONTENT_TYPE] = v
        v = props.get(PropertyId.RESPONSE_TOPIC)
        if v is not None:
            p[P_RESPONSE_TOPIC] = v
        v = props.get(PropertyId.CORRELATION_DATA)
        if v is not None:
            p[P_CORRELATION] = base64.b64encode(v).decode("ascii")
        v = props.get(PropertyId.PAYLOAD_FORMAT_INDICATOR)
        if v is not None:
            p[P_PAYLOAD_FORMAT] = str(v)
        v = props.get(PropertyId.MESSAGE_EXPIRY_INTERVAL)
        if v is not None:
            p[P_EXPIRY_AT] = str(int(time.time() * 1000) + v * 1000)
        v = props.get(PropertyId.USER_PROPERTY)
        if v:
            p[P_USER] = json.dumps([list(kv) for kv in v], separators=(",", ":"))
            for k, tp in v:
                if k == TRACEPARENT:
                    p[TRACEPARENT] = tp
                    break
    return Message(store_topic(path), payload, "", (), p)  # positional: cheaper than a keyword


def path_of(msg: Message) -> str:
    """The MQTT topic path a stored message is delivered under."""
    props = msg.properties
    path = props.get(P_TOPIC)
    if path:
        return path
    topic = props.get(DISPATCHED_FROM) or msg.topic  # (a session queue's copy: its original topic)
    return f"{topic}/{msg.tag}" if msg.tag else topic


def qos_of(msg: Message) -> int:
    """The QoS a stored message was published with (1 for messages from other protocols)."""
    q = msg.properties.get(P_QOS)
    return 1 if q is None else (ord(q[0]) - 48 if q in _QOS_STR else 1)


def v5_properties(msg: Message, now_ms: int | None = None) -> dict | None:
    """MQTT 5.0 PUBLISH properties of a stored message; None if none apply. An expired message
    gives the Message Expiry Interval 0 ... callers drop it (see `expired`)."""
    sp = msg.properties
    out: dict = {}
    v = sp.get(P_CONTENT_TYPE)
    if v is not None:
        out[PropertyId.CONTENT_TYPE] = v
    v = sp.get(P_RESPONSE_TOPIC)
    if v is not None:
        out[PropertyId.RESPONSE_TOPIC] = v
    v = sp.get(P_CORRELATION)
    if v is not None:
        out[PropertyId.CORRELATION_DATA] = base64.b64decode(v)
    v = sp.get(P_PAYLOAD_FORMAT)
    if v is not None:
        out[PropertyId.PAYLOAD_FORMAT_INDICATOR] = int(v)
    v = sp.get(P_EXPIRY_AT)
    if v is not None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        out[PropertyId.MESSAGE_EXPIRY_INTERVAL] = max(0, (int(v) - now + 999) // 1000)
    v = sp.get(P_USER)
    if v is not None:  # (MQTT's own, or an AMQP publish's headers: a client's traceparent among them)
        out[PropertyId.USER_PROPERTY] = pairs = [tuple(kv) for kv in json.loads(v)]
        v = sp.get(TRACEPARENT)
        if v is not None and all(kv[0] != TRACEPARENT for kv in pairs):  # (an AMQP byte-string one)
            pairs.append((TRACEPARENT, v))
    elif P_TOPIC not in sp and (pairs := application_pairs(sp)):  # a message of another protocol
        out[PropertyId.USER_PROPERTY] = pairs
    return out or None


def expired(sp: dict[str, str], now_ms: int) -> bool:
    v = sp.get(P_EXPIRY_AT)
    return v is not None and int(v) <= now_ms


def with_sub_ids(props: dict | None, ids: list[int] | None) -> dict | None:
    """5.0 PUBLISH properties plus the matching Subscription Identifiers (a new dict if any)."""
    if not ids:
        return props
    out = dict(props or {})
    out[PropertyId.SUBSCRIPTION_IDENTIFIER] = ids
    return out
