"""The remoting listener over real sockets with a raw client: routes, sends, protocol behaviour
(oneway, unknown codes, binary headers, malformed frames), client bookkeeping."""

from __future__ import annotations

import asyncio
import json
import struct
import zlib

from adapters.remoting.message_codec import BatchItem, decode_offset_msg_id, encode_batch, encode_properties
from messaging_processor import ClientKind, Message
from remoting import ROCKETMQ, RemotingCommand, RequestCode, ResponseCode, decode_frame, loads
from tests.adapters.remoting.support import CTX, close_env, open_env, raw_request, send
from tests.support import wait_until

R = ResponseCode
RC = RequestCode


# ---------------------------------------------------------------------------------------- routes


async def test_route_for_old_and_new_clients(env, client):
    old = client.command(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})
    r = await client.invoke(old, raw=raw_request(RC.GET_ROUTEINFO_BY_TOPIC, old.opaque, {"topic": "orders"}))
    assert r.code == R.SUCCESS and r.is_response and r.opaque == old.opaque
    assert f'"brokerAddrs":{{0:"{env.addr}"}}'.encode() in r.body  # version 121: fastjson's bare keys
    data = loads(r.body)
    assert data["queueDatas"] == [
        {"brokerName": "gateway", "perm": 6, "readQueueNums": 2, "topicSysFlag": 0, "writeQueueNums": 2}
    ]
    assert data["brokerDatas"][0]["cluster"] == "DefaultCluster"
    r = await client.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})  # version 401
    assert json.loads(r.body)["brokerDatas"][0]["brokerAddrs"] == {"0": env.addr}
    assert await env.processor.get_topic("orders")  # auto-created


async def test_route_unknown_topic_and_tbw102_without_auto_create(tmp_path):
    env = await open_env(str(tmp_path / "d"), auto_create=False)
    c = await env.client()
    try:
        r = await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "nope"})
        assert r.code == R.TOPIC_NOT_EXIST and "nope" in r.remark
        assert (await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})).code == R.TOPIC_NOT_EXIST
        assert (await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "bad topic"})).code == R.TOPIC_NOT_EXIST
        r = await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "%RETRY%g1"})  # retry topics: always
        assert r.code == R.SUCCESS
        r = await send(c, "nope", b"x")
        assert r.code == R.TOPIC_NOT_EXIST
        await env.processor.create_topic("yes", 3)
        r = await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "yes"})
        assert loads(r.body)["queueDatas"][0]["writeQueueNums"] == 3
    finally:
        await c.close()
        await close_env(env)


async def test_tbw102_answered_when_auto_creating(client):
    r = await client.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    assert r.code == R.SUCCESS and loads(r.body)["queueDatas"][0]["readQueueNums"] == 2


async def test_advertise_host(tmp_path):
    env = await open_env(str(tmp_path / "d"), advertise_host="gw.example")
    c = await env.client()
    try:
        r = await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})
        assert loads(r.body)["brokerDatas"][0]["brokerAddrs"] == {"0": f"gw.example:{env.port}"}
    finally:
        await c.close()
        await close_env(env)


async def test_cluster_info_topic_list_kv_config(env, client):
    await env.processor.create_topic("a1")
    r = await client.invoke(RC.GET_BROKER_CLUSTER_INFO, {})
    info = loads(r.body)
    assert info["clusterAddrTable"] == {"DefaultCluster": ["gateway"]}
    assert info["brokerAddrTable"]["gateway"]["brokerAddrs"] == {"0": env.addr}
    r = await client.invoke(RC.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {})
    assert "a1" in loads(r.body)["topicList"]
    r = await client.invoke(RC.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "a1"})
    assert r.code == R.QUERY_NOT_FOUND


# ---------------------------------------------------------------------------------------- send


async def test_send_v2_with_json_numbers(env, client):
    r = await send(
        client, "t1", b"hello", {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "U-1", "p": "v"}, queue_id=1
    )
    assert r.code == R.SUCCESS, r.remark
    ext = r.ext_fields
    assert (
        ext["queueId"] == "1" and ext["queueOffset"] == "0" and all(isinstance(v, str) for v in ext.values())
    )
    host, port, clo = decode_offset_msg_id(ext["msgId"])
    assert (host, port) == ("127.0.0.1", env.port)
    m = await env.processor.get_message_at(clo)
    assert (m.topic, m.body, m.tag, m.keys, m.message_id) == ("t1", b"hello", "TagA", ("k1", "k2"), "U-1")
    assert m.properties == {"p": "v"} and m.queue_id == 1 and m.born_host.startswith("127.0.0.1:")


