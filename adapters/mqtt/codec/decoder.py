"""The incremental decoder: bytes in, packet dataclasses out, protocol errors as MQTTCodecError.

    dec = Decoder()                      # server side; the first packet must be a CONNECT
    dec.feed(data)                       # whatever the socket returned: any split, many packets
    for packet in dec:                   # every complete packet, in order
        ...                              # dec.version is known once the CONNECT came out

A packet is decoded in one pass over an immutable `bytes` buffer with integer indexing and slicing:
no per-byte loops over data, no copies but the final ones (topic string, payload bytes). Bytes fed
while no partial frame is pending are parsed in place; a partial frame is kept as a list of chunks
and joined only once enough bytes for the whole frame have arrived (so a large payload arriving in
many reads costs one join, not a quadratic re-concatenation): `adapters/receive_buffer.py`'s rule,
shared with the AMQP decoder.

Limits and checks: the maximum packet size (whole packet, fixed header included) is enforced as
soon as the fixed header is complete, before the body is buffered (0x95 Packet too large);
a Remaining Length of more than 4 bytes or not minimally encoded is Malformed; the fixed-header
flags are checked for every type (PUBREL/SUBSCRIBE/UNSUBSCRIBE 0b0010, others 0, PUBLISH QoS 3 or
DUP with QoS 0 Malformed); every declared length must fit and the fields must use the Remaining
Length exactly; strings are validated as described in wire.py; topic names and filters as in
topics.py (the subscription packets: subscribe.py). After an error the decoder is dead: `feed` and
`next_packet` raise the same error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from adapters.receive_buffer import ReceiveBuffer

from .constants import (
    MAX_PACKET_SIZE,
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    PacketType,
    ReasonCode,
)
from .errors import MQTTCodecError
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
    Will,
)
from .properties import WILL, PropertyId, decode_properties
from .subscribe import decode_suback, decode_subscribe, decode_unsuback, decode_unsubscribe
from .wire import check_text, decode_bin, decode_str, malformed, protocol_error, reason_code

_TOPIC_ALIAS = PropertyId.TOPIC_ALIAS
_SUBID = PropertyId.SUBSCRIPTION_IDENTIFIER

# Packet types each side may receive (5.0 adds AUTH both ways and DISCONNECT server -> client).
_SERVER_RECEIVES = frozenset({1, 3, 4, 5, 6, 7, 8, 10, 12, 14, 15})
_CLIENT_RECEIVES = frozenset({2, 3, 4, 5, 6, 7, 9, 11, 13, 14, 15})
_FLAGS_0010 = frozenset({6, 8, 10})  # PUBREL, SUBSCRIBE, UNSUBSCRIBE
_ACKS = {4: Puback, 5: Pubrec, 6: Pubrel, 7: Pubcomp}


ALL_VERSIONS = frozenset((MQTT_3_1, MQTT_3_1_1, MQTT_5))  # shared by every decoder that takes them all


class Decoder(ReceiveBuffer):
    """Incremental MQTT decoder for one connection (its input kept by `ReceiveBuffer`).

    role: "server" (decodes what clients send; the first packet must be CONNECT, and it sets
      `version`) or "client" (decodes what servers send; pass the `version` the client connects with;
      the first packet must be CONNACK, or AUTH in 5.0).
    version: for a server, None (learn it from CONNECT); passing a version starts the decoder as if
      the CONNECT had been handled already.
    max_packet_size: largest accepted packet in bytes, fixed header included (5.0 Maximum Packet
      Size; also enforced for 3.1/3.1.1, where the answer is to close).
    supported_versions: protocol levels accepted in CONNECT (others: 0x01 / 0x84 CONNACK).
    strict_utf8: also reject the code points the spec says SHOULD NOT be sent (see wire.py).
    topic_alias_maximum: the Topic Alias Maximum this side announced (server: in CONNACK); inbound
      aliases above it (or 0) are 0x94 Topic alias invalid; aliases are resolved, so a decoded
      PUBLISH always carries its full topic (the TOPIC_ALIAS property stays in `properties`).
      May be changed at any time (e.g. once the CONNACK is built).
    """

    __slots__ = (
        "role",
        "version",
        "max_packet_size",
        "supported_versions",
        "strict_utf8",
        "topic_alias_maximum",
        "_server",
        "_ready",
        "_connect_level",
        "_aliases",
    )
    _error: MQTTCodecError | None

    def __init__(
        self,
        role: str = "server",
        *,
        version: int | None = None,
        max_packet_size: int = MAX_PACKET_SIZE,
        supported_versions: tuple[int, ...] | frozenset[int] = ALL_VERSIONS,
        strict_utf8: bool = False,
        topic_alias_maximum: int = 0,
    ) -> None:
        if role not in ("server", "client"):
            raise ValueError("role must be 'server' or 'client'")
        if role == "client" and version is None:
            raise ValueError("a client-side decoder needs the protocol version")
        if version is not None and version not in (MQTT_3_1, MQTT_3_1_1, MQTT_5):
            raise ValueError(f"unknown protocol version {version}")
        self.role = role
        self.version = version
        self.max_packet_size = max_packet_size
        self.supported_versions = frozenset(supported_versions)  # the same object for a frozenset
        self.strict_utf8 = strict_utf8
        self.topic_alias_maximum = topic_alias_maximum
        self._server = role == "server"
        self._ready = self._server and version is not None
        self._connect_level: int | None = None
        self._aliases: dict[int, str] | None = None  # made by the first alias set
        super().__init__()

    # --- input (feed, buffered: ReceiveBuffer) ---------------------------------------------------

    @property
    def error(self) -> MQTTCodecError | None:
        return self._error

    def receive(self, data: bytes | bytearray | memoryview) -> tuple[list[Any], MQTTCodecError | None]:
        """`feed` then every complete packet: (packets, the error that stopped decoding or None).
        Packets decoded before an error come with it, as `next_packet` would have handed them out
        one by one (one call per read instead of one per packet)."""
        out: list[Any] = []
        try:
            self.feed(data)
            while (packet := self.next_packet()) is not None:
                out.append(packet)
        except MQTTCodecError as e:
            return out, e
        if self._pos >= len(self._buf) and not self._more:  # all decoded: hold no read between reads
            self._buf = b""
            self._pos = 0
        return out, None

    def __iter__(self) -> Iterator[Any]:
        while True:
            packet = self.next_packet()
            if packet is None:
                return
            yield packet

    def next_packet(self) -> Any:
        """The next complete packet, or None if more bytes are needed. Raises MQTTCodecError."""
        if self._error is not None:
            raise self._error
        try:
            if self._more and not self._join():
                return None
            buf = self._buf
            pos = self._pos
            n = len(buf)
            if n - pos < 2:
                self._need = 2
                return None
            b0 = buf[pos]
            rl = buf[pos + 1]
            if rl < 0x80:
                start = pos + 2
            else:
                rl &= 0x7F
                shift = 7
                i = pos + 2
                while True:
                    if i >= n:
                        self._need = i - pos + 1
                        return None
                    b = buf[i]
                    i += 1
                    rl |= (b & 0x7F) << shift
                    if b < 0x80:
                        if not b:
                            raise malformed("remaining length not minimally encoded")
                        break
                    if i - pos == 5:
                        raise malformed("remaining length longer than 4 bytes")
                    shift += 7
                start = i
            end = start + rl
            if end - pos > self.max_packet_size:
                raise MQTTCodecError(
                    ReasonCode.PACKET_TOO_LARGE,
                    f"packet of {end - pos} bytes exceeds the maximum of {self.max_packet_size}",
                )
            if end > n:
                self._need = end - pos
                return None
            self._pos = end
            if self._ready:
                if b0 >> 4 == 3:
                    return self._publish(b0, buf, start, end)
                if b0 == 0x40 and rl == 2:  # PUBACK, short form
                    return Puback((buf[start] << 8) | buf[start + 1])
            return self._other(b0, buf, start, end)
        except MQTTCodecError as e:
            if e.version is None:
                e.version = self.version or self._connect_level or 0
                e.in_connect = self._server and not self._ready and self._connect_level is not None
            self._error = e
            self._drop()
            raise

    # --- PUBLISH (hot path) ------------------------------------------------------------------------

    def _publish(self, b0: int, buf: bytes, start: int, end: int) -> Publish:
        qos = (b0 >> 1) & 3
        if qos == 3 or (b0 & 8 and not qos):
            raise malformed("PUBLISH with QoS 3" if qos == 3 else "PUBLISH with DUP set and QoS 0")
        if end - start < 2:
            raise malformed("PUBLISH without a topic")
        q = start + 2 + ((buf[start] << 8) | buf[start + 1])
        if q > end:
            raise malformed("topic name runs past the end of the packet")
        try:
            topic = buf[start + 2 : q].decode()
        except UnicodeDecodeError:
            raise malformed("topic name is not well-formed UTF-8") from None
        if qos:
            if q + 2 > end:
                raise malformed("PUBLISH without a packet identifier")
            pid: int | None = (buf[q] << 8) | buf[q + 1]
            if not pid:
                raise protocol_error("PUBLISH with QoS > 0 and packet identifier 0")
            q += 2
        else:
            pid = None
        if "+" in topic or "#" in topic or "\x00" in topic or self.strict_utf8:
            if "+" in topic or "#" in topic:
                raise MQTTCodecError(ReasonCode.TOPIC_NAME_INVALID, "wildcard in a PUBLISH topic name")
            check_text(topic, "topic name", self.strict_utf8)
        if self.version == 5:
            if q >= end:
                raise malformed("PUBLISH without a property length")
            if buf[q]:
                props, q = decode_properties(buf, q, end, 3, self.strict_utf8)
                if _TOPIC_ALIAS in props:
                    topic = self._alias(props[_TOPIC_ALIAS], topic)
                if self._server and _SUBID in props:
                    raise protocol_error("a client must not send a Subscription Identifier in PUBLISH")
            else:
                props = {}
                q += 1
            if not topic:
                raise protocol_error("PUBLISH with an empty topic name and no topic alias")
            return Publish(topic, buf[q:end], qos, (b0 & 1) != 0, (b0 & 8) != 0, pid, props)
        if not topic:
            raise protocol_error("PUBLISH with an empty topic name")
        return Publish(topic, buf[q:end], qos, (b0 & 1) != 0, (b0 & 8) != 0, pid, {})

    def _alias(self, alias: int, topic: str) -> str:
        if not alias or alias > self.topic_alias_maximum:
            raise MQTTCodecError(
                ReasonCode.TOPIC_ALIAS_INVALID,
                f"topic alias {alias} outside 1..{self.topic_alias_maximum}",
            )
        aliases = self._aliases
        if topic:
            if aliases is None:
                aliases = self._aliases = {}
            aliases[alias] = topic
            return topic
        known = aliases.get(alias) if aliases is not None else None
        if known is None:
            raise protocol_error(f"topic alias {alias} used before it was set")
        return known

    # --- every other packet ------------------------------------------------------------------------

    def _other(self, b0: int, buf: bytes, start: int, end: int) -> Any:
        t = b0 >> 4
        flags = b0 & 0x0F
        version = self.version
        if t == 0:
            raise malformed("reserved packet type 0")
        if not self._ready:
            if self._server:
                if t != 1:
                    raise protocol_error(f"first packet is {PacketType(t).name}, not CONNECT")
                if flags:
                    raise malformed("CONNECT with non-zero fixed header flags")
                packet = self._connect(buf, start, end)
                self._ready = True
                return packet
            if t != 2 and not (t == 15 and version == MQTT_5):
                raise protocol_error(f"first packet from the server is {PacketType(t).name}, not CONNACK")
        if t == 15 and version != MQTT_5:
            raise malformed("packet type 15 is reserved before MQTT 5.0")
        if t == 3:  # PUBLISH arriving before a client decoder is ready
            raise protocol_error("PUBLISH before CONNACK")
        if flags != (2 if t in _FLAGS_0010 else 0) and not (
            version == MQTT_3_1 and t in _FLAGS_0010 and flags == 0x0A  # 3.1: DUP on retries
        ):
            raise malformed(f"invalid fixed header flags 0x{flags:X} for {PacketType(t).name}")
        if t not in (_SERVER_RECEIVES if self._server else _CLIENT_RECEIVES) or (
            t == 14 and not self._server and version != MQTT_5
        ):
            side = "server" if self._server else "client"
            raise protocol_error(f"{PacketType(t).name} is not sent to a {side}")
        if t == 1:
            raise protocol_error("second CONNECT on a connection")
        if t == 2 and self._ready:
            raise protocol_error("second CONNACK on a connection")
        if t in _ACKS:
            return self._ack(t, buf, start, end)
        if t == 8:
            return decode_subscribe(buf, start, end, version == MQTT_5, self.strict_utf8)
        if t == 10:
            return decode_unsubscribe(buf, start, end, version == MQTT_5, self.strict_utf8)
        if t == 12 or t == 13:
            if end != start:
                raise malformed(f"{PacketType(t).name} with a non-empty body")
            return Pingreq() if t == 12 else Pingresp()
        if t == 14:
            return self._disconnect(buf, start, end)
        if t == 15:
            return self._auth(buf, start, end)
        if t == 2:
            packet = self._connack(buf, start, end)
            self._ready = True
            return packet
        if t == 9:
            return decode_suback(buf, start, end, version == MQTT_5, self.strict_utf8)
        if t == 11:
            return decode_unsuback(buf, start, end, version == MQTT_5, self.strict_utf8)
        raise AssertionError(f"unhandled packet type {t}")  # pragma: no cover

    def _ack(self, t: int, buf: bytes, p: int, end: int) -> Any:
        rl = end - p
        if rl < 2:
            raise malformed(f"{PacketType(t).name} without a packet identifier")
        pid = (buf[p] << 8) | buf[p + 1]
        if self.version != MQTT_5:
            if rl != 2:
                raise malformed(f"{PacketType(t).name} with a remaining length of {rl}, not 2")
            return _ACKS[t](pid)
        if rl == 2:
            return _ACKS[t](pid)
        code = reason_code(t, buf[p + 2])
        if rl == 3:
            return _ACKS[t](pid, code)
        props, q = decode_properties(buf, p + 3, end, t, self.strict_utf8)
        if q != end:
            raise malformed(f"{PacketType(t).name} has bytes after its properties")
        return _ACKS[t](pid, code, props)

    def _connect(self, buf: bytes, p: int, end: int) -> Connect:
        strict = self.strict_utf8
        name, p = decode_str(buf, p, end, "protocol name", strict)
        if p >= end:
            raise malformed("CONNECT without a protocol level")
        level = buf[p]
        p += 1
        if name not in ("MQTT", "MQIsdp"):
            raise MQTTCodecError(
                ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, f"unknown protocol name {name!r}", version=0
            )
        known = level in (MQTT_3_1_1, MQTT_5) if name == "MQTT" else level == MQTT_3_1
        if not known or level not in self.supported_versions:
            # Answer in the client's own CONNACK format when it is one we know, else in 3.1.1's.
            answer = level if known else MQTT_3_1_1
            raise MQTTCodecError(
                ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                f"unsupported protocol {name!r} level {level}",
                version=answer,
                in_connect=True,
            )
        self._connect_level = level
        if p + 3 > end:
            raise malformed("truncated CONNECT variable header")
        flags = buf[p]
        keep_alive = (buf[p + 1] << 8) | buf[p + 2]
        p += 3
        if flags & 0x01:
            raise malformed("CONNECT reserved flag is set")
        will_flag = flags & 0x04
        will_qos = (flags >> 3) & 3
        will_retain = bool(flags & 0x20)
        if will_flag:
            if will_qos == 3:
                raise malformed("Will QoS 3")
        elif will_qos or will_retain:
            raise malformed("Will QoS or Will Retain set without the Will flag")
        if flags & 0x40 and not flags & 0x80 and level != MQTT_5:
            raise malformed("password flag set without the user name flag")
        props: dict[Any, Any] = {}
        if level == MQTT_5:
            props, p = decode_properties(buf, p, end, 1, strict)
            if PropertyId.AUTHENTICATION_DATA in props and PropertyId.AUTHENTICATION_METHOD not in props:
                raise protocol_error("Authentication Data without an Authentication Method")
        client_id, p = decode_str(buf, p, end, "client identifier", strict)
        if level == MQTT_3_1:
            if not 1 <= len(client_id) <= 23:
                raise MQTTCodecError(
                    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "MQTT 3.1 client id must have 1..23 characters"
                )
        elif level == MQTT_3_1_1 and not client_id and not flags & 0x02:
            raise MQTTCodecError(
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty client id with Clean Session 0"
            )
        will = None
        if will_flag:
            will_props: dict[Any, Any] = {}
            if level == MQTT_5:
                will_props, p = decode_properties(buf, p, end, WILL, strict)
            will_topic, p = decode_str(buf, p, end, "will topic", strict)
            if not will_topic or "+" in will_topic or "#" in will_topic:
                raise MQTTCodecError(ReasonCode.TOPIC_NAME_INVALID, f"invalid will topic {will_topic!r}")
            will_payload, p = decode_bin(buf, p, end, "will payload")
            will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
        username = password = None
        if flags & 0x80:
            username, p = decode_str(buf, p, end, "user name", strict)
        if flags & 0x40:
            password, p = decode_bin(buf, p, end, "password")
        if p != end:
            raise malformed("CONNECT has bytes after its payload")
        self.version = level
        return Connect(client_id, level, bool(flags & 0x02), keep_alive, username, password, will, props)

    def _connack(self, buf: bytes, p: int, end: int) -> Connack:
        if end - p < 2:
            raise malformed("truncated CONNACK")
        ack_flags = buf[p]
        code = buf[p + 1]
        if ack_flags & 0xFE:
            raise malformed("CONNACK reserved flags are set")
        if self.version == MQTT_5:
            reason_code(2, code)
            props, q = decode_properties(buf, p + 2, end, 2, self.strict_utf8)
            if q != end:
                raise malformed("CONNACK has bytes after its properties")
        else:
            if end - p != 2:
                raise malformed("CONNACK with a remaining length other than 2")
            if code > 5:
                raise protocol_error(f"CONNACK return code {code} is reserved")
            props = {}
        if code and ack_flags:
            raise protocol_error("CONNACK refusal with Session Present set")
        return Connack(bool(ack_flags), code, props)

    def _disconnect(self, buf: bytes, p: int, end: int) -> Disconnect:
        if self.version != MQTT_5:
            if end != p:
                raise malformed("DISCONNECT with a non-empty body")
            return Disconnect()
        if end == p:
            return Disconnect()
        code = reason_code(14, buf[p])
        if end - p == 1:
            return Disconnect(code)
        props, q = decode_properties(buf, p + 1, end, 14, self.strict_utf8)
        if q != end:
            raise malformed("DISCONNECT has bytes after its properties")
        return Disconnect(code, props)

    def _auth(self, buf: bytes, p: int, end: int) -> Auth:
        if end == p:
            return Auth()
        code = reason_code(15, buf[p])
        if end - p == 1:
            return Auth(code)
        props, q = decode_properties(buf, p + 1, end, 15, self.strict_utf8)
        if q != end:
            raise malformed("AUTH has bytes after its properties")
        return Auth(code, props)


def decode_packet(
    data: bytes, version: int | None = None, role: str = "server", **options: Any
) -> tuple[Any, int]:
    """Decode the first packet of `data` with a fresh Decoder: (packet, bytes used), or (None, 0).

    A server-side call with version=None expects a CONNECT (and rejects anything else)."""
    dec = Decoder(role, version=version, **options)
    dec.feed(data)
    packet = dec.next_packet()
    if packet is None:
        return None, 0
    return packet, dec._pos
