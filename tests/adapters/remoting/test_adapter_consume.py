"""The remoting listener's consume side over real sockets with a raw client: pulls with long
polling, consumer offsets, send-back through the retry topic and the DLQ, transactions with
CHECK_TRANSACTION_STATE, pop/ack/change invisible time."""

from __future__ import annotations

import asyncio
import json
import time

from adapters.remoting import message_codec as wm
from adapters.remoting.message_codec import decode_messages, decode_offset_msg_id, encode_message
from messaging_processor import Message, RetryPolicy
from remoting import RequestCode, ResponseCode
from tests.adapters.remoting.support import CTX, close_env, open_env, send
from tests.support import wait_until

R = ResponseCode
RC = RequestCode


def pull_req(topic: str, offset: int, *, qid: int = 0, suspend: int = 0, group: str = "G", **kw) -> dict:
    req = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": qid,
        "queueOffset": offset,
        "maxMsgNums": 32,
        "sysFlag": 2 if suspend else 0,
        "commitOffset": 0,
        "suspendTimeoutMillis": suspend,
        "subVersion": 0,
    }
    req.update(kw)
    return req


async def put(env, topic: str, *bodies: str, qid: int = 0, tag: str = "", **props: str) -> None:
    msgs = [Message(topic, b.encode(), tag, properties=dict(props), queue_id=qid) for b in bodies]
    await env.processor.send(CTX, msgs, auto_create=True)


# ---------------------------------------------------------------------------------------- pull


async def test_pull_found_records_and_offsets(env, client):
    await put(env, "p1", "a", "b", "c", tag="T1", p="v")
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p1", 0, maxMsgNums=2))
    assert r.code == R.SUCCESS
    assert r.ext_fields == {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": "2",
        "minOffset": "0",
        "maxOffset": "3",
    }
    msgs = decode_messages(r.body)
    assert [(m.body, m.queue_offset, m.tags) for m in msgs] == [(b"a", 0, "T1"), (b"b", 1, "T1")]
    m = msgs[0]
    assert m.properties["p"] == "v" and m.properties["UNIQ_KEY"] and m.store_host == ("127.0.0.1", env.port)
    assert (await env.processor.get_message_at(m.commitlog_offset)).body == b"a"
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p1", 2))
    assert r.ext_fields["nextBeginOffset"] == "3" and [m.body for m in decode_messages(r.body)] == [b"c"]


async def test_pull_not_found_and_offset_moved(env, client):
    await put(env, "p2", "a")
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p2", 1))
    assert r.code == R.PULL_NOT_FOUND and r.ext_fields["nextBeginOffset"] == "1" and r.body == b""
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p2", 9))
    assert r.code == R.PULL_OFFSET_MOVED and r.ext_fields["nextBeginOffset"] == "1"
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p2", 0, qid=1))  # empty queue
    assert r.code == R.PULL_NOT_FOUND and r.ext_fields["maxOffset"] == "0"
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p2", 4, qid=1))
    assert r.code == R.PULL_OFFSET_MOVED and r.ext_fields["nextBeginOffset"] == "0"
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p2", 0, qid=7))  # no such queue
    assert r.code == R.PULL_NOT_FOUND
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("nope", 0))
    assert r.code == R.TOPIC_NOT_EXIST


async def test_long_poll_woken_by_a_remoting_send(env, client):
    await put(env, "p3", "a")
    other = await env.client()
    try:
        t0 = time.monotonic()
        pull = asyncio.ensure_future(
            client.invoke(RC.PULL_MESSAGE, pull_req("p3", 1, suspend=15000), timeout=30)
        )
        await wait_until(lambda: env.adapter.service.hold.waiting == 1)
        assert (await send(other, "p3", b"late", queue_id=0)).code == R.SUCCESS
        r = await asyncio.wait_for(pull, 5)
        assert r.code == R.SUCCESS and [m.body for m in decode_messages(r.body)] == [b"late"]
        assert time.monotonic() - t0 < 5
    finally:
        await other.close()


