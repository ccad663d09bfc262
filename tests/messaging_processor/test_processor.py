"""MessagingProcessor over a real in-process Store: validation, error kinds, send/pop/ack,
transactions routed to registered producers, admin, metrics, authorization, delivery loop."""

from __future__ import annotations

import asyncio

import pytest

from messaging_processor import (
    Action,
    ClientContext,
    ClientInfo,
    ClientKind,
    DeliveryLoop,
    ErrorKind,
    Identity,
    Limits,
    LocalStoreClient,
    Message,
    MessageType,
    MessagingProcessor,
    Outcome,
    ProcessorError,
    RetryPolicy,
)
from store import Filter, Store, StoreConfig
from store.message import now_ms

CTX = ClientContext("test", client_id="c1")


@pytest.fixture
async def proc(tmp_path):
    store = await Store.open(
        StoreConfig(
            data_dir=str(tmp_path / "data"),
            auto_create_topics=False,
            transaction_timeout_ms=200,
            transaction_check_interval_ms=50,
        )
    )
    p = MessagingProcessor(LocalStoreClient(store), limits=Limits(max_body_size=1024))
    await p.start()
    yield p
    await p.close()
    await store.close()


def kind_of(exc_info) -> ErrorKind:
    return exc_info.value.kind


async def test_unknown_topic_is_not_created_by_default(proc):
    with pytest.raises(ProcessorError) as e:
        await proc.send(CTX, [Message("Nope", b"x")])
    assert kind_of(e) is ErrorKind.TOPIC_NOT_FOUND
    with pytest.raises(ProcessorError) as e:
        await proc.query_route(CTX, "Nope")
    assert kind_of(e) is ErrorKind.TOPIC_NOT_FOUND
    assert [t.name for t in await proc.list_topics()] == []


async def test_a_failed_send_says_which_of_its_messages_were_stored(proc, tmp_path):
    """A send that fails on a topic deleted through another processor of the same store (whose
    cache of known topics this one does not share) after placing some messages names them in
    `stored` (the Store places a batch in order up to the missing topic): a caller that sends the
    others again stores none twice. A send refused before the store stored nothing."""
    await proc.create_topic("Kept", 1)
    await proc.create_topic("Gone", 1)
    await proc.send(CTX, [Message("Kept", b"k0"), Message("Gone", b"g0")])  # both known here now
    other = MessagingProcessor(proc.store)  # another proxy over the same store
    await other.delete_topic("Gone")
    with pytest.raises(ProcessorError) as e:
        await proc.send(CTX, [Message("Kept", b"k1"), Message("Gone", b"g1"), Message("Kept", b"k2")])
    assert kind_of(e) is ErrorKind.TOPIC_NOT_FOUND
    assert e.value.stored == {0}
    await proc.send(CTX, [Message("Kept", b"k2")])  # what was not stored, again (the writer keeps order)
    assert [m.body for m in await proc.read(CTX, "Kept", 0, 0)] == [b"k0", b"k1", b"k2"]
    with pytest.raises(ProcessorError) as e:  # (Gone is no longer known here: refused before the store)
        await proc.send(CTX, [Message("Kept", b"k3"), Message("Gone", b"g3")])
    assert kind_of(e) is ErrorKind.TOPIC_NOT_FOUND and e.value.stored == frozenset()


async def test_auto_create_per_call(proc):
    r = await proc.send(CTX, [Message("Auto", b"x")], auto_create=True)
    assert r[0].topic == "Auto"
    route = await proc.query_route(CTX, "Auto")
    assert len(route.queues) == 8


@pytest.mark.parametrize(
    "msg, kind",
    [
        (Message("T", b"x" * 1025), ErrorKind.BODY_TOO_LARGE),
        (Message("bad topic", b"x"), ErrorKind.ILLEGAL_TOPIC),
        (Message("%HALF%", b"x"), ErrorKind.ILLEGAL_TOPIC),
        (Message("T", b"x", tag="a|b"), ErrorKind.ILLEGAL_TAG),
        (Message("T", b"x", tag="  "), ErrorKind.ILLEGAL_TAG),
        (Message("T", b"x", keys=("",)), ErrorKind.ILLEGAL_KEY),
        (Message("T", b"x", message_group="g" * 65), ErrorKind.ILLEGAL_MESSAGE_GROUP),
        (Message("T", b"x", msg_type=MessageType.FIFO), ErrorKind.ILLEGAL_MESSAGE_GROUP),
        (Message("T", b"x", properties={"k\n": "v"}), ErrorKind.ILLEGAL_PROPERTY),
        (Message("T", b"x", properties={"k": "v" * 20000}), ErrorKind.PROPERTIES_TOO_LARGE),
        (Message("T", b"x", deliver_at=now_ms() + 4 * 24 * 3600 * 1000), ErrorKind.ILLEGAL_DELIVERY_TIME),
    ],
)
async def test_invalid_messages_are_refused_and_nothing_is_stored(proc, msg, kind):
    await proc.create_topic("T", 1)
    good = Message("T", b"ok")
    with pytest.raises(ProcessorError) as e:
        await proc.send(CTX, [good, msg])
    assert kind_of(e) is kind
    assert (await proc.get_topic("T")).messages == 0


