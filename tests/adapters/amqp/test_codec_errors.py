"""Every error the decoder reports, with its reply code, fatality and close frame."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.amqp.codec import (
    HEARTBEAT,
    PROTOCOL_HEADER,
    SOFT_ERRORS,
    AMQPError,
    BasicAck,
    BasicConsume,
    BasicDeliver,
    BasicProperties,
    BasicPublish,
    BasicQos,
    ChannelClose,
    ChannelOpen,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    Decoder,
    Method,
    ProtocolHeaderError,
    QueueDeclare,
    ReplyCode,
    encode_basic_ack,
    encode_content_header,
    encode_frame,
    encode_method,
    encode_publish,
    is_soft_error,
)

R = ReplyCode


def server(**options) -> Decoder:
    options.setdefault("expect_header", False)
    options.setdefault("frame_max", 131072)
    return Decoder("server", **options)


def error_for(data: bytes, dec: Decoder | None = None) -> AMQPError:
    dec = dec or server()
    dec.feed(data)
    with pytest.raises(AMQPError) as info:
        dec.events()
    return info.value


def method_frame(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return encode_frame(1, channel, struct.pack(">HH", class_id, method_id) + args)


PUBLISH = encode_method(1, BasicPublish("", "q"))
HEADER_5 = encode_content_header(1, 5)
BODY_5 = encode_frame(3, 1, b"12345")

# --- protocol header ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"AMQP\x00\x00\x09\x00",  # 0-9-0
        b"AMQP\x00\x00\x08\x00",  # 0-8
        b"AMQP\x00\x01\x00\x00",  # AMQP 1.0
        b"AMQP\x03\x01\x00\x00",  # AMQP 1.0 SASL
        b"GET / HTTP/1.1\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01",  # TLS client hello
    ],
)
def test_wrong_protocol_header(data: bytes) -> None:
    e = error_for(data, Decoder())
    assert type(e) is ProtocolHeaderError
    assert e.fatal
    assert e.response() == PROTOCOL_HEADER == b"AMQP\x00\x00\x09\x01"
    assert e.received == data[:8]


def test_wrong_protocol_header_refused_before_8_bytes() -> None:
    dec = Decoder()
    dec.feed(b"AMQ")
    assert dec.events() == []
    dec.feed(b"X")
    with pytest.raises(ProtocolHeaderError):
        dec.events()


def test_frames_without_protocol_header() -> None:
    e = error_for(encode_method(0, ConnectionOpen()), Decoder())
    assert type(e) is ProtocolHeaderError


# --- framing (501, fatal) -----------------------------------------------------------------------------


def test_bad_frame_end_is_fatal() -> None:
    dec = server()
    e = error_for(encode_basic_ack(1, 1)[:-1] + b"\x00", dec)
    assert e.code == R.FRAME_ERROR and e.fatal and not e.soft
    assert dec.error is e
    with pytest.raises(AMQPError):  # the decoder is dead
        dec.feed(encode_basic_ack(1, 1))
    with pytest.raises(AMQPError):
        dec.next_event()


@pytest.mark.parametrize(("fudge", "largest"), [(8, 4096), (0, 4088)])
def test_frame_max_before_tune_ok(fudge: int, largest: int) -> None:
    ok = encode_frame(3, 1, b"x" * largest)
    dec = Decoder(expect_header=False, frame_size_fudge=fudge)
    dec.feed(PUBLISH + encode_content_header(1, largest) + ok)
    assert len(dec.events()[0].body) == largest
    # too large: refused from the 7-byte frame header alone, before the payload arrives
    dec = Decoder(expect_header=False, frame_size_fudge=fudge)
    e = error_for(struct.pack(">BHI", 3, 1, largest + 1), dec)
    assert e.code == R.FRAME_ERROR and e.fatal


def test_frame_max_zero_is_unlimited() -> None:
    dec = server(frame_max=0)
    body = b"b" * 300_000
    dec.feed(PUBLISH + encode_content_header(1, len(body)) + encode_frame(3, 1, body))
    assert dec.events()[0].body == body


def test_negotiated_frame_max_enforced() -> None:
    dec = server(frame_max=8192, frame_size_fudge=0)
    e = error_for(encode_frame(3, 1, b"x" * 8185), dec)
    assert e.code == R.FRAME_ERROR and e.fatal


# --- frame contents (501, not fatal) ------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        encode_frame(4, 1, b"x"),  # unknown frame type
        encode_frame(8, 0, b"x"),  # heartbeat with a payload
        encode_frame(1, 1, b"\x00\x3c\x00"),  # method frame shorter than the ids
        PUBLISH + encode_frame(2, 1, b"\x00\x3c\x00\x00" + b"\x00" * 7),  # 11-byte content header
        PUBLISH + HEADER_5 + encode_frame(3, 1, b"123456"),  # body frame beyond body_size
        PUBLISH + HEADER_5 + encode_frame(3, 1, b"123") + encode_frame(3, 1, b"456"),
    ],
    ids=["type-4", "heartbeat-payload", "short-method", "short-header", "body-too-big", "bodies-too-big"],
)
def test_frame_errors(data: bytes) -> None:
    e = error_for(data)
    assert e.code == R.FRAME_ERROR and not e.fatal


@pytest.mark.parametrize("frame_max", [4096, 131072], ids=["three-body-frames", "one-body-frame"])
def test_bodies_above_keep_body_size_are_read_and_dropped(frame_max: int) -> None:
    dec = server(keep_body_size=5000, frame_max=0)
    dec.feed(
        encode_publish(1, "", "q", None, b"x" * 9000, frame_max=frame_max)
        + encode_publish(1, "", "q", None, b"y" * 5000, frame_max=frame_max)
    )
    big, ok = dec.events()
    assert (big.body, big.dropped, big.method.routing_key) == (b"", 9000, "q")
    assert (ok.body, ok.dropped) == (b"y" * 5000, 0)


def test_body_size_above_maximum() -> None:
    e = error_for(PUBLISH + encode_content_header(1, 1001), server(max_body_size=1000))
    assert e.code == R.FRAME_ERROR and (e.class_id, e.method_id) == (60, 40)
    e = error_for(PUBLISH + encode_content_header(1, 536_870_913))  # RabbitMQ's 512 MiB
    assert e.code == R.FRAME_ERROR


# --- malformed arguments and properties (502) -----------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        method_frame(1, 60, 40, b"\x00\x00\x01e\x05rk"),  # publish: routing key runs past the end
        method_frame(1, 60, 40, b"\x00\x00\x00\x00\x00\x00"),  # publish: a trailing byte
        method_frame(1, 60, 80, b"\x00" * 8),  # ack without its bits octet
        method_frame(1, 60, 80, b"\x00" * 10),  # ack with a trailing byte
        method_frame(1, 60, 10, b"\x00\x00"),  # qos truncated
        method_frame(1, 50, 10, b"\x00\x00\x02\xff\xfe\x00\x00\x00\x00\x00"),  # queue name not UTF-8
        method_frame(1, 50, 10, b"\x00\x00\x01q\x00\x00\x00\x00\x03\x01kZ"),  # table: unknown type 'Z'
        method_frame(1, 50, 10, b"\x00\x00\x01q\x00\x00\x00\x00\x09\x01kS\x00\x00\x00\x09ab"),  # long str
        method_frame(1, 50, 10, b"\x00\x00\x01q\x00\x00\x00\x01\x00"),  # table longer than the frame
        method_frame(0, 10, 11, b"\x00\x00\x00\x00"),  # start-ok truncated after the table
        PUBLISH + encode_content_header(1, 0, b"\x80\x00\x05ab"),  # content type runs past the end
        PUBLISH + encode_content_header(1, 0, b"\x10\x00\x02\x03"),  # bytes after the property list
        PUBLISH + encode_content_header(1, 0, b"\x00"),  # one byte of flags
        PUBLISH + encode_content_header(1, 0, b"\x00\x01\x80\x00"),  # flag in a continuation word
    ],
)
def test_syntax_errors(data: bytes) -> None:
    e = error_for(data)
    assert e.code == R.SYNTAX_ERROR and not e.fatal and not e.soft


def test_absurdly_nested_table_is_a_syntax_error() -> None:
    table = b""
    for _ in range(5000):  # {"": {"": {...}}}, far deeper than the Python stack allows
        table = b"\x00F" + len(table).to_bytes(4, "big") + table
    args = b"\x00\x00\x01q\x00" + len(table).to_bytes(4, "big") + table
    e = error_for(method_frame(1, 50, 10, args), server(frame_max=0))
    assert e.code == R.SYNTAX_ERROR


def test_syntax_error_names_the_method() -> None:
    e = error_for(method_frame(1, 60, 10, b"\x00"))
    assert (e.class_id, e.method_id) == (60, 10)
    assert "basic.qos" in e.text


# --- frame sequence (503, 504, 505) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (encode_method(1, BasicDeliver("c", 1)), R.COMMAND_INVALID),  # a client never sends deliver
        (encode_method(1, ConnectionCloseOk()), R.COMMAND_INVALID),  # connection method on channel 1
        (encode_method(0, ChannelOpen()), R.CHANNEL_ERROR),  # channel method on channel 0
        (encode_method(0, BasicQos()), R.CHANNEL_ERROR),
        (encode_basic_ack(0, 1), R.CHANNEL_ERROR),
        (encode_frame(8, 1, b""), R.UNEXPECTED_FRAME),  # heartbeat on channel 1
        (HEADER_5, R.UNEXPECTED_FRAME),  # header without a content method
        (BODY_5, R.UNEXPECTED_FRAME),  # body without a content method
        (PUBLISH + BODY_5, R.UNEXPECTED_FRAME),  # body instead of the header
        (PUBLISH + PUBLISH, R.UNEXPECTED_FRAME),  # method instead of the header
        (PUBLISH + HEADER_5 + HEADER_5, R.UNEXPECTED_FRAME),  # header instead of a body
        (PUBLISH + HEADER_5 + encode_basic_ack(1, 1), R.UNEXPECTED_FRAME),  # method mid-body
        (PUBLISH + HEARTBEAT.replace(b"\x08\x00\x00", b"\x08\x00\x01"), R.UNEXPECTED_FRAME),
        (encode_content_header(0, 5), R.UNEXPECTED_FRAME),  # content on channel 0
        (encode_frame(3, 0, b"x"), R.UNEXPECTED_FRAME),
        (PUBLISH + encode_content_header(1, 5, class_id=50), R.UNEXPECTED_FRAME),  # other class
        (PUBLISH + encode_frame(2, 1, b"\x00\x3c\x00\x01" + bytes(8) + b"\x00\x00"), R.UNEXPECTED_FRAME),
        (method_frame(1, 60, 200, b""), R.NOT_IMPLEMENTED),  # basic.credit (RabbitMQ-internal)
        (method_frame(1, 99, 1, b""), R.NOT_IMPLEMENTED),
        (method_frame(0, 10, 99, b""), R.NOT_IMPLEMENTED),
    ],
)
def test_sequence_errors(data: bytes, code: ReplyCode) -> None:
    e = error_for(data)
    assert e.code == code and not e.fatal


def test_method_mid_content_names_the_content_method() -> None:
    e = error_for(PUBLISH + HEADER_5 + encode_basic_ack(1, 1))
    assert (e.class_id, e.method_id) == (60, 40)
    assert e.reply_text == "UNEXPECTED_FRAME - expected content body, got non content body frame instead"


def test_client_role_refuses_client_methods() -> None:
    dec = Decoder("client")
    e = error_for(encode_publish(1, "", "q", None, b""), dec)
    assert e.code == R.COMMAND_INVALID
    e = error_for(encode_method(1, BasicConsume("q")), Decoder("client"))
    assert e.code == R.COMMAND_INVALID


def test_other_channels_unaffected_by_incomplete_content() -> None:
    dec = server()
    dec.feed(PUBLISH + encode_basic_ack(2, 1))
    assert dec.events() == [Method(2, BasicAck(1))]
    assert dec.in_content(1) and not dec.in_content(2)


# --- after an error -----------------------------------------------------------------------------------


def test_non_fatal_error_switches_to_closing() -> None:
    dec = server()
    dec.feed(
        BODY_5  # 505
        + encode_publish(1, "", "q", None, b"x")
        + encode_basic_ack(1, 1)
        + encode_method(0, QueueDeclare())  # would be a 504, dropped now
        + encode_method(0, ConnectionCloseOk())
    )
    with pytest.raises(AMQPError) as info:
        dec.events()
    assert info.value.code == R.UNEXPECTED_FRAME
    assert dec.closing and dec.error is None
    assert dec.events() == [Method(0, ConnectionCloseOk())]


def test_events_before_an_error_come_out_first() -> None:
    dec = server()
    dec.feed(encode_basic_ack(1, 1) + encode_basic_ack(0, 2) + encode_basic_ack(1, 3))
    assert dec.events() == [Method(1, BasicAck(1))]
    with pytest.raises(AMQPError) as info:
        dec.events()
    assert info.value.code == R.CHANNEL_ERROR
    assert dec.closing and dec.events() == []
    # a fatal error is kept after the events before it, and raised again ever after
    dec = server()
    dec.feed(encode_basic_ack(1, 1) + b"\x01\x00\x01\x00\x00\x00\x00\x00")
    assert dec.events() == [Method(1, BasicAck(1))]
    for _ in range(2):
        with pytest.raises(AMQPError) as info:
            dec.next_event()
        assert info.value.fatal


def test_closing_still_checks_framing() -> None:
    dec = server()
    dec.closing = True
    e = error_for(encode_basic_ack(1, 1)[:-1] + b"\x01", dec)
    assert e.fatal


# --- the exception and its close frames ---------------------------------------------------------------


def decode_close(data: bytes):
    dec = Decoder("client", frame_max=0)
    dec.feed(data)
    (event,) = dec.events()
    return event


def test_connection_error_response() -> None:
    e = error_for(PUBLISH + HEADER_5 + encode_basic_ack(1, 1))
    text = "UNEXPECTED_FRAME - expected content body, got non content body frame instead"
    assert decode_close(e.response()) == Method(0, ConnectionClose(505, text, 60, 40))


def test_soft_error_response_closes_the_channel() -> None:
    e = AMQPError(R.NOT_FOUND, "no queue 'q1' in vhost '/'", class_id=50, method_id=10, channel=3)
    assert e.soft and not e.fatal
    assert decode_close(e.response()) == Method(
        3, ChannelClose(404, "NOT_FOUND - no queue 'q1' in vhost '/'", 50, 10)
    )


def test_soft_code_on_channel_0_closes_the_connection() -> None:
    e = AMQPError(R.ACCESS_REFUSED, "login refused")
    assert not e.soft
    assert decode_close(e.response()) == Method(
        0, ConnectionClose(403, "ACCESS_REFUSED - login refused", 0, 0)
    )


def test_hard_error_on_a_channel_closes_the_connection() -> None:
    e = AMQPError(R.NOT_ALLOWED, "vhost not found", channel=2)
    assert not e.soft
    assert decode_close(e.response()).channel == 0


def test_reply_text_is_cut_at_255_bytes() -> None:
    e = AMQPError(R.PRECONDITION_FAILED, "é" * 300, channel=1)
    assert len(e.reply_text.encode()) <= 255
    assert decode_close(e.response()).method.reply_text == e.reply_text
    assert AMQPError(R.INTERNAL_ERROR).reply_text == "INTERNAL_ERROR"


def test_reply_codes() -> None:
    assert {int(c) for c in SOFT_ERRORS} == {311, 312, 313, 403, 404, 405, 406}
    hard = {320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541}
    assert {int(c) for c in R} == {200} | {int(c) for c in SOFT_ERRORS} | hard
    assert all(not is_soft_error(c) for c in hard)
    assert (R.FRAME_ERROR, R.SYNTAX_ERROR, R.COMMAND_INVALID, R.CHANNEL_ERROR) == (501, 502, 503, 504)
    assert (R.UNEXPECTED_FRAME, R.NOT_IMPLEMENTED, R.CONTENT_TOO_LARGE, R.NO_ROUTE) == (505, 540, 311, 312)
    assert (R.NO_CONSUMERS, R.ACCESS_REFUSED, R.NOT_FOUND, R.RESOURCE_LOCKED) == (313, 403, 404, 405)
    assert R.PRECONDITION_FAILED == 406


def test_repr_mentions_code_and_channel() -> None:
    e = AMQPError(R.NOT_FOUND, "x", channel=4)
    assert "NOT_FOUND 404" in repr(e) and "channel=4" in repr(e)


# --- fuzzing: nothing but AMQPError comes out of the decoder ------------------------------------------


def _valid_stream() -> bytes:
    return b"".join(
        (
            encode_method(0, ConnectionOpen("/")),
            encode_method(1, ChannelOpen()),
            encode_method(1, QueueDeclare("q", arguments={"x-max-length": 10, "t": [1, "a"]})),
            encode_publish(1, "ex", "rk", BasicProperties(headers={"h": "v"}, delivery_mode=2), b"x" * 300),
            encode_basic_ack(1, 1),
            HEARTBEAT,
        )
    )


def _drain(data: bytes, step: int) -> None:
    dec = server(frame_max=4096)
    for i in range(0, len(data), step):
        try:
            dec.feed(data[i : i + step])
            dec.events()
        except AMQPError as e:
            if e.fatal:
                return


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 64))
def test_fuzz_random_bytes(data: bytes, step: int) -> None:
    _drain(data, step)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_mutated_stream(data) -> None:
    stream = bytearray(_valid_stream())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(stream) - 1))
        stream[i] = data.draw(st.integers(0, 255))
    _drain(bytes(stream), data.draw(st.integers(1, 400)))
