"""Every rejected input gives the right reason code, the right reaction, and kills the decoder."""

from __future__ import annotations

import pytest

from adapters.mqtt.codec import (
    MQTT_3_1_1,
    MQTT_5,
    Connack,
    Connect,
    Decoder,
    ErrorAction,
    MQTTCodecError,
    Pingreq,
    Publish,
    ReasonCode,
    Subscribe,
    Subscription,
    Unsubscribe,
    Will,
    encode,
)
from adapters.mqtt.codec import PropertyId as P
from adapters.mqtt.codec.wire import encode_str

R = ReasonCode
MALFORMED, PROTOCOL = R.MALFORMED_PACKET, R.PROTOCOL_ERROR


def fail(data: bytes, version: int | None = MQTT_5, role: str = "server", **opts) -> MQTTCodecError:
    if role == "client":
        dec = Decoder("client", version=version, **opts)
        data = encode(Connack(), version) + data
    else:
        dec = Decoder(version=version, **opts)
    with pytest.raises(MQTTCodecError) as ei:
        dec.feed(data)
        list(dec)
    e = ei.value
    # The decoder is dead afterwards: everything raises the same error.
    with pytest.raises(MQTTCodecError) as again:
        dec.feed(b"\xc0\x00")
    assert again.value is e
    with pytest.raises(MQTTCodecError):
        dec.next_packet()
    assert dec.error is e
    return e


def connect_bytes(body: bytes) -> bytes:
    assert len(body) < 128
    return bytes((0x10, len(body))) + body


def v5_after(e: MQTTCodecError, reason: int) -> None:
    assert e.reason == reason
    assert e.action is ErrorAction.DISCONNECT
    assert e.response() == bytes((0xE0, 2, reason, 0))


def v3_after(e: MQTTCodecError, reason: int) -> None:
    assert e.reason == reason
    assert e.action is ErrorAction.CLOSE
    assert e.response() == b""


# --- fixed header and framing -------------------------------------------------------------------------


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_remaining_length_more_than_four_bytes(version: int) -> None:
    # Detected as soon as the fifth length byte is due, without waiting for it or the body.
    dec = Decoder(version=version)
    dec.feed(b"\x30\xff\xff\xff")
    assert dec.next_packet() is None
    with pytest.raises(MQTTCodecError) as ei:
        dec.feed(b"\xff")
        dec.next_packet()
    assert ei.value.reason == MALFORMED
    assert ei.value.action is (ErrorAction.DISCONNECT if version == 5 else ErrorAction.CLOSE)


def test_remaining_length_not_minimal() -> None:
    v5_after(fail(b"\xc0\x80\x00"), MALFORMED)
    v5_after(fail(b"\x30\x81\x80\x00"), MALFORMED)


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_packet_too_large_before_body_arrives(version: int) -> None:
    raw = encode(Publish("t", b"x" * 200, 0), version)
    dec = Decoder(version=version, max_packet_size=200)
    with pytest.raises(MQTTCodecError) as ei:
        dec.feed(raw[:3])  # just the fixed header
        dec.next_packet()
    e = ei.value
    if version == MQTT_5:
        v5_after(e, R.PACKET_TOO_LARGE)
    else:
        v3_after(e, R.PACKET_TOO_LARGE)
    # The size counts the whole packet, fixed header included.
    ok = Decoder(version=version, max_packet_size=len(raw))
    ok.feed(raw)
    assert ok.next_packet().payload == b"x" * 200


def test_connect_too_large_closes() -> None:
    e = fail(encode(Connect("x" * 300, 5)), None, max_packet_size=100)
    assert e.reason == R.PACKET_TOO_LARGE and e.action is ErrorAction.CLOSE


def test_reserved_packet_types() -> None:
    v5_after(fail(b"\x00\x00"), MALFORMED)
    v3_after(fail(b"\xf0\x00", MQTT_3_1_1), MALFORMED)


