"""MQTT 5.0 properties: every type, placement per packet, duplicates, value ranges."""

from __future__ import annotations

import pytest

from adapters.mqtt.codec import (
    Connack,
    Decoder,
    ErrorAction,
    MQTTCodecError,
    PacketType,
    PropertyId,
    ReasonCode,
    decode_properties,
    encode,
    encode_properties,
)
from adapters.mqtt.codec import PropertyId as P
from adapters.mqtt.codec.encoder import encode_connect
from adapters.mqtt.codec.packets import Connect, Publish, Subscribe, Subscription
from adapters.mqtt.codec.properties import ALLOWED, PROPERTY_SPEC, WILL

R = ReasonCode

# One valid value per property, with its expected encoding (identifier byte first).
SAMPLES = {
    P.PAYLOAD_FORMAT_INDICATOR: (1, "0101"),
    P.MESSAGE_EXPIRY_INTERVAL: (0x01020304, "0201020304"),
    P.CONTENT_TYPE: ("a/b", "030003612F62"),
    P.RESPONSE_TOPIC: ("r", "08000172"),
    P.CORRELATION_DATA: (b"\x00\xff", "09000200FF"),
    P.SUBSCRIPTION_IDENTIFIER: ([128], "0B8001"),
    P.SESSION_EXPIRY_INTERVAL: (0xFFFFFFFF, "11FFFFFFFF"),
    P.ASSIGNED_CLIENT_IDENTIFIER: ("id", "1200026964"),
    P.SERVER_KEEP_ALIVE: (300, "13012C"),
    P.AUTHENTICATION_METHOD: ("m", "1500016D"),
    P.AUTHENTICATION_DATA: (b"", "160000"),
    P.REQUEST_PROBLEM_INFORMATION: (0, "1700"),
    P.WILL_DELAY_INTERVAL: (5, "1800000005"),
    P.REQUEST_RESPONSE_INFORMATION: (1, "1901"),
    P.RESPONSE_INFORMATION: ("ri", "1A00027269"),
    P.SERVER_REFERENCE: ("s", "1C000173"),
    P.REASON_STRING: ("é", "1F0002C3A9"),
    P.RECEIVE_MAXIMUM: (65535, "21FFFF"),
    P.TOPIC_ALIAS_MAXIMUM: (0, "220000"),
    P.TOPIC_ALIAS: (1, "230001"),
    P.MAXIMUM_QOS: (1, "2401"),
    P.RETAIN_AVAILABLE: (0, "2500"),
    P.USER_PROPERTY: ([("k", "v")], "2600016B000176"),
    P.MAXIMUM_PACKET_SIZE: (1, "2700000001"),
    P.WILDCARD_SUBSCRIPTION_AVAILABLE: (1, "2801"),
    P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: (0, "2900"),
    P.SHARED_SUBSCRIPTION_AVAILABLE: (1, "2A01"),
}


def test_every_property_has_a_sample() -> None:
    assert set(SAMPLES) == set(PropertyId) == set(PROPERTY_SPEC)


@pytest.mark.parametrize("pid", list(PropertyId), ids=lambda p: p.name)
def test_each_property_encoding_and_roundtrip(pid: PropertyId) -> None:
    value, hexa = SAMPLES[pid]
    raw = encode_properties({pid: value})
    body = bytes.fromhex(hexa)
    assert raw == bytes((len(body),)) + body
    where = min(PROPERTY_SPEC[pid][1])
    assert decode_properties(raw, 0, len(raw), where) == ({pid: value}, len(raw))


