"""Round trips of every method, content assembly, split and batched feeds, the fast encoders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.amqp.codec import (
    HEARTBEAT,
    METHODS,
    PROTOCOL_HEADER,
    AMQPError,
    BasicAck,
    BasicDeliver,
    BasicGetOk,
    BasicNack,
    BasicProperties,
    BasicPublish,
    BasicReject,
    BasicReturn,
    ChannelOpen,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionTuneOk,
    ContentBody,
    ContentHeader,
    Decoder,
    Heartbeat,
    Message,
    Method,
    ProtocolHeader,
    ReplyCode,
    decode_arguments,
    decode_frames,
    encode_arguments,
    encode_basic_ack,
    encode_basic_nack,
    encode_body,
    encode_content_header,
    encode_deliver,
    encode_get_ok,
    encode_message,
    encode_method,
    encode_properties,
    encode_publish,
    encode_return,
)
from tests.adapters.amqp.samples import PROPERTIES, SAMPLES
from tests.adapters.amqp.support import channel_for, role_decoding

IDS = [s.NAME for s in SAMPLES]


def server_decoder(**options) -> Decoder:
    options.setdefault("expect_header", False)
    options.setdefault("frame_max", 131072)
    return Decoder("server", **options)


def client_decoder(**options) -> Decoder:
    options.setdefault("frame_max", 131072)
    return Decoder("client", **options)


def decode_one(method, **options) -> Method:
    dec = server_decoder(**options) if role_decoding(method) == "server" else client_decoder(**options)
    dec.assemble = False
    dec.feed(encode_method(channel_for(method), method))
    events = dec.events()
    assert len(events) == 1 and dec.buffered == 0
    return events[0]


# --- every method ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", SAMPLES, ids=IDS)
def test_method_round_trip(method) -> None:
    event = decode_one(method)
    assert event == Method(channel_for(method), method)


@pytest.mark.parametrize("method", SAMPLES, ids=IDS)
def test_arguments_round_trip(method) -> None:
    raw = encode_arguments(method)
    assert decode_arguments(type(method), raw, 0, len(raw)) == method


@pytest.mark.parametrize("method", SAMPLES, ids=IDS)
def test_default_instance_round_trips(method) -> None:
    default = type(method)()
    raw = encode_arguments(default)
    assert decode_arguments(type(default), raw, 0, len(raw)) == default


def test_every_method_is_registered_once() -> None:
    assert len(METHODS) == 66
    assert len({c.NAME for c in METHODS.values()}) == 66
    for key, cls in METHODS.items():
        assert key == (cls.CLASS_ID << 16) | cls.METHOD_ID


def test_method_frame_layout() -> None:
    assert encode_method(1, ChannelOpen()) == bytes.fromhex("01 0001 00000005 0014 000A 00 CE")
    assert encode_method(0, ConnectionCloseOk()) == bytes.fromhex("01 0000 00000004 000A 0033 CE")
    # bits: mandatory is the low-order bit of the octet after the routing key
    assert encode_method(1, BasicPublish("e", "k", True, True)) == bytes.fromhex(
        "01 0001 0000000B 003C 0028 0000 0165 016B 03 CE"
    )


def test_bits_pack_into_one_octet() -> None:
    from adapters.amqp.codec import QueueDeclare

    raw = encode_arguments(QueueDeclare("q", passive=True, exclusive=True, nowait=True))
    # ticket, "q", bits (passive=1, durable=2, exclusive=4, auto_delete=8, nowait=16), empty table
    assert raw == bytes.fromhex("0000 0171 15 00000000")


# --- content ----------------------------------------------------------------------------------------


def test_publish_assembled_in_one_feed() -> None:
    dec = Decoder(frame_max=131072)
    data = PROTOCOL_HEADER + encode_publish(3, "amq.topic", "a.b", PROPERTIES, b"hello")
    dec.feed(data)
    header, message = dec.events()
    assert header == ProtocolHeader((0, 9, 1))
    assert type(message) is Message
    assert message.channel == 3
    assert message.method == BasicPublish("amq.topic", "a.b")
    assert message.properties == PROPERTIES
    assert message.raw_properties == encode_properties(PROPERTIES)
    assert message.body == b"hello"


@pytest.mark.parametrize("frame_max", [4096, 4097, 5000, 131072, 0])
@pytest.mark.parametrize("size", [0, 1, 4087, 4088, 4089, 10_000])
def test_publish_body_split_and_reassembled(frame_max: int, size: int) -> None:
    body = bytes(i % 251 for i in range(size))
    data = encode_publish(1, "", "q", None, body, frame_max)
    chunk = frame_max - 8 if frame_max else size
    frames = (size + chunk - 1) // chunk if size else 0
    assert len(data) == 18 + 22 + frames * 8 + size  # publish frame + header frame + body frames
    dec = server_decoder(frame_max=frame_max, frame_size_fudge=0)
    dec.feed(data)
    (message,) = dec.events()
    assert message.body == body and message.properties == BasicProperties()


def test_publish_streamed_without_assembly() -> None:
    data = encode_publish(1, "ex", "rk", PROPERTIES, b"x" * 10_000, 4096)
    dec = server_decoder(frame_max=4096, assemble=False)
    dec.feed(data)
    events = dec.events()
    assert events[0] == Method(1, BasicPublish("ex", "rk"))
    assert type(events[1]) is ContentHeader
    assert (events[1].channel, events[1].class_id, events[1].body_size) == (1, 60, 10_000)
    assert events[1].properties == PROPERTIES
    bodies = events[2:]
    assert [type(e) for e in bodies] == [ContentBody] * 3
    assert b"".join(e.data for e in bodies) == b"x" * 10_000
    assert not dec.in_content(1)


def test_empty_body_has_no_body_frame() -> None:
    data = encode_publish(1, "", "q", None, b"")
    assert len(data) == 18 + 22
    dec = server_decoder(assemble=False)
    dec.feed(data)
    events = dec.events()
    assert len(events) == 2 and events[1].body_size == 0 and not dec.in_content(1)
    (message,) = decode_frames(data)
    assert message.body == b""


def test_interleaved_channels() -> None:
    a = encode_publish(1, "", "a", None, b"A" * 5000, 4096)
    b = encode_publish(2, "", "b", None, b"B" * 10, 4096)
    ack = encode_basic_ack(3, 7)
    # channel 2's message and an ack on 3 between the two body frames of channel 1
    cut = len(a) - (8 + 5000 - 4088)
    dec = server_decoder(frame_max=4096)
    dec.feed(a[:cut] + b + ack + a[cut:])
    events = dec.events()
    assert [type(e) for e in events] == [Message, Method, Message]
    assert events[0].channel == 2 and events[0].body == b"B" * 10
    assert events[1] == Method(3, BasicAck(7, False))
    assert events[2].channel == 1 and events[2].body == b"A" * 5000


def test_lazy_properties() -> None:
    data = encode_publish(1, "", "q", PROPERTIES, b"x")
    (message,) = decode_frames(data, decode_properties=False)
    assert message._properties is None
    assert message.raw_properties == encode_properties(PROPERTIES)
    assert message.properties == PROPERTIES  # decoded on first access
    assert message._properties is not None


def test_lazy_properties_error_is_a_syntax_error() -> None:
    bad = encode_method(1, BasicPublish()) + encode_content_header(1, 0, b"\x80\x00\x05ab")
    (message,) = decode_frames(bad, decode_properties=False)
    with pytest.raises(AMQPError) as info:
        _ = message.properties
    assert info.value.code == ReplyCode.SYNTAX_ERROR


# --- feeding ---------------------------------------------------------------------------------------


def _stream() -> tuple[bytes, list]:
    """A client session's bytes and the events a server decoder must give for them."""
    props = BasicProperties(delivery_mode=2, headers={"k": "v"})
    client_methods = [s for s in SAMPLES if role_decoding(s) == "server" and not s.HAS_CONTENT]
    body = b"z" * 9000
    parts = [
        (PROTOCOL_HEADER, ProtocolHeader()),
        *[(encode_method(channel_for(s), s), Method(channel_for(s), s)) for s in client_methods],
        (HEARTBEAT, Heartbeat()),
        (
            encode_publish(5, "ex", "rk", props, body, 4096),
            Message(5, BasicPublish("ex", "rk"), props, body, encode_properties(props)),
        ),
        (encode_basic_ack(5, 1, True), Method(5, BasicAck(1, True))),
        (encode_basic_nack(5, 2, False, True), Method(5, BasicNack(2, False, True))),
    ]
    data = b"".join(raw for raw, _ in parts)
    return data, [ev for _, ev in parts]


