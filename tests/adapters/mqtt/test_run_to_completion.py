"""Issue 49: a lonely QoS 1 message costs no task. The publish is validated and appended in the
read's own callback (Publisher.publish_nowait, MessagingProcessor.send_nowait) and its PUBACK is
written from the append's completion; a clean subscriber's fan-out, caught up, parks on the store's
watch and reads and delivers in the watch's callback. PUBACKs keep the order of the PUBLISHes
whichever path each took (a retained one, one to a new topic and a refused one take the task)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adapters.mqtt.codec import Puback, encode_publish
from tests.adapters.mqtt.support import V5, Raw, next_message


def publish(topic: str, body: bytes, pid: int, retain: bool = False) -> bytes:
    return encode_publish(topic, body, 1, pid, retain=retain, version=5)


pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[3]


PRODUCT = tuple(str(REPO / d) + "/" for d in ("adapters", "messaging_processor", "store", "runtime"))


class TaskCount:
    """Counts the tasks the running loop creates for the gateway's code while installed (the test's
    clients run on the same loop: their tasks are left out)."""

    def __init__(self) -> None:
        self.n = 0
        self.names: list[str] = []
        self.loop = asyncio.get_running_loop()
        self._old = self.loop.get_task_factory()

    def __enter__(self) -> TaskCount:
        def factory(loop, coro, **kw):
            code = getattr(coro, "cr_code", None)
            if code is not None and code.co_filename.startswith(PRODUCT):
                self.n += 1
                self.names.append(coro.__qualname__)
            return asyncio.Task(coro, loop=loop, **kw)

        self.loop.set_task_factory(factory)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.set_task_factory(self._old)


async def test_lonely_qos1_messages_are_stored_answered_and_delivered_without_a_task(env):
    async with env.client(V5) as sub:
        await sub.subscribe("lonely/#", qos=1)
        pub, _ = await Raw.connect(env, "lonely-pub", 5)
        pub.send(publish("lonely/a", b"first", 1))  # (makes the topic: the async path)
        assert isinstance(await pub.recv(), Puback)
        assert (await next_message(sub)).payload == b"first"
        with TaskCount() as tasks:
            for i in range(2, 22):  # one at a time, each alone on its connection and commit
                pub.send(publish("lonely/a", b"m%d" % i, i))
                ack = await pub.recv()
                assert isinstance(ack, Puback) and ack.packet_id == i and ack.reason_code == 0
                assert (await next_message(sub)).payload == b"m%d" % i
        await pub.close()
    # a task per publish or per delivery would be 20 or 40 (a trace flush may make one)
    assert tasks.n <= 2, tasks.names


async def test_pubacks_keep_the_publish_order_across_both_paths(env):
    raw, _ = await Raw.connect(env, "order-pub", 5)
    raw.send(publish("order/a", b"x", 1))  # the topic exists from here on
    assert isinstance(await raw.recv(), Puback)
    burst = [
        publish("order/a", b"fast", 10),
        publish("order/a", b"kept", 11, retain=True),  # retained: the task
        publish("neworder/b", b"new", 12),  # a new topic: made first, the task
        publish("order/a", b"fast", 13),
        publish("$SYS/x", b"refused", 14),  # not for clients: refused (5.0: 0x90)
        publish("order/a", b"fast", 15),
    ]
    raw.send(b"".join(burst))
    got = [await raw.recv() for _ in burst]
    assert [(type(p), p.packet_id) for p in got] == [(Puback, i) for i in (10, 11, 12, 13, 14, 15)]
    assert [p.reason_code for p in got] == [0, 0, 0, 0, 0x90, 0]
    async with env.client(V5) as sub:  # and each stored one is there (the retained one too)
        await sub.subscribe("order/a", qos=1)
        m = await next_message(sub)
        assert (m.payload, m.retain) == (b"kept", True)
    await raw.close()


async def test_a_refused_fast_publish_is_answered_in_its_place(env):
    """A message over the body limit fails the processor's validation inside the read's callback:
    its PUBACK (5.0: 0x80, as 0x95 is no PUBACK code) is written at once, in order with its
    neighbours, and the connection goes on."""
    env.processor.limits.max_body_size = 64
    raw, _ = await Raw.connect(env, "big-pub", 5)
    raw.send(publish("big/a", b"ok", 1))
    assert isinstance(await raw.recv(), Puback)
    raw.send(publish("big/a", b"x" * 100, 2) + publish("big/a", b"ok", 3))
    a, b = await raw.recv(), await raw.recv()
    assert (a.packet_id, b.packet_id) == (2, 3)
    assert isinstance(a, Puback) and a.reason_code == 0x80 and b.reason_code == 0
    await raw.close()
