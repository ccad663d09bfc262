"""Interop both ways with two independent AMQP codecs as oracles: pamqp 4 (aio-pika's) and pika 1.x.

- ours -> oracle: bytes from our encoders are decoded by pamqp.frame.unmarshal and by
  pika.frame.decode_frame into the same method / properties / body;
- oracle -> ours: frames built by pamqp.frame.marshal and by pika.frame.Method/Header/Body.marshal
  are decoded by our Decoder into the same values.

Values are compared after normalising the oracles' representation choices (long strings as str
or bytes, timestamps as datetime, pamqp's `exchange_type` / `message_type` and pika's
`global_qos` for our `type` and `global_`). Known oracle limitations, worked around below:
pamqp reads longlong (delivery tags) as signed and refuses a non-empty cluster_id property;
pika cannot decode connection.update-secret (its decode() is a copy of secure-ok's), truncates
'f'/'d' table values to int and cannot encode floats.
"""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest

from adapters.amqp.codec import (
    HEARTBEAT,
    PROTOCOL_HEADER,
    AMQPError,
    BasicDeliver,
    BasicGetOk,
    BasicProperties,
    BasicPublish,
    BasicReturn,
    Decoder,
    Message,
    Method,
    ReplyCode,
    Timestamp,
    Typed,
    decode_table,
    encode_basic_ack,
    encode_basic_nack,
    encode_deliver,
    encode_get_ok,
    encode_method,
    encode_properties,
    encode_return,
    encode_table,
)
from tests.adapters.amqp.samples import PROPERTIES, SAMPLES, TABLE
from tests.adapters.amqp.support import channel_for, role_decoding

pamqp_frame = pytest.importorskip("pamqp.frame")
import pamqp.body  # noqa: E402
import pamqp.commands  # noqa: E402
import pamqp.header  # noqa: E402
import pamqp.heartbeat  # noqa: E402
import pika.frame  # noqa: E402
import pika.spec  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")

IDS = [s.NAME for s in SAMPLES]
PAMQP_SAMPLES = [s for s in SAMPLES if s.CLASS_ID != 30]  # pamqp has no access class
RENAMES_PAMQP = {"type": "exchange_type"}
RENAMES_PIKA = {"global_": "global_qos"}


def norm(value: Any) -> Any:
    """A representation-neutral form of a decoded value."""
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return bytes(value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return int(value.timestamp())
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, dict):
        return {norm(k): norm(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [norm(v) for v in value]
    return value


def fields_raw(method) -> dict[str, Any]:
    return {name: getattr(method, name) for _, name in method.SPEC if name}


def fields_of(method) -> dict[str, Any]:
    return {name: norm(getattr(method, name)) for _, name in method.SPEC if name}


def oracle_fields(obj, method, renames: dict[str, str]) -> dict[str, Any]:
    return {name: norm(getattr(obj, renames.get(name, name))) for _, name in method.SPEC if name}


def to_pamqp_value(value: Any) -> Any:
    """pamqp encodes bytes only as bytearray ('x') and timestamps only from datetime."""
    if isinstance(value, Timestamp):
        return datetime.datetime.fromtimestamp(int(value), tz=datetime.UTC)
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, dict):
        return {k: to_pamqp_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_pamqp_value(v) for v in value]
    return value


def to_pika_value(value: Any) -> Any:
    if isinstance(value, Timestamp):
        return datetime.datetime.fromtimestamp(int(value), tz=datetime.UTC).replace(tzinfo=None)
    if isinstance(value, dict):
        return {k: to_pika_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_pika_value(v) for v in value]
    return value


def our_decoder(method) -> Decoder:
    role = role_decoding(method)
    return Decoder(role, expect_header=False, frame_max=0, assemble=False)


def decode_ours(data: bytes, method) -> list:
    dec = our_decoder(method)
    dec.feed(data)
    return dec.events()


def pamqp_frames(data: bytes) -> list[tuple[int, Any]]:
    out = []
    while data:
        used, channel, frame = pamqp_frame.unmarshal(data)
        out.append((channel, frame))
        data = data[used:]
    return out


def pika_frames(data: bytes) -> list:
    out = []
    while data:
        used, frame = pika.frame.decode_frame(data)
        assert frame is not None, "pika needs more bytes"
        out.append(frame)
        data = data[used:]
    return out


# --- methods: ours -> oracle --------------------------------------------------------------------------


@pytest.mark.parametrize("method", PAMQP_SAMPLES, ids=[s.NAME for s in PAMQP_SAMPLES])
def test_ours_decoded_by_pamqp(method) -> None:
    ((channel, frame),) = pamqp_frames(encode_method(channel_for(method), method))
    assert channel == channel_for(method)
    assert frame.index == (method.CLASS_ID << 16) | method.METHOD_ID
    assert oracle_fields(frame, method, RENAMES_PAMQP) == fields_of(method)


PIKA_DECODABLE = [s for s in SAMPLES if s.NAME != "connection.update-secret"]


def no_floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: no_floats(v) for k, v in value.items() if not isinstance(v, float)}
    if isinstance(value, list):
        return [no_floats(v) for v in value if not isinstance(v, float)]
    return value