@pytest.mark.parametrize(
    "first",
    [0x60, 0x63, 0x80, 0x8A, 0xA0, 0xA3, 0x41, 0x48, 0x51, 0x71, 0xC1, 0xE1, 0xF1],
)
def test_invalid_fixed_header_flags(first: int) -> None:
    body = b"\x00\x01" if first >> 4 in (4, 5, 6, 7) else b""
    if first >> 4 in (8, 10):
        body = b"\x00\x01" + b"\x00" + encode_str("a") + (b"\x00" if first >> 4 == 8 else b"")
    v5_after(fail(bytes((first, len(body))) + body), MALFORMED)


def test_v31_only_allows_dup_on_qos1_control_packets() -> None:
    raw = bytearray(encode(Subscribe(1, [Subscription("a")]), MQTT_3_1_1))
    raw[0] |= 0x08
    v3_after(fail(bytes(raw), MQTT_3_1_1), MALFORMED)


def test_connect_fixed_header_flags() -> None:
    raw = bytearray(encode(Connect("a", 5)))
    raw[0] |= 1
    e = fail(bytes(raw), None)
    assert e.reason == MALFORMED and e.action is ErrorAction.CLOSE


# --- PUBLISH --------------------------------------------------------------------------------------------


def test_publish_qos3_and_dup_qos0() -> None:
    body = encode_str("a") + b"\x00\x01"
    v5_after(fail(bytes((0x36, len(body) + 1)) + body + b"\x00"), MALFORMED)
    body = encode_str("a") + b"\x00"
    v5_after(fail(bytes((0x38, len(body))) + body), MALFORMED)


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_publish_packet_id_zero(version: int) -> None:
    body = encode_str("a") + b"\x00\x00" + (b"\x00" if version == 5 else b"")
    e = fail(bytes((0x32, len(body))) + body, version)
    assert e.reason == PROTOCOL


def test_publish_truncated_fields() -> None:
    v5_after(fail(b"\x30\x01\x00"), MALFORMED)  # half a topic length
    v5_after(fail(b"\x30\x03\x00\x05a"), MALFORMED)  # topic longer than the packet
    v5_after(fail(b"\x32\x04\x00\x01a\x00"), MALFORMED)  # half a packet id
    v5_after(fail(b"\x30\x03\x00\x01a"), MALFORMED)  # 5.0: no property length
    v5_after(fail(b"\x30\x05\x00\x01a\x05\x01"), MALFORMED)  # properties past the end


@pytest.mark.parametrize("topic", ["a/+", "#", "a/#", "+", "a+b"])
def test_publish_wildcard_topic(topic: str) -> None:
    body = encode_str(topic) + b"\x00"
    v5_after(fail(bytes((0x30, len(body))) + body), R.TOPIC_NAME_INVALID)
    v3_after(fail(bytes((0x30, len(body) - 1)) + body[:-1], MQTT_3_1_1), R.TOPIC_NAME_INVALID)


def test_publish_empty_topic() -> None:
    v3_after(fail(b"\x30\x02\x00\x00", MQTT_3_1_1), PROTOCOL)
    v5_after(fail(b"\x30\x03\x00\x00\x00"), PROTOCOL)


def test_topic_alias_rules() -> None:
    def pub(topic: str, alias: int) -> bytes:
        return encode(Publish(topic, b"", 0, properties={P.TOPIC_ALIAS: alias}), 5)

    v5_after(fail(pub("a", 1)), R.TOPIC_ALIAS_INVALID)  # maximum 0: no alias allowed
    v5_after(fail(pub("a", 11), topic_alias_maximum=10), R.TOPIC_ALIAS_INVALID)
    v5_after(fail(pub("a", 0), topic_alias_maximum=10), R.TOPIC_ALIAS_INVALID)
    v5_after(fail(pub("", 2), topic_alias_maximum=10), PROTOCOL)  # never set


