"""Client batches stored as batch records, through every protocol (issue 27): a real client sends 64
messages in one go, the gateway stores them as one batch record (one processor send, one store
`append_many`), a consumer of the same protocol gets all 64 and settles them one by one (half acked,
half made visible again and acked on redelivery), and lookups by message id and key find messages
inside the batch.

- RocketMQ 4.x: the Apache C++ client (PyPI rocketmq 0.4.4) sends SEND_BATCH_MESSAGE; the consumer
  side is POP / ACK / CHANGE_INVISIBLE_TIME over the remoting wire (the real 4.x clients consume by
  offset, without per-message acks).
- gRPC: grpcio with the generated apache.rocketmq.v2 stubs: one SendMessage with 64 entries.
- AMQP 0-9-1: pika's asyncio adapter publishes 64 basic.publish from one callback, back to back, with
  publisher confirms; the gateway stores the publishes of each socket read as one batch record (the
  kernel may split the 64 over a few reads); aio-pika consumes with manual acks.
- CloudEvents: the `cloudevents` SDK writes the events, httpx posts them as one batched-mode request;
  pull consumption pops, acks and nacks them over HTTP.

All four run against one in-process gateway (`gateway.server.Gateway`, LOCAL mode) per test."""

from __future__ import annotations

import asyncio
import json
import uuid

import grpc
import httpx
import pytest

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from adapters.remoting.message_codec import MessageExt, decode_messages
from gateway.server import Gateway
from messaging_processor import ClientContext, Message
from remoting import RequestCode, ResponseCode
from remoting.client import RemotingClient
from tests.adapters.grpc.support import ack, change_invisible, msg, receive
from tests.adapters.remoting.support import needs_cpp, run
from tests.support import T, running_gateway, wait_until

pytestmark = pytest.mark.timeout(120)

N = 64  # messages per client batch
QUEUES = 4  # per topic: the batch must land in one of them
CTX = ClientContext("test", client_id="batch-records-test")


@pytest.fixture
async def gw(tmp_path):
    async with running_gateway(
        str(tmp_path / "data"), ("grpc", "remoting", "amqp", "http"), default_queues=QUEUES
    ) as g:
        yield g


def listener(gw: Gateway, name: str):
    return next(a for a in gw.adapters if a.name == name)


def batch_records(gw: Gateway) -> int:
    return gw.store.metrics.get("batch_records", 0)


async def stored_runs(gw: Gateway, topic: str) -> list[list[Message]]:
    """The topic's messages per queue used; asserts each queue's run has consecutive queue offsets
    and lies back to back in the commit log (the inner records of batch records)."""
    per_queue = [await gw.processor.read(CTX, topic, q, 0, max_messages=N + 1) for q in range(QUEUES)]
    runs = [ms for ms in per_queue if ms]
    for ms in runs:
        assert [m.queue_offset for m in ms] == list(range(len(ms)))
        for a, b in zip(ms, ms[1:], strict=False):
            assert b.commitlog_offset == a.commitlog_offset + a.size
    return runs


async def stored_in_one_queue(gw: Gateway, topic: str) -> list[Message]:
    """The topic's messages; asserts they all sit in one queue (see `stored_runs`)."""
    runs = await stored_runs(gw, topic)
    assert len(runs) == 1, [len(ms) for ms in runs]
    return runs[0]