async def test_send_long_names_compressed_and_queue_modulo(env, client):
    body = b"z" * 5000
    ext = {
        "producerGroup": "PG",
        "topic": "t2",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "5",  # 2 queues: 5 % 2
        "sysFlag": "1",  # compressed
        "bornTimestamp": "1",
        "flag": "0",
        "properties": encode_properties({"TAGS": "x"}),
        "reconsumeTimes": "0",
        "unitMode": "0",
        "batch": "0",
    }
    r = await client.invoke(RC.SEND_MESSAGE, ext, zlib.compress(body))
    assert r.code == R.SUCCESS and r.ext_fields["queueId"] == "1"
    m = await env.processor.get_message_at(decode_offset_msg_id(r.ext_fields["msgId"])[2])
    assert m.body == body
    bad = await client.invoke(RC.SEND_MESSAGE, {**ext, "sysFlag": "1"}, b"not zlib")
    assert bad.code == R.MESSAGE_ILLEGAL
    lz4 = await client.invoke(RC.SEND_MESSAGE, {**ext, "sysFlag": str(1 | (1 << 8))}, b"x")
    assert lz4.code == R.MESSAGE_ILLEGAL and "LZ4" in lz4.remark


async def test_batch_as_320_and_as_code_10(env, client):
    items = [BatchItem(f"b{i}".encode(), {"UNIQ_KEY": f"B{i}", "TAGS": "T"}) for i in range(3)]
    ext = {
        "a": "PG",
        "b": "t3",
        "c": "TBW102",
        "d": 4,
        "e": 0,
        "f": 0,
        "g": 1,
        "h": 0,
        "i": "",
        "j": 0,
        "k": False,
    }
    r = await client.invoke(RC.SEND_BATCH_MESSAGE, ext, encode_batch(items))
    assert r.code == R.SUCCESS
    ids = r.ext_fields["msgId"].split(",")
    assert len(ids) == 3 and r.ext_fields["queueOffset"] == "0"
    msgs = await env.processor.read(CTX, "t3", 0, 0)
    assert [(m.body, m.message_id) for m in msgs] == [(b"b0", "B0"), (b"b1", "B1"), (b"b2", "B2")]
    r = await client.invoke(
        RC.SEND_MESSAGE, {"topic": "t3", "queueId": 0, "batch": "1"}, encode_batch(items[:2])
    )
    assert r.code == R.SUCCESS and r.ext_fields["queueOffset"] == "3"
    assert (await client.invoke(RC.SEND_BATCH_MESSAGE, ext, b"\x00\x00")).code == R.MESSAGE_ILLEGAL


async def test_send_validation_and_oneway(env, client):
    r = await send(client, "t4", b"x", {"TAGS": "a||b"})
    assert r.code == R.MESSAGE_ILLEGAL and "tag" in r.remark
    r = await send(client, "%DLQ%g", b"x")
    assert r.code == R.MESSAGE_ILLEGAL
    r = await client.invoke(RC.SEND_MESSAGE_V2, {"a": "PG"})
    assert r.code == R.SYSTEM_ERROR and "topic" in r.remark
    client.oneway(RC.SEND_MESSAGE_V2, {"b": "t4", "e": 0, "i": encode_properties({"TAGS": "ow"})}, b"one")
    await wait_until(lambda: env.store.max_offset("t4", 0) == 1)
    r = await client.invoke(RC.GET_MAX_OFFSET, {"topic": "t4", "queueId": 0})
    assert r.ext_fields["offset"] == "1"


async def test_oneway_requests_get_no_reply(env):
    reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
    try:
        for opaque, code, ext in (
            (1, 4242, {}),
            (2, RC.SEND_MESSAGE_V2, {"b": "t9", "i": ""}),
            (3, RC.HEART_BEAT, {}),
        ):
            writer.write(raw_request(code, opaque, ext, b"x" if code != RC.HEART_BEAT else b"{}", flag=2))
        writer.write(raw_request(RC.GET_MAX_OFFSET, 4, {"topic": "t9", "queueId": 0}))
        length = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 5))[0]
        first = decode_frame(await reader.readexactly(length))
        assert first.opaque == 4 and first.is_response  # the oneway requests were answered by nothing
        await asyncio.sleep(0.1)
        assert reader.at_eof() is False and not reader._buffer  # type: ignore[attr-defined]
    finally:
        writer.close()