@pytest.mark.parametrize("method", PIKA_DECODABLE, ids=[s.NAME for s in PIKA_DECODABLE])
def test_ours_decoded_by_pika(method) -> None:
    if hasattr(method, "server_properties"):
        method = type(method)(
            **{**fields_raw(method), "server_properties": no_floats(method.server_properties)}
        )
    (frame,) = pika_frames(encode_method(channel_for(method), method))
    assert frame.channel_number == channel_for(method)
    assert frame.method.INDEX == (method.CLASS_ID << 16) | method.METHOD_ID
    assert oracle_fields(frame.method, method, RENAMES_PIKA) == fields_of(method)


# --- methods: oracle -> ours --------------------------------------------------------------------------


def pamqp_method(method):
    cls = pamqp.commands.INDEX_MAPPING[(method.CLASS_ID << 16) | method.METHOD_ID]
    kwargs = {}
    for code, name in method.SPEC:
        if name is None:
            continue
        value = getattr(method, name)
        if code == "S":
            value = value.decode()  # pamqp takes long strings as str
        kwargs[RENAMES_PAMQP.get(name, name)] = to_pamqp_value(value)
    return cls(**kwargs)


def pika_method(method):
    cls = pika.spec.methods[(method.CLASS_ID << 16) | method.METHOD_ID]
    kwargs = {
        RENAMES_PIKA.get(n, n): to_pika_value(no_floats(getattr(method, n))) for _, n in method.SPEC if n
    }
    return cls(**kwargs)


@pytest.mark.parametrize("method", PAMQP_SAMPLES, ids=[s.NAME for s in PAMQP_SAMPLES])
def test_pamqp_decoded_by_ours(method) -> None:
    data = pamqp_frame.marshal(pamqp_method(method), channel_for(method))
    (event,) = decode_ours(data, method)
    assert type(event) is Method and event.channel == channel_for(method)
    assert type(event.method) is type(method)
    assert fields_of(event.method) == fields_of(method)


@pytest.mark.parametrize("method", SAMPLES, ids=IDS)
def test_pika_decoded_by_ours(method) -> None:
    data = pika.frame.Method(channel_for(method), pika_method(method)).marshal()
    (event,) = decode_ours(data, method)
    assert type(event) is Method and event.channel == channel_for(method)
    assert type(event.method) is type(method)
    assert fields_of(event.method) == no_floats(fields_of(method))


# --- content ------------------------------------------------------------------------------------------

PAMQP_PROPS = {"type": "message_type"}


