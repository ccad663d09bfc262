"""Stored-message layout, batch bodies, properties strings, message ids and the 4.x <-> store
message mapping (byte fixtures built field by field, independently of the encoder)."""

from __future__ import annotations

import struct
import zlib

import pytest

from adapters.remoting.mapping import delay_level_ms, to_store, to_wire
from adapters.remoting.message_codec import (
    MAGIC_V1,
    MAGIC_V2,
    BatchItem,
    MessageCodecError,
    MessageExt,
    decode_batch,
    decode_message,
    decode_messages,
    decode_offset_msg_id,
    decode_properties,
    encode_batch,
    encode_message,
    encode_properties,
    offset_msg_id,
)
from messaging_processor import Message, MessageType
from remoting import parse_host_port


def stored_fixture(topic: bytes, body: bytes, props: bytes, *, v6: bool = False) -> bytes:
    """A record exactly as MessageDecoder.decode reads it, assembled field by field."""
    host = (b"\x00" * 15 + b"\x01") if v6 else bytes([10, 0, 0, 7])
    sys_flag = 0x30 if v6 else 0
    rest = b"".join(
        [
            struct.pack(">i", 3),  # queueId
            struct.pack(">i", 0),  # flag
            struct.pack(">q", 41),  # queueOffset
            struct.pack(">q", 123456),  # physicalOffset
            struct.pack(">i", sys_flag),
            struct.pack(">q", 1_700_000_000_000),  # bornTimestamp
            host + struct.pack(">i", 5555),  # bornHost
            struct.pack(">q", 1_700_000_000_500),  # storeTimestamp
            host + struct.pack(">i", 8080),  # storeHost
            struct.pack(">i", 2),  # reconsumeTimes
            struct.pack(">q", 0),  # preparedTransactionOffset
            struct.pack(">i", len(body)) + body,
            bytes([len(topic)]) + topic,
            struct.pack(">h", len(props)) + props,
        ]
    )
    total = 4 + 4 + 4 + len(rest)
    return struct.pack(">iii", total, MAGIC_V1, zlib.crc32(body) & 0x7FFFFFFF) + rest


