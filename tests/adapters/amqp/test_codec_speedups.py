"""The compiled AMQP 0-9-1 codec hot path (adapters/amqp/codec/_encode_speedups.pyx, the encoder,
and _decode_speedups.pyx, the decoder) against its pure-Python reference: field tables, the content
properties and basic.deliver give byte-identical output or equal values and the same errors (type
and message); a Decoder using the compiled per-frame parsing yields the same events, raises the same
AMQPErrors and ends in the same state; GATEWAY_PURE_PYTHON=1 selects the pure functions. (Here beside
the store's compiled path, docs/store.md "Compiled hot path", which it is built with.)"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import struct
from datetime import UTC, datetime
from decimal import Decimal
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.amqp.codec import content, decoder, encoder, properties, wire
from adapters.amqp.codec.errors import AMQPError
from adapters.amqp.codec.events import ContentHeader, Message
from adapters.amqp.codec.methods import (
    BasicAck,
    BasicConsume,
    BasicNack,
    BasicPublish,
    BasicQos,
    BasicReject,
    ChannelOpen,
)
from adapters.amqp.codec.properties import BasicProperties
from adapters.amqp.codec.wire import Timestamp, Typed
from tests.store.test_speedups import _compiler, _outcome, run_probe

EXTENSIONS = ("adapters.amqp.codec._encode_speedups", "adapters.amqp.codec._decode_speedups")


@pytest.mark.parametrize("name", EXTENSIONS)
def test_extension_is_built_where_a_compiler_is(name: str) -> None:
    if _compiler() is None:
        pytest.skip("no C compiler: the codec runs pure Python")
    assert importlib.util.find_spec(name) is not None


@pytest.fixture(scope="module")
def enc_sp():
    """The compiled encoder bound to the pure functions and types, whichever path this process chose."""
    mod = pytest.importorskip(EXTENSIONS[0])
    mod.bind_wire(Timestamp, wire.py_encode_table)
    mod.bind_properties(
        BasicProperties, properties.EMPTY_PROPERTIES, datetime, properties.py_encode_properties
    )
    mod.bind_encoder(encoder.py_encode_deliver)
    return mod


@pytest.fixture(scope="module")
def dec_sp():
    """The compiled decoder bound to the pure functions and types, whichever path this process chose."""
    mod = pytest.importorskip(EXTENSIONS[1])
    mod.bind_wire(Timestamp, Decimal, wire.py_decode_table)
    mod.bind_properties(BasicProperties, properties.py_decode_properties)
    mod.bind_decoder(Message, decoder.Method, BasicPublish, BasicAck, BasicNack, BasicReject)
    return mod


# --- comparing outcomes -------------------------------------------------------------------------------


def _canon(x: Any) -> Any:
    """A value with its types spelt out (True != 1 != 1.0, NaN == NaN, dict order counts)."""
    t = type(x)
    if t is float:
        return ("float", struct.pack(">d", x))
    if t is dict:
        return ("dict", [(_canon(k), _canon(v)) for k, v in x.items()])
    if t is list or t is tuple:
        return (t.__name__, [_canon(v) for v in x])
    if t is Decimal:
        return ("Decimal", repr(x))
    if t is BasicProperties or dataclasses.is_dataclass(x):
        return (t.__name__, [_canon(getattr(x, f.name)) for f in dataclasses.fields(x)])
    if t is ContentHeader:
        return ("ContentHeader", x.channel, x.class_id, x.body_size, x.raw_properties, _canon(x._properties))
    if t is Message:
        return (
            "Message",
            x.channel,
            _canon(x.method),
            x.raw_properties,
            x.body,
            x.dropped,
            _canon(x._properties),
        )
    return (t.__name__, x)


def same(fn_a: Any, fn_b: Any, *args: Any) -> None:
    """fn_a(*args) and fn_b(*args) give equal values (types included) or the same error."""
    a, b = _outcome(fn_a, *args), _outcome(fn_b, *args)
    if a[0] == "ok" and b[0] == "ok":
        assert _canon(a[1]) == _canon(b[1]), args
    else:
        assert a == b, args


# --- strategies -----------------------------------------------------------------------------------------

HOSTILE_TEXT = ["", "é", "\udcff\udc80", "a\ud800b", "\U0001f600" * 70, "x" * 255, "x" * 256, "\x00"]
texts = st.one_of(st.text(max_size=30), st.sampled_from(HOSTILE_TEXT))
shorts = st.one_of(texts, st.binary(max_size=40), st.just(b"y" * 256))
keys = st.one_of(
    st.text(max_size=12), st.binary(max_size=12), st.sampled_from(["x" * 256, "k\udcfe", "k\ud800", 7, None])
)
ints = st.one_of(
    st.integers(-(2**31) - 2, 2**31 + 2),
    st.integers(-(2**65), 2**65),
    st.sampled_from([-(2**63) - 1, -(2**63), 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**31), 2**31 - 1, 2**31]),
)
decimals = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=0, max_value=10**6),
    st.sampled_from(
        [Decimal("NaN"), Decimal("-1.5"), Decimal("1e300"), Decimal("5E+3"), Decimal("4294967296")]
    ),
)
datetimes = st.datetimes(
    min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.sampled_from([UTC, None])
)
typed = st.builds(
    Typed,
    st.sampled_from([*"bBsuIilLfdTtSxDFAV", "?", "bb"]),
    st.one_of(
        st.integers(-(2**64), 2**64), st.floats(), st.text(max_size=5), st.none(), st.just({}), st.just([])
    ),
)
leaves = st.one_of(
    texts,
    st.booleans(),
    ints,
    st.none(),
    st.floats(),  # NaN and infinities included
    st.binary(max_size=30),
    st.binary(max_size=8).map(bytearray),
    st.binary(max_size=8).map(memoryview),
    st.integers(-2, 2**64 + 1).map(Timestamp),
    decimals,
    datetimes,
    typed,
    st.sampled_from([object(), {1, 2}, 1j]),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
        st.dictionaries(st.text(max_size=4), inner, max_size=2).map(MappingProxyType),
    ),
    max_leaves=24,
)
tables = st.one_of(
    st.dictionaries(keys, values, max_size=6),
    st.dictionaries(st.text(max_size=10), st.one_of(texts, st.booleans(), ints, st.none()), max_size=5),
    st.sampled_from([None, {}, [], MappingProxyType({"a": 1})]),
)
ALL_TYPES = {
    "S": "é",
    "Sbad": b"\xff\xfe",
    "t": True,
    "b": Typed("b", -1),
    "B": Typed("B", 255),
    "s": Typed("s", -2),
    "u": Typed("u", 65534),
    "I": -5,
    "i": Typed("i", 4294967295),
    "l": 2**40,
    "L": Typed("L", -(2**63)),
    "f": Typed("f", 1.5),
    "d": -0.0,
    "D": Decimal("12.34"),
    "T": Timestamp(1_700_000_000),
    "x": b"\x00\x01",
    "A": [1, "a", [None, {"n": True}], b"", 2.5],
    "F": {"nested": {"deeper": {"k": "v"}}},
    "V": None,
}
prop_headers = st.one_of(st.none(), tables, st.just(ALL_TYPES))
octets = st.one_of(st.none(), st.integers(-1, 300), st.booleans(), st.just("2"))
stamps = st.one_of(
    st.none(),
    st.integers(-1, 2**64),
    st.integers(0, 2**40).map(Timestamp),
    datetimes.map(lambda d: d.replace(tzinfo=UTC)),
    st.just(1.5),
)
opt_shorts = st.one_of(st.none(), shorts, st.just(bytearray(b"ba")), st.just(3))
props_st = st.builds(
    BasicProperties,
    content_type=opt_shorts,
    content_encoding=opt_shorts,
    headers=prop_headers,
    delivery_mode=octets,
    priority=octets,
    correlation_id=opt_shorts,
    reply_to=opt_shorts,
    expiration=opt_shorts,
    message_id=opt_shorts,
    timestamp=stamps,
    type=opt_shorts,
    user_id=opt_shorts,
    app_id=opt_shorts,
    cluster_id=opt_shorts,
)
realistic_props = st.builds(
    BasicProperties,
    content_type=st.one_of(st.none(), st.just("application/json")),
    headers=st.one_of(
        st.none(),
        st.dictionaries(
            st.text(max_size=10),
            st.one_of(st.text(max_size=20), st.integers(-(2**63), 2**63 - 1), st.booleans()),
        ),
    ),
    delivery_mode=st.one_of(st.none(), st.sampled_from([1, 2])),
    priority=st.one_of(st.none(), st.integers(0, 9)),
    correlation_id=st.one_of(st.none(), st.text(max_size=36)),
    reply_to=st.one_of(st.none(), st.text(max_size=20)),
    message_id=st.one_of(st.none(), st.uuids().map(str)),
    timestamp=st.one_of(st.none(), st.integers(0, 2**33)),
    app_id=st.one_of(st.none(), st.text(max_size=10)),
)


@st.composite
def mutated(draw: Any, raw: bytes) -> bytes:
    """raw, or raw truncated, with a byte changed, or with garbage inserted."""
    how = draw(st.sampled_from(["same", "cut", "flip", "insert", "append"]))
    if how == "same" or not raw:
        return raw
    i = draw(st.integers(0, len(raw) - 1))
    if how == "cut":
        return raw[:i]
    if how == "flip":
        return raw[:i] + bytes([draw(st.integers(0, 255))]) + raw[i + 1 :]
    junk = draw(st.binary(min_size=1, max_size=6))
    return raw[:i] + junk + raw[i:] if how == "insert" else raw + junk


def _safe(fn: Any, *args: Any) -> bytes:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - an unencodable input: random bytes instead
        return b""


# --- field tables -----------------------------------------------------------------------------------------


@given(table=tables)
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_encode_table_matches_the_reference(enc_sp, table: Any) -> None:
    same(enc_sp.encode_table, wire.py_encode_table, table)


def test_encode_table_every_type_and_nesting(enc_sp) -> None:
    deep: Any = "leaf"
    for depth in (1, 31, 32, 33, 40, 300, 3000):
        deep = "leaf"
        for _ in range(depth):
            deep = {"d": deep}
        same(enc_sp.encode_table, wire.py_encode_table, deep)
        same(enc_sp.encode_table, wire.py_encode_table, {"a": [deep]})
    same(enc_sp.encode_table, wire.py_encode_table, ALL_TYPES)
    same(enc_sp.encode_table, wire.py_encode_table, {"big": "x" * 300_000, "k" * 255: b"v" * 70_000})
    assert enc_sp.encode_table(ALL_TYPES) == wire.py_encode_table(ALL_TYPES)


@given(data=st.data(), table=tables, p=st.integers(-3, 3), end_delta=st.one_of(st.none(), st.integers(-6, 6)))
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decode_table_matches_the_reference(
    dec_sp, data: Any, table: Any, p: int, end_delta: int | None
) -> None:
    raw = data.draw(mutated(_safe(wire.py_encode_table, table) or data.draw(st.binary(max_size=40))))
    start = max(p, 0)
    buf = b"\x00" * start + raw
    end = len(buf) if end_delta is None else len(buf) + end_delta
    same(dec_sp.decode_table, wire.py_decode_table, buf, p, end)


@st.composite
def raw_tables(draw: Any) -> bytes:
    """Name/value pairs of every tag (and unknown ones) with payloads of any length, in a length prefix
    that may lie."""
    body = b""
    for _ in range(draw(st.integers(0, 5))):
        key = draw(st.binary(max_size=6))
        tag = draw(st.sampled_from(list(b"StbBsuIilLfdDTxAFV") + [0, ord("U"), 255]))
        payload = draw(
            st.one_of(
                st.binary(max_size=12),
                st.binary(max_size=12).map(lambda b: len(b).to_bytes(4, "big") + b),
                st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x00\x02\xc3\x28", b"\x00\x00\x00\x00"]),
            )
        )
        body += bytes([len(key)]) + key + bytes([tag]) + payload
    size = draw(st.one_of(st.just(len(body)), st.integers(0, len(body) + 4)))
    return size.to_bytes(4, "big") + body


@given(raw=raw_tables(), tail=st.binary(max_size=4))
@settings(max_examples=300, deadline=None)
def test_decode_table_of_hostile_bytes_matches_the_reference(dec_sp, raw: bytes, tail: bytes) -> None:
    buf = raw + tail
    for end in (len(raw), len(buf)):
        same(dec_sp.decode_table, wire.py_decode_table, buf, 0, end)


def test_decode_table_every_type_and_nesting(dec_sp) -> None:
    for table in (ALL_TYPES, {"f": Typed("f", float("nan")), "d": float("-inf")}):
        raw = wire.py_encode_table(table)
        same(dec_sp.decode_table, wire.py_decode_table, raw, 0, len(raw))
    for depth in (32, 33, 200, 3000):
        deep: Any = {}
        for _ in range(depth):
            deep = {"d": deep}
        with contextlib.suppress(RecursionError):
            raw = wire.py_encode_table(deep)
            same(dec_sp.decode_table, wire.py_decode_table, raw, 0, len(raw))
        nested = b"\x00\x00\x00\x00"
        for _ in range(depth):  # built bytewise: deeper than the encoder's recursion allows
            nested = (len(nested) + 3).to_bytes(4, "big") + b"\x01dF" + nested
        same(dec_sp.decode_table, wire.py_decode_table, nested, 0, len(nested))
        same(dec_sp.decode_properties, properties.py_decode_properties, b"\x20\x00" + nested)
    same(dec_sp.decode_table, wire.py_decode_table, bytearray(b"\x00\x00\x00\x00"), 0, 4)
    same(dec_sp.decode_table, wire.py_decode_table, memoryview(b"\x00\x00\x00\x00"), 0, 4)
    same(dec_sp.decode_table, wire.py_decode_table, b"\x00\x00\x00\x00", 0, 4.0)
    same(dec_sp.decode_table, wire.py_decode_table, b"\x00\x00\x00\x00", 2**70, 4)


# --- content properties ------------------------------------------------------------------------------------


@given(props=st.one_of(props_st, realistic_props, st.sampled_from([None, object(), {"content_type": "x"}])))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_encode_properties_matches_the_reference(enc_sp, props: Any) -> None:
    same(enc_sp.encode_properties, properties.py_encode_properties, props)


@given(
    data=st.data(),
    props=st.one_of(realistic_props, props_st),
    pad=st.integers(0, 3),
    end_delta=st.one_of(st.none(), st.integers(-4, 4)),
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decode_properties_matches_the_reference(
    dec_sp, data: Any, props: Any, pad: int, end_delta: int | None
) -> None:
    raw = _safe(properties.py_encode_properties, props) or data.draw(st.binary(max_size=30))
    raw = data.draw(mutated(raw))
    buf = b"\xaa" * pad + raw
    same(dec_sp.decode_properties, properties.py_decode_properties, raw)
    end = None if end_delta is None else len(buf) + end_delta
    same(dec_sp.decode_properties, properties.py_decode_properties, buf, pad, end)


def test_decode_properties_edge_cases(dec_sp) -> None:
    every = BasicProperties(
        "a", "b", ALL_TYPES, 2, 9, "c", "d", "60000", "e", 2**64 - 1, "f", "g", "h", "\udcff"
    )
    raw = properties.py_encode_properties(every)
    cases = [
        (raw,),
        (raw, 0, None),
        (b"\x00\x00",),
        (b"\x00\x01\x00\x00",),  # a continuation word
        (b"\x00\x01\x00\x01\x00\x00",),
        (b"\x00\x01\x00\x02",),  # a flag beyond the 14 properties
        (b"\x00\x01",),
        (b"\x80\x00\x05ab",),  # a short string past the end
        (b"\x20\x00\x00\x00\x00\x09\x00",),  # headers past the end
        (b"\x00\x40\x00\x00\x00",),  # a timestamp past the end
        (b"\x00\x00\x00",),  # bytes after the list
        (b"",),
        (b"\x80\x00\x02\xff\xfe",),  # not UTF-8: surrogateescape
        (raw, -len(raw)),
        (raw, 0, len(raw) + 1),
        (raw, 0, -1),
        (bytearray(raw),),
        (memoryview(raw),),
        (raw, 0.0),
        (raw, True),
        (None,),
    ]
    for args in cases:
        same(dec_sp.decode_properties, properties.py_decode_properties, *args)
    assert _canon(dec_sp.decode_properties(raw)) == _canon(properties.py_decode_properties(raw))
    assert dec_sp.decode_properties(raw).headers["F"] == ALL_TYPES["F"]


# --- basic.deliver ---------------------------------------------------------------------------------------

bodies = st.one_of(
    st.binary(max_size=600),
    st.sampled_from([b"", b"x" * 20_000, bytes(range(256)) * 40]),
    st.binary(max_size=8).map(bytearray),
    st.binary(max_size=8).map(memoryview),
)
frame_maxes = st.one_of(
    st.sampled_from([0, 4096, 131072, 8, 9, 10, 1, -5, 2**40, 2**70]), st.integers(0, 700)
)


@given(
    channel=st.one_of(st.integers(-1, 70_000), st.sampled_from([True, "1", 2**70])),
    consumer_tag=st.one_of(shorts, st.just(bytearray(b"ct")), st.none()),
    delivery_tag=st.one_of(st.integers(-1, 2**64), st.booleans(), st.just(1.0)),
    redelivered=st.one_of(st.booleans(), st.integers(-1, 2), st.sampled_from([None, "", "x", [0]])),
    exchange=shorts,
    routing_key=st.one_of(shorts, st.just(memoryview(b"rk"))),
    props=st.one_of(
        realistic_props,
        props_st,
        st.sampled_from(
            [None, b"\x00\x00", b"", b"\x90\x00\x10application/json\x02", bytearray(b"\x00\x00")]
        ),
    ),
    body=bodies,
    frame_max=frame_maxes,
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_encode_deliver_matches_the_reference(
    enc_sp, channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, props, body, frame_max
) -> None:
    args = (channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, props, body, frame_max)
    same(enc_sp.encode_deliver, encoder.py_encode_deliver, *args)


def test_encode_deliver_splits_bodies_like_the_reference(enc_sp) -> None:
    """Bodies around frame_max - 8: one frame, two, many; empty; the default frame_max."""
    props = BasicProperties(content_type="text/plain", delivery_mode=2, headers={"x-retries": 2, "src": "a"})
    for frame_max in (0, 9, 10, 4096, 131072):
        for n in (0, 1, 2, 4087, 4088, 4089, 8176, 8177, 131064, 131065, 300_000):
            for p in (None, props, b"\x00\x00"):
                args = (1, "ctag", n + 1, n % 2 == 0, "amq.topic", "a.b", p, b"z" * n, frame_max)
                assert enc_sp.encode_deliver(*args) == encoder.py_encode_deliver(*args)
    args = (7, b"ctag", 2**64 - 1, True, b"", b"rk", props, b"body")
    assert enc_sp.encode_deliver(*args) == encoder.py_encode_deliver(*args)


# --- the decoder -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _decoder_path(mod: Any):
    """decoder.py on the compiled path (mod) or the pure one (None), for the duration."""
    saved = decoder._hot_frame, decoder.decode_properties, content.decode_properties
    decoder._hot_frame = None if mod is None else mod.hot_frame
    decoder.decode_properties = properties.py_decode_properties if mod is None else mod.decode_properties
    content.decode_properties = decoder.decode_properties  # (content header frames: content.py)
    try:
        yield
    finally:
        decoder._hot_frame, decoder.decode_properties, content.decode_properties = saved


def _trace(mod: Any, chunks: list[bytes], options: dict[str, Any]) -> list[Any]:
    """Every event and error a Decoder gives for `chunks` fed one by one, and its state at the end."""
    out: list[Any] = []
    with _decoder_path(mod):
        dec = decoder.Decoder(**options)
        for chunk in chunks:
            try:
                dec.feed(chunk)
            except AMQPError as e:
                out.append(("feed error", type(e), str(e), e.fatal))
                break
            for _ in range(10_000):
                try:
                    event = dec.next_event()
                except AMQPError as e:
                    out.append(
                        ("error", type(e), str(e), e.code, e.class_id, e.method_id, e.channel, e.fatal)
                    )
                    if e.fatal:
                        break
                    continue
                if event is None:
                    break
                out.append(_canon(event))
        out.append(("state", dec._pos, dec.buffered, dec.closing, sorted(dec._pending), dec.frame_max))
    return out


def _publish(
    ch: int, props: Any, body: bytes, frame_max: int = 0, exchange: Any = "ex", key: Any = "rk"
) -> bytes:
    return encoder.encode_publish(ch, exchange, key, props, body, frame_max, ch % 2 == 1, ch % 3 == 1)


@st.composite
def frame_streams(draw: Any) -> bytes:
    """Frames a client (or a server) sends: publishes (one body frame, several, none), acks, nacks,
    rejects, heartbeats, other methods; realistic, then maybe cut, flipped or padded."""
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(
            st.sampled_from(["publish", "publish", "ack", "nack", "reject", "hb", "qos", "consume", "junk"])
        )
        ch = draw(st.sampled_from([1, 1, 2, 0, 65535]))
        if kind == "publish":
            props = draw(st.one_of(st.none(), realistic_props, st.just(BasicProperties(headers=ALL_TYPES))))
            body = draw(st.one_of(st.binary(max_size=300), st.just(b"b" * 5000)))
            fm = draw(st.sampled_from([0, 0, 4096, 100, 20]))
            ex = draw(st.one_of(st.just("amq.topic"), st.text(max_size=5), st.just(b"\xff\xfe")))
            parts.append(_publish(ch, props, body, fm, ex, draw(st.text(max_size=20))))
        elif kind in ("ack", "nack", "reject"):
            tag = draw(st.integers(0, 2**64 - 1))
            bits = draw(st.booleans())
            method = {
                "ack": BasicAck(tag, bits),
                "nack": BasicNack(tag, bits, True),
                "reject": BasicReject(tag, bits),
            }
            parts.append(encoder.encode_method(ch, method[kind]))
        elif kind == "hb":
            parts.append(encoder.HEARTBEAT)
        elif kind == "qos":
            parts.append(encoder.encode_method(ch, BasicQos(0, draw(st.integers(0, 100)), False)))
        elif kind == "consume":
            parts.append(encoder.encode_method(ch, BasicConsume(0, "q", "c", arguments={"x-priority": 3})))
        else:
            parts.append(draw(st.binary(max_size=30)))
    if draw(st.booleans()):
        parts.insert(0, encoder.encode_method(1, ChannelOpen()))
    return draw(mutated(b"".join(parts)))


@given(
    data=st.data(),
    stream=frame_streams(),
    role=st.sampled_from(["server", "server", "client"]),
    assemble=st.booleans(),
    decode_props=st.booleans(),
    frame_max=st.sampled_from([0, 4096, 131072, 200, 9]),
    keep=st.sampled_from([None, 0, 100, 10**6]),
    header=st.booleans(),
)
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decoder_matches_the_reference(
    dec_sp, data, stream, role, assemble, decode_props, frame_max, keep, header
) -> None:
    if header:
        stream = (
            data.draw(st.sampled_from([b"AMQP\x00\x00\x09\x01", b"AMQP\x01\x01\x00\x09", b"AMQX"])) + stream
        )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    options = dict(
        role=role,
        expect_header=header,
        assemble=assemble,
        decode_properties=decode_props,
        frame_max=frame_max,
        keep_body_size=keep,
    )
    assert _trace(dec_sp, chunks, options) == _trace(None, chunks, options)


def test_decoder_hot_frames_are_compiled(dec_sp) -> None:
    """The hot frames come out of hot_frame (not the general path) and equal the reference's events."""
    props = BasicProperties(content_type="application/json", delivery_mode=2, headers={"x-trace": "abc"})
    stream = (
        _publish(1, props, b"x" * 100)
        + _publish(2, None, b"")
        + encoder.encode_method(1, BasicAck(5, True))
        + encoder.encode_method(1, BasicNack(6, False, True))
        + encoder.encode_method(1, BasicReject(7, False))
    )
    for decode_props in (True, False):
        dec = decoder.Decoder(expect_header=False, frame_max=0, decode_properties=decode_props)
        dec.feed(stream)
        pos = 0
        events = []
        while (event := dec_sp.hot_frame(dec, stream, pos, len(stream))) is not None:
            events.append(_canon(event))
            pos = dec._pos
        assert pos == len(stream)
        options = dict(expect_header=False, frame_max=0, decode_properties=decode_props)
        assert events == _trace(None, [stream], options)[:-1]
    # anything else is left to the general path, untouched
    dec = decoder.Decoder(expect_header=False, frame_max=0)
    for frames in (_publish(1, None, b"a" * 50, 30), encoder.HEARTBEAT, stream[:30], b"\x01\x00" * 10):
        dec._pos = 0
        assert dec_sp.hot_frame(dec, frames, 0, len(frames)) is None
        assert dec._pos == 0


# --- which path is chosen -------------------------------------------------------------------------------


@pytest.mark.parametrize("env", ["1", None])
def test_gateway_pure_python_selects_the_pure_codec(enc_sp, dec_sp, env: str | None) -> None:
    probe = (
        "from adapters.amqp.codec import decoder, encoder, properties, wire\n"
        "print(all(m.encode_speedups is None for m in (wire, properties, encoder)),"
        " all(m.decode_speedups is None for m in (wire, properties, decoder)),"
        " wire.encode_table is wire.py_encode_table, wire.decode_table is wire.py_decode_table,"
        " properties.encode_properties is properties.py_encode_properties,"
        " properties.decode_properties is properties.py_decode_properties,"
        " encoder.encode_deliver is encoder.py_encode_deliver, decoder._hot_frame is None)"
    )
    assert run_probe(probe, env) == (["True"] * 8 if env == "1" else ["False"] * 8)
