"""AMQP <-> store message mapping and store names (see docs/amqp.md).

A message routed to queue Q is stored on Q's store topic (`store_name`) as one store Message:

    body                  the body
    tag                   the routing key (when the exchange is not the default one and the key
                          is a valid tag: not blank, no '|' or control characters)
    amqp.exchange         the exchange it was published to (absent for the default exchange)
    amqp.rk               the routing key, when it is not the tag
    amqp.props            the content header's property flags + list exactly as received, as a
                          latin-1 string (lossless; forwarded to AMQP consumers as is)
    amqp.expires_at       absolute expiry (epoch ms) from the queue's x-message-ttl and/or the
                          message's `expiration`
    amqp.content_type, amqp.correlation_id, amqp.reply_to, amqp.message_id
                          readable copies for other protocols, when set
    traceparent           a copy of the `traceparent` header (the W3C trace context other protocols
                          deliver and the processor traces); the content header itself is delivered
                          exactly as published, and no trace context is ever added to it

A message that entered through another protocol (no amqp.exchange / amqp.rk) is presented to AMQP
consumers with exchange "", routing key = its MQTT path with '/' -> '.', else its tag, else its
topic, and synthesized properties: delivery_mode 2, message_id, timestamp, content_type from
mqtt.content_type and the store properties as string headers (`__`-prefixed internal ones
excepted: a trace context the gateway made is not delivered).
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from messaging_processor import Message
from messaging_processor.properties import P_CONTENT_TYPE, P_PATH
from messaging_processor.trace_context import TRACEPARENT

from .codec import BasicProperties, Timestamp, decode_properties, encode_properties

P_EXCHANGE = "amqp.exchange"
P_RK = "amqp.rk"
P_PROPS = "amqp.props"
P_EXPIRES = "amqp.expires_at"
READABLE = (
    ("content_type", "amqp.content_type"),
    ("correlation_id", "amqp.correlation_id"),
    ("reply_to", "amqp.reply_to"),
    ("message_id", "amqp.message_id"),
)
# property flag bits (first flags word) of the readable ones, and of expiration / headers / user_id
READABLE_FLAGS = 0x8000 | 0x0400 | 0x0200 | 0x0080
FLAG_HEADERS = 0x2000
FLAG_EXPIRATION = 0x0100
FLAG_USER_ID = 0x0010
EMPTY_PROPS = b"\x00\x00"

_IDENTITY = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
_OK = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_tag_ok: dict[str, bool] = {}


def store_name(vhost: str, queue: str) -> str:
    """The store topic (and consumer group) of a queue: the queue name itself in vhost "/" when it
    is 1-100 of [A-Za-z0-9_.-]; else `amqp|<sanitized vhost.queue>|<12 hex of its SHA-1>`."""
    if vhost == "/" and _IDENTITY.fullmatch(queue):
        return queue
    full = queue if vhost == "/" else f"{vhost}.{queue}"
    h = hashlib.sha1(f"{vhost}\x00{queue}".encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return "amqp|" + "".join(c if c in _OK else "_" for c in full)[:100] + "|" + h


def tag_for(routing_key: str) -> str:
    """The store tag for a routing key ("" when it is not a valid tag)."""
    ok = _tag_ok.get(routing_key)
    if ok is None:
        ok = bool(routing_key.strip()) and "|" not in routing_key and not _CONTROL.search(routing_key)
        if len(_tag_ok) < 65536:
            _tag_ok[routing_key] = ok
    return routing_key if ok else ""


def flags_of(raw: bytes) -> int:
    return (raw[0] << 8) | raw[1] if len(raw) >= 2 else 0


def base_properties(exchange: str, routing_key: str, raw: bytes, props: BasicProperties | None) -> dict:
    """Store properties shared by every queue copy of one publish (`props`: decoded, when the
    readable ones are present)."""
    p: dict[str, str] = {}
    tag = tag_for(routing_key) if exchange else ""
    if exchange:
        p[P_EXCHANGE] = exchange
    if routing_key != tag or not exchange:
        p[P_RK] = routing_key
    if raw != EMPTY_PROPS:
        p[P_PROPS] = raw.decode("latin-1")
    if props is not None:
        for attr, name in READABLE:
            v = getattr(props, attr)
            if v is not None:
                p[name] = v
    if _TRACEPARENT_BYTES in raw:  # (a substring test first: decoding the headers costs more)
        tp = headers_of(raw).get(TRACEPARENT)
        if isinstance(tp, bytes):
            tp = tp.decode("utf-8", "replace")
        if isinstance(tp, str):
            p[TRACEPARENT] = tp
    return p


_TRACEPARENT_BYTES = TRACEPARENT.encode()


def parse_expiration(value: str) -> int | None:
    """The per-message TTL (ms) of an `expiration` property; None if it is not a valid one."""
    if not value.isdigit() or len(value) > 19:
        return None
    return int(value)


def is_amqp(m: Message) -> bool:
    p = m.properties
    return P_EXCHANGE in p or P_RK in p


def present(m: Message) -> tuple[str, str, bytes]:
    """(exchange, routing key, raw properties) to deliver a stored message with."""
    p = m.properties
    if P_EXCHANGE in p or P_RK in p:
        raw = p.get(P_PROPS)
        rk = p.get(P_RK)
        return (
            p.get(P_EXCHANGE, ""),
            m.tag if rk is None else rk,
            raw.encode("latin-1") if raw else EMPTY_PROPS,
        )
    path = p.get(P_PATH)
    rk = path.replace("/", ".") if path else (m.tag or m.topic)
    headers: dict[str, Any] = {k: v for k, v in p.items() if not k.startswith("__")}
    props = BasicProperties(
        content_type=p.get(P_CONTENT_TYPE) or p.get("ce_datacontenttype"),
        headers=headers or None,
        delivery_mode=2,
        message_id=m.message_id or None,
        timestamp=(m.born_timestamp or m.store_timestamp) // 1000 or None,
    )
    return "", rk[:255], encode_properties(props)


def expires_at(m: Message) -> int:
    v = m.properties.get(P_EXPIRES)
    return int(v) if v else 0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def dead_letter_properties(
    raw: bytes, queue: str, reason: str, exchange: str, routing_keys: list[str]
) -> bytes:
    """The properties of a dead-lettered copy, with RabbitMQ's x-death bookkeeping: one entry per
    (queue, reason) with a count, newest first, x-first-death-* and x-last-death-* headers; the
    expiration is removed (kept as original-expiration in the entry)."""
    props = decode_properties(raw) if raw != EMPTY_PROPS else BasicProperties()
    headers = dict(props.headers or {})
    deaths = [dict(d) for d in headers.get("x-death") or () if isinstance(d, dict)]
    entry: dict[str, Any] | None = None
    for i, d in enumerate(deaths):
        if d.get("queue") == queue and d.get("reason") == reason:
            entry = deaths.pop(i)
            entry["count"] = int(entry.get("count", 0)) + 1
            entry["time"] = Timestamp(int(time.time()))
            break
    if entry is None:
        entry = {
            "count": 1,
            "reason": reason,
            "queue": queue,
            "time": Timestamp(int(time.time())),
            "exchange": exchange,
            "routing-keys": list(routing_keys),
        }
    if props.expiration is not None:
        entry["original-expiration"] = props.expiration
        props.expiration = None
    deaths.insert(0, entry)
    headers["x-death"] = deaths
    headers.setdefault("x-first-death-reason", reason)
    headers.setdefault("x-first-death-queue", queue)
    headers.setdefault("x-first-death-exchange", exchange)
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = queue
    headers["x-last-death-exchange"] = exchange
    props.headers = headers
    return encode_properties(props)


def headers_of(raw: bytes) -> dict[str, Any]:
    """The headers table of raw properties ({} when none; malformed ones give {})."""
    if not flags_of(raw) & FLAG_HEADERS:
        return {}
    try:
        return decode_properties(raw).headers or {}
    except ValueError:
        return {}
