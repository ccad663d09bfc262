"""The hand-encoded ReceiveMessageResponse equals what protobuf builds with `fill_proto`."""

from __future__ import annotations

import dataclasses

import pytest

from adapters.grpc.convert import fill_proto, split_properties
from adapters.grpc.delivery_bytes import delivery_response
from adapters.grpc.generated import service_pb2 as s
from messaging_processor import Delivery
from store import Message, MessageType

BASE = Message(
    "orders",
    b"hello",
    tag="TagA",
    message_id="0A0B0C0D00002A9F0000000000000001",
    born_timestamp=1_763_000_000_123,
    born_host="10.0.0.7",
    queue_id=3,
    store_timestamp=1_763_000_000_456,
    store_host="127.0.0.1:8081",
    queue_offset=1234,
)

VARIANTS = {
    "plain": {},
    "no tag, no id, no born host": {"tag": "", "message_id": "", "born_host": ""},
    "keys": {"keys": ("k1", "ключ", "")},
    "empty body": {"body": b""},
    "large body (multi-byte lengths)": {"body": bytes(range(256)) * 300},
    "long strings": {"tag": "t" * 200, "topic": "T" * 200, "born_host": "h" * 130},
    "zero and whole-second times": {"born_timestamp": 0, "store_timestamp": 1_763_000_000_000},
    "no store time or host": {"store_timestamp": 0, "store_host": ""},
    "queue 0, offset 0": {"queue_id": 0, "queue_offset": 0},
    "negative queue and offset": {"queue_id": -1, "queue_offset": -1},
    "huge offset": {"queue_offset": 2**62 + 5},
    "delay (released as NORMAL)": {"deliver_at": 1_763_000_060_500},
    "delay type": {"deliver_at": 1_763_000_060_000, "msg_type": MessageType.DELAY},
    "fifo": {"message_group": "group-ü", "msg_type": MessageType.FIFO},
    "transaction": {"msg_type": MessageType.TRANSACTION},
    "user properties": {"properties": {"a": "1", "empty": "", "名前": "値", "x" * 200: "y" * 300}},
    "hidden properties": {
        "properties": {
            "TRACE_CONTEXT": "00-abc-def-01",
            "CHECK_IMMUNITY_TIME_IN_SECONDS": "30",
            "__REAL_TOPIC": "t",
            "TRANSACTION_CHECK_TIMES": "2",
            "user": "kept",
        }
    },
    "recovery zero": {"properties": {"CHECK_IMMUNITY_TIME_IN_SECONDS": "0"}},
    "recovery not a number": {"properties": {"CHECK_IMMUNITY_TIME_IN_SECONDS": "soon"}},
    "recovery not ASCII digits": {"properties": {"CHECK_IMMUNITY_TIME_IN_SECONDS": "²"}},
    "recovery beyond int64": {"properties": {"CHECK_IMMUNITY_TIME_IN_SECONDS": str(2**63)}},
    "empty topic": {"topic": ""},
    "MQTT 5 user properties": {
        "properties": {
            "mqtt.user_properties": '[["site","north"],["k","1"],["k","2"],["seq","x"]]',
            "seq": "7",
        }
    },
}


def test_user_property_pairs_are_user_properties_unless_a_property_has_the_name() -> None:
    user, _, _ = split_properties(
        {"mqtt.user_properties": '[["site","north"],["k","1"],["k","2"],["seq","x"]]', "seq": "7"}
    )
    assert dict(user) == {"mqtt.user_properties": user[0][1], "seq": "7", "site": "north", "k": "1"}
    assert split_properties({"mqtt.user_properties": "not json"})[0] == [("mqtt.user_properties", "not json")]


def _expected(dl: Delivery, host: str) -> s.ReceiveMessageResponse:
    r = s.ReceiveMessageResponse()
    fill_proto(dl, r.message, host)
    return r


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("attempt", [1, 300])
@pytest.mark.parametrize("host", ["", "gateway:8081"])
def test_same_message_as_fill_proto(name: str, attempt: int, host: str) -> None:
    m = dataclasses.replace(BASE, **VARIANTS[name])
    dl = Delivery(m, f"handle-{name}-é", 1_763_000_100_000, attempt)
    want = _expected(dl, host)
    for _ in range(2):  # the second time from the caches of repeated values
        raw = delivery_response(dl, host)
        got = s.ReceiveMessageResponse.FromString(raw)
        assert got == want
        assert got.WhichOneof("content") == "message"
        # The same presence of optional and message fields, not only the same values.
        assert got.message.system_properties.ListFields() == want.message.system_properties.ListFields()
        if not want.message.user_properties:  # protobuf writes map entries in its own hash order
            assert raw == want.SerializeToString()  # fields in number order: the very same bytes


def test_messages_in_a_row_do_not_share_values() -> None:
    """Values that repeat are cached: messages with other values right after must not get them."""
    for i in range(3):
        m = dataclasses.replace(BASE, tag=f"tag{i % 2}", topic=f"topic{i}", born_timestamp=1_000 * i + i)
        dl = Delivery(m, f"h{i}", 0, i + 1)
        assert s.ReceiveMessageResponse.FromString(delivery_response(dl)) == _expected(dl, "")
