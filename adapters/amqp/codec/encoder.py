"""Encoders: frames for any method, content, and fast paths for the per-message frames.

    encode_method(channel, method)                       one method frame (any method, both sides)
    encode_message(channel, method, properties, body, frame_max)
                                                         content method + header + body frames
    encode_deliver(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                   properties, body, frame_max)          basic.deliver + header + body, one bytes
    encode_basic_ack / encode_basic_nack                 publisher confirms (one frame each)
    HEARTBEAT, PROTOCOL_HEADER                           constant frames

`properties` is a BasicProperties, None (no property), or the already encoded flags + property
list as bytes (e.g. a received Message's `raw_properties`, forwarded without re-encoding). Bodies
are split into frames of at most frame_max - 8 bytes (frame_max 0: no limit); an empty body sends
no body frame. Short strings given as bytes are used as is (callers can cache encoded consumer
tags and names); str is encoded as UTF-8 (with surrogateescape, so decoded names round-trip).

`encode_deliver` (with its content tail and the properties) is compiled (`_encode_speedups.pyx`,
hand-written because it runs once per delivered message; built by `uv sync` where there is a C
compiler) unless `GATEWAY_PURE_PYTHON=1`; `py_encode_deliver` is the pure-Python reference it matches
byte for byte (and error for error: anything off the compiled fast path is handed to it).
"""

from __future__ import annotations

import struct
from typing import Any

from .arguments import encode_arguments
from .constants import DEFAULT_FRAME_MAX, PROTOCOL_HEADER
from .methods import AMQPMethod
from .properties import EMPTY_PROPERTIES, BasicProperties, encode_properties, py_encode_properties
from .wire import encode_speedups

__all__ = [
    "HEARTBEAT",
    "PROTOCOL_HEADER",
    "encode_basic_ack",
    "encode_basic_nack",
    "encode_body",
    "encode_content_header",
    "encode_deliver",
    "encode_frame",
    "encode_get_ok",
    "encode_message",
    "encode_method",
    "encode_publish",
    "encode_return",
]

HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"

_FRAME_HEAD = struct.Struct(">BHI").pack
_METHOD_HEAD = struct.Struct(">BHIHH").pack
_END_AND_HEADER = struct.Struct(">BBHIHHQ").pack  # frame end, then a content header frame's head
_END_AND_BODY = struct.Struct(">BBHI").pack  # frame end, then a body frame's head
_DELIVER_HEAD = struct.Struct(">BHIHHB").pack  # method frame head + class/method + consumer tag length
_Q_B_B = struct.Struct(">QBB").pack
_ACK = struct.Struct(">BHIHHQBB").pack  # whole basic.ack / nack frame


def _short(s: str | bytes) -> bytes:
    raw = s if type(s) is bytes else s.encode("utf-8", "surrogateescape") if type(s) is str else bytes(s)
    if len(raw) > 255:
        raise ValueError(f"short string of {len(raw)} bytes (more than 255)")
    return raw


def _props(properties: BasicProperties | bytes | None) -> bytes:
    if properties is None:
        return EMPTY_PROPERTIES
    if type(properties) is bytes:
        return properties
    return encode_properties(properties)  # type: ignore[arg-type]


def encode_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return b"".join((_FRAME_HEAD(frame_type, channel, len(payload)), payload, b"\xce"))


def encode_method(channel: int, method: AMQPMethod) -> bytes:
    """One method frame for `method` on `channel`."""
    args = encode_arguments(method)
    return b"".join(
        (_METHOD_HEAD(1, channel, 4 + len(args), method.CLASS_ID, method.METHOD_ID), args, b"\xce")
    )


def encode_content_header(
    channel: int, body_size: int, properties: BasicProperties | bytes | None = None, class_id: int = 60
) -> bytes:
    props = _props(properties)
    return b"".join(
        (
            _FRAME_HEAD(2, channel, 12 + len(props)),
            struct.pack(">HHQ", class_id, 0, body_size),
            props,
            b"\xce",
        )
    )


def encode_body(channel: int, body: bytes, frame_max: int = DEFAULT_FRAME_MAX) -> bytes:
    """The body frames for `body` (b"" for an empty body)."""
    size = len(body)
    if not size:
        return b""
    chunk = frame_max - 8 if frame_max else size
    if chunk <= 0:
        raise ValueError(f"frame_max {frame_max} leaves no room for a body")
    if size <= chunk:
        return b"".join((_FRAME_HEAD(3, channel, size), body, b"\xce"))
    return b"".join(_body_frames(channel, body, chunk))


def _body_frames(channel: int, body: bytes, chunk: int) -> list[Any]:
    """The body frames of `body` as parts to join (heads, views of `body`, frame ends)."""
    view = memoryview(body)
    out: list[Any] = []
    for i in range(0, len(body), chunk):
        part = view[i : i + chunk]
        out.append(_FRAME_HEAD(3, channel, len(part)))
        out.append(part)
        out.append(b"\xce")
    return out


def encode_message(
    channel: int,
    method: AMQPMethod,
    properties: BasicProperties | bytes | None,
    body: bytes,
    frame_max: int = DEFAULT_FRAME_MAX,
) -> bytes:
    """A content-bearing method (publish, deliver, get-ok, return) with its header and body frames."""
    if not method.HAS_CONTENT:
        raise ValueError(f"{method.NAME} does not carry content")
    return b"".join(
        (
            encode_method(channel, method),
            encode_content_header(channel, len(body), properties, method.CLASS_ID),
            encode_body(channel, body, frame_max),
        )
    )


