"""`mapping.with_traceparent`: the `traceparent` header added to a stored message's raw properties on
delivery, by appending to the header table in place (the usual case) or by decoding and encoding
the properties again (the rest): both give the same properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.amqp.codec import BasicProperties, decode_properties, encode_properties
from adapters.amqp.codec.properties import PROPERTY_NAMES
from adapters.amqp.mapping import with_traceparent
from messaging_processor.tracing import TRACEPARENT, derived_traceparent
from tests.adapters.amqp.test_codec_tables import ALL, values

TP = derived_traceparent("AC11000200000000" + "00A1B2C3D4E5F60718293A4B5C6D7E8F")
assert TP is not None


def by_decoding(raw: bytes, traceparent: str) -> BasicProperties:
    props = decode_properties(raw)
    props.headers = {**(props.headers or {}), TRACEPARENT: traceparent}
    return props


@settings(max_examples=400, deadline=None)
@given(
    present=st.lists(st.sampled_from(PROPERTY_NAMES), unique=True),
    headers=st.dictionaries(st.text(max_size=12), values, max_size=5),
    old_traceparent=st.one_of(st.none(), st.text(max_size=8)),
)
def test_the_header_is_set_and_every_other_property_kept(present, headers, old_traceparent) -> None:
    props = BasicProperties(**{name: getattr(ALL, name) for name in present})
    if "headers" in present:
        props.headers = dict(headers)
        if old_traceparent is not None:  # an invalid one from the publisher: replaced
            props.headers[TRACEPARENT] = old_traceparent
    raw = encode_properties(props)
    assert decode_properties(with_traceparent(raw, TP)) == by_decoding(raw, TP)


def test_the_publishers_table_bytes_are_kept() -> None:
    """A header the publisher typed its own way (a short-short int 'b', not the 'l' we would write)
    stays as it was: the table is appended to, not encoded again."""
    table = b"\x01kb\x05"  # {"k": 5} as a signed 8-bit int
    raw = b"\x30\x00" + len(table).to_bytes(4, "big") + table + b"\x02"  # headers + delivery_mode 2
    out = with_traceparent(raw, TP)
    assert out.startswith(raw[:2] + (len(table) + 13 + 4 + len(TP)).to_bytes(4, "big") + table)
    assert out.endswith(b"\x02")
    assert decode_properties(out).headers == {"k": 5, TRACEPARENT: TP}


def test_properties_that_carry_the_value_already_are_returned_as_they_are() -> None:
    raw = encode_properties(BasicProperties(headers={TRACEPARENT: TP}, delivery_mode=2))
    assert with_traceparent(raw, TP) is raw


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_malformed_properties_never_raise(junk: bytes) -> None:
    assert isinstance(with_traceparent(junk, TP), bytes)
