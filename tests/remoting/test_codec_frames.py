"""Remoting frames, headers, lenient extFields and fastjson quirks (sans-IO codec, byte fixtures)."""

from __future__ import annotations

import json
import struct

import pytest

from adapters.remoting.message_codec import decode_batch, decode_properties
from remoting import (
    JSON,
    ROCKETMQ,
    Decoder,
    Ext,
    FrameTooLarge,
    HeaderError,
    RemotingCodecError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    decode_command,
    dumps,
    loads,
    send_header,
    wants_standard_json,
)
from remoting import routes as rd
from remoting.codes import request_name, response_name
from remoting.command import stdlib_json_header
from tests.remoting.samples import FRAMES


def frame(header: bytes, body: bytes = b"", stype: int = JSON) -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


# ---------------------------------------------------------------------------------------- JSON header


def test_decode_ali_ons_route_request_fixture():
    cmd = decode_command(FRAMES["ALIONS_GET_ROUTEINFO_BY_TOPIC"])
    assert (cmd.code, cmd.language, cmd.version, cmd.flag) == (105, "JAVA", 121, 0)
    assert cmd.ext_fields == {"topic": "CAP"} and cmd.body == b"" and cmd.serialize_type == JSON
    assert not cmd.is_response and not cmd.is_oneway


def test_ali_ons_json_numbers_and_booleans_become_strings():
    cmd = decode_command(FRAMES["ALIONS_SEND_MESSAGE_V2"])
    assert cmd.code == RequestCode.SEND_MESSAGE_V2
    ext = cmd.ext_fields
    assert ext["e"] == "1" and ext["f"] == "0" and ext["k"] == "false" and ext["d"] == "4"
    h = send_header(ext)
    assert h.str("topic") == "CAP" and h.int("queueId") == 1 and h.bool("unitMode") is False
    assert decode_properties(h.str("properties")) == {"TAGS": "TagA", "KEYS": "key-0", "origin": "ali-ons"}
    assert cmd.body == b"alions-0"


def test_cpp_frames_with_trailing_newline_and_credentials():
    cmd = decode_command(FRAMES["CPP_SEND_MESSAGE"])
    assert (cmd.code, cmd.language, cmd.version, cmd.remark) == (10, "CPP", 63, "")
    ext = Ext(cmd.ext_fields)
    assert ext.str("AccessKey") == "" and ext.str("OnsChannel") == "ALIYUN" and ext.bool("batch") is False
    assert ext.int("queueId") == 0 and ext.int("reconsumeTimes") == 0
    props = decode_properties(ext.str("properties"))
    assert props["UNIQ_KEY"] and props["WAIT"] == "true" and props["origin"] == "cpp"


def test_cpp_batch_is_code_10_with_batch_1():
    cmd = decode_command(FRAMES["CPP_SEND_BATCH"])
    assert cmd.code == RequestCode.SEND_MESSAGE
    assert Ext(cmd.ext_fields).bool("batch") is True  # "1": Java's parseBoolean would say false
    items = decode_batch(cmd.body)
    assert [i.body for i in items] == [b"batch-0", b"batch-1"]
    assert all(i.properties["UNIQ_KEY"] and i.properties["TAGS"] == "TagA" for i in items)
    assert [i.properties["KEYS"] for i in items] == ["key-0", "key-1"]


def test_cpp_send_back_carries_only_offset_group_and_delay_level():
    ext = Ext(decode_command(FRAMES["CPP_CONSUMER_SEND_MSG_BACK"]).ext_fields)
    assert ext.int("offset") >= 0 and ext.str("group") == "CAPG2" and ext.int("delayLevel") == 0
    assert "originMsgId" not in ext and "maxReconsumeTimes" not in ext


