"""Content frames: a content method's header and body frames, checked and assembled per channel
as RabbitMQ's command assembler does (decoder.py's module docstring lists the checks).

`content_header` and `content_body` are handed the decoder (typed by `Assembly`: its settings and
its per-channel `Content` in progress) and return the event the frame completes, or None."""

from __future__ import annotations

import struct
from typing import Any, Protocol

from .constants import ReplyCode
from .errors import MALFORMED, AMQPError, frame_error, syntax_error, unexpected_frame
from .events import ContentBody, ContentHeader, Message
from .methods import AMQPMethod
from .properties import BasicProperties, decode_properties

_CONTENT_HEAD = struct.Struct(">HHQ").unpack_from


class Content:
    """Per-channel state of a content in progress."""

    __slots__ = (
        "method",
        "class_id",
        "method_id",
        "header_seen",
        "remaining",
        "properties",
        "raw",
        "parts",
        "dropped",
    )

    def __init__(self, method: AMQPMethod, class_id: int, method_id: int) -> None:
        self.method = method
        self.class_id = class_id
        self.method_id = method_id
        self.header_seen = False
        self.remaining = 0
        self.properties: BasicProperties | None = None
        self.raw = b""
        self.parts: list[Any] = []
        self.dropped = 0  # body_size of a body counted but not kept (above keep_body_size)


class Assembly(Protocol):
    """What the content frames use of the decoder."""

    assemble: bool
    decode_properties: bool
    max_body_size: int
    keep_body_size: int
    _pending: dict[int, Content]


def content_header(dec: Assembly, channel: int, buf: bytes, start: int, end: int) -> Any:
    c = dec._pending.get(channel) if channel else None
    if c is None or c.header_seen:
        if not channel:
            raise unexpected_frame("content header frame on channel 0")
        if c is None:
            raise unexpected_frame("expected method frame, got non method frame instead")
        raise unexpected_frame(
            "expected content body, got non content body frame instead", c.class_id, c.method_id
        )
    if end - start < 12:
        raise frame_error("content header frame shorter than 12 bytes", channel)
    class_id, weight, body_size = _CONTENT_HEAD(buf, start)
    if class_id != c.class_id or weight:
        raise unexpected_frame(
            f"expected content header for class {c.class_id}, got one for class {class_id} instead"
            if not weight
            else f"expected content header for class {c.class_id}, got non content header frame instead",
            c.class_id,
            c.method_id,
        )
    if body_size > dec.max_body_size:
        raise AMQPError(
            ReplyCode.FRAME_ERROR,
            f"content body size {body_size} exceeds maximum allowed size {dec.max_body_size}",
            class_id=c.class_id,
            method_id=c.method_id,
        )
    raw = buf[start + 12 : end]
    props = None
    if dec.decode_properties:
        try:
            props = decode_properties(raw, 0, len(raw))
        except MALFORMED as e:
            raise syntax_error(f"malformed content properties: {e}", c.class_id, c.method_id) from None
    if dec.assemble:
        if not body_size:
            del dec._pending[channel]
            return Message(channel, c.method, props, b"", raw)
        c.header_seen = True
        c.remaining = body_size
        c.properties = props
        c.raw = raw
        if body_size > dec.keep_body_size:
            c.dropped = body_size
        return None
    if body_size:
        c.header_seen = True
        c.remaining = body_size
    else:
        del dec._pending[channel]
    return ContentHeader(channel, class_id, body_size, props, raw)


def content_body(dec: Assembly, channel: int, buf: bytes, start: int, end: int) -> Any:
    c = dec._pending.get(channel) if channel else None
    if c is None or not c.header_seen:
        if not channel:
            raise unexpected_frame("content body frame on channel 0")
        if c is None:
            raise unexpected_frame("expected method frame, got non method frame instead")
        raise unexpected_frame(
            f"expected content header for class {c.class_id}, got non content header frame instead",
            c.class_id,
            c.method_id,
        )
    size = end - start
    remaining = c.remaining - size
    if remaining < 0:
        raise AMQPError(
            ReplyCode.FRAME_ERROR,
            "content body frame exceeds remaining content size",
            class_id=c.class_id,
            method_id=c.method_id,
        )
    c.remaining = remaining
    if not dec.assemble:
        if not remaining:
            del dec._pending[channel]
        return ContentBody(channel, buf[start:end])
    if remaining:
        if not c.dropped:
            c.parts.append(memoryview(buf)[start:end])
        return None
    del dec._pending[channel]
    if c.dropped:
        return Message(channel, c.method, c.properties, b"", c.raw, c.dropped)
    if c.parts:
        c.parts.append(memoryview(buf)[start:end])
        body = b"".join(c.parts)
    else:
        body = buf[start:end]
    return Message(channel, c.method, c.properties, body, c.raw)