def assert_lookups(gw: Gateway, stored: list[Message], keyed: bool) -> None:
    """Messages at the start, inside and at the end of the batch are found by id (and by key)."""
    for m in (stored[0], stored[len(stored) // 2], stored[-1]):
        found = gw.store.get_by_id(m.message_id)
        assert [(f.body, f.commitlog_offset) for f in found] == [(m.body, m.commitlog_offset)]
        if keyed:
            (key,) = m.keys
            assert [f.message_id for f in gw.store.get_by_key(key)] == [m.message_id]


async def all_settled(gw: Gateway, group: str, topic: str) -> None:
    await wait_until(
        lambda: gw.store.backlog(group, topic) == 0 and gw.store.inflight_count(group, topic) == 0
    )


# ---------------------------------------------------------------------------------------- RocketMQ 4.x


def pop_req(topic: str, n: int, invisible_ms: int = 30_000, poll_ms: int = 0) -> dict:
    return {
        "consumerGroup": "PG-BATCH", "topic": topic, "queueId": -1, "maxMsgNums": n,
        "invisibleTime": invisible_ms, "pollTime": poll_ms, "bornTime": 0, "initMode": 0,
        "expType": "TAG", "exp": "*", "order": False,
    }  # fmt: skip


def settle_req(m: MessageExt, **extra: object) -> dict:
    return {
        "consumerGroup": "PG-BATCH", "topic": m.topic, "queueId": m.queue_id, "offset": m.queue_offset,
        "extraInfo": m.properties["POP_CK"], **extra,
    }  # fmt: skip


async def pop_until(client: RemotingClient, topic: str, n: int) -> list[MessageExt]:
    got: list[MessageExt] = []
    async with asyncio.timeout(T):
        while len(got) < n:
            r = await client.invoke(RequestCode.POP_MESSAGE, pop_req(topic, n - len(got), poll_ms=1000))
            if r.code == ResponseCode.SUCCESS:
                got += decode_messages(r.body)
    return got


@needs_cpp
async def test_remoting_batch_send(gw, tmp_path):
    topic = "rmq-batch"
    await gw.processor.create_topic(topic, QUEUES)
    remoting = listener(gw, "remoting")
    before = batch_records(gw)
    ev = await run(
        "cpp", "batch", "--namesrv", remoting.address, "--topic", topic, "--count", str(N),
        "--prefix", "b", home=tmp_path / "home",
    )  # fmt: skip
    assert ev[0]["event"] == "batch_sent" and ev[0]["status"] == 0
    assert batch_records(gw) == before + 1
    stored = await stored_in_one_queue(gw, topic)
    assert [m.body for m in stored] == [f"b-{i}".encode() for i in range(N)]
    assert [m.keys for m in stored] == [(f"key-{i}",) for i in range(N)]
    assert_lookups(gw, stored, keyed=True)

    client = await RemotingClient.connect("127.0.0.1", remoting.bound_port)
    try:
        r = await client.invoke(RequestCode.POP_MESSAGE, pop_req(topic, N))
        got = decode_messages(r.body)
        assert r.code == ResponseCode.SUCCESS and len(got) == N  # the whole batch in one pop
        assert [m.body for m in got] == [m.body for m in stored]
        for m in got[::2]:
            assert (await client.invoke(RequestCode.ACK_MESSAGE, settle_req(m))).code == ResponseCode.SUCCESS
        for m in got[1::2]:
            r = await client.invoke(
                RequestCode.CHANGE_MESSAGE_INVISIBLETIME, settle_req(m, invisibleTime=100)
            )
            assert r.code == ResponseCode.SUCCESS
        again = await pop_until(client, topic, N // 2)
        assert sorted(m.body for m in again) == sorted(m.body for m in got[1::2])
        assert all(m.reconsume_times == 1 for m in again)
        for m in again:
            assert (await client.invoke(RequestCode.ACK_MESSAGE, settle_req(m))).code == ResponseCode.SUCCESS
        await all_settled(gw, "PG-BATCH", topic)
    finally:
        await client.close()


# ---------------------------------------------------------------------------------------- gRPC

MD = (("x-mq-client-id", "batch-host@1@0@grpc"), ("x-mq-language", "PYTHON"))


async def receive_until(stub, topic: str, n: int) -> list[d.Message]:
    got: list[d.Message] = []
    async with asyncio.timeout(T):
        while len(got) < n:
            _st, msgs, _ = await receive(stub, "G-BATCH", topic, batch=n - len(got), poll_ms=1000, md=MD)
            got += msgs
    return got


async def test_grpc_send_message_with_many_entries(gw):
    topic = "grpc-batch"
    await gw.processor.create_topic(topic, QUEUES)
    ids = [f"01{uuid.uuid4().hex.upper()}" for _ in range(N)]  # as the official clients make them
    entries = [msg(topic, f"g-{i}".encode(), keys=[f"gk-{i}"], message_id=ids[i]) for i in range(N)]
    before = batch_records(gw)
    async with grpc.aio.insecure_channel(listener(gw, "grpc").address) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        r = await stub.SendMessage(s.SendMessageRequest(messages=entries), metadata=MD)
        assert r.status.code == d.OK, r.status
        assert [e.message_id for e in r.entries] == ids and [e.offset for e in r.entries] == list(range(N))
        assert batch_records(gw) == before + 1
        stored = await stored_in_one_queue(gw, topic)
        assert [m.message_id for m in stored] == ids
        assert_lookups(gw, stored, keyed=True)

        st, got, _ = await receive(stub, "G-BATCH", topic, batch=N, md=MD)
        assert st.code == d.OK and len(got) == N  # the whole batch in one receive
        assert [m.system_properties.message_id for m in got] == ids
        handles = [m.system_properties.receipt_handle for m in got]
        r = await ack(stub, "G-BATCH", topic, *handles[::2], md=MD)
        assert [e.status.code for e in r.entries] == [d.OK] * (N // 2)
        for h in handles[1::2]:
            assert (await change_invisible(stub, "G-BATCH", topic, h, 100, md=MD)).status.code == d.OK
        again = await receive_until(stub, topic, N // 2)
        assert sorted(m.system_properties.message_id for m in again) == sorted(ids[1::2])
        assert all(m.system_properties.delivery_attempt == 2 for m in again)
        r = await ack(stub, "G-BATCH", topic, *(m.system_properties.receipt_handle for m in again), md=MD)
        assert [e.status.code for e in r.entries] == [d.OK] * (N // 2)
    await all_settled(gw, "G-BATCH", topic)


# ---------------------------------------------------------------------------------------- AMQP 0-9-1


async def pika_publish(port: int, queue: str, bodies: list[bytes]) -> tuple[set[int], set[int]]:
    """Publish `bodies` to `queue` (default exchange, mandatory) with pika's asyncio adapter, all from
    one callback and so written back to back, with publisher confirms; (acked, nacked) delivery tags."""
    import pika
    from pika.adapters.asyncio_connection import AsyncioConnection

    loop = asyncio.get_running_loop()
    confirmed = loop.create_future()
    closed = loop.create_future()
    acked: set[int] = set()
    nacked: set[int] = set()

    def publish(ch) -> None:  # noqa: ANN001 - pika's Channel
        for i, body in enumerate(bodies):
            props = pika.BasicProperties(message_id=f"amqp-{i}", delivery_mode=2)
            ch.basic_publish("", queue, body, props, mandatory=True)

    def on_confirm(frame) -> None:  # noqa: ANN001 - pika's Method frame
        m = frame.method
        tags = range(1, m.delivery_tag + 1) if m.multiple else (m.delivery_tag,)
        (acked if isinstance(m, pika.spec.Basic.Ack) else nacked).update(tags)
        if len(acked | nacked) == len(bodies) and not confirmed.done():
            confirmed.set_result(None)

    def on_channel(ch) -> None:  # noqa: ANN001
        ch.confirm_delivery(on_confirm, callback=lambda _frame: publish(ch))

    def failed(_conn, err) -> None:  # noqa: ANN001
        if not confirmed.done():
            confirmed.set_exception(RuntimeError(f"pika: {err}"))
        if not closed.done():
            closed.set_result(None)

    conn = AsyncioConnection(
        pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_open_error_callback=failed,
        on_close_callback=lambda _c, _r: closed.done() or closed.set_result(None),
        custom_ioloop=loop,
    )
    try:
        await asyncio.wait_for(confirmed, T)
    finally:
        if not closed.done():
            conn.close()
        await asyncio.wait_for(closed, T)
    return acked, nacked


async def test_amqp_publishes_of_one_read(gw):
    import aio_pika

    topic = "amqp-batch"
    await gw.processor.create_topic(topic, QUEUES)  # the AMQP queue of that name is this topic
    port = listener(gw, "amqp").bound_port
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    try:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=N)
        queue = await ch.declare_queue(topic, durable=True)
        before = batch_records(gw)
        bodies = [f"a-{i}".encode() for i in range(N)]
        acked, nacked = await pika_publish(port, topic, bodies)
        assert acked == set(range(1, N + 1)) and not nacked
        # The publishes of each socket read are one batch record in one queue. pika writes the 64
        # back to back, but the kernel may hand them to the gateway in more than one read (seen:
        # 5 + 59), so: at least one batch record, each queue holding publishes in their order.
        assert batch_records(gw) > before
        runs = await stored_runs(gw, topic)
        for ms in runs:
            assert [m.body for m in ms] == sorted((m.body for m in ms), key=bodies.index)
        stored = sorted((m for ms in runs for m in ms), key=lambda m: m.commitlog_offset)
        assert [m.body for m in stored] == bodies
        assert_lookups(gw, stored, keyed=False)

        inbox: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(inbox.put)

        async def take(n: int) -> list[aio_pika.abc.AbstractIncomingMessage]:
            async with asyncio.timeout(T):
                return [await inbox.get() for _ in range(n)]

        first = await take(N)
        assert sorted(m.body for m in first) == sorted(bodies) and not any(m.redelivered for m in first)
        for m in first[::2]:
            await m.ack()
        for m in first[1::2]:
            await m.nack(requeue=True)
        again = await take(N // 2)
        assert sorted(m.body for m in again) == sorted(bodies[1::2]) and all(m.redelivered for m in again)
        for m in again:
            await m.ack()
        await all_settled(gw, topic, topic)  # an AMQP queue's group is its topic
        assert inbox.empty()
    finally:
        await conn.close()


# ---------------------------------------------------------------------------------------- CloudEvents


async def test_cloudevents_batched_mode(gw):
    from cloudevents.core.formats.json import JSONFormat
    from cloudevents.core.v1.event import CloudEvent

    topic = "ce-batch"
    await gw.processor.create_topic(topic, QUEUES)
    fmt = JSONFormat()
    events = [
        CloudEvent({"id": f"e-{i}", "source": "/batch", "type": "test.batch"}, {"n": i}) for i in range(N)
    ]
    body = b"[" + b",".join(fmt.write(e) for e in events) + b"]"
    base = f"/topics/{topic}/subscriptions/CG-BATCH"
    before = batch_records(gw)
    async with httpx.AsyncClient(base_url=f"http://{listener(gw, 'http').address}", timeout=T) as http:
        r = await http.post(
            f"/topics/{topic}/events",
            content=body,
            headers={"content-type": "application/cloudevents-batch+json"},
        )
        assert r.status_code == 202, r.text
        assert batch_records(gw) == before + 1
        stored = await stored_in_one_queue(gw, topic)
        assert [json.loads(m.body) for m in stored] == [{"n": i} for i in range(N)]
        assert_lookups(gw, stored, keyed=False)

        r = await http.post(f"{base}/pop", json={"max_events": N})
        got = r.json()
        assert r.status_code == 200 and len(got) == N  # the whole batch in one pop
        assert [e["id"] for e in got] == [f"e-{i}" for i in range(N)]
        handles = [e["receipthandle"] for e in got]
        for h in handles[::2]:  # one by one
            r = await http.post(f"{base}/ack", json={"receipt_handles": [h]})
            assert r.json() == {"acked": 1, "failed": []}
        r = await http.post(f"{base}/nack", json={"receipt_handles": handles[1::2], "invisible_time_ms": 100})
        assert r.status_code == 200 and not r.json()["failed"]
        again: list[dict] = []
        async with asyncio.timeout(T):
            while len(again) < N // 2:
                r = await http.post(f"{base}/pop", json={"max_events": N, "wait_ms": 1000})
                again += r.json()
        assert sorted(e["id"] for e in again) == sorted(f"e-{i}" for i in range(1, N, 2))
        r = await http.post(f"{base}/ack", json={"receipt_handles": [e["receipthandle"] for e in again]})
        assert r.json() == {"acked": N // 2, "failed": []}
    await all_settled(gw, "CG-BATCH", topic)
