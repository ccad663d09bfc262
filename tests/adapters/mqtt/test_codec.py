"""Round trips for every packet type in 3.1, 3.1.1 and 5.0, split feeding and batching."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.mqtt.codec import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    MQTTCodecError,
    Pingreq,
    Pingresp,
    PropertyId,
    PropertyType,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
    encode_puback,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
)
from adapters.mqtt.codec import PropertyId as P
from adapters.mqtt.codec.constants import VALID_REASON_CODES, PacketType
from adapters.mqtt.codec.properties import ALLOWED, PROPERTY_SPEC, WILL

SERVER_BOUND = (
    Connect,
    Publish,
    Puback,
    Pubrec,
    Pubrel,
    Pubcomp,
    Subscribe,
    Unsubscribe,
    Pingreq,
    Disconnect,
    Auth,
)


def decode_all(data: bytes, version: int | None, role: str = "server", **opts) -> list:
    """Decode `data` with a decoder in the state right after the handshake."""
    if role == "client":
        dec = Decoder("client", version=version, **opts)
    elif version is None:
        dec = Decoder(**opts)
    else:
        dec = Decoder(version=version, **opts)
    dec.feed(data)
    out = list(dec)
    assert dec.buffered == 0
    return out


def roundtrip(packet, version: int) -> None:
    data = encode(packet, version)
    if isinstance(packet, Connect):
        assert decode_all(data, None) == [packet]
        return
    if isinstance(packet, SERVER_BOUND):
        assert decode_all(data, version) == [packet]
    if not isinstance(packet, Connect | Subscribe | Unsubscribe | Pingreq) and not (
        isinstance(packet, Disconnect) and version != MQTT_5
    ):
        prefix = b"" if isinstance(packet, Connack) else encode(Connack(), version)
        out = decode_all(prefix + data, version, "client")
        assert out[-1] == packet


# --- explicit examples: every packet type, every version ---------------------------------------------

V3_PACKETS = [
    Connect("client-1", MQTT_3_1_1),
    Connect("", MQTT_3_1_1, clean_start=True, keep_alive=0),
    Connect("c2", MQTT_3_1_1, False, 65535, "user", b"\x00secret", Will("last/will", b"\xffbye", 2, True)),
    Connect("c3", MQTT_3_1_1, True, 10, "only-user"),
    Connack(False, 0),
    Connack(True, 0),
    Connack(False, 5),
    Publish("a/b", b"payload", 0),
    Publish("a/b", b"", 1, True, True, 1),
    Publish("ü/€/𝄞", b"x" * 300, 2, False, False, 65535),
    Publish("$SYS/broker/uptime", b"1", 0, True),
    Puback(1),
    Pubrec(2),
    Pubrel(3),
    Pubcomp(65535),
    Subscribe(7, [Subscription("a/+/c", 1), Subscription("#", 2), Subscription("$share/g/x/#", 0)]),
    Suback(7, [0, 1, 2, 0x80]),
    Unsubscribe(8, ["a/+/c", "#"]),
    Unsuback(8),
    Pingreq(),
    Pingresp(),
    Disconnect(),
]


@pytest.mark.parametrize("packet", V3_PACKETS, ids=lambda p: type(p).__name__)
def test_roundtrip_v311(packet) -> None:
    roundtrip(packet, MQTT_3_1_1)


def test_roundtrip_v31() -> None:
    for packet in [
        Connect("client-31", MQTT_3_1, True, 30, "u", b"p", Will("w/t", b"m", 1)),
        Publish("a/b", b"x", 1, packet_id=5),
        Pubrel(5),
        Subscribe(6, [Subscription("a/#", 1)]),
        Unsubscribe(7, ["a/#"]),
        Connack(False, 0),
        Suback(6, [1]),
        Unsuback(7),
        Pingreq(),
        Disconnect(),
    ]:
        roundtrip(packet, MQTT_3_1)
    data = encode(Connect("client-31", MQTT_3_1))
    assert data[2:10] == b"\x00\x06MQIsdp"


def test_v31_dup_flag_on_retried_subscribe_is_accepted() -> None:
    data = bytearray(encode(Subscribe(6, [Subscription("a", 1)]), MQTT_3_1))
    data[0] |= 0x08
    assert decode_all(bytes(data), MQTT_3_1) == [Subscribe(6, [Subscription("a", 1)])]


V5_PACKETS = [
    Connect("c5", MQTT_5),
    Connect(
        "",
        MQTT_5,
        False,
        120,
        None,
        b"pw-without-user",
        Will(
            "will/t",
            b"w",
            1,
            True,
            {P.WILL_DELAY_INTERVAL: 30, P.PAYLOAD_FORMAT_INDICATOR: 1, P.USER_PROPERTY: [("a", "b")]},
        ),
        {
            P.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF,
            P.RECEIVE_MAXIMUM: 100,
            P.MAXIMUM_PACKET_SIZE: 65536,
            P.TOPIC_ALIAS_MAXIMUM: 10,
            P.REQUEST_RESPONSE_INFORMATION: 1,
            P.REQUEST_PROBLEM_INFORMATION: 0,
            P.AUTHENTICATION_METHOD: "SCRAM",
            P.AUTHENTICATION_DATA: b"\x01",
            P.USER_PROPERTY: [("k", "v"), ("k", "v")],
        },
    ),
    Connack(True, 0, {P.ASSIGNED_CLIENT_IDENTIFIER: "auto-1", P.SERVER_KEEP_ALIVE: 30, P.MAXIMUM_QOS: 1}),
    Connack(
        False,
        ReasonCode.NOT_AUTHORIZED,
        {
            P.REASON_STRING: "no",
            P.RETAIN_AVAILABLE: 0,
            P.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
            P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 1,
            P.SHARED_SUBSCRIPTION_AVAILABLE: 0,
            P.SERVER_REFERENCE: "other:1883",
            P.RESPONSE_INFORMATION: "resp/",
        },
    ),
    Publish("a/b", b"p", 0),
    Publish(
        "a/b",
        b"p" * 200,
        2,
        True,
        True,
        9,
        {
            P.PAYLOAD_FORMAT_INDICATOR: 1,
            P.MESSAGE_EXPIRY_INTERVAL: 60,
            P.CONTENT_TYPE: "text/plain",
            P.RESPONSE_TOPIC: "reply/to",
            P.CORRELATION_DATA: b"\x00\x01",
            P.USER_PROPERTY: [("z", "1"), ("a", "2"), ("z", "3")],
        },
    ),
    Puback(1),
    Puback(2, ReasonCode.NO_MATCHING_SUBSCRIBERS),
    Puback(3, ReasonCode.QUOTA_EXCEEDED, {P.REASON_STRING: "slow down", P.USER_PROPERTY: [("a", "b")]}),
    Puback(4, 0, {P.REASON_STRING: "ok"}),
    Pubrec(5, ReasonCode.PAYLOAD_FORMAT_INVALID),
    Pubrel(6, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND),
    Pubcomp(7, 0, {P.USER_PROPERTY: [("x", "")]}),
    Subscribe(
        10,
        [
            Subscription("a/+", 2, True, True, 2),
            Subscription("$share/grp/s/#", 1, False, True, 1),
            Subscription("#", 0),
        ],
        {P.SUBSCRIPTION_IDENTIFIER: [268_435_455], P.USER_PROPERTY: [("s", "t")]},
    ),
    Suback(10, [2, 1, 0x80, 0x8F, 0xA2], {P.REASON_STRING: "partial"}),
    Unsubscribe(11, ["a/+", "$share/grp/s/#"], {P.USER_PROPERTY: [("u", "v")]}),
    Unsuback(11, [0x00, 0x11], {P.REASON_STRING: "r"}),
    Pingreq(),
    Pingresp(),
    Disconnect(),
    Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE),
    Disconnect(ReasonCode.SERVER_MOVED, {P.SERVER_REFERENCE: "b:1883", P.SESSION_EXPIRY_INTERVAL: 0}),
    Auth(),
    Auth(ReasonCode.CONTINUE_AUTHENTICATION, {P.AUTHENTICATION_METHOD: "SCRAM", P.AUTHENTICATION_DATA: b"x"}),
    Auth(ReasonCode.RE_AUTHENTICATE),
]


@pytest.mark.parametrize("packet", V5_PACKETS, ids=lambda p: type(p).__name__)
def test_roundtrip_v5(packet) -> None:
    roundtrip(packet, MQTT_5)


def test_v5_publish_with_subscription_identifiers_to_client() -> None:
    p = Publish("a/b", b"x", 1, packet_id=3, properties={P.SUBSCRIPTION_IDENTIFIER: [1, 2, 300]})
    out = decode_all(encode(Connack(), 5) + encode(p, 5), 5, "client")
    assert out[-1] == p


def test_short_forms_v5() -> None:
    assert encode(Puback(1), 5) == b"\x40\x02\x00\x01"
    assert encode(Puback(1, 0x10), 5) == b"\x40\x03\x00\x01\x10"
    assert encode(Disconnect(), 5) == b"\xe0\x00"
    assert encode(Disconnect(0x8B), 5) == b"\xe0\x01\x8b"
    assert encode(Auth(), 5) == b"\xf0\x00"
    # A PUBACK with reason code and an explicit zero property length decodes too.
    assert decode_all(b"\x40\x04\x00\x01\x10\x00", 5) == [Puback(1, 0x10)]
    assert decode_all(b"\xe0\x02\x04\x00", 5) == [Disconnect(4)]


def test_v3_drops_v5_only_fields() -> None:
    """Delivering a 5.0 message to a 3.1.1 subscriber: properties and reason codes go."""
    p = Publish("a", b"x", 1, packet_id=2, properties={P.CONTENT_TYPE: "t"})
    assert encode(p, 4) == encode_publish("a", b"x", 1, 2)
    assert encode(Puback(2, 0x80, {P.REASON_STRING: "x"}), 4) == b"\x40\x02\x00\x02"
    assert encode(Suback(1, [0, 0x8F, 0xA2]), 4) == b"\x90\x05\x00\x01\x00\x80\x80"
    with pytest.raises(ValueError):
        encode(Auth(), 4)


def test_fast_encoders_match_generic() -> None:
    for v in (4, 5):
        for qos, pid in ((0, None), (1, 10), (2, 65535)):
            for retain in (False, True):
                p = Publish("t/x", b"y" * 130, qos, retain, bool(qos), pid)
                assert encode_publish("t/x", b"y" * 130, qos, pid, retain, bool(qos), v) == encode(p, v)
                assert encode_publish(b"t/x", b"y" * 130, qos, pid, retain, bool(qos), v) == encode(p, v)
        for fn, cls in ((encode_puback, Puback), (encode_pubrec, Pubrec), (encode_pubrel, Pubrel)):
            assert fn(513, version=v) == encode(cls(513), v)
        assert encode_pubcomp(513, 0x92, v) == encode(Pubcomp(513, 0x92), v)
    with pytest.raises(ValueError):
        encode_publish("a", b"", 1, None)
    with pytest.raises(ValueError):
        encode_publish("a", b"", 3, 1)


# --- hypothesis: random packets ----------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
_level = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/+#"), max_size=8)
topic_names = st.lists(_level, min_size=1, max_size=5).map("/".join).filter(bool)


@st.composite
def topic_filters(draw) -> str:
    levels = draw(st.lists(st.one_of(_level, st.just("+")), min_size=1, max_size=5))
    if draw(st.booleans()):
        levels.append("#")
    f = "/".join(levels)
    if not f:
        f = "#"
    if draw(st.integers(0, 5)) == 0:
        name = draw(
            st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/+#"), min_size=1)
        )
        f = f"$share/{name}/{f}"
    return f


def _value(draw, t: PropertyType, pid: int):
    if pid in (P.RECEIVE_MAXIMUM, P.TOPIC_ALIAS_MAXIMUM, P.SERVER_KEEP_ALIVE):
        return draw(st.integers(1 if pid == P.RECEIVE_MAXIMUM else 0, 0xFFFF))
    if t == PropertyType.BYTE:
        return draw(st.integers(0, 1))
    if t == PropertyType.TWO_BYTE_INT:
        return draw(st.integers(0, 0xFFFF))
    if t == PropertyType.FOUR_BYTE_INT:
        return draw(st.integers(1 if pid == P.MAXIMUM_PACKET_SIZE else 0, 0xFFFFFFFF))
    if t == PropertyType.VARIABLE_BYTE_INT:
        return draw(st.integers(1, 268_435_455))
    if t == PropertyType.UTF8_STRING:
        return draw(topic_names if pid == P.RESPONSE_TOPIC else _text)
    if t == PropertyType.BINARY:
        return draw(st.binary(max_size=20))
    return (draw(_text), draw(_text))


@st.composite
def properties(draw, packet_type: int, exclude: frozenset = frozenset()) -> dict:
    ids = sorted(ALLOWED[packet_type] - exclude)
    chosen = draw(st.lists(st.sampled_from(ids), unique=True, max_size=6)) if ids else []
    props: dict = {}
    for pid in chosen:
        key = PropertyId(pid)
        t = PROPERTY_SPEC[pid][0]
        if pid == P.USER_PROPERTY:
            props[key] = draw(st.lists(st.tuples(_text, _text), min_size=1, max_size=3))
        elif pid == P.SUBSCRIPTION_IDENTIFIER:
            n = 3 if packet_type == PacketType.PUBLISH else 1
            props[key] = draw(st.lists(st.integers(1, 268_435_455), min_size=1, max_size=n))
        else:
            props[key] = _value(draw, t, pid)
    if P.AUTHENTICATION_DATA in props and P.AUTHENTICATION_METHOD not in props:
        props[P.AUTHENTICATION_METHOD] = "m"
    return props


def _props_or_empty(draw, version: int, packet_type: int, exclude: frozenset = frozenset()) -> dict:
    return draw(properties(packet_type, exclude)) if version == MQTT_5 else {}


@st.composite
def connects(draw) -> Connect:
    v = draw(st.sampled_from([MQTT_3_1, MQTT_3_1_1, MQTT_5]))
    if v == MQTT_3_1:
        cid = draw(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=23))
    else:
        cid = draw(_text)
    clean = draw(st.booleans()) if cid or v == MQTT_5 else True
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_names),
            draw(st.binary(max_size=30)),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            _props_or_empty(draw, v, WILL),
        )
    username = draw(st.one_of(st.none(), _text))
    password = draw(st.one_of(st.none(), st.binary(max_size=10)))
    if username is None and v != MQTT_5:
        password = None
    return Connect(
        cid, v, clean, draw(st.integers(0, 0xFFFF)), username, password, will,
        _props_or_empty(draw, v, PacketType.CONNECT),
    )  # fmt: skip


@st.composite
def acks(draw, v: int):
    cls = draw(st.sampled_from([Puback, Pubrec, Pubrel, Pubcomp]))
    if v != MQTT_5:
        return cls(draw(st.integers(0, 0xFFFF)))
    return cls(
        draw(st.integers(0, 0xFFFF)),
        draw(st.sampled_from(sorted(VALID_REASON_CODES[cls.packet_type]))),
        draw(properties(cls.packet_type)),
    )


@st.composite
def server_bound(draw, v: int):
    kind = draw(st.sampled_from(["pub", "ack", "sub", "unsub", "ping", "disc", "auth"]))
    if kind == "pub":
        qos = draw(st.integers(0, 2))
        return Publish(
            draw(topic_names),
            draw(st.binary(max_size=200)),
            qos,
            draw(st.booleans()),
            draw(st.booleans()) if qos else False,
            draw(st.integers(1, 0xFFFF)) if qos else None,
            _props_or_empty(
                draw, v, PacketType.PUBLISH, frozenset({P.TOPIC_ALIAS, P.SUBSCRIPTION_IDENTIFIER})
            ),
        )
    if kind == "ack":
        return draw(acks(v))
    if kind == "sub":
        subs = []
        for f in draw(st.lists(topic_filters(), min_size=1, max_size=4)):
            if v == MQTT_5:
                shared = f.startswith("$share/")
                subs.append(
                    Subscription(
                        f,
                        draw(st.integers(0, 2)),
                        False if shared else draw(st.booleans()),
                        draw(st.booleans()),
                        draw(st.integers(0, 2)),
                    )
                )
            else:
                subs.append(Subscription(f, draw(st.integers(0, 2))))
        return Subscribe(draw(st.integers(1, 0xFFFF)), subs, _props_or_empty(draw, v, PacketType.SUBSCRIBE))
    if kind == "unsub":
        return Unsubscribe(
            draw(st.integers(1, 0xFFFF)),
            draw(st.lists(topic_filters(), min_size=1, max_size=4)),
            _props_or_empty(draw, v, PacketType.UNSUBSCRIBE),
        )
    if kind == "ping" or v != MQTT_5 and kind == "auth":
        return Pingreq()
    if kind == "disc":
        if v != MQTT_5:
            return Disconnect()
        return Disconnect(
            draw(st.sampled_from(sorted(VALID_REASON_CODES[PacketType.DISCONNECT]))),
            draw(properties(PacketType.DISCONNECT)),
        )
    return Auth(
        draw(st.sampled_from(sorted(VALID_REASON_CODES[PacketType.AUTH]))),
        draw(properties(PacketType.AUTH)),
    )


@st.composite
def client_bound(draw, v: int):
    kind = draw(st.sampled_from(["pub", "ack", "suback", "unsuback", "ping", "disc"]))
    if kind == "pub":
        qos = draw(st.integers(0, 2))
        return Publish(
            draw(topic_names),
            draw(st.binary(max_size=200)),
            qos,
            draw(st.booleans()),
            False,
            draw(st.integers(1, 0xFFFF)) if qos else None,
            _props_or_empty(draw, v, PacketType.PUBLISH, frozenset({P.TOPIC_ALIAS})),
        )
    if kind == "ack":
        return draw(acks(v))
    if kind == "suback":
        valid = sorted(VALID_REASON_CODES[PacketType.SUBACK]) if v == MQTT_5 else [0, 1, 2, 0x80]
        return Suback(
            draw(st.integers(1, 0xFFFF)),
            draw(st.lists(st.sampled_from(valid), min_size=1, max_size=5)),
            _props_or_empty(draw, v, PacketType.SUBACK),
        )
    if kind == "unsuback":
        if v != MQTT_5:
            return Unsuback(draw(st.integers(1, 0xFFFF)))
        return Unsuback(
            draw(st.integers(1, 0xFFFF)),
            draw(st.lists(st.sampled_from(sorted(VALID_REASON_CODES[PacketType.UNSUBACK])), min_size=1)),
            draw(properties(PacketType.UNSUBACK)),
        )
    if kind == "disc" and v == MQTT_5:
        return Disconnect(
            draw(st.sampled_from(sorted(VALID_REASON_CODES[PacketType.DISCONNECT]))),
            draw(properties(PacketType.DISCONNECT)),
        )
    return Pingresp()


@given(connects())
def test_hypothesis_connect_roundtrip(packet: Connect) -> None:
    assert decode_all(encode(packet), None) == [packet]


@st.composite
def server_sessions(draw):
    connect = draw(connects())
    v = connect.protocol_level
    return connect, draw(st.lists(server_bound(v), max_size=8))


@st.composite
def client_sessions(draw):
    v = draw(st.sampled_from([MQTT_3_1_1, MQTT_5]))
    props = _props_or_empty(draw, v, PacketType.CONNACK)
    return v, [Connack(draw(st.booleans()), 0, props), *draw(st.lists(client_bound(v), max_size=8))]


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150)
@given(server_sessions(), st.data())
def test_hypothesis_server_stream_split_anywhere(session, data) -> None:
    """A CONNECT and packets after it, as one stream cut into random pieces, decode to the same packets."""
    connect, packets = session
    v = connect.protocol_level
    stream = encode(connect) + b"".join(encode(p, v) for p in packets)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    dec = Decoder()
    out = []
    prev = 0
    for c in [*cuts, len(stream)]:
        dec.feed(stream[prev:c])
        out.extend(dec)
        prev = c
    assert out == [connect, *packets]
    assert dec.version == v and dec.buffered == 0


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=100)
@given(client_sessions())
def test_hypothesis_client_stream(session) -> None:
    v, packets = session
    dec = Decoder("client", version=v)
    dec.feed(b"".join(encode(p, v) for p in packets))
    assert list(dec) == packets


# --- split feeding and batching ---------------------------------------------------------------------


def _sample_stream() -> tuple[list, bytes]:
    connect = Connect("split", MQTT_5, properties={P.TOPIC_ALIAS_MAXIMUM: 5, P.USER_PROPERTY: [("a", "b")]})
    packets = [
        connect,
        Publish("a/b", b"x" * 200, 1, packet_id=1),  # two-byte remaining length
        Publish("big", b"y" * 20_000, 0, properties={P.CONTENT_TYPE: "c"}),  # three-byte remaining length
        Puback(1),
        Subscribe(2, [Subscription("a/#", 1)]),
        Pingreq(),
        Disconnect(0x04, {P.REASON_STRING: "bye"}),
    ]
    return packets, b"".join(encode(p, MQTT_5) for p in packets)


def test_split_at_every_offset() -> None:
    packets, stream = _sample_stream()
    for i in range(len(stream) + 1):
        dec = Decoder()
        dec.feed(stream[:i])
        out = list(dec)
        dec.feed(stream[i:])
        out.extend(dec)
        assert out == packets, i


def test_byte_by_byte() -> None:
    packets, stream = _sample_stream()
    dec = Decoder()
    out = []
    for i in range(len(stream)):
        dec.feed(stream[i : i + 1])
        out.extend(dec)
    assert out == packets
    assert dec.buffered == 0


def test_split_inside_remaining_length_varint() -> None:
    raw = encode(Publish("t", b"z" * 2_100_000, 0), 4)  # four-byte remaining length
    assert raw[1] & 0x80 and raw[2] & 0x80 and raw[3] & 0x80 and not raw[4] & 0x80
    for cut in (1, 2, 3, 4):
        dec = Decoder(version=4)
        dec.feed(raw[:cut])
        assert dec.next_packet() is None
        dec.feed(raw[cut:])
        assert dec.next_packet().payload == b"z" * 2_100_000


def test_many_packets_in_one_feed() -> None:
    pubs = [Publish(f"d/{i}/t", bytes([i % 256]) * (i % 50), 1, packet_id=i + 1) for i in range(1000)]
    dec = Decoder(version=MQTT_3_1_1)
    dec.feed(b"".join(encode(p, 4) for p in pubs) + b"\x40\x02")  # plus half a PUBACK
    assert list(dec) == pubs
    assert dec.buffered == 2
    dec.feed(b"\x00\x09")
    assert list(dec) == [Puback(9)]


def test_receive_returns_the_packets_before_an_error_with_it() -> None:
    """`receive` = feed + every complete packet; an error comes with the packets decoded before
    it, stays (later calls give it at once) and leaves no packet behind."""
    pubs = [Publish(f"t/{i}", b"x", 1, packet_id=i + 1) for i in range(3)]
    dec = Decoder(version=MQTT_3_1_1)
    raw = b"".join(encode(p, 4) for p in pubs)
    assert dec.receive(raw[:-2]) == (pubs[:2], None)  # the third is incomplete
    got, err = dec.receive(raw[-2:] + b"\x00\x00")  # the rest, then a reserved packet type 0
    assert got == pubs[2:] and isinstance(err, MQTTCodecError)
    again, err2 = dec.receive(encode(pubs[0], 4))
    assert again == [] and err2 is err


def test_partial_iteration_then_more_data() -> None:
    """Stopping iteration midway and feeding more never hides complete packets."""
    big = encode(Publish("big", b"x" * 5000, 0), 4)
    small = encode(Publish("s", b"y", 0), 4)
    dec = Decoder(version=4)
    dec.feed(big[:100])
    assert dec.next_packet() is None  # waiting for 5000+ bytes
    dec.feed(big[100:] + small + small)
    assert dec.next_packet().topic == "big"
    assert dec.next_packet().topic == "s"  # stop here: one small packet left unread
    dec.feed(small)
    assert [p.topic for p in dec] == ["s", "s"]
    dec.feed(small + small)
    assert dec.next_packet().topic == "s"
    dec.feed(small[:1])
    dec.feed(small[1:])
    assert [p.topic for p in dec] == ["s", "s"]


def test_accepts_bytearray_and_memoryview() -> None:
    raw = encode(Publish("a", b"b", 1, packet_id=1), 4)
    dec = Decoder(version=4)
    buf = bytearray(raw)
    dec.feed(buf)
    buf[:] = b"\x00" * len(buf)  # the decoder kept its own copy
    dec.feed(memoryview(raw))
    assert [p.topic for p in dec] == ["a", "a"]


def test_next_packet_none_when_empty() -> None:
    dec = Decoder(version=4)
    assert dec.next_packet() is None
    dec.feed(b"")
    assert dec.next_packet() is None


def test_version_learned_from_connect() -> None:
    for level in (3, 4, 5):
        dec = Decoder()
        assert dec.version is None
        dec.feed(encode(Connect("abc", level)) + encode(Publish("a", b"", 1, packet_id=1), level))
        assert [type(p) for p in dec] == [Connect, Publish]
        assert dec.version == level


def test_topic_alias_resolution() -> None:
    dec = Decoder(version=5, topic_alias_maximum=10)
    first = Publish("long/topic/name", b"1", 0, properties={P.TOPIC_ALIAS: 3})
    second = Publish("", b"2", 0, properties={P.TOPIC_ALIAS: 3})
    dec.feed(encode(first, 5) + encode(second, 5))
    out = list(dec)
    assert [p.topic for p in out] == ["long/topic/name", "long/topic/name"]
    assert out[1].properties == {P.TOPIC_ALIAS: 3}
    # A new topic re-maps the alias.
    dec.feed(encode(Publish("other", b"3", 0, properties={P.TOPIC_ALIAS: 3}), 5) + encode(second, 5))
    assert [p.topic for p in dec] == ["other", "other"]
