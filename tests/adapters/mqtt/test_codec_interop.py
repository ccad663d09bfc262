"""Byte-exact checks against known-good encodings.

Sources, as marked on each test:
- "spec 3.1.1" / "spec 5.0": byte sequences printed in the OASIS specifications (the Remaining
  Length boundary table, 3.1.1 2.2.3 / 5.0 1.5.5; the non-normative CONNECT variable header
  examples of section 3.1.2, flags 0xCE and keep alive 10, plus Session Expiry Interval 10 in 5.0;
  the non-normative PUBLISH variable header examples of section 3.3.2, topic "a/b" and packet id
  10; the two-byte PINGREQ/PINGRESP/DISCONNECT packets of sections 3.12-3.14).
- "paho": bytes produced by paho-mqtt 2.2's own client packet builders (`Client._send_*`), captured
  by replacing `Client._packet_queue`; decoded by our Decoder, and re-encoded by our encoder to the
  same bytes.
- "amqtt": server-side 3.1.1 packets (CONNACK, SUBACK, UNSUBACK) built by amqtt 0.12's codec.
"""

from __future__ import annotations

import pytest

from adapters.mqtt.codec import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    Pingreq,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
    decode_packet,
    encode,
    encode_connack,
    encode_suback,
    encode_unsuback,
)
from adapters.mqtt.codec import PropertyId as P
from adapters.mqtt.codec.wire import decode_vbi, encode_vbi

paho_client = pytest.importorskip("paho.mqtt.client")
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402
from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode  # noqa: E402
from paho.mqtt.subscribeoptions import SubscribeOptions  # noqa: E402

# --- spec examples ---------------------------------------------------------------------------------

# spec 3.1.1 2.2.3 / spec 5.0 1.5.5: Remaining Length boundaries.
VBI_TABLE = [
    (0, "00"),
    (127, "7F"),
    (128, "8001"),
    (16_383, "FF7F"),
    (16_384, "808001"),
    (2_097_151, "FFFF7F"),
    (2_097_152, "80808001"),
    (268_435_455, "FFFFFF7F"),
]


@pytest.mark.parametrize(("value", "hexa"), VBI_TABLE)
def test_spec_variable_byte_integer(value: int, hexa: str) -> None:
    raw = bytes.fromhex(hexa)
    assert encode_vbi(value) == raw
    assert decode_vbi(raw, 0, len(raw)) == (value, len(raw))


def _connect_ce(level: int, props: dict | None = None) -> Connect:
    # Flags 0xCE: user name, password, Will QoS 1, Will flag, Clean Session; keep alive 10.
    return Connect(
        "c",
        level,
        True,
        10,
        "u",
        b"p",
        Will("w", b"m", qos=1),
        props or {},
    )


def test_spec_311_connect_variable_header() -> None:
    """spec 3.1.1 3.1.2 example: 00 04 'MQTT' 04 CE 00 0A."""
    data = encode(_connect_ce(4), 4)
    assert data[2:12] == bytes.fromhex("00044D51545404CE000A")
    assert decode_packet(data)[0] == _connect_ce(4)


def test_spec_5_connect_variable_header() -> None:
    """spec 5.0 3.1.2 example: 00 04 'MQTT' 05 CE 00 0A, properties 05 11 0000000A."""
    pkt = _connect_ce(5, {P.SESSION_EXPIRY_INTERVAL: 10})
    data = encode(pkt, 5)
    assert data[2:18] == bytes.fromhex("00044D51545405CE000A05110000000A")
    assert decode_packet(data)[0] == pkt


def test_spec_publish_variable_header() -> None:
    """spec 3.3.2 examples: topic a/b, packet id 10 -> 00 03 61 2F 62 00 0A; 5.0 adds property length 00."""
    p = Publish("a/b", b"", 1, packet_id=10)
    assert encode(p, 4) == bytes.fromhex("32070003612F62000A")
    assert encode(p, 5) == bytes.fromhex("32080003612F62000A00")
    assert decode_packet(encode(p, 4), 4)[0] == p
    assert decode_packet(encode(p, 5), 5)[0] == p


def test_spec_two_byte_packets() -> None:
    """spec: PINGREQ C0 00, PINGRESP D0 00, DISCONNECT E0 00."""
    from adapters.mqtt.codec import DISCONNECT_V3, PINGREQ, PINGRESP, Pingresp

    assert PINGREQ == encode(Pingreq()) == bytes.fromhex("C000")
    assert PINGRESP == encode(Pingresp()) == bytes.fromhex("D000")
    assert DISCONNECT_V3 == encode(Disconnect(), 4) == encode(Disconnect(), 5) == bytes.fromhex("E000")


# --- paho-mqtt ----------------------------------------------------------------------------------------


class _FakeSocket:
    def close(self) -> None:
        pass


class _Capture:
    def __init__(self, protocol: int, **kwargs) -> None:
        self.out: list[bytes] = []
        c = paho_client.Client(paho_client.CallbackAPIVersion.VERSION2, protocol=protocol, **kwargs)
        c._sock = _FakeSocket()  # _send_publish refuses to build without a socket
        c._packet_queue = lambda command, packet, mid, qos, info=None: self.out.append(bytes(packet))
        self.client = c

    def last(self) -> bytes:
        return self.out[-1]