def test_heartbeat_bodies_of_both_clients_parse():
    ali = loads(decode_command(FRAMES["ALIONS_HEART_BEAT"]).body)
    assert ali["consumerDataSet"][0]["messageModel"] == "CLUSTERING"
    cpp = loads(decode_command(FRAMES["CPP_HEART_BEAT"]).body)
    assert cpp["consumerDataSet"][0]["messageModel"] == 1  # C++ sends enum ordinals
    topics = {s["topic"] for s in cpp["consumerDataSet"][0]["subscriptionDataSet"]}
    assert topics == {"CAP2", "%RETRY%CAPG2"}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_every_captured_frame_decodes_and_reencodes(name):
    cmd = decode_command(FRAMES[name])
    again = decode_command(cmd.encode())
    assert (again.code, again.opaque, again.flag, again.ext_fields, again.body) == (
        cmd.code,
        cmd.opaque,
        cmd.flag,
        cmd.ext_fields,
        cmd.body,
    )


def test_response_encoding_is_strict_json():
    req = RemotingCommand(14, opaque=77, language="JAVA", version=121)
    resp = req.response(ResponseCode.SUCCESS, ext_fields={"offset": 5, "ok": True})  # type: ignore[dict-item]
    data = resp.encode()
    (length, word) = struct.unpack_from(">II", data)
    assert length == len(data) - 4 and word >> 24 == JSON
    head = data[8 : 8 + (word & 0xFFFFFF)]
    assert head == (
        b'{"code":0,"extFields":{"offset":"5","ok":"true"},"flag":1,"language":"PYTHON","opaque":77,'
        b'"serializeTypeCurrentRPC":"JSON","version":401}'
    )
    assert list(json.loads(head)) == sorted(json.loads(head))  # fastjson key order
    with_remark = decode_command(req.response(1, "boom").encode())
    assert with_remark.remark == "boom" and with_remark.is_response


@pytest.mark.parametrize(
    "cmd",
    [
        RemotingCommand(9100, 1, ext_fields={"a": '{"topic":"t","positions":{"0":12}}'}),
        RemotingCommand(
            10,
            2**31 - 1,
            1,
            "JAVA",
            121,
            'quote " backslash \\ tab \t newline \n nul \x00 unit sep \x1f del \x7f',
            {"z": "last", "a": "first", "ü": "Grüße ✓ 𝄞 \u2028", "M": "", "_": "x"},
            b"body",
        ),
        RemotingCommand(0, 5, remark=""),
    ],
)
def test_json_headers_are_the_bytes_the_stdlib_wrote(cmd):
    data = cmd.encode()
    (_, word) = struct.unpack_from(">II", data)
    assert data[8 : 8 + (word & 0xFFFFFF)] == stdlib_json_header(cmd)  # the bytes written before
    again = decode_command(data)
    assert (again.remark, again.ext_fields, again.body) == (cmd.remark, cmd.ext_fields, cmd.body)


def test_headers_only_the_stdlib_parses_still_decode():
    """What orjson refuses and the stdlib read before keeps decoding (the stdlib is the fallback)."""
    big = 2**70
    cmd = decode_command(frame(b'{"code":11,"opaque":1,"extFields":{"n":NaN,"big":%d,"s":"\\ud800"}}' % big))
    assert cmd.code == 11 and cmd.ext_fields == {"n": "nan", "big": str(big), "s": "\ud800"}


def test_oneway_flag():
    cmd = decode_command(frame(b'{"code":15,"flag":2,"opaque":3,"extFields":{"commitOffset":-1}}'))
    assert cmd.is_oneway and not cmd.is_response and cmd.ext_fields == {"commitOffset": "-1"}


def test_lenient_header_values():
    head = (
        b'{"code":"11","opaque":"9","flag":null,"language":3,"version":"63","remark":null,'
        b'"unknown":[1,2],"extFields":{"a":null,"b":1.0,"c":2.5,"d":{"x":1},"e":true}}'
    )
    cmd = decode_command(frame(head))
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.language, cmd.version, cmd.remark) == (
        11,
        9,
        0,
        "PYTHON",
        63,
        None,
    )
    assert cmd.ext_fields == {"b": "1", "c": "2.5", "d": '{"x":1}', "e": "true"}


@pytest.mark.parametrize(
    "head",
    [b"not json", b"[1,2]", b'{"opaque":1}', b'{"code":"x"}', b'{"code":1,"extFields":[1]}', b"\xff\xfe"],
)
def test_malformed_json_headers(head):
    with pytest.raises(RemotingCodecError):
        decode_command(frame(head))