def test_decode_stored_message_fixture():
    props = b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01ABCDEF\x02"
    data = stored_fixture(b"orders", b"hello", props)
    m, end = decode_message(data)
    assert end == len(data) == m.store_size
    assert (m.topic, m.body, m.queue_id, m.queue_offset, m.commitlog_offset) == (
        "orders",
        b"hello",
        3,
        41,
        123456,
    )
    assert (m.born_host, m.store_host, m.reconsume_times) == (("10.0.0.7", 5555), ("10.0.0.7", 8080), 2)
    assert m.properties == {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABCDEF"}
    assert m.tags == "TagA" and m.keys == "k1 k2" and m.msg_id == "ABCDEF"
    assert m.offset_msg_id == "0A00000700001F90000000000001E240"
    # The encoder produces the same bytes.
    assert encode_message(m) == data


def test_ipv6_hosts_by_sys_flag():
    data = stored_fixture(b"t", b"x", b"", v6=True)
    m, _ = decode_message(data)
    assert m.born_host == ("::1", 5555) and m.store_host == ("::1", 8080) and m.sys_flag == 0x30
    assert encode_message(m) == data
    m.born_host = ("127.0.0.1", 1)
    m2, _ = decode_message(encode_message(m))
    assert m2.sys_flag & 0x10 == 0 and m2.sys_flag & 0x20 == 0x20


def test_long_topic_uses_magic_v2_with_int16_topic_length():
    m = MessageExt("%RETRY%" + "g" * 200, b"b", {"a": "1"})
    data = encode_message(m)
    assert struct.unpack_from(">i", data, 4)[0] == MAGIC_V2
    back, _ = decode_message(data)
    assert back.topic == m.topic and back.properties == {"a": "1"}


def test_decode_messages_back_to_back_and_errors():
    a = encode_message(MessageExt("t", b"1", queue_offset=0))
    b = encode_message(MessageExt("t", b"2", queue_offset=1))
    assert [m.body for m in decode_messages(a + b)] == [b"1", b"2"]
    with pytest.raises(MessageCodecError):
        decode_messages(a + b[:-3])
    bad = bytearray(a)
    bad[4:8] = struct.pack(">i", 12345)
    with pytest.raises(MessageCodecError, match="magic"):
        decode_message(bytes(bad))


def test_properties_string():
    s = encode_properties({"a": "1", "b": "x y", "": "dropped", "bad\x01key": "v\x02w"})
    assert s == "a\x011\x02b\x01x y\x02bad key\x01v w\x02"
    assert decode_properties(s) == {"a": "1", "b": "x y", "bad key": "v w"}
    assert decode_properties("a\x011\x02b\x012") == {"a": "1", "b": "2"}  # no trailing separator
    assert decode_properties("\x02\x02noval\x02\x01v\x02k\x01\x02") == {"k": ""}
    assert decode_properties(b"k\x01\xc3\xbc\x02") == {"k": "ü"} and decode_properties(None) == {}


def test_batch_body_fixture_and_round_trip():
    def rec(flag: int, body: bytes, props: bytes) -> bytes:
        size = 20 + len(body) + 2 + len(props)
        return (
            struct.pack(">iiiii", size, 0, 0, flag, len(body)) + body + struct.pack(">h", len(props)) + props
        )

    data = rec(0, b"m1", b"UNIQ_KEY\x01A\x02") + rec(7, b"", b"")
    items = decode_batch(data)
    assert items == [BatchItem(b"m1", {"UNIQ_KEY": "A"}, 0), BatchItem(b"", {}, 7)]
    assert encode_batch(items) == data
    with pytest.raises(MessageCodecError):
        decode_batch(data[:-1] + b"")
    with pytest.raises(MessageCodecError):
        decode_batch(rec(0, b"m1", b"")[:10])


def test_offset_message_ids():
    mid = offset_msg_id("127.0.0.1", 8080, 1 << 40)
    assert mid == "7F00000100001F900000010000000000"
    assert decode_offset_msg_id(mid) == ("127.0.0.1", 8080, 1 << 40)
    v6 = offset_msg_id("::1", 1, 5)
    assert len(v6) == 56 and decode_offset_msg_id(v6) == ("::1", 1, 5)
    for bad in ("XYZ", "00", "7F0000010000"):
        with pytest.raises(ValueError):
            decode_offset_msg_id(bad)
    assert offset_msg_id("not-an-ip", 1, 0).startswith("7F000001")


def test_parse_host_port():
    assert parse_host_port("1.2.3.4:5") == ("1.2.3.4", 5)
    assert parse_host_port("[::1]:9") == ("::1", 9)
    assert parse_host_port("host") == ("host", 0) and parse_host_port("") == ("127.0.0.1", 0)
    assert parse_host_port("h:x", 7) == ("h", 7)


# ---------------------------------------------------------------------------------------- mapping


def test_inbound_mapping_moves_system_properties_onto_fields():
    props = {
        "TAGS": "TagA",
        "KEYS": "k1  k2",
        "UNIQ_KEY": "U1",
        "WAIT": "true",
        "MSG_REGION": "x",
        "user": "v",
        "PGROUP": "PG",
    }
    m = to_store("t", b"b", props, queue_id=2, born_timestamp=5, born_host="1.2.3.4:9", flag=3)
    assert (m.tag, m.keys, m.message_id, m.queue_id, m.msg_type) == (
        "TagA",
        ("k1", "k2"),
        "U1",
        2,
        MessageType.NORMAL,
    )
    assert m.properties == {"user": "v", "PGROUP": "PG", "__FLAG": "3"}
    assert (m.born_timestamp, m.born_host, m.deliver_at) == (5, "1.2.3.4:9", 0)


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({"DELAY": "3"}, 1_000_000 + 10_000),
        ({"DELAY": "99"}, 1_000_000 + 7_200_000),
        ({"__STARTDELIVERTIME": "1500000"}, 1_500_000),
        ({"TIMER_DELIVER_MS": "1600000"}, 1_600_000),
        ({"TIMER_DELAY_SEC": "2"}, 1_002_000),
        ({"TIMER_DELAY_MS": "250"}, 1_000_250),
    ],
)
def test_inbound_delays(props, expected):
    m = to_store("t", b"", dict(props), now_ms=1_000_000)
    assert m.deliver_at == expected and m.msg_type == MessageType.DELAY and not m.properties