def _props(packet_type: int, **values) -> Properties:
    p = Properties(packet_type)
    for k, v in values.items():
        setattr(p, k, v)
    return p


def _check(raw: bytes, expected, version: int, role: str = "server") -> None:
    """Our decoder reads paho's bytes as `expected`, and our encoder writes exactly paho's bytes."""
    if isinstance(expected, Connect):
        got, used = decode_packet(raw, None, role)
    elif role == "client" and not isinstance(expected, Connack):
        dec = Decoder("client", version=version)
        dec.feed(encode(Connack(), version) + raw)
        got = list(dec)[-1]
        used = len(raw)
    else:
        got, used = decode_packet(raw, version, role)
    assert used == len(raw)
    assert got == expected
    assert encode(got, version) == raw


@pytest.mark.parametrize("level", [MQTT_3_1, MQTT_3_1_1, MQTT_5])
def test_paho_connect_minimal(level: int) -> None:
    cap = _Capture(level, client_id="dev-1")
    cap.client._send_connect(30)
    _check(cap.last(), Connect("dev-1", level, True, 30), level)


def test_paho_connect_v311_full() -> None:
    cap = _Capture(paho_client.MQTTv311, client_id="dev-2", clean_session=False)
    cap.client.username_pw_set("user", "pässword")
    cap.client.will_set("dev/2/status", b"offline", qos=2, retain=True)
    cap.client._send_connect(60)
    expected = Connect(
        "dev-2", 4, False, 60, "user", "pässword".encode(), Will("dev/2/status", b"offline", 2, True)
    )
    _check(cap.last(), expected, 4)


def test_paho_connect_v5_properties_and_will_properties() -> None:
    cap = _Capture(paho_client.MQTTv5, client_id="dev-3")
    cap.client.username_pw_set("user", "pw")
    will_props = _props(PacketTypes.WILLMESSAGE, WillDelayInterval=5, ContentType="text/plain")
    will_props.UserProperty = ("k", "v")
    cap.client.will_set("dev/3/status", b"gone", qos=1, properties=will_props)
    cap.client._connect_properties = _props(
        PacketTypes.CONNECT, SessionExpiryInterval=3600, ReceiveMaximum=20, TopicAliasMaximum=8
    )
    cap.client._connect_properties.UserProperty = [("a", "1"), ("a", "2")]
    cap.client._send_connect(45)
    got, _ = decode_packet(cap.last())
    assert got.protocol_level == 5 and got.client_id == "dev-3" and got.keep_alive == 45
    assert got.properties[P.SESSION_EXPIRY_INTERVAL] == 3600
    assert got.properties[P.RECEIVE_MAXIMUM] == 20
    assert got.properties[P.TOPIC_ALIAS_MAXIMUM] == 8
    assert got.properties[P.USER_PROPERTY] == [("a", "1"), ("a", "2")]
    assert got.will == Will(
        "dev/3/status",
        b"gone",
        1,
        False,
        {P.CONTENT_TYPE: "text/plain", P.WILL_DELAY_INTERVAL: 5, P.USER_PROPERTY: [("k", "v")]},
    )
    assert encode(got, 5) == cap.last()


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho_publish(version: int, qos: int) -> None:
    cap = _Capture(version)
    cap.client._send_publish(77 if qos else 0, b"sensors/t1", b"\x00\x01payload", qos, True, False)
    _check(
        cap.last(), Publish("sensors/t1", b"\x00\x01payload", qos, True, False, 77 if qos else None), version
    )


def test_paho_publish_v5_properties_and_large_payload() -> None:
    cap = _Capture(paho_client.MQTTv5)
    props = _props(
        PacketTypes.PUBLISH,
        PayloadFormatIndicator=1,
        MessageExpiryInterval=120,
        ResponseTopic="reply/here",
        CorrelationData=b"\x01\x02",
        ContentType="application/json",
    )
    props.UserProperty = [("x", "1"), ("y", "2")]
    payload = b"z" * 20_000  # three-byte remaining length
    cap.client._send_publish(9, b"a/b", payload, 1, False, True, properties=props)
    raw = cap.last()
    got, used = decode_packet(raw, 5)
    assert used == len(raw)
    assert (got.topic, got.payload, got.qos, got.dup, got.packet_id) == ("a/b", payload, 1, True, 9)
    assert got.properties == {
        P.PAYLOAD_FORMAT_INDICATOR: 1,
        P.MESSAGE_EXPIRY_INTERVAL: 120,
        P.CONTENT_TYPE: "application/json",
        P.RESPONSE_TOPIC: "reply/here",
        P.CORRELATION_DATA: b"\x01\x02",
        P.USER_PROPERTY: [("x", "1"), ("y", "2")],
    }
    assert encode(got, 5) == raw


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_paho_acks(version: int) -> None:
    cap = _Capture(version)
    cap.client._send_puback(1)
    cap.client._send_pubrec(2)
    cap.client._send_pubrel(3)
    cap.client._send_pubcomp(65535)
    expected = [Puback(1), Pubrec(2), Pubrel(3), Pubcomp(65535)]
    for raw, exp in zip(cap.out, expected, strict=True):
        _check(raw, exp, version)
        _check(raw, exp, version, role="client")