async def test_concurrent_sends_are_batched(env, monkeypatch):
    calls = []
    orig = env.processor.send

    async def spy(ctx, msgs, **kw):
        calls.append(len(msgs))
        return await orig(ctx, msgs, **kw)

    monkeypatch.setattr(env.processor, "send", spy)
    clients = [await env.client() for _ in range(4)]
    try:
        rs = await asyncio.gather(
            *(send(c, "t5", f"m{i}-{j}".encode()) for j in range(10) for i, c in enumerate(clients))
        )
        assert all(r.code == R.SUCCESS for r in rs)
        offsets = {(r.ext_fields["queueId"], r.ext_fields["queueOffset"]) for r in rs}
        assert len(offsets) == 40
        assert sum(calls) == 40 and len(calls) < 40  # fewer processor calls than messages
    finally:
        for c in clients:
            await c.close()


async def test_batched_send_isolates_a_bad_message(env):
    c = await env.client()
    try:
        good, bad = await asyncio.gather(
            send(c, "t6", b"ok", {"TAGS": "fine"}), send(c, "t6", b"no", {"TAGS": "x|y"})
        )
        assert good.code == R.SUCCESS and bad.code == R.MESSAGE_ILLEGAL
    finally:
        await c.close()


# ---------------------------------------------------------------------------------------- protocol


async def test_unknown_code_oneway_binary_header_and_garbage(env, client):
    r = await client.invoke(4242, {})
    assert r.code == R.REQUEST_CODE_NOT_SUPPORTED and "4242" in r.remark
    client.oneway(4242, {})
    cmd = RemotingCommand(RC.GET_MAX_OFFSET, 9001, ext_fields={"topic": "zz", "queueId": "0"})
    r = await client.invoke(cmd, raw=cmd.encode(ROCKETMQ))  # binary request, JSON answer
    assert r.code == R.SUCCESS and r.ext_fields == {"offset": "0"} and r.serialize_type == 0
    await asyncio.sleep(0.05)
    assert all(c.opaque != 0 for c in client.requests)
    client.send_raw(struct.pack(">II", 10, 6) + b"{bad}!")
    await asyncio.wait_for(client.closed.wait(), 5)


async def test_oversized_frame_closes_connection(tmp_path):
    env = await open_env(str(tmp_path / "d"), max_frame_size=1024)
    c = await env.client()
    try:
        c.send_raw(struct.pack(">I", 4096))
        await asyncio.wait_for(c.closed.wait(), 5)
    finally:
        await c.close()
        await close_env(env)


# ---------------------------------------------------------------------------------------- clients


def heartbeat(client_id: str, group: str, topics: dict[str, str], *, cpp: bool = False) -> bytes:
    subs = [{"topic": t, "subString": e, "subVersion": 1} for t, e in topics.items()]
    cd = {
        "groupName": group,
        "consumeType": 1 if cpp else "CONSUME_PASSIVELY",
        "messageModel": 1 if cpp else "CLUSTERING",
        "consumeFromWhere": 0 if cpp else "CONSUME_FROM_LAST_OFFSET",
        "subscriptionDataSet": subs,
    }
    return json.dumps(
        {"clientID": client_id, "consumerDataSet": [cd], "producerDataSet": [{"groupName": "PG"}]}
    ).encode()