def test_publish_subscription_identifier_from_client() -> None:
    raw = encode(Publish("a", b"", 0, properties={P.SUBSCRIPTION_IDENTIFIER: [1]}), 5)
    v5_after(fail(raw), PROTOCOL)
    # ... but a server may send it to a client
    dec = Decoder("client", version=5)
    dec.feed(encode(Connack(), 5) + raw)
    assert list(dec)[1].properties == {P.SUBSCRIPTION_IDENTIFIER: [1]}


def test_response_topic_must_not_have_wildcards() -> None:
    v5_after(fail(encode(Publish("a", b"", 0, properties={P.RESPONSE_TOPIC: "r/+"}), 5)), PROTOCOL)


# --- UTF-8 ----------------------------------------------------------------------------------------------

BAD_UTF8 = {
    "invalid byte": b"\xff",
    "overlong": b"\xc0\xaf",
    "encoded surrogate": b"\xed\xa0\x80",
    "truncated sequence": b"a\xe2\x82",
    "above U+10FFFF": b"\xf4\x90\x80\x80",
    "U+0000": b"a\x00b",
}


@pytest.mark.parametrize("raw", BAD_UTF8.values(), ids=BAD_UTF8.keys())
@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
def test_bad_utf8_in_topic(raw: bytes, version: int) -> None:
    body = len(raw).to_bytes(2, "big") + raw + (b"\x00" if version == 5 else b"")
    e = fail(bytes((0x30, len(body))) + body, version)
    assert e.reason == MALFORMED


@pytest.mark.parametrize("raw", BAD_UTF8.values(), ids=BAD_UTF8.keys())
def test_bad_utf8_in_client_id_and_user_property(raw: bytes) -> None:
    body = encode_str("MQTT") + b"\x05\x02\x00\x0a\x00" + len(raw).to_bytes(2, "big") + raw
    e = fail(connect_bytes(body), None)
    assert e.reason == MALFORMED and e.action is ErrorAction.CONNACK
    assert e.response() == b"\x20\x03\x00\x81\x00"
    prop = b"\x26" + len(raw).to_bytes(2, "big") + raw + b"\x00\x01v"
    props = bytes((len(prop),)) + prop
    v5_after(fail(b"\x40" + bytes((3 + len(props),)) + b"\x00\x01\x00" + props), MALFORMED)


@pytest.mark.parametrize("char", ["\x01", "\x1f", "\x7f", "\x9f", "\ufdd0", "\uffff", "\U0010fffe"])
def test_discouraged_code_points_accepted_unless_strict(char: str) -> None:
    raw = encode(Publish(f"a{char}b", b"", 0), 5)
    dec = Decoder(version=5)
    dec.feed(raw)
    assert next(iter(dec)).topic == f"a{char}b"
    v5_after(fail(raw, strict_utf8=True), MALFORMED)


# --- exact lengths --------------------------------------------------------------------------------------


def test_trailing_or_missing_bytes() -> None:
    v3_after(fail(b"\x40\x03\x00\x01\x00", MQTT_3_1_1), MALFORMED)  # 3.1.1 PUBACK is exactly 2 bytes
    v3_after(fail(b"\x40\x01\x00", MQTT_3_1_1), MALFORMED)
    v5_after(fail(b"\x40\x01\x00"), MALFORMED)
    v5_after(fail(b"\xc0\x01\x00"), MALFORMED)  # PINGREQ with a body
    v3_after(fail(b"\xe0\x01\x00", MQTT_3_1_1), MALFORMED)  # 3.1.1 DISCONNECT with a body
    v5_after(fail(b"\x40\x06\x00\x01\x00\x00\x00\x00"), MALFORMED)  # bytes after the properties
    v5_after(fail(b"\xe0\x04\x00\x01\x00\x00"), MALFORMED)
    v5_after(fail(b"\xf0\x04\x00\x01\x00\x00"), MALFORMED)
    # property length 2 but the property inside needs 5
    v5_after(fail(b"\x40\x08\x00\x01\x00\x02\x02\x00\x00\x00"), MALFORMED)