async def test_long_poll_woken_by_another_protocol_and_timeout(env, client):
    await put(env, "p4", "a")
    pull = asyncio.ensure_future(client.invoke(RC.PULL_MESSAGE, pull_req("p4", 1, suspend=15000), timeout=30))
    await wait_until(lambda: env.adapter.service.hold.waiting == 1)
    await put(env, "p4", "from-elsewhere")  # processor.send: noticed by the hold service's check
    r = await asyncio.wait_for(pull, 5)
    assert r.code == R.SUCCESS and decode_messages(r.body)[0].body == b"from-elsewhere"
    t0 = time.monotonic()
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p4", 2, suspend=300))
    assert r.code == R.PULL_NOT_FOUND and 0.25 < time.monotonic() - t0 < 3


async def test_pull_tag_filters(env, client):
    await put(env, "p5", "a", tag="A")
    await put(env, "p5", "b", tag="B")
    await put(env, "p5", "a2", tag="A")
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p5", 0, sysFlag=4, subscription="B"))
    assert [m.body for m in decode_messages(r.body)] == [b"b"] and r.ext_fields["nextBeginOffset"] == "3"
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p5", 1, sysFlag=4, subscription="C || D"))
    assert r.code == R.PULL_RETRY_IMMEDIATELY and r.ext_fields["nextBeginOffset"] == "3"
    # No subscription in the pull: the one from the group's heartbeat applies.
    hb = {
        "clientID": "c",
        "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": [{"topic": "p5", "subString": "A"}]}],
    }
    await client.invoke(RC.HEART_BEAT, None, json.dumps(hb).encode())
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("p5", 0))
    assert [m.body for m in decode_messages(r.body)] == [b"a", b"a2"]
    r = await client.invoke(
        RC.PULL_MESSAGE, pull_req("p5", 0, sysFlag=4, subscription="a>1", expressionType="SQL92")
    )
    assert r.code == R.SUBSCRIPTION_PARSE_FAILED


async def test_pull_respects_the_byte_budget(tmp_path):
    env = await open_env(str(tmp_path / "d"))
    env.adapter.service.max_pull_bytes = 3000
    c = await env.client()
    try:
        await put(env, "p6", *["x" * 1000] * 5)
        r = await c.invoke(RC.PULL_MESSAGE, pull_req("p6", 0))
        n = len(decode_messages(r.body))
        assert 1 <= n < 5 and r.ext_fields["nextBeginOffset"] == str(n)
    finally:
        await c.close()
        await close_env(env)


# ---------------------------------------------------------------------------------------- offsets