def test_paho_pingreq_and_disconnect() -> None:
    cap = _Capture(paho_client.MQTTv311)
    cap.client._send_pingreq()
    cap.client._send_disconnect()
    _check(cap.out[0], Pingreq(), 4)
    _check(cap.out[1], Disconnect(), 4)


def test_paho_disconnect_v5_reason_and_properties() -> None:
    cap = _Capture(paho_client.MQTTv5)
    props = _props(PacketTypes.DISCONNECT, SessionExpiryInterval=0, ReasonString="bye")
    cap.client._send_disconnect(PahoReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message"), props)
    _check(cap.last(), Disconnect(0x04, {P.SESSION_EXPIRY_INTERVAL: 0, P.REASON_STRING: "bye"}), 5)


def test_paho_subscribe_v311() -> None:
    cap = _Capture(paho_client.MQTTv311)
    cap.client._send_subscribe(False, [(b"a/+/c", 1), (b"#", 0), (b"$SYS/x", 2)])
    _check(
        cap.last(),
        Subscribe(1, [Subscription("a/+/c", 1), Subscription("#", 0), Subscription("$SYS/x", 2)]),
        4,
    )


def test_paho_subscribe_v5_options() -> None:
    cap = _Capture(paho_client.MQTTv5)
    props = _props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=42)
    props.UserProperty = ("u", "v")
    cap.client._send_subscribe(
        False,
        [
            (b"a/#", SubscribeOptions(qos=1, noLocal=True, retainAsPublished=True, retainHandling=2)),
            (b"$share/g/b/+", SubscribeOptions(qos=2, retainHandling=1)),
        ],
        props,
    )
    expected = Subscribe(
        1,
        [Subscription("a/#", 1, True, True, 2), Subscription("$share/g/b/+", 2, False, False, 1)],
        {P.SUBSCRIPTION_IDENTIFIER: [42], P.USER_PROPERTY: [("u", "v")]},
    )
    _check(cap.last(), expected, 5)


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_paho_unsubscribe(version: int) -> None:
    cap = _Capture(version)
    cap.client._send_unsubscribe(False, [b"a/+/c", b"x"])
    _check(cap.last(), Unsubscribe(1, ["a/+/c", "x"]), version)


def test_paho_properties_unpack_our_encoding() -> None:
    """paho's property decoder reads what our encoder writes (every type, repeats included)."""
    from adapters.mqtt.codec import encode_properties

    ours = {
        P.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF,
        P.AUTHENTICATION_METHOD: "SCRAM-SHA-1",
        P.AUTHENTICATION_DATA: b"\x00\xff",
        P.REQUEST_PROBLEM_INFORMATION: 0,
        P.RECEIVE_MAXIMUM: 65535,
        P.MAXIMUM_PACKET_SIZE: 1 << 20,
        P.USER_PROPERTY: [("k", "v1"), ("k", "v2"), ("ü", "∑")],
    }
    theirs = Properties(PacketTypes.CONNECT)
    theirs.unpack(encode_properties(ours))
    assert theirs.SessionExpiryInterval == 0xFFFFFFFF
    assert theirs.AuthenticationMethod == "SCRAM-SHA-1"
    assert theirs.AuthenticationData == b"\x00\xff"
    assert theirs.RequestProblemInformation == 0
    assert theirs.ReceiveMaximum == 65535
    assert theirs.MaximumPacketSize == 1 << 20
    assert theirs.UserProperty == [("k", "v1"), ("k", "v2"), ("ü", "∑")]
    sub = Properties(PacketTypes.PUBLISH)
    sub.unpack(encode_properties({P.SUBSCRIPTION_IDENTIFIER: [1, 268_435_455]}))
    assert sub.SubscriptionIdentifier == [1, 268_435_455]


# --- amqtt (server-side 3.1.1 packets) ----------------------------------------------------------------


def test_amqtt_connack_suback_unsuback() -> None:
    pytest.importorskip("amqtt")
    from amqtt.mqtt.connack import ConnackPacket
    from amqtt.mqtt.suback import SubackPacket
    from amqtt.mqtt.unsuback import UnsubackPacket

    for sp, rc in [(0, 0), (1, 0), (0, 1), (0, 2), (0, 5)]:
        raw = bytes(ConnackPacket.build(sp, rc).to_bytes())
        assert encode_connack(bool(sp), rc, 4) == raw
        _check(raw, Connack(bool(sp), rc), 4, role="client")
    raw = bytes(SubackPacket.build(10, [0, 1, 2, 0x80]).to_bytes())
    assert encode_suback(10, [0, 1, 2, 0x80], 4) == raw
    _check(raw, Suback(10, [0, 1, 2, 0x80]), 4, role="client")
    raw = bytes(UnsubackPacket.build(11).to_bytes())
    assert encode_unsuback(11, version=4) == raw
    _check(raw, Unsuback(11), 4, role="client")
