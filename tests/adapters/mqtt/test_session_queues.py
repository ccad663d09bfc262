"""A queue per persistent session (session_routing.py, messaging_processor/dispatch.py): a send
stores a message also in the queues of the sessions whose filters match it, whatever protocol it
came from, and in no other; a session reads only its queue; the queue ends with the session and
the routing survives a restart."""

from __future__ import annotations

import asyncio
import random
import uuid

from adapters.mqtt.codec import (
    Publish,
    Subscribe,
    Subscription,
    encode_disconnect,
    encode_puback,
    encode_subscribe,
)
from adapters.mqtt.codec.packets import Suback
from messaging_processor import ClientContext, Message, MessageType
from messaging_processor.dispatch import DISPATCHED_FROM
from tests.adapters.mqtt.support import V5, Env, Raw, close_env, open_env, restart
from tests.support import wait_until

GRPC = ClientContext("grpc", client_id="producer-1")


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def subscribed(env: Env, cid: str, *filters: str) -> tuple[Raw, str]:
    """A persistent 3.1.1 session subscribed to `filters` (QoS 1), and its queue."""
    raw, _ = await Raw.connect(env, cid, 4, clean_start=False)
    raw.send(encode_subscribe(Subscribe(1, [Subscription(f, 1) for f in filters]), 4))
    assert isinstance(await raw.recv(), Suback)
    st = env.adapter.broker.registry.states[cid]
    assert st.queue is not None
    return raw, st.queue


async def queued(env: Env, queue: str) -> int:
    lo, hi = await env.processor.queue_offsets(queue, 0)
    return hi - lo


async def publishes(raw: Raw, n: int) -> list[Publish]:
    out = []
    while len(out) < n:
        p = await raw.recv()
        assert p is not None, f"closed after {len(out)} of {n}"
        if isinstance(p, Publish):
            raw.send(encode_puback(p.packet_id, 0, 4))
            out.append(p)
    return out


async def test_a_queue_holds_exactly_the_messages_its_filters_match(env):
    raw_a, qa = await subscribed(env, uid("a"), "fleet/1/cmd")
    raw_b, qb = await subscribed(env, uid("b"), "fleet/+/cmd", "alarms/#")
    async with env.client(V5) as pub:
        for path in ("fleet/1/cmd", "fleet/2/cmd", "fleet/1/telemetry", "alarms/x/y", "other/z"):
            await pub.publish(path, path.encode(), qos=1)
    assert (await queued(env, qa), await queued(env, qb)) == (1, 3)
    assert [p.topic for p in await publishes(raw_a, 1)] == ["fleet/1/cmd"]
    assert [p.topic for p in await publishes(raw_b, 3)] == ["fleet/1/cmd", "fleet/2/cmd", "alarms/x/y"]
    copy = (await env.processor.read(GRPC, qb, 0, 0, max_messages=1))[0]  # a copy keeps the original's id
    assert copy.properties[DISPATCHED_FROM] == "fleet"
    assert [m.message_id for m in await env.processor.get_message_by_id(copy.message_id)]
    for r in (raw_a, raw_b):
        await r.close()


async def test_a_message_of_another_protocol_reaches_an_offline_session(env):
    """The dispatch is the processor's: a send that is not MQTT's (a gRPC producer's, topic and
    tag: the path `fleet/cmd`) is queued for a matching session while it is offline."""
    cid = uid("off")
    raw, queue = await subscribed(env, cid, "fleet/#")
    raw.abort()
    await wait_until(lambda: env.adapter.broker.registry.states[cid].attached is None)
    await env.processor.send(
        GRPC, [Message("fleet", b"from-grpc", tag="cmd", properties={"k": "v"})], auto_create=True
    )
    assert await queued(env, queue) == 1
    raw, ack = await Raw.connect(env, cid, 4, clean_start=False)
    assert ack.session_present
    (p,) = await publishes(raw, 1)
    assert (p.topic, p.payload) == ("fleet/cmd", b"from-grpc")
    await raw.close()


