"""`mapping.present`: an AMQP consumer gets the content header exactly as the publisher sent it (every
property, the headers table byte for byte and in its order, a `traceparent` header only when the
publisher sent one), and a message of another protocol gets the `traceparent` its client sent as a
header, never one the gateway derived or made (issue 47)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.amqp.codec import BasicProperties, decode_properties, encode_properties
from adapters.amqp.codec.properties import PROPERTY_NAMES
from adapters.amqp.mapping import base_properties, present
from messaging_processor import Message
from messaging_processor.processor import ensure_traceparents
from messaging_processor.tracing import GATEWAY_TRACEPARENT, TRACEPARENT, derived_traceparent
from tests.adapters.amqp.test_codec_tables import ALL, values

MID = "AC11000200000000" + "00A1B2C3D4E5F60718293A4B5C6D7E8F"
TP = derived_traceparent(MID)
assert TP is not None


def stored(raw: bytes, message_id: str = MID) -> Message:
    """The store message of a publish to the default exchange with these raw properties, after the
    processor's send path saw it."""
    m = Message("q", b"body", "", (), base_properties("", "q", raw, None), message_id=message_id)
    ensure_traceparents([m])
    return m


@settings(max_examples=400, deadline=None)
@given(
    present_names=st.lists(st.sampled_from(PROPERTY_NAMES), unique=True),
    headers=st.dictionaries(st.text(max_size=12), values, max_size=5),
    traceparent=st.one_of(st.none(), st.just(TP), st.text(max_size=8)),
)
def test_the_content_header_is_delivered_as_published(present_names, headers, traceparent) -> None:
    props = BasicProperties(**{name: getattr(ALL, name) for name in present_names})
    if "headers" in present_names:
        props.headers = dict(headers)
        if traceparent is not None:  # a valid or an invalid one: delivered as sent either way
            props.headers[TRACEPARENT] = traceparent
    raw = encode_properties(props)
    assert present(stored(raw))[2] == raw
    assert present(stored(raw, "order-17"))[2] == raw  # (a context made here stays internal)


def test_the_publishers_table_bytes_and_order_are_kept() -> None:
    """Headers the publisher typed its own way (a short-short int 'b', not the 'l' we would write),
    with `traceparent` between two others: the same bytes, the same order."""
    tp = b"\x0btraceparentS" + len(TP).to_bytes(4, "big") + TP.encode()
    table = b"\x01zb\x05" + tp + b"\x01ab\x07"
    raw = b"\x30\x00" + len(table).to_bytes(4, "big") + table + b"\x02"  # headers + delivery_mode 2
    m = stored(raw)
    assert m.properties[TRACEPARENT] == TP  # (a copy for the trace and for other protocols)
    assert present(m)[2] == raw
    assert list(decode_properties(present(m)[2]).headers) == ["z", TRACEPARENT, "a"]


def test_a_message_of_another_protocol_gets_only_its_clients_traceparent() -> None:
    plain = Message("q", b"x", properties={"site": "north"}, message_id=MID)
    ensure_traceparents([plain])
    assert decode_properties(present(plain)[2]).headers == {"site": "north"}  # none derived
    odd = Message("q", b"x", properties={"site": "north"}, message_id="order-17")
    ensure_traceparents([odd])
    assert GATEWAY_TRACEPARENT in odd.properties
    assert decode_properties(present(odd)[2]).headers == {"site": "north"}  # none made
    sent = Message("q", b"x", properties={"site": "north", TRACEPARENT: TP}, message_id=MID)
    assert decode_properties(present(sent)[2]).headers == {"site": "north", TRACEPARENT: TP}