def test_connect_trailing_bytes() -> None:
    raw = encode(Connect("abc", 5))
    body = raw[2:] + b"\x00"
    e = fail(connect_bytes(body), None)
    assert e.reason == MALFORMED and e.action is ErrorAction.CONNACK and e.version == 5
    raw = encode(Connect("abc", 4))
    e = fail(connect_bytes(raw[2:] + b"\x00"), None)
    assert e.reason == MALFORMED and e.action is ErrorAction.CLOSE and e.version == 4


# --- CONNECT --------------------------------------------------------------------------------------------


def connect_var(name: str = "MQTT", level: int = 4, flags: int = 0x02, rest: bytes = b"") -> bytes:
    body = encode_str(name) + bytes((level, flags)) + b"\x00\x3c"
    if level == 5:
        body += b"\x00"
    return connect_bytes(body + (rest or encode_str("cid")))


@pytest.mark.parametrize("level", [4, 5])
def test_connect_reserved_flag(level: int) -> None:
    e = fail(connect_var(level=level, flags=0x03), None)
    assert e.reason == MALFORMED
    assert e.response() == (b"\x20\x03\x00\x81\x00" if level == 5 else b"")


@pytest.mark.parametrize(
    "flags",
    [
        0x02 | 0x04 | 0x18,  # Will QoS 3
        0x02 | 0x08,  # Will QoS without the Will flag
        0x02 | 0x20,  # Will Retain without the Will flag
    ],
)
def test_connect_will_flag_rules(flags: int) -> None:
    rest = encode_str("cid") + encode_str("w") + encode_str("m")
    e = fail(connect_var(flags=flags, rest=rest), None)
    assert e.reason == MALFORMED


def test_connect_password_without_username() -> None:
    rest = encode_str("cid") + encode_str("pw")
    assert fail(connect_var(level=4, flags=0x42, rest=rest), None).reason == MALFORMED
    dec = Decoder()
    dec.feed(connect_var(level=5, flags=0x42, rest=rest))
    assert next(iter(dec)).password == b"pw"  # 5.0 allows it


@pytest.mark.parametrize(
    ("name", "level", "response"),
    [
        ("MQTT", 6, b"\x20\x02\x00\x01"),  # unknown level: answered in 3.1.1 form
        ("MQTT", 3, b"\x20\x02\x00\x01"),  # 3.1 level with the 3.1.1 name
        ("MQIsdp", 4, b"\x20\x02\x00\x01"),
        ("MQTT", 0, b"\x20\x02\x00\x01"),
    ],
)
def test_connect_unsupported_protocol_level(name: str, level: int, response: bytes) -> None:
    e = fail(connect_var(name, level), None)
    assert e.reason == R.UNSUPPORTED_PROTOCOL_VERSION
    assert e.action is ErrorAction.CONNACK
    assert e.response() == response


def test_connect_version_not_enabled() -> None:
    e = fail(encode(Connect("a", 5)), None, supported_versions=(4,))
    assert e.response() == b"\x20\x03\x00\x84\x00" and e.return_code == 0x84
    e = fail(encode(Connect("a", 4)), None, supported_versions=(5,))
    assert e.response() == b"\x20\x02\x00\x01" and e.return_code == 1
    e = fail(encode(Connect("a", 3)), None, supported_versions=(4, 5))
    assert e.response() == b"\x20\x02\x00\x01" and e.version == 3


def test_connect_unknown_protocol_name_closes() -> None:
    e = fail(connect_var("HTTP", 4), None)
    assert e.action is ErrorAction.CLOSE and e.response() == b""