def test_property_placement_table_spot_checks() -> None:
    """Spec table 2-4, a few rows."""
    assert P.TOPIC_ALIAS in ALLOWED[PacketType.PUBLISH]
    assert P.TOPIC_ALIAS not in ALLOWED[WILL]
    assert P.WILL_DELAY_INTERVAL in ALLOWED[WILL] and P.WILL_DELAY_INTERVAL not in ALLOWED[PacketType.CONNECT]
    assert P.SESSION_EXPIRY_INTERVAL in ALLOWED[PacketType.DISCONNECT]
    assert P.REASON_STRING not in ALLOWED[PacketType.CONNECT] and P.REASON_STRING in ALLOWED[PacketType.AUTH]
    assert P.SUBSCRIPTION_IDENTIFIER in ALLOWED[PacketType.SUBSCRIBE]
    assert ALLOWED[PacketType.UNSUBSCRIBE] == {P.USER_PROPERTY}
    assert ALLOWED[PacketType.PINGREQ] == frozenset()
    assert len(ALLOWED[PacketType.CONNACK]) == 17


def _decode(raw: bytes, packet_type: int):
    return decode_properties(raw, 0, len(raw), packet_type)


def _reason(raw: bytes, packet_type: int) -> int:
    with pytest.raises(MQTTCodecError) as ei:
        _decode(raw, packet_type)
    return ei.value.reason


@pytest.mark.parametrize("packet_type", [*PacketType, WILL], ids=lambda t: getattr(t, "name", "WILL"))
def test_properties_not_allowed_in_packet_are_malformed(packet_type: int) -> None:
    for pid, (value, _) in SAMPLES.items():
        raw = encode_properties({pid: value})
        if pid in ALLOWED[packet_type]:
            assert _decode(raw, packet_type)[0] == {pid: value}
        else:
            assert _reason(raw, packet_type) == R.MALFORMED_PACKET, pid.name


def test_unknown_property_identifier() -> None:
    assert _reason(b"\x02\x04\x00", PacketType.PUBLISH) == R.MALFORMED_PACKET
    assert _reason(b"\x02\x80\x01", PacketType.PUBLISH) == R.MALFORMED_PACKET  # two-byte identifier


@pytest.mark.parametrize(
    "pid", [p for p in PropertyId if p not in (P.USER_PROPERTY, P.SUBSCRIPTION_IDENTIFIER)]
)
def test_duplicates_are_protocol_errors(pid: PropertyId) -> None:
    body = bytes.fromhex(SAMPLES[pid][1]) * 2
    raw = bytes((len(body),)) + body
    assert _reason(raw, min(PROPERTY_SPEC[pid][1])) == R.PROTOCOL_ERROR


def test_repeatable_properties_keep_order() -> None:
    props = {P.USER_PROPERTY: [("b", "1"), ("a", "2"), ("b", "3")]}
    raw = encode_properties(props)
    assert _decode(raw, PacketType.PUBACK)[0] == props
    subids = encode_properties({P.SUBSCRIPTION_IDENTIFIER: [3, 1, 2]})
    assert _decode(subids, PacketType.PUBLISH)[0] == {P.SUBSCRIPTION_IDENTIFIER: [3, 1, 2]}
    # SUBSCRIBE carries at most one Subscription Identifier.
    assert _reason(subids, PacketType.SUBSCRIBE) == R.PROTOCOL_ERROR
    # A single (name, value) or int is accepted by the encoder too.
    assert encode_properties({P.USER_PROPERTY: ("k", "v")}) == encode_properties(
        {P.USER_PROPERTY: [("k", "v")]}
    )


@pytest.mark.parametrize(
    ("hexa", "packet_type"),
    [
        ("0102", PacketType.PUBLISH),  # Payload Format Indicator 2
        ("1702", PacketType.CONNECT),  # Request Problem Information 2
        ("1902", PacketType.CONNECT),
        ("2402", PacketType.CONNACK),  # Maximum QoS 2
        ("2502", PacketType.CONNACK),
        ("2802", PacketType.CONNACK),
        ("2902", PacketType.CONNACK),
        ("2A02", PacketType.CONNACK),
        ("210000", PacketType.CONNECT),  # Receive Maximum 0
        ("2700000000", PacketType.CONNECT),  # Maximum Packet Size 0
        ("0B00", PacketType.SUBSCRIBE),  # Subscription Identifier 0
        ("0800022F23", PacketType.PUBLISH),  # Response Topic "/#"
        ("080000", PacketType.PUBLISH),  # empty Response Topic
    ],
)
def test_out_of_range_values_are_protocol_errors(hexa: str, packet_type: int) -> None:
    body = bytes.fromhex(hexa)
    assert _reason(bytes((len(body),)) + body, packet_type) == R.PROTOCOL_ERROR