async def test_a_committed_transaction_message_is_queued_and_a_half_one_is_not(env):
    raw, queue = await subscribed(env, uid("tx"), "fleet/#")
    (r,) = await env.processor.send(
        GRPC, [Message("fleet", b"tx", tag="cmd", msg_type=MessageType.TRANSACTION)], auto_create=True
    )
    assert await queued(env, queue) == 0  # half: not delivered to anyone yet
    await env.processor.end_transaction(GRPC, r.transaction_id, True)
    assert await queued(env, queue) == 1
    (p,) = await publishes(raw, 1)
    assert p.payload == b"tx"
    await raw.close()


async def test_the_queue_ends_with_its_session(env):
    cid = uid("end")
    raw, queue = await subscribed(env, cid, "fleet/#")
    await raw.close()
    raw, ack = await Raw.connect(env, cid, 4, clean_start=True)  # the old session is discarded
    assert not ack.session_present
    assert queue not in {t.name for t in await env.processor.list_topics(include_system=True)}
    assert env.adapter.broker.routes is not None and cid not in env.adapter.broker.routes.queues
    await env.processor.send(GRPC, [Message("fleet", b"x", tag="cmd")], auto_create=True)
    assert queue not in {t.name for t in await env.processor.list_topics(include_system=True)}
    await raw.close()


async def test_routing_survives_a_restart(tmp_path):
    env = await open_env(str(tmp_path / "data"))
    try:
        cid = uid("rs")
        raw, queue = await subscribed(env, cid, "fleet/+/cmd")
        await raw.close()
        env = await restart(env)
        async with env.client(V5) as pub:
            await pub.publish("fleet/3/cmd", b"after-restart", qos=1)
            await pub.publish("fleet/3/telemetry", b"not-for-it", qos=1)
        assert await queued(env, queue) == 1
        raw, ack = await Raw.connect(env, cid, 4, clean_start=False)
        assert ack.session_present
        (p,) = await publishes(raw, 1)
        assert p.payload == b"after-restart"
        await raw.close()
    finally:
        await close_env(env)


FLEET = 10_000  # persistent sessions of the fleet test (issue 48: "test them at 10,000 sessions")


async def test_ten_thousand_offline_sessions_cost_only_what_they_receive(tmp_path):
    """10,000 persistent sessions on their own `dev/<i>/cmd`, all offline (one process could not
    hold 10,000 client and 10,000 server sockets): telemetry none of them matches lands in no
    queue; commands to 1,000 of them land in exactly those queues and arrive on reconnect."""
    env = await open_env(str(tmp_path / "data"))
    try:
        sem = asyncio.Semaphore(64)

        async def enrol(i: int) -> None:
            async with sem:
                raw, _ = await Raw.connect(env, f"dev-{i}", 4, clean_start=False)
                raw.send(encode_subscribe(Subscribe(1, [Subscription(f"dev/{i}/cmd", 1)]), 4))
                assert isinstance(await raw.recv(), Suback)
                raw.send(encode_disconnect(0, 4))
                assert await raw.recv() is None

        await asyncio.gather(*(enrol(i) for i in range(FLEET)))
        routes = env.adapter.broker.routes
        assert routes is not None and len(routes) == FLEET
        queues = {cid: st.queue for cid, st in env.adapter.broker.registry.states.items()}
        await wait_until(
            lambda: all(st.attached is None for st in env.adapter.broker.registry.states.values())
        )
        targets = random.Random(48).sample(range(FLEET), 1000)
        async with env.client(V5) as pub:
            for k in range(200):
                await pub.publish(f"dev/{k}/telemetry", b"t", qos=1)
            for i in targets:
                await pub.publish(f"dev/{i}/cmd", b"c%d" % i, qos=1)
        counts = {cid: await queued(env, q) for cid, q in queues.items()}
        want = {f"dev-{i}" for i in targets}
        assert {c for c, n in counts.items() if n} == want and set(counts.values()) == {0, 1}

        async def resume(i: int) -> bytes:
            async with sem:
                raw, ack = await Raw.connect(env, f"dev-{i}", 4, clean_start=False)
                assert ack.session_present
                (p,) = await publishes(raw, 1)
                assert p.topic == f"dev/{i}/cmd"
                await raw.close()
                return p.payload

        assert await asyncio.gather(*(resume(i) for i in targets)) == [b"c%d" % i for i in targets]
    finally:
        await close_env(env)