def test_inbound_transaction_and_fifo():
    assert to_store("t", b"", {"TRAN_MSG": "true"}).msg_type == MessageType.TRANSACTION
    assert to_store("t", b"", {}, sys_flag=0x4).msg_type == MessageType.TRANSACTION
    m = to_store("t", b"", {"__SHARDINGKEY": "g1"})
    assert m.msg_type == MessageType.FIFO and m.message_group == "g1"
    assert to_store("t", b"", {"DELAY": "0"}).msg_type == MessageType.NORMAL
    assert delay_level_ms(0) == 0 and delay_level_ms(1) == 1000 and delay_level_ms(18) == 7_200_000


def test_outbound_mapping():
    msg = Message(
        "t",
        b"body",
        "TagB",
        ("a", "b"),
        {"p": "1", "__REAL_TOPIC": "x", "RECONSUME_TIME": "3", "__FLAG": "9", "mqtt.qos": "1"},
        "grp",
        message_id="MID",
        born_host="gw-host",
        queue_id=1,
    )
    msg.queue_offset, msg.commitlog_offset, msg.store_timestamp = 7, 99, 1234
    w = to_wire(msg, ("10.1.1.1", 8080), extra={"X": "y"})
    assert w.properties == {
        "p": "1",
        "mqtt.qos": "1",
        "TAGS": "TagB",
        "KEYS": "a b",
        "UNIQ_KEY": "MID",
        "__SHARDINGKEY": "grp",
        "X": "y",
    }
    assert (w.reconsume_times, w.flag, w.queue_id, w.queue_offset, w.commitlog_offset) == (3, 9, 1, 7, 99)
    assert w.born_host == ("gw-host", 0) and w.store_timestamp == 1234
    back, _ = decode_message(encode_message(w))
    assert back.born_host == ("127.0.0.1", 0) and back.msg_id == "MID"
    assert to_wire(msg, ("1.1.1.1", 1), reconsume_times=0).reconsume_times == 0
    # MQTT 5 user properties / AMQP headers are properties of their own (stored names win)
    msg.properties = {"p": "1", "mqtt.user_properties": '[["site","north"],["p","x"],["k","1"],["k","2"]]'}
    w = to_wire(msg, ("10.1.1.1", 8080))
    assert (w.properties["site"], w.properties["p"], w.properties["k"]) == ("north", "1", "1")


def test_uniq_keys():
    from adapters.remoting.message_codec import UniqKeyFactory, uniq_key_ip

    f = UniqKeyFactory("10.1.2.3", pid=77)
    month_start = 1_698_796_800_000  # 2023-11-01T00:00:00Z
    a, b = f.next(month_start + 1000), f.next(month_start + 1000)
    assert len(a) == 32 and a != b and a.isupper() and a[:12] == "0A010203004D"
    assert int(a[20:28], 16) == 1000 and int(b[28:], 16) == int(a[28:], 16) + 1
    assert uniq_key_ip(a) == "10.1.2.3" and uniq_key_ip("xyz") is None
    c = f.next(month_start + 31 * 86_400_000)  # December 2nd: counted from December 1st
    assert int(c[20:28], 16) == 86_400_000