async def test_send_pop_ack_and_redelivery(proc):
    await proc.create_topic("T", 2)
    receipts = await proc.send(CTX, [Message("T", b"a", tag="x"), Message("T", b"b", tag="y")])
    # one send of one topic is one batch: one queue, consecutive offsets (store/appending.py)
    assert len({r.queue_id for r in receipts}) == 1
    assert receipts[1].queue_offset == receipts[0].queue_offset + 1
    got = await proc.pop(CTX, "g", "T", filter=Filter.from_expression("x"), max_messages=10)
    assert [d.message.body for d in got] == [b"a"]
    assert got[0].delivery_attempt == 1
    await proc.change_invisible_time(CTX, got[0].receipt_handle, 0)
    again = await proc.pop(CTX, "g", "T", filter=Filter.from_expression("x"))
    assert [(d.message.body, d.delivery_attempt) for d in again] == [(b"a", 2)]
    with pytest.raises(ProcessorError) as e:
        await proc.ack(CTX, got[0].receipt_handle)  # superseded by the redelivery
    assert kind_of(e) is ErrorKind.INVALID_RECEIPT_HANDLE
    await proc.ack(CTX, again[0].receipt_handle)
    info = await proc.get_group("g")
    # "b" does not match the group's filter: like RocketMQ, pop skips it for this group.
    assert info.topics["T"] == {"backlog": 0, "inflight": 0}
    snap = proc.metrics.snapshot()
    assert snap["messages_in"][("test", "T")] == 2
    assert snap["redeliveries"][("test", "T")] == 1
    assert snap["acks"]["test"] == 1


async def test_malformed_handle(proc):
    with pytest.raises(ProcessorError) as e:
        await proc.ack(CTX, "not a handle")
    assert kind_of(e) is ErrorKind.INVALID_RECEIPT_HANDLE


async def test_pop_argument_checks(proc):
    await proc.create_topic("T", 1)
    with pytest.raises(ProcessorError) as e:
        await proc.pop(CTX, "g", "T", invisible_time_ms=-1)
    assert kind_of(e) is ErrorKind.ILLEGAL_INVISIBLE_TIME
    with pytest.raises(ProcessorError) as e:
        await proc.pop(CTX, "bad group", "T")
    assert kind_of(e) is ErrorKind.ILLEGAL_GROUP
    with pytest.raises(ProcessorError) as e:
        await proc.pop(CTX, "g", "Missing")
    assert kind_of(e) is ErrorKind.TOPIC_NOT_FOUND


async def test_long_poll_is_woken_by_a_send(proc):
    await proc.create_topic("T", 4)
    waiter = asyncio.create_task(proc.pop(CTX, "g", "T", long_poll_ms=10_000))
    await asyncio.sleep(0)  # let the pop register before the send
    await proc.send(CTX, [Message("T", b"late")])
    got = await asyncio.wait_for(waiter, 5)
    assert [d.message.body for d in got] == [b"late"]


async def test_dlq_forward_and_max_attempts(proc):
    await proc.create_topic("T", 1)
    await proc.create_group("g", max_attempts=2, retry=RetryPolicy(initial_ms=0))
    await proc.send(CTX, [Message("T", b"a"), Message("T", b"b")])
    first = await proc.pop(CTX, "g", "T", max_messages=2)
    r = await proc.forward_to_dlq(CTX, first[0].receipt_handle)
    assert r.topic == "%DLQ%g"
    await proc.change_invisible_time(CTX, first[1].receipt_handle, 0)
    second = await proc.pop(CTX, "g", "T")
    assert [d.delivery_attempt for d in second] == [2]
    await proc.nack(CTX, second[0].receipt_handle)  # attempt 2 of 2 failed: to the DLQ on next pop
    assert await proc.pop(CTX, "g", "T", long_poll_ms=100) == []
    dead = await proc.pop(CTX, "dlq-reader", "%DLQ%g", max_messages=10)
    assert sorted(d.message.body for d in dead) == [b"a", b"b"]
    assert proc.metrics.dlq[("test", "%DLQ%g")] == 1
    assert "%DLQ%g" in [t.name for t in await proc.list_topics()]


