"""Field tables and arrays (every RabbitMQ field type), short/long strings and the basic properties."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.amqp.codec import (
    FIELD_TYPES,
    BasicProperties,
    Timestamp,
    Typed,
    decode_array,
    decode_properties,
    decode_table,
    encode_array,
    encode_longstr,
    encode_properties,
    encode_shortstr,
    encode_table,
)
from adapters.amqp.codec.properties import PROPERTY_NAMES
from adapters.amqp.codec.wire import decode_longstr, decode_shortstr


def one(tag_and_value: bytes) -> object:
    """Decode a one-entry table {"k": <tagged value>}."""
    body = b"\x01k" + tag_and_value
    raw = len(body).to_bytes(4, "big") + body
    table, end = decode_table(raw, 0, len(raw))
    assert end == len(raw)
    return table["k"]


def enc(value: object) -> bytes:
    """The tagged encoding of `value` alone (without the table around it)."""
    return encode_table({"k": value})[6:]


# tag, wire bytes after the tag, decoded value (RabbitMQ's rabbit_binary_parser semantics)
DECODE_CASES = [
    ("t", "01", True),
    ("t", "00", False),
    ("t", "02", True),  # any non-zero octet is true
    ("b", "FF", -1),  # signed 8-bit
    ("B", "FF", 255),  # unsigned 8-bit
    ("s", "FFFE", -2),  # signed 16-bit (not the spec's short string)
    ("u", "FFFE", 65534),
    ("I", "FFFFFFFF", -1),
    ("i", "FFFFFFFF", 4294967295),
    ("l", "FFFFFFFFFFFFFFFF", -1),
    ("L", "FFFFFFFFFFFFFFFF", -1),  # decoded like 'l', as RabbitMQ does
    ("f", "3FC00000", 1.5),
    ("d", "3FF8000000000000", 1.5),
    ("D", "02000004D2", Decimal("12.34")),
    ("D", "00FFFFFFFF", Decimal(4294967295)),
    ("T", "000000006553F100", 1_700_000_000),
    ("S", "00000003616263", "abc"),
    ("S", "00000002C3A9", "é"),
    ("S", "00000002FFFE", b"\xff\xfe"),  # not UTF-8: stays bytes (as pika and pamqp do)
    ("x", "0000000300FF01", b"\x00\xff\x01"),
    ("V", "", None),
    ("A", "00000009" + "4900000001" + "7401" + "56" + "56", [1, True, None, None]),
    ("F", "00000007" + "0161" + "4900000002", {"a": 2}),
    ("A", "00000000", []),
    ("F", "00000000", {}),
]


@pytest.mark.parametrize(("tag", "hexa", "value"), DECODE_CASES)
def test_decode_each_type(tag: str, hexa: str, value: object) -> None:
    decoded = one(tag.encode() + bytes.fromhex(hexa))
    assert decoded == value
    assert type(decoded) is type(value) or (tag == "T" and type(decoded) is Timestamp)


def test_every_rabbitmq_type_is_known() -> None:
    assert set("tbBsuIilLfdDTSxAFV") == FIELD_TYPES


# Python value -> tagged encoding chosen by the encoder
ENCODE_CASES = [
    (True, "7401"),
    (False, "7400"),
    (0, "4900000000"),
    (2**31 - 1, "497FFFFFFF"),
    (-(2**31), "4980000000"),
    (2**31, "6C0000000080000000"),
    (-(2**63), "6C8000000000000000"),
    (1.5, "643FF8000000000000"),
    (Decimal("12.34"), "4402000004D2"),
    (Decimal("1E+3"), "4400000003E8"),
    (Timestamp(1), "540000000000000001"),
    (datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC), "54000000006553F100"),
    ("abc", "5300000003616263"),
    (b"\x00\xff", "780000000200FF"),
    (bytearray(b"\x01"), "780000000101"),
    (None, "56"),
    ([1, "a"], "410000000B" + "4900000001" + "530000000161"),
    ((True,), "41000000027401"),
    ({"a": 1}, "4600000007" + "0161" + "4900000001"),
]


@pytest.mark.parametrize(("value", "hexa"), ENCODE_CASES)
def test_encode_picks_the_type(value: object, hexa: str) -> None:
    assert enc(value).hex().upper() == hexa


TYPED_CASES = [
    (Typed("b", -128), "6280"),
    (Typed("B", 255), "42FF"),
    (Typed("s", -2), "73FFFE"),
    (Typed("u", 65535), "75FFFF"),
    (Typed("I", -1), "49FFFFFFFF"),
    (Typed("i", 4294967295), "69FFFFFFFF"),
    (Typed("l", 1), "6C0000000000000001"),
    (Typed("f", 1.5), "663FC00000"),
    (Typed("d", 2.0), "644000000000000000"),
    (Typed("D", "1.5"), "44010000000F"),
    (Typed("T", 5), "540000000000000005"),
    (Typed("S", b"\xff"), "5300000001FF"),
    (Typed("x", "a"), "780000000161"),
    (Typed("t", 1), "7401"),
    (Typed("V", None), "56"),
    (Typed("A", [Typed("b", 1)]), "41000000026201"),
    (Typed("F", {}), "4600000000"),
]


@pytest.mark.parametrize(("value", "hexa"), TYPED_CASES)
def test_encode_typed(value: Typed, hexa: str) -> None:
    raw = enc(value)
    assert raw.hex().upper() == hexa
    decoded = one(raw)
    expected = value.value
    if value.tag == "D":
        expected = Decimal(expected)
    elif value.tag == "S":
        expected = b"\xff"
    elif value.tag == "x":
        expected = b"a"
    elif value.tag == "t":
        expected = True
    elif value.tag == "A":
        expected = [1]
    assert decoded == expected


@pytest.mark.parametrize(
    "value",
    [
        2**63,
        -(2**63) - 1,
        Decimal("-1"),
        Decimal("4294967296"),
        Decimal("NaN"),
        Typed("b", 128),
        Typed("B", -1),
    ],
)
def test_encode_out_of_range(value: object) -> None:
    with pytest.raises(ValueError):
        enc(value)


def test_encode_unknown_python_type() -> None:
    with pytest.raises(TypeError):
        enc(object())
    with pytest.raises(ValueError):
        enc(Typed("Z", 1))
    with pytest.raises(ValueError):
        encode_table({"k" * 256: 1})


def test_nested_table_byte_exact() -> None:
    table = {"capabilities": {"publisher_confirms": True}, "product": "gw"}
    raw = encode_table(table)
    inner = b"\x12publisher_confirmst\x01"
    expected_body = (
        b"\x0ccapabilitiesF" + len(inner).to_bytes(4, "big") + inner + b"\x07productS\x00\x00\x00\x02gw"
    )
    assert raw == len(expected_body).to_bytes(4, "big") + expected_body
    assert decode_table(raw, 0, len(raw)) == (table, len(raw))
    assert encode_table(None) == encode_table({}) == b"\x00\x00\x00\x00"


def test_array_round_trip() -> None:
    items = [1, "two", [3, {"four": 4.0}], None, b"\x05", True]
    raw = encode_array(items)
    assert decode_array(raw, 0, len(raw)) == (items, len(raw))


@pytest.mark.parametrize(
    "body",
    [
        b"\x01kZ",  # unknown type
        b"\x01k",  # key without a value
        b"\x05k",  # key longer than the table
        b"\x01kI\x00\x00",  # value runs past the table
        b"\x01kS\x00\x00\x00\x05ab",  # long string runs past the table
        b"\x01kF\x00\x00\x00\x09\x00",  # nested table longer than the outer one
        b"\x01kA\x00\x00\x00\x02I\x00",  # array item runs past the array
    ],
)
def test_malformed_tables(body: bytes) -> None:
    raw = len(body).to_bytes(4, "big") + body
    with pytest.raises((ValueError, IndexError)):
        decode_table(raw + b"\xce" * 8, 0, len(raw))


def test_table_keys_are_not_utf8_checked() -> None:
    raw = b"\x00\x00\x00\x03\x01\xffV"
    table, _ = decode_table(raw, 0, len(raw))
    assert encode_table(table) == raw


def test_short_and_long_strings() -> None:
    assert encode_shortstr("ab") == b"\x02ab"
    assert encode_shortstr(b"\xff") == b"\x01\xff"
    assert decode_shortstr(b"\x02ab", 0, 3) == ("ab", 3)
    assert encode_longstr("é") == b"\x00\x00\x00\x02\xc3\xa9"
    assert decode_longstr(b"\x00\x00\x00\x01z", 0, 5) == (b"z", 5)
    with pytest.raises(ValueError):
        encode_shortstr("x" * 256)
    with pytest.raises(ValueError):
        decode_shortstr(b"\x05ab", 0, 3)
    with pytest.raises(ValueError):
        decode_longstr(b"\x00\x00\x00\x05ab", 0, 6)


# --- property-based ---------------------------------------------------------------------------------

scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.none(),
    st.integers(min_value=0, max_value=2**64 - 1).map(Timestamp),
    st.decimals(min_value=0, max_value=42949672, places=2, allow_nan=False),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.text(max_size=10), children, max_size=5),
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=30), values, max_size=8))
def test_table_round_trip(table: dict) -> None:
    raw = encode_table(table)
    decoded, end = decode_table(raw, 0, len(raw))
    assert end == len(raw)
    assert decoded == table
    assert encode_table(decoded) == raw  # the types survive the round trip too


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_decode_table_never_crashes_otherwise(junk: bytes) -> None:
    raw = len(junk).to_bytes(4, "big") + junk
    try:
        decode_table(raw, 0, len(raw))
    except (ValueError, IndexError):
        pass
    except Exception as e:  # struct.error is what remains
        assert type(e).__name__ == "error"


# --- basic properties -------------------------------------------------------------------------------

ALL = BasicProperties(
    "text/plain", "utf-8", {"h": 1}, 2, 9, "c", "r", "1000", "m", 1_700_000_000, "t", "u", "a", "cl"
)


def test_property_names_and_order() -> None:
    assert PROPERTY_NAMES == (
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
    )


def test_all_properties_round_trip() -> None:
    raw = encode_properties(ALL)
    assert raw[:2] == b"\xff\xfc"
    assert decode_properties(raw) == ALL


@pytest.mark.parametrize("index", range(14))
def test_each_property_alone(index: int) -> None:
    name = PROPERTY_NAMES[index]
    props = BasicProperties(**{name: getattr(ALL, name)})
    raw = encode_properties(props)
    assert int.from_bytes(raw[:2], "big") == 0x8000 >> index
    assert decode_properties(raw) == props


def test_property_values_byte_exact() -> None:
    assert encode_properties(None) == encode_properties(BasicProperties()) == b"\x00\x00"
    assert encode_properties(BasicProperties(delivery_mode=2)) == b"\x10\x00\x02"
    assert encode_properties(BasicProperties(content_type="a", priority=1)) == b"\x88\x00\x01a\x01"
    assert encode_properties(BasicProperties(timestamp=1)) == b"\x00\x40" + (1).to_bytes(8, "big")
    when = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert decode_properties(encode_properties(BasicProperties(timestamp=when))).timestamp == 1_700_000_000  # type: ignore[arg-type]
    assert encode_properties(BasicProperties(headers={})) == b"\x20\x00\x00\x00\x00\x00"


def test_continuation_flag_words_are_skipped() -> None:
    raw = b"\x10\x01" + b"\x00\x01" + b"\x00\x00" + b"\x02"
    assert decode_properties(raw) == BasicProperties(delivery_mode=2)


def test_property_shortstr_too_long() -> None:
    with pytest.raises(ValueError):
        encode_properties(BasicProperties(message_id="x" * 256))


def test_properties_not_utf8_round_trip() -> None:
    raw = b"\x00\x80\x02\xff\xfe"
    props = decode_properties(raw)
    assert encode_properties(props) == raw


prop_text = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)


@settings(max_examples=200, deadline=None)
@given(
    st.builds(
        BasicProperties,
        content_type=st.none() | prop_text,
        content_encoding=st.none() | prop_text,
        headers=st.none() | st.dictionaries(st.text(max_size=10), values, max_size=4),
        delivery_mode=st.none() | st.integers(0, 255),
        priority=st.none() | st.integers(0, 255),
        correlation_id=st.none() | prop_text,
        reply_to=st.none() | prop_text,
        expiration=st.none() | prop_text,
        message_id=st.none() | prop_text,
        timestamp=st.none() | st.integers(0, 2**64 - 1),
        type=st.none() | prop_text,
        user_id=st.none() | prop_text,
        app_id=st.none() | prop_text,
        cluster_id=st.none() | prop_text,
    )
)
def test_properties_round_trip(props: BasicProperties) -> None:
    raw = encode_properties(props)
    assert decode_properties(raw) == props


def test_float_nan_survives_as_nan() -> None:
    decoded = one(enc(float("nan")))
    assert math.isnan(decoded)  # type: ignore[arg-type]