def _decoder_for_stream() -> Decoder:
    return Decoder("server")


def test_one_feed() -> None:
    data, expected = _stream()
    dec = _decoder_for_stream()
    dec.feed(data)
    assert dec.events() == expected
    assert dec.buffered == 0


def test_byte_by_byte() -> None:
    data, expected = _stream()
    dec = _decoder_for_stream()
    events = []
    for i in range(len(data)):
        dec.feed(data[i : i + 1])
        events.extend(dec)
    assert events == expected
    assert dec.buffered == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=80))
def test_random_splits(sizes: list[int]) -> None:
    data, expected = _stream()
    dec = _decoder_for_stream()
    events = []
    pos = 0
    i = 0
    while pos < len(data):
        step = sizes[i % len(sizes)]
        dec.feed(bytearray(data[pos : pos + step]))
        pos += step
        i += 1
        events.extend(dec.events())
    assert events == expected


def test_many_messages_in_one_feed() -> None:
    one = encode_publish(1, "amq.direct", "k", BasicProperties(content_type="text/plain"), b"m")
    dec = server_decoder()
    dec.feed(one * 1000 + encode_basic_ack(1, 5))
    events = dec.events()
    assert len(events) == 1001
    assert all(type(e) is Message and e.body == b"m" for e in events[:1000])


