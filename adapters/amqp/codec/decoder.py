"""The incremental decoder: bytes in, events out, protocol errors as AMQPError.

    dec = Decoder()                      # server side: expects the protocol header first
    dec.feed(data)                       # whatever the socket returned: any split, many frames
    for event in dec:                    # ProtocolHeader, Method, Message, Heartbeat, ...
        ...

Frames are parsed in place from an immutable `bytes` buffer (a partial frame is kept as a list of
chunks and joined once, when enough bytes for the whole frame are there: the rule of
`adapters/receive_buffer.py`, shared with the MQTT decoder). Per channel the decoder follows
RabbitMQ's command assembler: after a content-bearing method (basic.publish on the server
side; deliver, get-ok, return on the client side) it expects one content header frame, then body
frames until `body_size` bytes have arrived (content.py). With `assemble=True` (default) the three are folded
into one `Message` event; with `assemble=False` they come out as Method, ContentHeader and
ContentBody events (to stream large bodies), the same checks applying. Hot paths: basic.publish
looks ahead for its header and single body frame in the same buffer and builds the Message at
once; basic.ack / nack / reject are decoded with one struct call. With decode_properties=False
the property bytes are kept as received and decoded on first access of `.properties`.

Compiled hot path: the per-frame parsing of those hot frames (basic.publish + its content header +
single body frame in the same buffer, basic.ack / nack / reject) is done by
`_decode_speedups.hot_frame` (hand-written, built by `uv sync` where there is a C compiler) unless
`GATEWAY_PURE_PYTHON=1`, in which case `_hot_frame` is None. Decoder stays this sans-IO class:
`next_event` hands the frame at its position to `_hot_frame`, which returns the event (and moves
`_pos`) only for a well-formed hot frame it decodes exactly as the code below would, and None
otherwise, with no state changed: the code below (the pure-Python reference) then takes the frame
and reports any error itself.

Checks and the reply code each gives (all are connection errors; "fatal" ones mean the byte stream
is out of sync, see AMQPError):

    wrong protocol header: ProtocolHeaderError, whose response() is our header    fatal
    frame-end octet is not 0xCE                                              501  fatal
    frame payload above frame_max - 8 (+ frame_size_fudge)                   501  fatal
    unknown frame type; heartbeat with a payload; method frame < 4 bytes;
      content header < 12 bytes; body size above max_body_size;
      body frame larger than the rest of the content                         501
    malformed method arguments or properties (truncated, trailing bytes,
      bad field table, invalid UTF-8 where RabbitMQ requires it)              502
    method the other side never sends (e.g. basic.deliver to a server),
      connection-class method on a channel other than 0                      503
    non-connection method on channel 0                                       504
    heartbeat on a channel other than 0; content frame on channel 0; content
      header or body without a content method before it; a method while a
      content is incomplete; content header of another class or weight != 0  505
    unknown class or method id (incl. RabbitMQ's basic.credit)               540

RabbitMQ answers 501 "cannot decode" for malformed method arguments; we use 502 SYNTAX_ERROR there.
`frame_max` starts at 4096 (the spec minimum, which applies until tune-ok) and a server-side decoder
applies the client's connection.tune-ok frame_max by itself (0 means no limit); the session may
set `frame_max` at any time. RabbitMQ accepts payloads up to frame_max itself (not frame_max - 8)
because many clients miscount: `frame_size_fudge` (default 8) does the same, 0 is strict.

After a fatal error the decoder is dead (feed and next_event raise it again). After another error
it goes to `closing` mode, as RabbitMQ does once it has sent connection.close: frames are still
framed and checked for sync, but everything except connection.close / close-ok on channel 0 is
dropped, so the session can wait for close-ok. The session sets `closing = True` itself when it
closes the connection for its own reasons.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from adapters.receive_buffer import ReceiveBuffer

from .arguments import decode_arguments
from .constants import (
    FRAME_MIN_SIZE,
    FRAME_SIZE_FUDGE,
    MAX_BODY_SIZE,
    PROTOCOL_HEADER,
    PROTOCOL_HEADER_0_9,
    ReplyCode,
)
from .content import Content, content_body, content_header
from .errors import MALFORMED, AMQPError, ProtocolHeaderError, frame_error, syntax_error, unexpected_frame
from .events import HEARTBEAT, Message, Method, ProtocolHeader
from .methods import (
    CLIENT_METHODS,
    METHODS,
    SERVER_METHODS,
    AMQPMethod,
    BasicAck,
    BasicNack,
    BasicPublish,
    BasicReject,
)
from .properties import decode_properties
from .wire import decode_speedups

_FRAME_HEAD = struct.Struct(">BHI").unpack_from
_FRAME_HEAD_KEY = struct.Struct(">BHII").unpack_from  # + (class_id << 16 | method_id)
_HEADER_FRAME = struct.Struct(">BHIHHQ").unpack_from  # frame head + class, weight, body size
_unpack_I = struct.Struct(">I").unpack_from
_unpack_QB = struct.Struct(">QB").unpack_from

_K_PUBLISH = (60 << 16) | 40
_K_ACK = (60 << 16) | 80
_K_NACK = (60 << 16) | 120
_K_REJECT = (60 << 16) | 90
_K_TUNE_OK = (10 << 16) | 31
_K_CLOSE = (10 << 16) | 50
_K_CLOSE_OK = (10 << 16) | 51
_ACK_LIKE = {_K_ACK: BasicAck, _K_NACK: BasicNack, _K_REJECT: BasicReject}
_SERVER_ACCEPTS = {k: c for k, c in METHODS.items() if k in CLIENT_METHODS}  # what clients send
_CLIENT_ACCEPTS = {k: c for k, c in METHODS.items() if k in SERVER_METHODS}  # what servers send


class Decoder(ReceiveBuffer):
    """Incremental AMQP 0-9-1 decoder for one connection (its input kept by `ReceiveBuffer`).

    role: "server" (decodes what clients send) or "client" (decodes what servers send).
    expect_header: the stream starts with the 8-byte protocol header (default: True for a server).
    frame_max: largest frame accepted (negotiated; 0 = no limit); starts at 4096.
    frame_size_fudge: bytes of slack on frame_max (RabbitMQ's 8; 0 for the strict spec limit).
    assemble: fold content methods, headers and bodies into Message events.
    decode_properties: decode the content properties (else only `raw_properties` is set).
    max_body_size: largest body_size accepted in a content header (501 above it).
    keep_body_size: bodies above this (and within max_body_size) are read and dropped, not kept:
      the Message comes out with an empty body and `dropped` = its size, so that the receiver can
      refuse it as RabbitMQ does above its configured max message size (channel error 406) without
      holding it in memory. None = max_body_size.
    """

    __slots__ = (
        "role",
        "_frame_max",
        "_frame_size_fudge",
        "_limit",
        "assemble",
        "decode_properties",
        "max_body_size",
        "keep_body_size",
        "closing",
        "_server",
        "_accept",
        "_expect_header",
        "_pending",
    )
    _error: AMQPError | None  # a fatal one stops the decoder; another is raised by the next call

    def __init__(
        self,
        role: str = "server",
        *,
        expect_header: bool | None = None,
        frame_max: int = FRAME_MIN_SIZE,
        frame_size_fudge: int = FRAME_SIZE_FUDGE,
        assemble: bool = True,
        decode_properties: bool = True,
        max_body_size: int = MAX_BODY_SIZE,
        keep_body_size: int | None = None,
    ) -> None:
        if role not in ("server", "client"):
            raise ValueError("role must be 'server' or 'client'")
        self.role = role
        self._frame_max = frame_max
        self._frame_size_fudge = frame_size_fudge
        self._limit = 0
        self._set_limit()
        self.assemble = assemble
        self.decode_properties = decode_properties
        self.max_body_size = max_body_size
        self.keep_body_size = max_body_size if keep_body_size is None else min(keep_body_size, max_body_size)
        self.closing = False
        self._server = role == "server"
        self._accept = _SERVER_ACCEPTS if self._server else _CLIENT_ACCEPTS
        self._expect_header = self._server if expect_header is None else expect_header
        self._pending: dict[int, Content] = {}
        super().__init__()

    @property
    def frame_max(self) -> int:
        """Largest frame accepted, frame header and end included (0: no limit)."""
        return self._frame_max

    @frame_max.setter
    def frame_max(self, value: int) -> None:
        self._frame_max = value
        self._set_limit()

    @property
    def frame_size_fudge(self) -> int:
        return self._frame_size_fudge

    @frame_size_fudge.setter
    def frame_size_fudge(self, value: int) -> None:
        self._frame_size_fudge = value
        self._set_limit()

    def _set_limit(self) -> None:
        fm = self._frame_max
        self._limit = fm - 8 + self._frame_size_fudge if fm else 0xFFFFFFFF  # largest payload

    # --- input (feed, buffered: ReceiveBuffer) ---------------------------------------------------

    @property
    def error(self) -> AMQPError | None:
        """The fatal error that stopped the decoder, if any."""
        return self._error if self._error is not None and self._error.fatal else None

    def in_content(self, channel: int) -> bool:
        """True while `channel` has a content method whose header or body is still incomplete."""
        return channel in self._pending

    def __iter__(self) -> Iterator[Any]:
        while True:
            event = self.next_event()
            if event is None:
                return
            yield event

    def events(self) -> list[Any]:
        """Every event the buffered bytes give, in order.

        An error raises here only if no event came before it; otherwise the events before it are
        returned and the error is raised by the next call (events, next_event or iteration).
        """
        out = []
        nxt = self.next_event
        try:
            while True:
                event = nxt()
                if event is None:
                    return out
                out.append(event)
        except AMQPError as e:
            if not out:
                raise
            self._error = e  # raised by the next call (and cleared then, unless fatal)
            return out

    def next_event(self) -> Any:
        """The next event, or None if more bytes are needed. Raises AMQPError."""
        if self._error is not None:
            e = self._error
            if not e.fatal:
                self._error = None
            raise e
        try:
            while True:
                if self._more and not self._join():
                    return None
                buf = self._buf
                pos = self._pos
                n = len(buf)
                if self._expect_header:
                    return self._protocol_header(buf, pos, n)
                if _hot_frame is not None and not self.closing:
                    event = _hot_frame(self, buf, pos, n)  # compiled: the hot frames, or None
                    if event is not None:
                        return event
                if n - pos >= 11:  # frame head + what is the class and method id of a method frame
                    ftype, channel, size, key = _FRAME_HEAD_KEY(buf, pos)
                elif n - pos >= 7:
                    ftype, channel, size = _FRAME_HEAD(buf, pos)
                    key = 0  # only a method frame too short to have ids can be this short
                else:
                    self._need = 7
                    return None
                if size > self._limit:
                    raise frame_error(
                        f"type {ftype}, frame of {size + 8} bytes exceeds frame_max {self._frame_max}",
                        channel,
                        fatal=True,
                    )
                end = pos + 7 + size
                if end >= n:
                    self._need = end + 1 - pos
                    return None
                if buf[end] != 0xCE:
                    raise frame_error(
                        f"type {ftype}, invalid frame end marker {buf[end]:#04x}", channel, fatal=True
                    )
                self._pos = end + 1
                if self.closing:
                    event = self._closing_frame(ftype, channel, buf, pos + 7, end)
                elif ftype == 1:
                    event = self._method(channel, key, buf, pos + 7, end)
                elif ftype == 3:
                    event = content_body(self, channel, buf, pos + 7, end)
                elif ftype == 2:
                    event = content_header(self, channel, buf, pos + 7, end)
                elif ftype == 8:
                    if size:
                        raise frame_error("heartbeat frame with a payload", channel)
                    if channel:
                        raise unexpected_frame(f"heartbeat frame on channel {channel}")
                    event = HEARTBEAT
                else:
                    raise frame_error(f"unknown frame type {ftype}", channel)
                if event is not None:
                    return event
        except AMQPError as e:
            if e.fatal:
                self._error = e
                self._drop()
            else:
                self.closing = True
                self._pending.clear()
            raise

    # --- frames ------------------------------------------------------------------------------------

    def _protocol_header(self, buf: bytes, pos: int, n: int) -> ProtocolHeader | None:
        have = min(n - pos, 8)
        if buf[pos : pos + min(have, 4)] != b"AMQP"[: min(have, 4)]:
            raise ProtocolHeaderError(buf[pos : pos + have])
        if have < 8:
            self._need = have + 1 if have < 4 else 8  # byte by byte while "AMQP" can be refused
            return None
        header = buf[pos : pos + 8]
        self._pos = pos + 8
        if header in (PROTOCOL_HEADER, PROTOCOL_HEADER_0_9):
            self._expect_header = False
            return ProtocolHeader((0, 9, 1) if header == PROTOCOL_HEADER else (0, 9, 0))
        raise ProtocolHeaderError(header)

    def _method(self, channel: int, key: int, buf: bytes, start: int, end: int) -> Any:
        if end - start < 4:
            raise frame_error("method frame without class and method ids", channel)
        pending = self._pending
        if pending and channel in pending:
            c = pending[channel]
            raise unexpected_frame(
                "expected content header, got non content header frame instead"
                if not c.header_seen
                else "expected content body, got non content body frame instead",
                c.class_id,
                c.method_id,
            )
        if key == _K_PUBLISH and channel and self._server:
            # hot path: basic.publish (ticket, exchange, routing key, bits)
            try:
                p = start + 6
                q = p + 1 + buf[p]
                exchange = buf[p + 1 : q].decode("utf-8", "surrogateescape")
                p = q + 1 + buf[q]
                routing_key = buf[q + 1 : p].decode("utf-8", "surrogateescape")
                bits = buf[p]
            except IndexError:
                p = -1
            if p + 1 != end:
                raise syntax_error("malformed basic.publish arguments", 60, 40)
            method: AMQPMethod = BasicPublish(exchange, routing_key, (bits & 1) != 0, (bits & 2) != 0)
            if self.assemble:
                # Look ahead: when the content header and the single body frame are already in the
                # buffer and regular, build the Message here; otherwise the general path takes the
                # frames one by one (and reports any error).
                h = end + 1
                n = len(buf)
                if h + 20 <= n:
                    ftype, ch, size, class_id, weight, body_size = _HEADER_FRAME(buf, h)
                    hend = h + 7 + size
                    limit = self._limit
                    if (
                        ftype == 2
                        and ch == channel
                        and 12 <= size <= limit
                        and hend < n
                        and buf[hend] == 0xCE
                        and class_id == 60
                        and not weight
                        and body_size <= self.keep_body_size
                    ):
                        b = hend + 1
                        if not body_size:
                            body = b""
                            bend = hend
                        elif b + 7 <= n:
                            ftype, ch, size = _FRAME_HEAD(buf, b)
                            bend = b + 7 + size
                            if (
                                ftype == 3
                                and ch == channel
                                and size == body_size
                                and size <= limit
                                and bend < n
                                and buf[bend] == 0xCE
                            ):
                                body = buf[b + 7 : bend]
                            else:
                                bend = 0
                        else:
                            bend = 0
                        if bend:
                            self._pos = bend + 1
                            raw = buf[h + 19 : hend]
                            if not self.decode_properties:
                                return Message(channel, method, None, body, raw)
                            try:
                                props = decode_properties(raw, 0, hend - h - 19)
                            except MALFORMED as e:
                                raise syntax_error(f"malformed content properties: {e}", 60, 40) from None
                            return Message(channel, method, props, body, raw)
                pending[channel] = Content(method, 60, 40)
                return None
            pending[channel] = Content(method, 60, 40)
            return Method(channel, method)
        ack_cls = _ACK_LIKE.get(key)
        if (
            ack_cls is not None
            and channel
            and end - start == 13
            and (self._server or ack_cls is not BasicReject)
        ):
            # hot path: basic.ack / nack / reject (delivery tag, bits)
            tag, bits = _unpack_QB(buf, start + 4)
            if ack_cls is BasicNack:
                return Method(channel, BasicNack(tag, (bits & 1) != 0, (bits & 2) != 0))
            return Method(channel, ack_cls(tag, (bits & 1) != 0))
        class_id = key >> 16
        method_id = key & 0xFFFF
        cls = self._accept.get(key)
        if cls is None:
            if key in METHODS:
                raise AMQPError(
                    ReplyCode.COMMAND_INVALID,
                    f"{METHODS[key].NAME} is not sent by a {'client' if self._server else 'server'}",
                    class_id=class_id,
                    method_id=method_id,
                )
            raise AMQPError(
                ReplyCode.NOT_IMPLEMENTED,
                f"unknown method class {class_id} method {method_id}",
                class_id=class_id,
                method_id=method_id,
            )
        if class_id == 10:
            if channel:
                raise AMQPError(
                    ReplyCode.COMMAND_INVALID,
                    f"{cls.NAME} on channel {channel} (connection methods use channel 0)",
                    class_id=class_id,
                    method_id=method_id,
                )
        elif not channel:
            raise AMQPError(
                ReplyCode.CHANNEL_ERROR,
                f"{cls.NAME} on channel 0",
                class_id=class_id,
                method_id=method_id,
            )
        try:
            method = decode_arguments(cls, buf, start + 4, end)
        except MALFORMED as e:
            raise syntax_error(f"malformed {cls.NAME} arguments: {e}", class_id, method_id) from None
        if cls.HAS_CONTENT:
            pending[channel] = Content(method, class_id, method_id)
            return None if self.assemble else Method(channel, method)
        if key == _K_TUNE_OK and self._server:
            self.frame_max = method.frame_max  # type: ignore[attr-defined]
        return Method(channel, method)

    def _closing_frame(self, ftype: int, channel: int, buf: bytes, start: int, end: int) -> Any:
        """While closing, only connection.close / close-ok come out; anything else is dropped."""
        if ftype != 1 or channel or end - start < 4:
            return None
        key = _unpack_I(buf, start)[0]
        if key != _K_CLOSE and key != _K_CLOSE_OK:
            return None
        try:
            return Method(0, decode_arguments(METHODS[key], buf, start + 4, end))
        except MALFORMED:
            return None


# the compiled per-frame parsing of the hot frames (see the module docstring), None for pure Python
_hot_frame: Any = None
if decode_speedups is not None:
    decode_speedups.bind_decoder(Message, Method, BasicPublish, BasicAck, BasicNack, BasicReject)
    _hot_frame = decode_speedups.hot_frame


def decode_frames(data: bytes, role: str = "server", **options: Any) -> list[Any]:
    """All events from `data` with a fresh Decoder (no protocol header expected unless given)."""
    options.setdefault("expect_header", False)
    options.setdefault("frame_max", 0)
    dec = Decoder(role, **options)
    dec.feed(data)
    return dec.events()