async def test_consumer_offsets(env, client):
    await put(env, "o1", "a", "b", "c")
    q = {"consumerGroup": "G", "topic": "o1", "queueId": 0}
    r = await client.invoke(RC.QUERY_CONSUMER_OFFSET, q)
    assert r.code == R.SUCCESS and r.ext_fields["offset"] == "0"  # never committed, queue starts at 0
    assert (await client.invoke(RC.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 2})).code == R.SUCCESS
    assert (await client.invoke(RC.QUERY_CONSUMER_OFFSET, q)).ext_fields["offset"] == "2"
    assert await env.processor.committed_offset("G", "o1", 0) == 2
    await client.invoke(RC.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": -1})  # ignored
    assert (await client.invoke(RC.QUERY_CONSUMER_OFFSET, q)).ext_fields["offset"] == "2"
    client.oneway(RC.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": 3})
    await wait_until(lambda: env.store.committed_offset("G", "o1", 0) == 3)
    # A pull with the commit-offset flag commits too.
    await client.invoke(RC.PULL_MESSAGE, pull_req("o1", 3, sysFlag=1, commitOffset=1))
    assert await env.processor.committed_offset("G", "o1", 0) == 1
    r = await client.invoke(RC.QUERY_CONSUMER_OFFSET, {**q, "topic": "nope"})
    assert r.code == R.QUERY_NOT_FOUND


async def test_query_offset_not_found_once_the_queue_start_moved(env, client, monkeypatch):
    await put(env, "o2", "a")

    async def moved(topic, qid):
        return 5, 9

    monkeypatch.setattr(env.processor, "queue_offsets", moved)
    r = await client.invoke(RC.QUERY_CONSUMER_OFFSET, {"consumerGroup": "new", "topic": "o2", "queueId": 0})
    assert r.code == R.QUERY_NOT_FOUND


async def test_queue_offsets_search_and_store_time(env, client):
    before = int(time.time() * 1000) - 1
    await put(env, "o3", "a", "b")
    await asyncio.sleep(0.05)
    mid = int(time.time() * 1000)
    await put(env, "o3", "c")
    q = {"topic": "o3", "queueId": 0}
    assert (await client.invoke(RC.GET_MAX_OFFSET, q)).ext_fields["offset"] == "3"
    assert (await client.invoke(RC.GET_MIN_OFFSET, q)).ext_fields["offset"] == "0"
    assert (await client.invoke(RC.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": mid})).ext_fields[
        "offset"
    ] == "2"
    r = await client.invoke(RC.GET_EARLIEST_MSG_STORETIME, q)
    assert int(r.ext_fields["timestamp"]) >= before
    assert (await client.invoke(RC.GET_MAX_OFFSET, {"topic": "zz", "queueId": 0})).ext_fields["offset"] == "0"
    r = await client.invoke(RC.GET_EARLIEST_MSG_STORETIME, {"topic": "zz", "queueId": 0})
    assert r.ext_fields["timestamp"] == "-1"


async def test_view_message_by_offset(env, client):
    r = await send(client, "v1", b"look", {"TAGS": "x"})
    clo = decode_offset_msg_id(r.ext_fields["msgId"])[2]
    v = await client.invoke(RC.VIEW_MESSAGE_BY_ID, {"offset": clo})
    assert decode_messages(v.body)[0].body == b"look"
    assert (await client.invoke(RC.VIEW_MESSAGE_BY_ID, {"offset": clo + 3})).code == R.SYSTEM_ERROR


# ---------------------------------------------------------------------------------------- send-back


class RetryReader:
    """Pulls every queue of `%RETRY%<group>` from where it last stopped."""

    def __init__(self, client, group: str) -> None:
        self.client, self.topic, self.group = client, f"%RETRY%{group}", group
        self.next: dict[int, int] = {}

    async def get(self, timeout: float = 10.0) -> list:
        route = await self.client.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": self.topic})
        n = json.loads(route.body)["queueDatas"][0]["readQueueNums"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for qid in range(n):
                off = self.next.get(qid, 0)
                r = await self.client.invoke(
                    RC.PULL_MESSAGE, pull_req(self.topic, off, qid=qid, group=self.group)
                )
                if r.code == R.SUCCESS:
                    self.next[qid] = int(r.ext_fields["nextBeginOffset"])
                    return decode_messages(r.body)
            await asyncio.sleep(0.02)
        return []


async def test_send_back_by_commitlog_offset_alone_redelivers_with_backoff(env, client):
    await env.processor.create_group("SB", 3, RetryPolicy(200, 2.0, 1000))
    r = await send(client, "s1", b"again", {"TAGS": "t", "KEYS": "k", "UNIQ_KEY": "UK1"})
    clo = decode_offset_msg_id(r.ext_fields["msgId"])[2]
    t0 = time.monotonic()
    back = await client.invoke(
        RC.CONSUMER_SEND_MSG_BACK, {"offset": str(clo), "group": "SB", "delayLevel": 0}
    )
    assert back.code == R.SUCCESS, back.remark
    retries = RetryReader(client, "SB")
    msgs = await retries.get()
    assert msgs and time.monotonic() - t0 >= 0.15  # the group's 200 ms back-off
    m = msgs[0]
    assert (m.topic, m.body, m.tags, m.keys, m.reconsume_times) == ("%RETRY%SB", b"again", "t", "k", 1)
    assert m.properties["RETRY_TOPIC"] == "s1" and m.properties["UNIQ_KEY"] == "UK1"
    assert m.properties["ORIGIN_MESSAGE_ID"] == "UK1" and "RECONSUME_TIME" not in m.properties
    # Second failure: from the retry copy; third: max attempts 3 -> 2 reconsumes -> DLQ.
    await client.invoke(
        RC.CONSUMER_SEND_MSG_BACK, {"offset": m.commitlog_offset, "group": "SB", "delayLevel": 0}
    )
    msgs = await retries.get()
    assert msgs[0].reconsume_times == 2 and msgs[0].properties["RETRY_TOPIC"] == "s1"
    await client.invoke(RC.CONSUMER_SEND_MSG_BACK, {"offset": msgs[0].commitlog_offset, "group": "SB"})
    dlq = await env.processor.read(CTX, "%DLQ%SB", 0, 0)
    assert [(d.body, d.message_id, d.properties["ORIGIN_TOPIC"]) for d in dlq] == [(b"again", "UK1", "s1")]
    assert dlq[0].properties["RECONSUME_TIMES"] == "2"
    assert await retries.get(timeout=0.5) == []


async def test_send_back_ali_ons_style_with_origin_id_and_levels(env, client):
    r = await send(client, "s2", b"m")
    mid = r.ext_fields["msgId"]
    ext = {"offset": 10**9, "group": "SB2", "delayLevel": -1, "originMsgId": mid, "originTopic": "s2"}
    assert (await client.invoke(RC.CONSUMER_SEND_MSG_BACK, ext)).code == R.SUCCESS  # offset wrong, id right
    assert [d.body for d in await env.processor.read(CTX, "%DLQ%SB2", 0, 0)] == [b"m"]  # level < 0: DLQ now
    ext = {"offset": decode_offset_msg_id(mid)[2], "group": "SB3", "delayLevel": 1, "maxReconsumeTimes": 16}
    t0 = time.monotonic()
    assert (await client.invoke(RC.CONSUMER_SEND_MSG_BACK, ext)).code == R.SUCCESS
    msgs = await RetryReader(client, "SB3").get()
    assert msgs and time.monotonic() - t0 >= 0.9  # delay level 1 = 1 s
    ext = {"offset": decode_offset_msg_id(mid)[2], "group": "SB4", "maxReconsumeTimes": 0}
    await client.invoke(RC.CONSUMER_SEND_MSG_BACK, ext)
    assert len(await env.processor.read(CTX, "%DLQ%SB4", 0, 0)) == 1
    bad = await client.invoke(RC.CONSUMER_SEND_MSG_BACK, {"offset": 10**9, "group": "SB"})
    assert bad.code == R.SYSTEM_ERROR


async def test_producer_send_to_retry_topic(env, client):
    """What ali-ons does when CONSUMER_SEND_MSG_BACK fails: it sends the retry copy itself."""
    await env.processor.create_group("RT", 16, RetryPolicy(100, 1.0, 100))
    props = {"RETRY_TOPIC": "orig", "ORIGIN_MESSAGE_ID": "X", "TAGS": "t"}
    r = await send(client, "%RETRY%RT", b"again", props, j=1)
    assert r.code == R.SUCCESS, r.remark
    msgs = await RetryReader(client, "RT").get()
    m = msgs[0]
    assert (m.body, m.reconsume_times, m.properties["RETRY_TOPIC"]) == (b"again", 1, "orig")
    r = await send(client, "%RETRY%RT", b"dead", props, j=20, l=16)
    assert r.code == R.SUCCESS and len(await env.processor.read(CTX, "%DLQ%RT", 0, 0)) == 1


# ---------------------------------------------------------------------------------------- transactions


async def test_transaction_commit_and_rollback(env, client):
    r = await send(client, "x1", b"half", {"TRAN_MSG": "true", "PGROUP": "TPG", "UNIQ_KEY": "TX1"}, f=4)
    assert r.code == R.SUCCESS and r.ext_fields["transactionId"] == "TX1"
    assert env.store.max_offset("x1", 0) == 0  # invisible until committed
    clo = decode_offset_msg_id(r.ext_fields["msgId"])[2]
    end = {"producerGroup": "TPG", "tranStateTableOffset": 0, "commitLogOffset": clo, "commitOrRollback": 8}
    client.oneway(
        RC.END_TRANSACTION, {**end, "msgId": "TX1", "transactionId": "TX1", "fromTransactionCheck": False}
    )
    await wait_until(lambda: env.store.max_offset("x1", 0) == 1)
    r2 = await send(client, "x1", b"half2", {"TRAN_MSG": "true", "PGROUP": "TPG"})
    clo2 = decode_offset_msg_id(r2.ext_fields["msgId"])[2]
    rb = await client.invoke(RC.END_TRANSACTION, {**end, "commitLogOffset": clo2, "commitOrRollback": 12})
    assert rb.code == R.SUCCESS
    assert (
        await client.invoke(RC.END_TRANSACTION, {**end, "commitLogOffset": clo2, "commitOrRollback": 12})
    ).code == (R.SYSTEM_ERROR)
    assert (await client.invoke(RC.END_TRANSACTION, {**end, "commitOrRollback": 0})).code == R.SUCCESS
    r = await client.invoke(RC.PULL_MESSAGE, pull_req("x1", 0))
    assert [m.body for m in decode_messages(r.body)] == [b"half"]


async def test_check_transaction_state_goes_to_the_producer(tmp_path):
    env = await open_env(
        str(tmp_path / "d"), store_kw={"transaction_timeout_ms": 200, "transaction_check_interval_ms": 100}
    )
    producer, stranger = await env.client(), await env.client()
    try:
        hb = {"clientID": "p1", "producerDataSet": [{"groupName": "TPG"}], "consumerDataSet": []}
        await producer.invoke(RC.HEART_BEAT, None, json.dumps(hb).encode())
        hb2 = {"clientID": "p2", "producerDataSet": [{"groupName": "OTHER"}], "consumerDataSet": []}
        await stranger.invoke(RC.HEART_BEAT, None, json.dumps(hb2).encode())
        r = await send(
            producer, "x2", b"orphan", {"TRAN_MSG": "true", "PGROUP": "TPG", "UNIQ_KEY": "TX2", "k": "v"}
        )
        clo = decode_offset_msg_id(r.ext_fields["msgId"])[2]
        check = await asyncio.wait_for(producer.server_requests.get(), 10)
        assert check.code == RC.CHECK_TRANSACTION_STATE and check.is_oneway
        assert check.ext_fields["commitLogOffset"] == str(clo) and check.ext_fields["msgId"] == "TX2"
        assert check.ext_fields["transactionId"] == "TX2" and check.ext_fields["topic"] == "x2"
        assert decode_offset_msg_id(check.ext_fields["offsetMsgId"])[2] == clo
        half = decode_messages(check.body)[0]
        assert (half.topic, half.body, half.commitlog_offset) == ("x2", b"orphan", clo)
        assert half.properties["TRAN_MSG"] == "true" and half.properties["PGROUP"] == "TPG"
        assert half.sys_flag & 0xC == 0x4 and half.properties["k"] == "v"
        end = {
            "producerGroup": "TPG",
            "tranStateTableOffset": check.ext_fields["tranStateTableOffset"],
            "commitLogOffset": check.ext_fields["commitLogOffset"],
            "commitOrRollback": 8,
            "fromTransactionCheck": True,
            "msgId": "TX2",
            "transactionId": "TX2",
        }
        producer.oneway(RC.END_TRANSACTION, end)
        await wait_until(lambda: env.store.max_offset("x2", 0) + env.store.max_offset("x2", 1) == 1)
        assert not [c for c in stranger.requests if c.code == RC.CHECK_TRANSACTION_STATE]
    finally:
        await producer.close()
        await stranger.close()
        await close_env(env)


# ---------------------------------------------------------------------------------------- pop


def pop_req(topic: str, **kw) -> dict:
    req = {"consumerGroup": "PG1", "topic": topic, "queueId": -1, "maxMsgNums": 8, "invisibleTime": 30000}
    req.update(
        {"pollTime": 0, "bornTime": 0, "initMode": 0, "expType": "TAG", "exp": "*", "order": False}, **kw
    )
    return req


async def test_pop_ack_and_change_invisible_time(env, client):
    await put(env, "q1", "a", "b", tag="T")
    r = await client.invoke(RC.POP_MESSAGE, pop_req("q1"))
    assert r.code == R.SUCCESS
    assert r.ext_fields["startOffsetInfo"] == "0 0 0" and r.ext_fields["msgOffsetInfo"] == "0 0 0,1"
    msgs = decode_messages(r.body)
    assert [m.body for m in msgs] == [b"a", b"b"]
    ck = msgs[0].properties["POP_CK"].split(" ")
    assert len(ck) == 9 and ck[5] == "gateway" and ck[6] == "0" and ck[7] == "0"
    ack = {
        "consumerGroup": "PG1",
        "topic": "q1",
        "queueId": 0,
        "offset": 0,
        "extraInfo": msgs[0].properties["POP_CK"],
    }
    assert (await client.invoke(RC.ACK_MESSAGE, ack)).code == R.SUCCESS
    assert (await client.invoke(RC.ACK_MESSAGE, ack)).code == R.NO_MESSAGE  # already acked
    # Change, then ack with the 8-field extraInfo a Java client builds itself afterwards.
    chg = {**ack, "offset": 1, "extraInfo": msgs[1].properties["POP_CK"], "invisibleTime": 100}
    r = await client.invoke(RC.CHANGE_MESSAGE_INVISIBLETIME_SHORT, chg)
    assert r.code == R.SUCCESS and r.ext_fields["invisibleTime"] == "100"
    await asyncio.sleep(0.2)
    r = await client.invoke(RC.POP_MESSAGE_SHORT, pop_req("q1"))
    again = decode_messages(r.body)
    assert [m.body for m in again] == [b"b"] and again[0].reconsume_times == 1
    eight = " ".join(again[0].properties["POP_CK"].split(" ")[:8])
    ack2 = {**ack, "offset": 1, "extraInfo": eight}
    assert (await client.invoke(RC.ACK_MESSAGE_SHORT, ack2)).code == R.SUCCESS
    assert env.store.backlog("PG1", "q1") == 0 and env.store.inflight_count("PG1", "q1") == 0


async def test_pop_ack_survives_a_proxy_restart(tmp_path):
    env = await open_env(str(tmp_path / "d"))
    await put(env, "q2", "a")
    c = await env.client()
    r = await c.invoke(RC.POP_MESSAGE, pop_req("q2"))
    ck = decode_messages(r.body)[0].properties["POP_CK"]
    await c.close()
    env.adapter.service.pop_handles = type(env.adapter.service.pop_handles)()  # a fresh proxy
    c = await env.client()
    try:
        ack = {"consumerGroup": "PG1", "topic": "q2", "queueId": 0, "offset": 0, "extraInfo": ck}
        assert (await c.invoke(RC.ACK_MESSAGE, ack)).code == R.SUCCESS
        assert (
            await c.invoke(RC.ACK_MESSAGE, {**ack, "extraInfo": "0 1 2 0 0 gateway 0 0"})
        ).code == R.NO_MESSAGE
    finally:
        await c.close()
        await close_env(env)


async def test_pop_empty_filter_and_long_poll(env, client):
    await put(env, "q3", "a", tag="A")
    r = await client.invoke(RC.POP_MESSAGE, pop_req("q3", exp="B"))
    assert r.code == R.PULL_NOT_FOUND and r.ext_fields["restNum"] == "0"
    t0 = time.monotonic()
    r = await client.invoke(RC.POP_MESSAGE, pop_req("q3", exp="B", pollTime=300))
    assert r.code == R.POLLING_TIMEOUT and time.monotonic() - t0 >= 0.25
    r = await client.invoke(RC.POP_MESSAGE, pop_req("q3", exp="x", expType="SQL92"))
    assert r.code == R.SUBSCRIPTION_PARSE_FAILED
    assert (await client.invoke(RC.POP_MESSAGE, pop_req("nope"))).code == R.TOPIC_NOT_EXIST


def test_encoded_messages_of_other_protocols_decode():
    m = Message("t", b"x", properties={"mqtt.topic": "t/a", "mqtt.qos": "1"}, message_id="ID")
    from adapters.remoting.mapping import to_wire

    rec = decode_messages(encode_message(to_wire(m, ("127.0.0.1", 1))))[0]
    assert (
        rec.properties[wm.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] == "ID"
        and rec.properties["mqtt.topic"] == "t/a"
    )