def pamqp_properties(props: BasicProperties):
    kwargs = {PAMQP_PROPS.get(k, k): v for k, v in _props_dict(props).items() if v is not None}
    assert "cluster_id" not in kwargs, "pamqp refuses a cluster_id"
    if "timestamp" in kwargs:
        kwargs["timestamp"] = datetime.datetime.fromtimestamp(kwargs["timestamp"], tz=datetime.UTC)
    if "headers" in kwargs:
        kwargs["headers"] = to_pamqp_value(kwargs["headers"])
    return pamqp.commands.Basic.Properties(**kwargs)


def pika_properties(props: BasicProperties):
    kwargs = _props_dict(props)
    if kwargs["headers"] is not None:
        kwargs["headers"] = to_pika_value(kwargs["headers"])
    return pika.spec.BasicProperties(**kwargs)


def _props_dict(props: BasicProperties) -> dict[str, Any]:
    return {name: getattr(props, name) for name in props.__slots__}


def norm_props(obj, renames: dict[str, str] | None = None) -> dict[str, Any]:
    renames = renames or {}
    out = {}
    for name in BasicProperties.__slots__:
        value = getattr(obj, renames.get(name, name))
        out[name] = None if value in (None, "") else norm(value)
    return out


BODY = bytes(range(256)) * 40  # 10240 bytes: three body frames at frame_max 4096


def test_deliver_decoded_by_pamqp() -> None:
    data = encode_deliver(2, "ctag", 42, True, "amq.topic", "a.b", PROPERTIES, BODY, 4096)
    frames = pamqp_frames(data)
    assert [c for c, _ in frames] == [2] * 5
    (_, deliver), (_, header), *bodies = frames
    assert isinstance(deliver, pamqp.commands.Basic.Deliver)
    assert oracle_fields(deliver, BasicDeliver(), {}) == fields_of(
        BasicDeliver("ctag", 42, True, "amq.topic", "a.b")
    )
    assert header.body_size == len(BODY) and header.class_id == 60 and header.weight == 0
    assert norm_props(header.properties, PAMQP_PROPS) == norm_props(PROPERTIES)
    assert all(isinstance(b, pamqp.body.ContentBody) for _, b in bodies)
    assert b"".join(b.value for _, b in bodies) == BODY


def test_deliver_decoded_by_pika() -> None:
    data = encode_deliver(2, b"ctag", 42, False, b"", b"q", encode_properties(PROPERTIES), BODY, 4096)
    deliver, header, *bodies = pika_frames(data)
    assert isinstance(deliver.method, pika.spec.Basic.Deliver)
    assert (deliver.method.consumer_tag, deliver.method.delivery_tag, deliver.method.redelivered) == (
        "ctag",
        42,
        False,
    )
    assert header.body_size == len(BODY)
    assert norm_props(header.properties) == norm_props(PROPERTIES)
    assert b"".join(b.fragment for b in bodies) == BODY


@pytest.mark.parametrize(
    ("data", "cls"),
    [
        (encode_get_ok(1, 5, True, "ex", "rk", 9, PROPERTIES, b"get"), pika.spec.Basic.GetOk),
        (encode_return(1, 312, "NO_ROUTE", "ex", "rk", None, b"ret"), pika.spec.Basic.Return),
    ],
)
def test_get_ok_and_return_decoded_by_pika(data: bytes, cls: type) -> None:
    method, header, body = pika_frames(data)
    assert isinstance(method.method, cls)
    assert header.body_size == len(body.fragment) == 3


PROPERTIES_NO_CLUSTER = BasicProperties(**{**_props_dict(PROPERTIES), "cluster_id": None})


def test_pamqp_publish_decoded_by_ours() -> None:
    publish = pamqp.commands.Basic.Publish(exchange="amq.topic", routing_key="a.b", mandatory=True)
    frames = [
        pamqp_frame.marshal(publish, 3),
        pamqp_frame.marshal(
            pamqp.header.ContentHeader(0, len(BODY), pamqp_properties(PROPERTIES_NO_CLUSTER)), 3
        ),
    ]
    for i in range(0, len(BODY), 4088):
        frames.append(pamqp_frame.marshal(pamqp.body.ContentBody(BODY[i : i + 4088]), 3))
    dec = Decoder(frame_max=4096)
    dec.feed(pamqp.header.ProtocolHeader().marshal() + b"".join(frames))
    _, message = dec.events()
    assert type(message) is Message and message.channel == 3
    assert message.method == BasicPublish("amq.topic", "a.b", True, False)
    assert norm_props(message.properties) == norm_props(PROPERTIES_NO_CLUSTER)
    assert message.body == BODY