@pytest.mark.parametrize(
    "raw",
    [
        b"\x05\x02\x00\x00\x00",  # four-byte value cut by the property length
        b"\x02\x13\x00",  # two-byte value cut
        b"\x01\x01",  # byte value missing
        b"\x04\x03\x00\x05a",  # string longer than the properties
        b"\x03\x0b\x80\x80",  # VBI cut
        b"\x06\x0b\x80\x80\x80\x80\x01",  # VBI of 5 bytes
        b"\x03\x0b\x80\x00",  # VBI not minimal
        b"\x05\x26\x00\x01k\x00",  # user property without its value
        b"\x09\x01\x01",  # property length past the end
        b"\x80\x80\x80\x80\x01",  # property length of 5 bytes
    ],
)
def test_malformed_property_blocks(raw: bytes) -> None:
    assert _reason(raw, PacketType.PUBLISH) == R.MALFORMED_PACKET


def test_multi_byte_property_length() -> None:
    props = {P.USER_PROPERTY: [("k" * 50, "v" * 50)] * 3}
    raw = encode_properties(props)
    assert raw[0] & 0x80  # two-byte property length
    assert _decode(raw, PacketType.PUBLISH) == (props, len(raw))


def test_packet_level_property_errors_have_the_right_reaction() -> None:
    # A CONNACK-only property inside CONNECT: CONNACK 0x81.
    base = encode_connect(Connect("a", 5))[2:]  # variable header: property length at offset 10
    body = base[:10] + b"\x02\x24\x01" + base[11:]
    dec = Decoder()
    with pytest.raises(MQTTCodecError) as ei:
        dec.feed(bytes((0x10, len(body))) + body)
        dec.next_packet()
    assert ei.value.reason == R.MALFORMED_PACKET and ei.value.action is ErrorAction.CONNACK
    # Authentication Data without Authentication Method in CONNECT: CONNACK 0x82.
    body = base[:10] + b"\x03\x16\x00\x00" + base[11:]
    dec = Decoder()
    with pytest.raises(MQTTCodecError) as ei:
        dec.feed(bytes((0x10, len(body))) + body)
        dec.next_packet()
    assert ei.value.reason == R.PROTOCOL_ERROR and ei.value.response() == b"\x20\x03\x00\x82\x00"
    # A duplicated Topic Alias in PUBLISH: DISCONNECT 0x82.
    body = b"\x00\x01a\x06\x23\x00\x01\x23\x00\x01"
    dec = Decoder(version=5, topic_alias_maximum=5)
    with pytest.raises(MQTTCodecError) as ei:
        dec.feed(bytes((0x30, len(body))) + body)
        dec.next_packet()
    assert ei.value.response() == b"\xe0\x02\x82\x00"


def test_encoder_refuses_misplaced_properties() -> None:
    with pytest.raises(ValueError):
        encode(Connect("a", 5, properties={P.TOPIC_ALIAS: 1}))
    with pytest.raises(ValueError):
        encode(Connack(properties={P.WILL_DELAY_INTERVAL: 1}), 5)
    with pytest.raises(ValueError):
        encode(Subscribe(1, [Subscription("a")], {P.CONTENT_TYPE: "x"}), 5)
    with pytest.raises(ValueError):
        encode_properties({0x7F: 1})
    # PUBLISH is the hot path: it is not checked, but the decoder on the other side would refuse it.
    raw = encode(Publish("a", b"", 0, properties={P.ASSIGNED_CLIENT_IDENTIFIER: "x"}), 5)
    dec = Decoder(version=5)
    with pytest.raises(MQTTCodecError):
        dec.feed(raw)
        dec.next_packet()