def _content_tail(channel: int, props: bytes, body: bytes, frame_max: int) -> list[Any]:
    """Frame end of the method frame + header frame + body frames, as parts to join."""
    size = len(body)
    parts = [_END_AND_HEADER(0xCE, 2, channel, 12 + len(props), 60, 0, size), props]
    if not size:
        parts.append(b"\xce")
    elif not frame_max or size <= frame_max - 8:
        parts += (_END_AND_BODY(0xCE, 3, channel, size), body, b"\xce")
    else:
        parts.append(b"\xce")
        parts += _body_frames(channel, body, frame_max - 8)  # joined once, with the rest
    return parts


def encode_deliver(
    channel: int,
    consumer_tag: str | bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties: BasicProperties | bytes | None,
    body: bytes,
    frame_max: int = DEFAULT_FRAME_MAX,
) -> bytes:
    """basic.deliver + content header + body frame(s), as one bytes object."""
    ct = consumer_tag if type(consumer_tag) is bytes else _short(consumer_tag)
    ex = exchange if type(exchange) is bytes else _short(exchange)
    rk = routing_key if type(routing_key) is bytes else _short(routing_key)
    lc, le, lr = len(ct), len(ex), len(rk)
    if lc > 255 or le > 255 or lr > 255:
        raise ValueError("short string of more than 255 bytes")
    props = (
        properties
        if type(properties) is bytes
        else EMPTY_PROPERTIES
        if properties is None
        else py_encode_properties(properties)  # type: ignore[arg-type]
    )
    return b"".join(
        [
            _DELIVER_HEAD(1, channel, 16 + lc + le + lr, 60, 60, lc),
            ct,
            _Q_B_B(delivery_tag, 1 if redelivered else 0, le),
            ex,
            bytes((lr,)),
            rk,
            *_content_tail(channel, props, body, frame_max),
        ]
    )


def encode_get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    message_count: int,
    properties: BasicProperties | bytes | None,
    body: bytes,
    frame_max: int = DEFAULT_FRAME_MAX,
) -> bytes:
    """basic.get-ok + content header + body frame(s)."""
    ex = _short(exchange)
    rk = _short(routing_key)
    args = b"".join(
        (struct.pack(">QBB", delivery_tag, 1 if redelivered else 0, len(ex)), ex, bytes((len(rk),)), rk)
    )
    return b"".join(
        [
            _METHOD_HEAD(1, channel, 4 + len(args) + 4, 60, 71),
            args,
            struct.pack(">I", message_count),
            *_content_tail(channel, _props(properties), body, frame_max),
        ]
    )


def encode_return(
    channel: int,
    reply_code: int,
    reply_text: str | bytes,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties: BasicProperties | bytes | None,
    body: bytes,
    frame_max: int = DEFAULT_FRAME_MAX,
) -> bytes:
    """basic.return + content header + body frame(s) (e.g. 312 NO_ROUTE for a mandatory publish)."""
    txt, ex, rk = _short(reply_text), _short(exchange), _short(routing_key)
    args = b"".join(
        (
            struct.pack(">HB", reply_code, len(txt)),
            txt,
            bytes((len(ex),)),
            ex,
            bytes((len(rk),)),
            rk,
        )
    )
    return b"".join(
        [
            _METHOD_HEAD(1, channel, 4 + len(args), 60, 50),
            args,
            *_content_tail(channel, _props(properties), body, frame_max),
        ]
    )


def encode_publish(
    channel: int,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties: BasicProperties | bytes | None,
    body: bytes,
    frame_max: int = DEFAULT_FRAME_MAX,
    mandatory: bool = False,
    immediate: bool = False,
) -> bytes:
    """Client side: basic.publish + content header + body frame(s) (for tests and benchmarks)."""
    ex, rk = _short(exchange), _short(routing_key)
    method = b"".join(
        (
            b"\x00\x00",
            bytes((len(ex),)),
            ex,
            bytes((len(rk),)),
            rk,
            bytes(((1 if mandatory else 0) | (2 if immediate else 0),)),
        )
    )
    return b"".join(
        [
            _METHOD_HEAD(1, channel, 4 + len(method), 60, 40),
            method,
            *_content_tail(channel, _props(properties), body, frame_max),
        ]
    )


def encode_basic_ack(channel: int, delivery_tag: int, multiple: bool = False) -> bytes:
    """basic.ack frame (server: publisher confirm; client: consumer ack)."""
    return _ACK(1, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0, 0xCE)


def encode_basic_nack(
    channel: int, delivery_tag: int, multiple: bool = False, requeue: bool = False
) -> bytes:
    """basic.nack frame (server: negative publisher confirm, requeue is ignored by clients)."""
    return _ACK(1, channel, 13, 60, 120, delivery_tag, (1 if multiple else 0) | (2 if requeue else 0), 0xCE)


py_encode_deliver = encode_deliver
if encode_speedups is not None:
    encode_speedups.bind_encoder(py_encode_deliver)
    encode_deliver = encode_speedups.encode_deliver  # noqa: F811 - the compiled twin of the above