def test_pika_publish_decoded_by_ours() -> None:
    frames = [
        pika.frame.Method(1, pika.spec.Basic.Publish(exchange="", routing_key="q")).marshal(),
        pika.frame.Header(1, len(BODY), pika_properties(PROPERTIES)).marshal(),
    ]
    for i in range(0, len(BODY), 4088):
        frames.append(pika.frame.Body(1, BODY[i : i + 4088]).marshal())
    dec = Decoder(frame_max=4096)
    dec.feed(pika.frame.ProtocolHeader().marshal() + b"".join(frames))
    _, message = dec.events()
    assert message.method == BasicPublish("", "q")
    assert norm_props(message.properties) == norm_props(PROPERTIES)
    assert message.body == BODY


def test_pika_deliver_decoded_by_our_client_decoder() -> None:
    props = pika.spec.BasicProperties(content_type="text/plain", delivery_mode=2, headers={"a": 1})
    data = b"".join(
        (
            pika.frame.Method(4, pika.spec.Basic.Deliver("c", 7, True, "ex", "rk")).marshal(),
            pika.frame.Header(4, 3, props).marshal(),
            pika.frame.Body(4, b"abc").marshal(),
            pika.frame.Method(4, pika.spec.Basic.GetOk(8, False, "ex", "rk", 0)).marshal(),
            pika.frame.Header(4, 0, pika.spec.BasicProperties()).marshal(),
            pika.frame.Method(4, pika.spec.Basic.Return(312, "NO_ROUTE", "ex", "rk")).marshal(),
            pika.frame.Header(4, 1, pika.spec.BasicProperties()).marshal(),
            pika.frame.Body(4, b"r").marshal(),
        )
    )
    dec = Decoder("client", frame_max=0)
    dec.feed(data)
    d, g, r = dec.events()
    assert d.method == BasicDeliver("c", 7, True, "ex", "rk") and d.body == b"abc"
    assert d.properties == BasicProperties(content_type="text/plain", delivery_mode=2, headers={"a": 1})
    assert g.method == BasicGetOk(8, False, "ex", "rk", 0) and g.body == b""
    assert r.method == BasicReturn(312, "NO_ROUTE", "ex", "rk") and r.body == b"r"


@pytest.mark.parametrize("name", BasicProperties.__slots__)
def test_each_property_both_ways_with_pika(name: str) -> None:
    props = BasicProperties(**{name: getattr(PROPERTIES, name)})
    ours = encode_properties(props)
    theirs = pika.frame.Header(1, 0, pika_properties(props)).marshal()[19:-1]
    assert ours == theirs
    assert norm_props(pika_decode_props(ours)) == norm_props(props)


def pika_decode_props(raw: bytes):
    p = pika.spec.BasicProperties()
    p.decode(raw)
    return p


@pytest.mark.parametrize("name", [n for n in BasicProperties.__slots__ if n not in ("headers", "cluster_id")])
def test_each_property_byte_exact_with_pamqp(name: str) -> None:
    props = BasicProperties(**{name: getattr(PROPERTIES, name)})
    assert encode_properties(props) == pamqp_properties(props).marshal()