# ---------------------------------------------------------------------------------------- binary header


def binary_header(code, lang, version, opaque, flag, remark: bytes, ext: list[tuple[bytes, bytes]]) -> bytes:
    e = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v for k, v in ext)
    return (
        struct.pack(">hbhii", code, lang, version, opaque, flag)
        + struct.pack(">i", len(remark))
        + remark
        + (struct.pack(">i", len(e)) + e)
    )


def test_decode_rocketmq_binary_header_fixture():
    head = binary_header(105, 0, 401, 42, 0, b"", [(b"topic", b"T"), (b"k", "ü".encode())])
    assert len(head) == 21 + 0 + (2 + 5 + 4 + 1) + (2 + 1 + 4 + 2)
    cmd = decode_command(frame(head, b"body", ROCKETMQ))
    assert (cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.serialize_type) == (
        105,
        "JAVA",
        401,
        42,
        ROCKETMQ,
    )
    assert cmd.ext_fields == {"topic": "T", "k": "ü"} and cmd.remark is None and cmd.body == b"body"
    cmd2 = decode_command(frame(binary_header(0, 1, 63, 1, 1, b"oops", []), b"", ROCKETMQ))
    assert (cmd2.language, cmd2.remark, cmd2.is_response) == ("CPP", "oops", True)


def test_binary_round_trip_and_pop_codes_need_json():
    cmd = RemotingCommand(30, 5, 0, "GO", 413, "r", {"topic": "T", "queueId": "1"}, b"x")
    back = decode_command(cmd.encode(ROCKETMQ))
    assert (back.code, back.language, back.remark, back.ext_fields, back.body) == (
        30,
        "GO",
        "r",
        cmd.ext_fields,
        b"x",
    )
    with pytest.raises(ValueError, match="int16"):
        RemotingCommand(RequestCode.POP_MESSAGE).encode(ROCKETMQ)
    assert (RequestCode.POP_MESSAGE & 0xFFFF) == RequestCode.POP_MESSAGE_SHORT == 3442


@pytest.mark.parametrize(
    "head",
    [
        b"\x00\x0b\x00",  # shorter than the fixed part
        struct.pack(">hbhii", 1, 0, 1, 1, 0) + struct.pack(">i", 99),  # remark beyond the header
        struct.pack(">hbhii", 1, 0, 1, 1, 0) + struct.pack(">ii", 0, 50),  # ext beyond the header
    ],
)
def test_malformed_binary_headers(head):
    with pytest.raises(RemotingCodecError):
        decode_command(frame(head, b"", ROCKETMQ))


def test_unknown_serialize_type_and_bad_lengths():
    with pytest.raises(RemotingCodecError, match="serialize type"):
        decode_command(frame(b"{}", b"", 7))
    bad = struct.pack(">II", 4 + 2, 50) + b"{}"
    with pytest.raises(RemotingCodecError, match="exceeds"):
        decode_command(bad)


# ---------------------------------------------------------------------------------------- Decoder


def test_incremental_decoder_byte_by_byte_and_pipelined():
    data = b"".join(FRAMES[k] for k in ("ALIONS_HEART_BEAT", "CPP_SEND_BATCH", "ALIONS_PULL_MESSAGE"))
    dec = Decoder()
    got = []
    for i in range(len(data)):
        dec.feed(data[i : i + 1])
        got += list(dec)
    assert [c.code for c in got] == [34, 10, 11]
    dec.feed(data)
    assert [c.code for c in dec] == [34, 10, 11] and dec.buffered == 0


def test_decoder_rejects_oversized_frames_before_buffering():
    dec = Decoder(max_frame_size=1024)
    dec.feed(struct.pack(">I", 1025))
    with pytest.raises(FrameTooLarge):
        dec.next_command()
    dec = Decoder()
    dec.feed(struct.pack(">I", 16 * 1024 * 1024 + 1))
    with pytest.raises(FrameTooLarge):
        list(dec)
    dec = Decoder()
    dec.feed(struct.pack(">I", 3))
    with pytest.raises(RemotingCodecError):
        dec.next_command()


