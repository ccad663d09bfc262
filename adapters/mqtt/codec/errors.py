"""The one exception the codec raises, and what the session layer should do about it."""

from __future__ import annotations

from enum import Enum

from .constants import MQTT_5, V5_TO_V3_CONNACK, ReasonCode


class ErrorAction(Enum):
    """What the server (or client) should do when a received packet is rejected."""

    CONNACK = "connack"  # answer the CONNECT with a refusing CONNACK, then close
    DISCONNECT = "disconnect"  # MQTT 5.0: send DISCONNECT with the reason code, then close
    CLOSE = "close"  # close the network connection without sending anything


class MQTTCodecError(Exception):
    """A received byte stream broke the protocol.

    `reason` is always an MQTT 5.0 reason code (0x81 Malformed Packet, 0x82 Protocol Error,
    0x95 Packet too large, 0x84 Unsupported protocol version, 0x85 Client identifier not valid, ...),
    whatever the version spoken: for 3.1/3.1.1, `return_code` gives the CONNACK return code when
    there is one. `version` is the protocol level the answer must be encoded in (0 if not known,
    e.g. the first packet was not a CONNECT) and `in_connect` tells that the error was found while
    decoding a CONNECT (so a CONNACK, not a DISCONNECT, is the answer). `action` and `response()`
    derive the right reaction from those:

    - error in a CONNECT, 5.0: CONNACK with the reason code (0x80 and above), then close;
    - error in a CONNECT, 3.1/3.1.1: CONNACK with return code 0x01 (unacceptable protocol version)
      or 0x02 (identifier rejected) where one applies, otherwise just close (3.1.1 has no CONNACK
      code for a malformed CONNECT);
    - any later error, 5.0: DISCONNECT with the reason code, then close;
    - any later error, 3.1/3.1.1, or an unknown version: close.
    """

    def __init__(
        self,
        reason: int,
        message: str = "",
        *,
        version: int | None = None,
        in_connect: bool = False,
    ) -> None:
        super().__init__(message or ReasonCode(reason).name)
        self.reason = ReasonCode(reason)
        self.message = message
        self.version = version
        self.in_connect = in_connect

    def __repr__(self) -> str:
        return (
            f"MQTTCodecError({self.reason.name} 0x{self.reason:02X}, {self.message!r}, "
            f"version={self.version}, in_connect={self.in_connect})"
        )

    @property
    def action(self) -> ErrorAction:
        if self.version == MQTT_5:
            return ErrorAction.CONNACK if self.in_connect else ErrorAction.DISCONNECT
        if self.version in (3, 4) and self.in_connect and self.reason in V5_TO_V3_CONNACK:
            return ErrorAction.CONNACK
        return ErrorAction.CLOSE

    @property
    def return_code(self) -> int | None:
        """The code for the CONNACK (5.0 reason code or 3.1.1 return code), or None."""
        if self.action is not ErrorAction.CONNACK:
            return None
        if self.version == MQTT_5:
            return int(self.reason)
        return int(V5_TO_V3_CONNACK[self.reason])

    def response(self) -> bytes:
        """The bytes to send before closing (a CONNACK or a DISCONNECT), or b"" to just close."""
        action = self.action
        if action is ErrorAction.CONNACK:
            if self.version == MQTT_5:
                return bytes((0x20, 3, 0, self.reason, 0))
            return bytes((0x20, 2, 0, self.return_code or 0))
        if action is ErrorAction.DISCONNECT:
            return bytes((0xE0, 2, self.reason, 0))
        return b""