async def test_heartbeat_consumer_list_notify_and_unregister(env):
    c1, c2 = await env.client(), await env.client()
    try:
        assert (await c1.invoke(RC.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})).code == R.SYSTEM_ERROR
        assert (await c1.invoke(RC.HEART_BEAT, None, heartbeat("c1", "G", {"t": "*"}))).code == R.SUCCESS
        r = await c1.invoke(RC.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
        assert json.loads(r.body) == {"consumerIdList": ["c1"]}
        await c2.invoke(RC.HEART_BEAT, None, heartbeat("c2", "G", {"t": "*"}, cpp=True))
        note = await asyncio.wait_for(c1.server_requests.get(), 5)
        assert note.code == RC.NOTIFY_CONSUMER_IDS_CHANGED and note.is_oneway
        assert note.ext_fields == {"consumerGroup": "G"}
        r = await c1.invoke(RC.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
        assert json.loads(r.body)["consumerIdList"] == ["c1", "c2"]
        kinds = {(c.client_id, c.kind) for c in env.processor.clients.list(protocol="remoting")}
        assert ("c2@G", ClientKind.PUSH_CONSUMER) in kinds and ("c1@PG", ClientKind.PRODUCER) in kinds
        r = await c2.invoke(
            RC.UNREGISTER_CLIENT, {"clientID": "c2", "consumerGroup": "G", "producerGroup": "PG"}
        )
        assert r.code == R.SUCCESS
        r = await c1.invoke(RC.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"})
        assert json.loads(r.body)["consumerIdList"] == ["c1"]
    finally:
        await c2.close()
    await c1.close()
    await wait_until(lambda: not env.adapter.service.clients.consumers)
    assert not env.processor.clients.list(protocol="remoting")


async def test_client_expiry(tmp_path):
    env = await open_env(str(tmp_path / "d"), client_expiry_s=0.3)
    c = await env.client()
    try:
        await c.invoke(RC.HEART_BEAT, None, heartbeat("c1", "G", {"t": "*"}))
        assert env.adapter.service.clients.consumer_ids("G") == ["c1"]
        await wait_until(lambda: not env.adapter.service.clients.consumer_ids("G"), 5)
    finally:
        await c.close()
        await close_env(env)


async def test_locks_and_client_config(env, client):
    mq = [
        {"topic": "t", "brokerName": "gateway", "queueId": 0},
        {"topic": "t", "brokerName": "gateway", "queueId": 1},
    ]
    body = json.dumps({"consumerGroup": "G", "clientId": "a", "mqSet": mq}).encode()
    r = await client.invoke(RC.LOCK_BATCH_MQ, {}, body)
    assert len(json.loads(r.body)["lockOKMQSet"]) == 2
    other = json.dumps({"consumerGroup": "G", "clientId": "b", "mqSet": mq}).encode()
    assert json.loads((await client.invoke(RC.LOCK_BATCH_MQ, {}, other)).body)["lockOKMQSet"] == []
    await client.invoke(
        RC.UNLOCK_BATCH_MQ, {}, json.dumps({"consumerGroup": "G", "clientId": "a", "mqSet": mq[:1]}).encode()
    )
    assert json.loads((await client.invoke(RC.LOCK_BATCH_MQ, {}, other)).body)["lockOKMQSet"] == mq[:1]
    sql = json.dumps({"group": "G", "subscriptionData": {"expressionType": "SQL92", "subString": "a > 1"}})
    assert (await client.invoke(RC.CHECK_CLIENT_CONFIG, {}, sql.encode())).code == R.SYSTEM_ERROR
    tag = json.dumps({"group": "G", "subscriptionData": {"expressionType": "TAG", "subString": "*"}})
    assert (await client.invoke(RC.CHECK_CLIENT_CONFIG, {}, tag.encode())).code == R.SUCCESS
    assert (await client.invoke(RC.HEART_BEAT, {}, b"[not json")).code == R.SYSTEM_ERROR


async def test_access_key_becomes_the_identity(env, client):
    seen = []

    def authorizer(identity, action, resource):
        seen.append((identity.username, action.value, str(resource)))
        return resource.name != "secret"

    env.processor.authorizer = authorizer
    r = await send(client, "open", b"x", AccessKey="ak1", Signature="sig")
    assert r.code == R.SUCCESS and ("ak1", "publish", "topic:open") in seen
    r = await send(client, "secret", b"x", AccessKey="ak1")
    assert r.code == R.NO_PERMISSION


async def test_stop_answers_held_pulls(tmp_path):
    env = await open_env(str(tmp_path / "d"))
    await env.processor.send(CTX, [Message("held", b"x", queue_id=0)], auto_create=True)
    c = await env.client()
    req = {
        "consumerGroup": "G",
        "topic": "held",
        "queueId": 0,
        "queueOffset": 1,
        "maxMsgNums": 1,
        "sysFlag": 2,
    }
    pull = asyncio.ensure_future(
        c.invoke(RC.PULL_MESSAGE, {**req, "suspendTimeoutMillis": 20000}, timeout=30)
    )
    await wait_until(lambda: env.adapter.service.hold.waiting == 1)
    await close_env(env)
    r = await asyncio.wait_for(pull, 5)
    assert r.code == R.PULL_NOT_FOUND
    await c.close()