# ---------------------------------------------------------------------------------------- Ext


def test_ext_accessors():
    e = Ext({"a": " 12 ", "b": "1.0", "c": "true", "d": "1", "e": "", "f": "null", "g": "x", "h": "1.5"})
    assert e.int("a") == 12 and e.int("b") == 1 and e.int("c") == 1
    assert e.bool("c") and e.bool("d") and not e.bool("e") and e.bool("missing", True)
    assert e.int("e", 7) == 7 and e.int("f", 8) == 8 and e.opt_int("e") is None and e.opt_int("a") == 12
    assert "a" in e and "e" not in e and "zz" not in e
    with pytest.raises(HeaderError, match="no field zz"):
        e.str("zz")
    with pytest.raises(HeaderError, match="not a number"):
        e.int("g")
    with pytest.raises(HeaderError, match="not an integer"):
        e.int("h")


def test_send_header_maps_v2_short_names():
    h = send_header({"a": "PG", "b": "T", "e": "3", "m": "true", "n": "broker-a", "zz": "kept"})
    assert h.str("producerGroup") == "PG" and h.str("topic") == "T" and h.int("queueId") == 3
    assert h.bool("batch") and h.str("brokerName") == "broker-a" and h.str("zz") == "kept"
    assert send_header({"topic": "T", "b": "x"}).str("topic") == "T"


def test_code_names():
    assert request_name(310) == "SEND_MESSAGE_V2" and request_name(424242) == "424242"
    assert response_name(17) == "TOPIC_NOT_EXIST" and response_name(22) == "QUERY_NOT_FOUND"
    assert (ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY) == (0, 1, 2)
    assert (
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
    ) == (
        19,
        20,
        21,
    )


# ---------------------------------------------------------------------------------------- JSON quirks


def test_route_data_old_clients_get_unquoted_broker_ids():
    data = rd.route_data(
        [rd.BrokerData("b", "c", {0: "127.0.0.1:8080", 1: "127.0.0.1:8081"})], [rd.QueueData("b", 4, 4)]
    )
    old = rd.encode(data, standard_json=False)
    assert old == (
        b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:8080",1:"127.0.0.1:8081"},"brokerName":"b",'
        b'"cluster":"c"}],"filterServerTable":{},"queueDatas":[{"brokerName":"b","perm":6,'
        b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}'
    )
    new = rd.encode(data, standard_json=True)
    assert json.loads(new)["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:8080", "1": "127.0.0.1:8081"}
    assert loads(old) == json.loads(new)
    brokers, queues = rd.parse_route(loads(old))
    assert brokers[0].addrs == {0: "127.0.0.1:8080", 1: "127.0.0.1:8081"} and queues[0].write_queues == 4


def test_wants_standard_json_by_version_or_flag():
    assert not wants_standard_json(121, {}) and not wants_standard_json(63, {})
    assert not wants_standard_json(400, {"acceptStandardJsonOnly": "false"})
    assert wants_standard_json(401, {}) and wants_standard_json(479, {})
    assert wants_standard_json(121, {"acceptStandardJsonOnly": "true"})


def test_loads_quotes_only_bare_keys_outside_strings():
    text = '{0:"a",1:{"x":"{2:3}", 5 :[1,2]},"s":",7:"}'
    assert loads(text) == {"0": "a", "1": {"x": "{2:3}", "5": [1, 2]}, "s": ",7:"}
    assert dumps({"b": 1, "a": {2: "x", 1: "y"}}, unquoted_int_keys=True) == '{"a":{1:"y",2:"x"},"b":1}'
    assert dumps({"z": [{"b": 1, "a": None}]}) == '{"z":[{"a":null,"b":1}]}'


def test_cluster_info():
    info = rd.cluster_info([rd.BrokerData("b1", "c", {0: "h:1"}), rd.BrokerData("b2", "c", {0: "h:2"})])
    assert info["clusterAddrTable"] == {"c": ["b1", "b2"]}
    assert info["brokerAddrTable"]["b2"] == {"brokerAddrs": {0: "h:2"}, "brokerName": "b2", "cluster": "c"}