def test_connect_identifier_rejected() -> None:
    e = fail(encode(Connect("", 4, clean_start=False)), None)
    assert e.reason == R.CLIENT_IDENTIFIER_NOT_VALID
    assert e.response() == b"\x20\x02\x00\x02"
    for bad in ("", "x" * 24):
        e = fail(encode(Connect(bad, 3)), None)
        assert e.response() == b"\x20\x02\x00\x02"
    # 5.0: an empty client id asks the server to assign one, whatever Clean Start says.
    dec = Decoder()
    dec.feed(encode(Connect("", 5, clean_start=False)))
    assert next(iter(dec)).client_id == ""


def test_connect_will_topic_with_wildcard() -> None:
    e = fail(encode(Connect("a", 5, will=Will("w/#", b""))), None)
    assert e.reason == R.TOPIC_NAME_INVALID and e.response() == b"\x20\x03\x00\x90\x00"


def test_connect_truncated() -> None:
    raw = encode(Connect("client", 5, username="u", will=Will("w", b"m")))
    for cut in range(3, len(raw) - 1):
        body = raw[2:cut]
        e = fail(connect_bytes(body), None)
        assert e.reason == MALFORMED
        assert e.action is (ErrorAction.CONNACK if cut > 8 else ErrorAction.CLOSE), cut


def test_first_packet_must_be_connect() -> None:
    e = fail(encode(Publish("a", b""), 4), None)
    assert e.reason == PROTOCOL and e.action is ErrorAction.CLOSE
    e = fail(b"\xc0\x00", None)
    assert e.action is ErrorAction.CLOSE


def test_second_connect() -> None:
    v5_after(fail(encode(Connect("a", 5)) + encode(Connect("a", 5)), None), PROTOCOL)
    v3_after(fail(encode(Connect("a", 4)) + encode(Connect("a", 4)), None), PROTOCOL)


# --- direction ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw", [b"\x20\x03\x00\x00\x00", b"\x90\x04\x00\x01\x00\x00", b"\xb0\x03\x00\x01\x00", b"\xd0\x00"]
)
def test_server_rejects_server_to_client_packets(raw: bytes) -> None:
    v5_after(fail(raw), PROTOCOL)


def test_client_side_rules() -> None:
    e = fail(encode(Connect("a", 5)), 5, role="client")
    v5_after(e, PROTOCOL)
    v5_after(fail(b"\xc0\x00", 5, role="client"), PROTOCOL)
    v5_after(fail(encode(Subscribe(1, [Subscription("a")]), 5), 5, role="client"), PROTOCOL)
    v5_after(fail(encode(Connack(), 5), 5, role="client"), PROTOCOL)  # a second CONNACK
    v3_after(fail(b"\xe0\x00", 4, role="client"), PROTOCOL)  # no DISCONNECT from a 3.1.1 server
    dec = Decoder("client", version=4)
    with pytest.raises(MQTTCodecError):
        dec.feed(b"\xd0\x00")  # PINGRESP before CONNACK
        dec.next_packet()
    v3_after(fail(b"\x20\x02\x00\x06", 4, role="client"), PROTOCOL)  # reserved return code
    v3_after(fail(b"\x90\x03\x00\x01\x03", 4, role="client"), PROTOCOL)  # reserved SUBACK code


def test_connack_checks() -> None:
    dec = Decoder("client", version=5)
    with pytest.raises(MQTTCodecError) as ei:
        dec.feed(b"\x20\x03\x01\x80\x00")  # refused with Session Present
        dec.next_packet()
    assert ei.value.reason == PROTOCOL
    dec = Decoder("client", version=4)
    with pytest.raises(MQTTCodecError) as ei:
        dec.feed(b"\x20\x02\x02\x00")  # reserved acknowledge flag
        dec.next_packet()
    assert ei.value.reason == MALFORMED


# --- SUBSCRIBE / UNSUBSCRIBE ------------------------------------------------------------------------------