async def test_transaction_commit_rollback_and_check_via_registered_producer(proc):
    await proc.create_topic("T", 1)
    [r1, r2, r3] = await proc.send(
        CTX, [Message("T", bytes([i]), msg_type=MessageType.TRANSACTION) for i in (1, 2, 3)]
    )
    assert r1.transaction_id and r1.transaction_id != r2.transaction_id
    assert await proc.pop(CTX, "g", "T") == []
    committed = await proc.end_transaction(CTX, r1.transaction_id, True)
    assert committed is not None and committed.topic == "T"
    assert await proc.end_transaction(CTX, r2.transaction_id, False) is None
    with pytest.raises(ProcessorError) as e:
        await proc.end_transaction(CTX, r2.transaction_id, True)
    assert kind_of(e) is ErrorKind.TRANSACTION_NOT_FOUND

    asked: asyncio.Queue = asyncio.Queue()

    async def check(msg: Message, tid: str) -> None:
        await asked.put((msg, tid))

    proc.clients.register(
        ClientInfo("p1", "test", ClientKind.PRODUCER, topics=frozenset({"T"}), transaction_check=check)
    )
    msg, tid = await asyncio.wait_for(asked.get(), 5)
    assert (msg.topic, msg.body, tid) == ("T", bytes([3]), r3.transaction_id)
    assert "__REAL_TOPIC" not in msg.properties
    await proc.end_transaction(CTX, tid, True)
    got = await proc.pop(CTX, "g", "T", max_messages=10)
    assert sorted(d.message.body for d in got) == [b"\x01", b"\x03"]


async def test_admin_topics_and_groups(proc):
    t = await proc.create_topic("Orders", 3)
    assert (t.name, t.queues) == ("Orders", 3)
    await proc.send(CTX, [Message("Orders", b"x")])
    assert (await proc.get_topic("Orders")).messages == 1
    g = await proc.create_group("G", max_attempts=5)
    assert g.max_attempts == 5
    assert [x.name for x in await proc.list_groups()] == ["G"]
    await proc.delete_group("G")
    with pytest.raises(ProcessorError) as e:
        await proc.get_group("G")
    assert kind_of(e) is ErrorKind.GROUP_NOT_FOUND
    await proc.delete_topic("Orders")
    with pytest.raises(ProcessorError) as e:
        await proc.send(CTX, [Message("Orders", b"x")])
    assert kind_of(e) is ErrorKind.TOPIC_NOT_FOUND
    with pytest.raises(ProcessorError) as e:
        await proc.delete_topic("Orders")
    assert kind_of(e) is ErrorKind.TOPIC_NOT_FOUND


async def test_authorizer_is_consulted(proc):
    await proc.create_topic("T", 1)
    seen = []

    def only_alice(identity, action, resource):
        seen.append((identity.username, action, str(resource)))
        return identity.username == "alice"

    proc.authorizer = only_alice
    alice = ClientContext("test", identity=Identity(username="alice"))
    bob = ClientContext("test", identity=Identity(username="bob"))
    await proc.send(alice, [Message("T", b"x")])
    with pytest.raises(ProcessorError) as e:
        await proc.send(bob, [Message("T", b"x")])
    assert kind_of(e) is ErrorKind.FORBIDDEN
    with pytest.raises(ProcessorError) as e:
        await proc.pop(bob, "g", "T")
    assert kind_of(e) is ErrorKind.FORBIDDEN
    assert ("alice", Action.PUBLISH, "topic:T") in seen
    assert ("bob", Action.SUBSCRIBE, "topic:T") in seen


async def test_client_registry(proc):
    proc.clients.register(ClientInfo("a", "grpc", ClientKind.PRODUCER))
    proc.clients.register(ClientInfo("b", "grpc", ClientKind.SIMPLE_CONSUMER, group="g"))
    proc.clients.register(ClientInfo("a", "mqtt"))
    assert len(proc.clients) == 3
    assert [c.client_id for c in proc.clients.list(group="g")] == ["b"]
    assert proc.clients.touch("grpc", "a") and not proc.clients.touch("grpc", "zz")
    assert proc.clients.unregister("grpc", "a") is not None
    assert [c.protocol for c in proc.clients.list()] == ["grpc", "mqtt"]
    assert len(proc.clients.expire(-1)) == 2