def test_acks_and_heartbeat_decoded_by_oracles() -> None:
    (frame,) = pika_frames(encode_basic_ack(1, 2**40, True))
    assert (frame.method.delivery_tag, frame.method.multiple) == (2**40, True)
    ((_, nack),) = pamqp_frames(encode_basic_nack(1, 3, False, True))
    assert (nack.delivery_tag, nack.multiple, nack.requeue) == (3, False, True)
    assert HEARTBEAT == pamqp.heartbeat.Heartbeat().marshal() == pika.frame.Heartbeat().marshal()
    assert PROTOCOL_HEADER == pamqp.header.ProtocolHeader().marshal() == pika.frame.ProtocolHeader().marshal()


def test_error_response_decoded_by_oracles() -> None:
    dec = Decoder(expect_header=False)
    dec.feed(encode_method(0, BasicPublish()))
    with pytest.raises(AMQPError) as info:
        dec.events()
    ((channel, close),) = pamqp_frames(info.value.response())
    assert channel == 0 and isinstance(close, pamqp.commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (ReplyCode.CHANNEL_ERROR, 60, 40)
    soft = AMQPError(ReplyCode.NOT_FOUND, "no exchange 'x'", class_id=60, method_id=40, channel=9)
    (frame,) = pika_frames(soft.response())
    assert frame.channel_number == 9 and isinstance(frame.method, pika.spec.Channel.Close)
    assert frame.method.reply_text == "NOT_FOUND - no exchange 'x'"


# --- field tables with every type ---------------------------------------------------------------------


def pamqp_decode_table(raw: bytes) -> dict:
    import pamqp.decode

    used, table = pamqp.decode.field_table(raw)
    assert used == len(raw)
    return table


def test_every_field_type_decoded_by_pamqp() -> None:
    table = {
        "t": True,
        "b": Typed("b", -5),
        "B": Typed("B", 250),
        "s": Typed("s", -300),
        "u": Typed("u", 65000),
        "I": Typed("I", -70000),
        "i": Typed("i", 4_000_000_000),
        "l": Typed("l", -(2**40)),
        "f": Typed("f", 0.5),
        "d": 2.25,
        "D": Decimal("3.14"),
        "T": Timestamp(1_700_000_000),
        "S": "str é",
        "x": b"\x00\x01",
        "A": [1, "a", [True]],
        "F": {"nested": {"deep": None}},
        "V": None,
    }
    decoded = pamqp_decode_table(encode_table(table))
    expected = {k: (v.value if isinstance(v, Typed) else v) for k, v in table.items()}
    assert norm(decoded) == norm(expected)
    assert decoded["x"] == bytearray(b"\x00\x01")  # pamqp's byte array type
    assert decoded["T"] == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)


def test_every_field_type_from_pamqp_decoded_by_ours() -> None:
    import pamqp.encode

    table = {
        "t": False,
        "b": -5,  # pamqp picks the smallest integer type: b, s, u, I
        "s": -300,
        "u": 65000,
        "I": -70000,
        "f": 0.5,  # pamqp encodes floats as 'f'
        "D": Decimal("3.14"),
        "T": datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC),
        "S": "str",
        "x": bytearray(b"\x00\x01"),
        "A": [1, "a"],
        "F": {"k": "v"},
        "V": None,
    }
    raw = pamqp.encode.field_table(table)
    tags = {raw[i + 2 : i + 3] for i in range(len(raw) - 2)}  # crude: every tag appears somewhere
    assert {b"b", b"s", b"u", b"I", b"f", b"D", b"T", b"S", b"x", b"A", b"F", b"V", b"t"} <= tags
    ours, end = decode_table(raw, 0, len(raw))
    assert end == len(raw)
    assert norm(ours) == norm(table)
    assert type(ours["T"]) is Timestamp


def test_sample_table_both_ways_with_pika() -> None:
    table = no_floats(TABLE)
    ours = encode_table(table)
    import pika.data

    decoded, used = pika.data.decode_table(ours, 0)
    assert used == len(ours)
    assert norm(decoded) == norm(table)
    buf: list = []
    pika.data.encode_table(buf, to_pika_value(table))
    theirs = b"".join(buf)
    assert norm(decode_table(theirs, 0, len(theirs))[0]) == norm(table)