def sub_bytes(pid: int, entries: list[tuple[str, int]], version: int = 5) -> bytes:
    body = pid.to_bytes(2, "big") + (b"\x00" if version == 5 else b"")
    for f, o in entries:
        body += encode_str(f) + bytes((o,))
    return bytes((0x82, len(body))) + body


def test_subscribe_packet_id_zero_and_empty() -> None:
    v5_after(fail(sub_bytes(0, [("a", 0)])), PROTOCOL)
    v5_after(fail(sub_bytes(1, [])), PROTOCOL)
    v3_after(fail(sub_bytes(1, [], 4), 4), PROTOCOL)


def test_subscribe_options() -> None:
    v5_after(fail(sub_bytes(1, [("a", 3)])), MALFORMED)  # QoS 3
    v5_after(fail(sub_bytes(1, [("a", 0x40)])), MALFORMED)  # reserved bit
    v5_after(fail(sub_bytes(1, [("a", 0x80)])), MALFORMED)
    v5_after(fail(sub_bytes(1, [("a", 0x30)])), PROTOCOL)  # retain handling 3
    v5_after(fail(sub_bytes(1, [("$share/g/a", 0x04)])), PROTOCOL)  # No Local on a shared subscription
    v3_after(fail(sub_bytes(1, [("a", 0x04)], 4), 4), MALFORMED)  # 3.1.1: upper 6 bits reserved
    v3_after(fail(sub_bytes(1, [("a", 3)], 4), 4), MALFORMED)
    body = b"\x00\x01\x00" + encode_str("a")  # no options byte
    v5_after(fail(bytes((0x82, len(body))) + body), MALFORMED)


@pytest.mark.parametrize(
    "filt",
    [
        *("", "a/#/b", "a#", "#/", "a/b#", "+a", "a/+b"),
        *("$share/g", "$share/g/", "$share//a", "$share/g+/a", "$share/#/a", "$share/g/a/#/b", "a\x00"),
    ],
)
def test_invalid_topic_filters(filt: str) -> None:
    code = MALFORMED if "\x00" in filt else R.TOPIC_FILTER_INVALID
    v5_after(fail(sub_bytes(1, [(filt, 0)])), code)
    body = b"\x00\x01\x00" + encode_str(filt)
    v5_after(fail(bytes((0xA2, len(body))) + body), code)


def test_unsubscribe_rules() -> None:
    v5_after(fail(b"\xa2\x03\x00\x01\x00"), PROTOCOL)  # no filter
    v5_after(fail(encode(Unsubscribe(0, ["a"]), 5)), PROTOCOL)  # packet id 0


# --- reason codes ----------------------------------------------------------------------------------------


def test_invalid_reason_codes() -> None:
    v5_after(fail(b"\x40\x03\x00\x01\x05"), PROTOCOL)  # 0x05 is no PUBACK reason
    v5_after(fail(b"\x62\x03\x00\x01\x10"), PROTOCOL)  # PUBREL: only 0x00 / 0x92
    v5_after(fail(b"\xe0\x01\x01"), PROTOCOL)
    v5_after(fail(b"\xf0\x01\x04"), PROTOCOL)
    v5_after(fail(b"\x90\x04\x00\x01\x00\x03", 5, role="client"), PROTOCOL)
    v5_after(fail(b"\xb0\x04\x00\x01\x00\x02", 5, role="client"), PROTOCOL)


def test_error_repr_and_codes() -> None:
    e = fail(b"\x00\x00")
    assert "MALFORMED_PACKET" in repr(e)
    assert e.return_code is None
    assert not e.in_connect


def test_error_after_good_packets_keeps_them() -> None:
    dec = Decoder(version=4)
    dec.feed(encode(Pingreq()) + encode(Pingreq()) + b"\x00\x00" + encode(Pingreq()))
    it = iter(dec)
    assert next(it) == Pingreq() and next(it) == Pingreq()
    with pytest.raises(MQTTCodecError):
        next(it)
