"""The one exception type for protocol errors, with the close frame that answers it."""

from __future__ import annotations

import struct

from .constants import FRAME_END, PROTOCOL_HEADER, ReplyCode, is_soft_error

# what a malformed argument list or property list raises (RecursionError: absurdly nested tables)
MALFORMED = (ValueError, IndexError, struct.error, RecursionError)

_CLOSE = struct.Struct(">BHIHHHB")  # frame header + class/method id + reply-code + shortstr length


class AMQPError(Exception):
    """An AMQP exception: a reply code, a text and the method that caused it.

    Raised by the codec for what it detects (always connection errors: 501 framing, 502 malformed
    arguments, 503/504/505 frame sequence, 540 unknown method) and meant to be raised by the
    session layer too (404 NOT_FOUND, 406 PRECONDITION_FAILED, 530 NOT_ALLOWED, ...).

    - `soft`: a channel error (311, 312, 313, 403, 404, 405, 406) on a channel other than 0: answer
      with channel.close on `channel`; anything else closes the connection with connection.close.
    - `response()`: the close frame to send (`reply_text` is "NAME - text", as RabbitMQ words it).
    - `fatal`: the decoder lost sync with the byte stream (bad frame end, oversized frame,
      bad protocol header): send `response()` and close the socket without waiting for
      close-ok. A non-fatal connection error leaves the decoder in `closing` mode so that the
      client's connection.close-ok can still be read.
    """

    def __init__(
        self,
        code: int,
        text: str = "",
        *,
        class_id: int = 0,
        method_id: int = 0,
        channel: int = 0,
        fatal: bool = False,
    ) -> None:
        self.code = ReplyCode(code)
        self.text = text
        self.class_id = class_id
        self.method_id = method_id
        self.channel = channel
        self.fatal = fatal
        super().__init__(self.reply_text)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.code.name} {int(self.code)}, {self.text!r}, "
            f"channel={self.channel}, method=({self.class_id}, {self.method_id}), fatal={self.fatal})"
        )

    @property
    def soft(self) -> bool:
        """True if only the channel is closed (channel.close), False for connection.close."""
        return self.channel != 0 and is_soft_error(self.code)

    @property
    def reply_text(self) -> str:
        text = f"{self.code.name} - {self.text}" if self.text else self.code.name
        raw = text.encode("utf-8", "surrogateescape")
        if len(raw) > 255:
            text = raw[:255].decode("utf-8", "ignore")
        return text

    def response(self) -> bytes:
        """connection.close (channel 0) or channel.close (self.channel) for this error."""
        text = self.reply_text.encode("utf-8", "surrogateescape")
        channel, cls = (self.channel, 20) if self.soft else (0, 10)
        size = 4 + 2 + 1 + len(text) + 4
        return b"".join(
            (
                _CLOSE.pack(1, channel, size, cls, 40 if cls == 20 else 50, self.code, len(text)),
                text,
                struct.pack(">HHB", self.class_id, self.method_id, FRAME_END),
            )
        )


class ProtocolHeaderError(AMQPError):
    """The connection did not start with the AMQP 0-9-1 protocol header.

    The spec's answer (and RabbitMQ's) is to send our own protocol header and close the socket:
    `response()` returns PROTOCOL_HEADER. `received` holds the bytes that were refused.
    """

    def __init__(self, received: bytes) -> None:
        super().__init__(ReplyCode.FRAME_ERROR, f"bad protocol header {received!r}", fatal=True)
        self.received = received

    def response(self) -> bytes:
        return PROTOCOL_HEADER


def frame_error(text: str, channel: int = 0, *, fatal: bool = False) -> AMQPError:
    """501 FRAME_ERROR; `fatal` when the stream cannot be framed any more."""
    return AMQPError(ReplyCode.FRAME_ERROR, text, channel=channel, fatal=fatal)


def syntax_error(text: str, class_id: int = 0, method_id: int = 0) -> AMQPError:
    return AMQPError(ReplyCode.SYNTAX_ERROR, text, class_id=class_id, method_id=method_id)


def unexpected_frame(text: str, class_id: int = 0, method_id: int = 0) -> AMQPError:
    return AMQPError(ReplyCode.UNEXPECTED_FRAME, text, class_id=class_id, method_id=method_id)
