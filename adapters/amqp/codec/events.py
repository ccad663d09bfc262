"""What the Decoder yields: one small slotted class per kind of event.

ContentHeader and Message are hand-written (not dataclasses) so that `properties` can be decoded
lazily from `raw_properties`; they compare equal on channel, method/ids, raw properties and body.
"""

from __future__ import annotations

from dataclasses import dataclass

from .constants import ReplyCode
from .errors import AMQPError
from .methods import AMQPMethod
from .properties import EMPTY_PROPERTIES, BasicProperties, decode_properties


@dataclass(slots=True)
class ProtocolHeader:
    """The client's protocol header was accepted (0-9-1, or 0-9 which is handled as 0-9-1)."""

    version: tuple[int, int, int] = (0, 9, 1)


@dataclass(slots=True)
class Method:
    """A method frame (for content-bearing methods only when the decoder does not assemble)."""

    channel: int
    method: AMQPMethod


class _LazyProperties:
    """`properties` decoded from `raw_properties` on first access when the decoder did not."""

    __slots__ = ("raw_properties", "_properties")

    raw_properties: bytes
    _properties: BasicProperties | None

    @property
    def properties(self) -> BasicProperties:
        """The decoded properties; AMQPError 502 if they are malformed (lazy decoding only)."""
        props = self._properties
        if props is None:
            try:
                props = decode_properties(self.raw_properties)
            except (ValueError, RecursionError) as e:
                raise AMQPError(ReplyCode.SYNTAX_ERROR, f"malformed content properties: {e}") from None
            self._properties = props
        return props


class ContentHeader(_LazyProperties):
    """A content header frame (only when the decoder does not assemble).

    `raw_properties` is the property flags + list exactly as received (forward it as is to avoid
    re-encoding); `properties` is decoded by the decoder (default) or on first access.
    """

    __slots__ = ("channel", "class_id", "body_size")

    def __init__(
        self,
        channel: int,
        class_id: int,
        body_size: int,
        properties: BasicProperties | None = None,
        raw_properties: bytes = EMPTY_PROPERTIES,
    ) -> None:
        self.channel = channel
        self.class_id = class_id
        self.body_size = body_size
        self._properties = properties
        self.raw_properties = raw_properties

    def __repr__(self) -> str:
        return (
            f"ContentHeader(channel={self.channel}, class_id={self.class_id}, "
            f"body_size={self.body_size}, raw_properties={self.raw_properties!r})"
        )

    def __eq__(self, other: object) -> bool:
        if type(other) is not ContentHeader:
            return NotImplemented
        return (self.channel, self.class_id, self.body_size, self.raw_properties) == (
            other.channel,
            other.class_id,
            other.body_size,
            other.raw_properties,
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(slots=True)
class ContentBody:
    """A content body frame (only when the decoder does not assemble)."""

    channel: int
    data: bytes


@dataclass(slots=True)
class Heartbeat:
    """A heartbeat frame (always on channel 0)."""


class Message(_LazyProperties):
    """A content-bearing method with its header and whole body (the decoder assembles by default).

    `method` is a BasicPublish on the server side (BasicDeliver, BasicGetOk or BasicReturn on the
    client side); `raw_properties` and `properties` as in ContentHeader.
    """

    __slots__ = ("channel", "method", "body", "dropped")

    def __init__(
        self,
        channel: int,
        method: AMQPMethod,
        properties: BasicProperties | None,
        body: bytes,
        raw_properties: bytes = EMPTY_PROPERTIES,
        dropped: int = 0,
    ) -> None:
        self.channel = channel
        self.method = method
        self._properties = properties
        self.body = body
        self.raw_properties = raw_properties
        self.dropped = dropped  # a body the decoder read but did not keep (see Decoder): its size

    def __repr__(self) -> str:
        return (
            f"Message(channel={self.channel}, method={self.method!r}, "
            f"raw_properties={self.raw_properties!r}, body={self.body!r})"
        )

    def __eq__(self, other: object) -> bool:
        if type(other) is not Message:
            return NotImplemented
        return (self.channel, self.method, self.raw_properties, self.body) == (
            other.channel,
            other.method,
            other.raw_properties,
            other.body,
        )

    __hash__ = None  # type: ignore[assignment]


HEARTBEAT = Heartbeat()  # the decoder yields this one instance

Event = ProtocolHeader | Method | ContentHeader | ContentBody | Heartbeat | Message