async def test_delivery_loop_flow_control_and_outcomes(proc):
    await proc.create_topic("T", 2)
    await proc.create_group("g", retry=RetryPolicy(initial_ms=0))
    await proc.send(CTX, [Message("T", str(i).encode()) for i in range(10)])
    release = asyncio.Event()
    started: list[bytes] = []
    attempts: dict[bytes, int] = {}
    max_seen = 0
    loop: DeliveryLoop

    async def handler(d):
        nonlocal max_seen
        body = d.message.body
        started.append(body)
        attempts[body] = d.delivery_attempt
        max_seen = max(max_seen, loop.inflight)
        await release.wait()
        if body == b"3" and d.delivery_attempt == 1:
            return Outcome.RETRY
        if body == b"4":
            return Outcome.DLQ
        if body == b"5" and d.delivery_attempt == 1:
            raise RuntimeError("handler bug")  # counts as RETRY
        return Outcome.ACK

    loop = DeliveryLoop(proc, CTX, "g", "T", handler, max_inflight=3, long_poll_ms=200)
    loop.start()
    while len(started) < 3:
        await asyncio.sleep(0.01)
    assert loop.inflight == 3
    await asyncio.sleep(0.1)
    assert len(started) == 3  # no fourth message while three are in flight
    release.set()
    while (await proc.get_group("g")).topics["T"]["backlog"] > 0:
        await asyncio.sleep(0.01)
    assert max_seen <= 3
    assert attempts[b"3"] == 2
    assert attempts[b"5"] == 2
    await loop.stop()
    dead = await proc.pop(CTX, "r", "%DLQ%g")
    assert [d.message.body for d in dead] == [b"4"]


async def test_delivery_loop_ends_when_topic_is_deleted(proc):
    await proc.create_topic("T", 1)
    ended: asyncio.Future = asyncio.get_running_loop().create_future()

    async def handler(d):
        return Outcome.ACK

    loop = DeliveryLoop(proc, CTX, "g", "T", handler, long_poll_ms=50, on_error=ended.set_result)
    loop.start()
    await proc.delete_topic("T")
    err = await asyncio.wait_for(ended, 5)
    assert err.kind is ErrorKind.TOPIC_NOT_FOUND
    assert not loop.running or await asyncio.wait_for(loop.stop(), 5) is None


async def test_durable_key_value_metadata(tmp_path):
    data = str(tmp_path / "kvdata")
    store = await Store.open(StoreConfig(data_dir=data))
    p = MessagingProcessor(LocalStoreClient(store))
    await p.kv_put("mqtt.session", "dev/1", b"\x00one")
    await p.kv_put_many("mqtt.session", {"dev/2": b"two", "other": b"x", "dev/1": None})
    await p.kv_put("mqtt.retained", "dev/2", b"r")
    assert await p.kv_get("mqtt.session", "dev/1") is None
    assert await p.kv_scan("mqtt.session", "dev/") == [("dev/2", b"two")]
    assert await p.kv_delete("mqtt.session", "other") is True
    assert await p.kv_delete("mqtt.session", "other") is False
    # put-if-absent: exactly one of concurrent creators stores its value; the others get it back.
    got = await asyncio.gather(*(p.kv_put_if_absent("amqp.queues", "q", b"v%d" % i) for i in range(8)))
    winner = await p.kv_get("amqp.queues", "q")
    assert got.count(None) == 1 and all(v == winner for v in got if v is not None)
    assert winner == b"v%d" % got.index(None)
    await store.close()
    store = await Store.open(StoreConfig(data_dir=data))
    p = MessagingProcessor(LocalStoreClient(store))
    assert await p.kv_scan("mqtt.session") == [("dev/2", b"two")]
    assert await p.kv_get("mqtt.retained", "dev/2") == b"r"
    assert await p.kv_get("amqp.queues", "q") == winner
    await store.close()


def test_property_size_limit_counts_utf8_bytes_at_the_boundary():
    from messaging_processor.validation import Limits, check_message

    limits = Limits()
    room = limits.max_properties_size - 1  # the key "k" takes one byte
    ok = [{"k": "v" * room}, {"k": "é" * (room // 2)}, {"k": "€" * (room // 3)}, {"k": "😀" * (room // 4)}]
    for props in ok:
        check_message(Message("T", b"x", properties=props), limits, now_ms())
    over = [{"k": "v" * (room + 1)}, {"k": "é" * (room // 2 + 1)}, {"k": "😀" * (room // 4 + 1)}]
    for props in over:
        with pytest.raises(ProcessorError) as e:
            check_message(Message("T", b"x", properties=props), limits, now_ms())
        assert kind_of(e) is ErrorKind.PROPERTIES_TOO_LARGE