def test_partial_frame_then_next() -> None:
    dec = server_decoder()
    ack = encode_basic_ack(1, 1)
    dec.feed(ack[:5])
    assert dec.next_event() is None
    assert dec.buffered == 5
    dec.feed(ack[5:] + ack[:3])
    assert dec.next_event() == Method(1, BasicAck(1))
    assert dec.next_event() is None
    dec.feed(ack[3:])
    assert dec.next_event() == Method(1, BasicAck(1))


def test_feed_accepts_memoryview_and_empty() -> None:
    dec = server_decoder()
    dec.feed(b"")
    dec.feed(memoryview(encode_basic_ack(1, 9)))
    assert dec.events() == [Method(1, BasicAck(9))]


# --- protocol header, tune-ok, closing ----------------------------------------------------------------


def test_protocol_header_0_9_is_accepted_as_0_9_1() -> None:
    dec = Decoder()
    dec.feed(b"AMQP\x01\x01\x00\x09")
    assert dec.events() == [ProtocolHeader((0, 9, 0))]


def test_protocol_header_split() -> None:
    dec = Decoder()
    for b in PROTOCOL_HEADER:
        assert dec.events() == []
        dec.feed(bytes((b,)))
    assert dec.events() == [ProtocolHeader()]


def test_tune_ok_sets_frame_max() -> None:
    dec = Decoder(expect_header=False)
    assert dec.frame_max == 4096
    dec.feed(encode_method(0, ConnectionTuneOk(2047, 131072, 60)))
    dec.events()
    assert dec.frame_max == 131072
    dec.feed(encode_publish(1, "", "q", None, b"x" * 100_000, 131072))
    assert len(dec.events()[0].body) == 100_000


def test_closing_mode_keeps_only_connection_close() -> None:
    dec = server_decoder()
    dec.closing = True
    dec.feed(
        encode_publish(1, "", "q", None, b"x")
        + encode_basic_ack(1, 1)
        + HEARTBEAT
        + encode_method(0, ConnectionClose(200, "bye"))
        + encode_method(0, ConnectionCloseOk())
    )
    assert dec.events() == [Method(0, ConnectionClose(200, "bye")), Method(0, ConnectionCloseOk())]


def test_client_role_decodes_server_content() -> None:
    dec = client_decoder()
    deliver = encode_deliver(1, "ctag", 10, True, "ex", "rk", PROPERTIES, b"d" * 9000, 4096)
    get_ok = encode_get_ok(2, 11, False, "ex", "q", 3, None, b"g")
    ret = encode_return(3, 312, "NO_ROUTE", "ex", "rk", BasicProperties(app_id="a"), b"r")
    dec.feed(deliver + get_ok + ret + encode_basic_ack(1, 4) + encode_basic_nack(1, 5, True))
    d, g, r, a, n = dec.events()
    assert d.method == BasicDeliver("ctag", 10, True, "ex", "rk")
    assert d.properties == PROPERTIES and d.body == b"d" * 9000
    assert g.method == BasicGetOk(11, False, "ex", "q", 3) and g.body == b"g"
    assert r.method == BasicReturn(312, "NO_ROUTE", "ex", "rk") and r.properties.app_id == "a"
    assert a == Method(1, BasicAck(4)) and n == Method(1, BasicNack(5, True, False))


# --- encoders ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("frame_max", [4096, 131072, 0])
def test_encode_deliver_equals_generic_encoding(frame_max: int) -> None:
    body = bytes(range(256)) * 40
    fast = encode_deliver(7, "ctag", 99, True, "ex", "rk", PROPERTIES, body, frame_max)
    generic = encode_message(7, BasicDeliver("ctag", 99, True, "ex", "rk"), PROPERTIES, body, frame_max)
    assert fast == generic
    # raw (already encoded) properties and bytes names give the same bytes
    raw = encode_properties(PROPERTIES)
    assert encode_deliver(7, b"ctag", 99, True, b"ex", b"rk", raw, body, frame_max) == fast


def test_largest_delivery_tag() -> None:
    tag = 2**64 - 1
    dec = client_decoder()
    dec.feed(
        encode_deliver(1, "c", tag, False, "", "q", None, b"x")
        + encode_get_ok(1, tag, False, "", "q", 0, None, b"")
    )
    deliver, get_ok = dec.events()
    assert deliver.method.delivery_tag == get_ok.method.delivery_tag == tag
    dec = server_decoder()
    dec.feed(encode_basic_ack(1, tag) + encode_method(1, BasicReject(tag)) + encode_basic_nack(1, tag))
    assert [e.method.delivery_tag for e in dec.events()] == [tag] * 3


def test_encode_get_ok_and_return_equal_generic_encoding() -> None:
    assert encode_get_ok(1, 5, True, "ex", "rk", 3, PROPERTIES, b"body") == encode_message(
        1, BasicGetOk(5, True, "ex", "rk", 3), PROPERTIES, b"body"
    )
    assert encode_return(1, 312, "NO_ROUTE", "ex", "rk", None, b"") == encode_message(
        1, BasicReturn(312, "NO_ROUTE", "ex", "rk"), None, b""
    )
    assert encode_publish(1, "ex", "rk", PROPERTIES, b"b", mandatory=True) == encode_message(
        1, BasicPublish("ex", "rk", True), PROPERTIES, b"b"
    )


def test_encode_acks_equal_generic_encoding() -> None:
    assert encode_basic_ack(3, 2**64 - 1, True) == encode_method(3, BasicAck(2**64 - 1, True))
    assert encode_basic_nack(3, 8, True, True) == encode_method(3, BasicNack(8, True, True))
    assert encode_basic_nack(3, 8) == encode_method(3, BasicNack(8, False, False))


def test_encode_body_splits_at_frame_max_minus_8() -> None:
    frames = encode_body(1, b"a" * 10, 12)
    assert frames == (b"\x03\x00\x01\x00\x00\x00\x04aaaa\xce" * 2) + b"\x03\x00\x01\x00\x00\x00\x02aa\xce"
    assert encode_body(1, b"") == b""
    with pytest.raises(ValueError):
        encode_body(1, b"a", 8)


def test_encoders_reject_long_short_strings() -> None:
    with pytest.raises(ValueError):
        encode_deliver(1, "c" * 256, 1, False, "", "", None, b"")
    with pytest.raises(ValueError):
        encode_method(1, BasicPublish("e" * 256))
    with pytest.raises(ValueError):
        encode_message(1, BasicAck(), None, b"")


def test_reject_fast_path_matches_generic() -> None:
    dec = server_decoder()
    dec.feed(encode_method(1, BasicReject(5, False)) + encode_method(1, BasicReject(6, True)))
    assert dec.events() == [Method(1, BasicReject(5, False)), Method(1, BasicReject(6, True))]


def test_non_ascii_names_round_trip() -> None:
    pub = BasicPublish("échange", "clé.✓", False, False)
    (message,) = decode_frames(encode_message(1, pub, None, b""))
    assert message.method == pub
    # bytes that are not UTF-8 survive in a publish routing key (RabbitMQ does not check them)
    raw = encode_publish(1, b"ex", b"\xff\xfe", None, b"")
    (message,) = decode_frames(raw)
    assert message.method.routing_key.encode("utf-8", "surrogateescape") == b"\xff\xfe"
    assert encode_method(1, message.method) == raw[: raw.index(b"\xce") + 1]


# --- property-based: any argument values round-trip -------------------------------------------------

short_text = st.text(max_size=60).filter(lambda s: len(s.encode("utf-8", "surrogatepass")) <= 255)
table_values = st.recursive(
    st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=10), st.binary(max_size=10)),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)
ARG_STRATEGIES = {
    "o": st.integers(0, 255),
    "h": st.integers(0, 65535),
    "l": st.integers(0, 2**32 - 1),
    "q": st.integers(0, 2**64 - 1),
    "b": st.booleans(),
    "s": short_text.filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)),
    "z": short_text.filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)),
    "S": st.binary(max_size=300),
    "F": st.dictionaries(st.text(max_size=8), table_values, max_size=4),
}


@st.composite
def any_method(draw):
    cls = draw(st.sampled_from(sorted(METHODS.values(), key=lambda c: c.NAME)))
    args = [draw(ARG_STRATEGIES[code]) for code, name in cls.SPEC if name]
    return cls(*args)


@settings(max_examples=500, deadline=None)
@given(any_method())
def test_any_method_round_trips(method) -> None:
    assert decode_one(method) == Method(channel_for(method), method)
