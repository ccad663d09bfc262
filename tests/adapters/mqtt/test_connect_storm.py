"""CONNECT of persistent sessions (issue 48 item 3): the store operations of one CONNECT do not grow
with the number of sessions the gateway holds, and the session records of CONNECTs that arrive
together are written together (persistence.py RecordWriter: one kv transaction for a batch), each
durable before its CONNACK."""

from __future__ import annotations

import asyncio
import collections
import inspect

import aiomqtt

from adapters.mqtt.persistence import SESSIONS_NS, RecordWriter
from tests.adapters.mqtt.support import V3, close_env, open_env, restart
from tests.support import wait_until


class StoreOps:
    """Counts the calls made to the store client (`processor.store`) while `on`; the first
    kv_put_many of the session records is held until `hold()` returns True."""

    def __init__(self, store) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.session_writes = 0  # kv transactions writing "mqtt.sessions"
        self.on = False
        self.hold = lambda: True
        for name in dir(store):
            fn = getattr(store, name)
            if not name.startswith("_") and inspect.iscoroutinefunction(fn):
                setattr(store, name, self._wrap(name, fn))

    def _wrap(self, name, fn):
        async def counted(*args, **kw):
            if self.on:
                self.ops[name] += 1
                if name in ("kv_put", "kv_put_many", "kv_delete") and args[0] == SESSIONS_NS:
                    self.session_writes += 1
                    if self.session_writes == 1:
                        await wait_until(self.hold)
            return await fn(*args, **kw)

        return counted


async def persistent(env, cid: str) -> None:
    """Connect `cid` with a persistent 3.1.1 session subscribed to its own command topic, then
    disconnect."""
    async with aiomqtt.Client("127.0.0.1", env.port, identifier=cid, protocol=V3, clean_session=False) as c:
        await c.subscribe(f"dev/{cid}/cmd", qos=1)


def settled(env) -> bool:
    """No connection left and every persistent session's detach (its record write) done."""
    broker = env.adapter.broker
    return not broker.sessions and all(
        st.detaching is None or st.detaching.done() for st in broker.states.values()
    )


async def resume_ops(env, ops: StoreOps, cid: str) -> collections.Counter[str]:
    """The store calls of one CONNECT resuming `cid` (up to the CONNACK)."""
    await wait_until(lambda: settled(env))
    ops.ops.clear()
    ops.on = True
    async with aiomqtt.Client("127.0.0.1", env.port, identifier=cid, protocol=V3, clean_session=False):
        ops.on = False
    return collections.Counter(ops.ops)


async def test_the_store_operations_of_a_connect_do_not_grow_with_the_sessions(tmp_path):
    env = await open_env(str(tmp_path / "data"))
    try:
        ops = StoreOps(env.processor.store)
        for i in range(10):
            await persistent(env, f"d{i}")
        few = await resume_ops(env, ops, "d3")
        await asyncio.gather(*(persistent(env, f"e{i}") for i in range(150)))
        many = await resume_ops(env, ops, "d3")
        assert few == many, (few, many)
        assert sum(many.values()) <= 8, many
        assert not {"kv_scan", "list_groups", "subscriptions", "list_topics"} & set(many), many
    finally:
        await close_env(env)


async def test_the_session_records_of_a_reconnect_storm_are_written_together(tmp_path):
    env = await open_env(str(tmp_path / "data"))
    n = 20
    try:
        for i in range(n):
            await persistent(env, f"s{i}")
        await wait_until(lambda: settled(env))
        ops = StoreOps(env.processor.store)
        broker = env.adapter.broker
        # the first record write waits until every CONNECT of the storm is attached
        ops.hold = lambda: sum(1 for st in broker.states.values() if st.attached is not None) == n
        ops.on = True
        clients = [
            aiomqtt.Client("127.0.0.1", env.port, identifier=f"s{i}", protocol=V3, clean_session=False)
            for i in range(n)
        ]
        await asyncio.gather(*(c.__aenter__() for c in clients))
        assert ops.session_writes <= 2, ops.ops  # one transaction each before: n
        ops.on = False
        await asyncio.gather(*(c.__aexit__(None, None, None) for c in clients))
        await wait_until(lambda: not broker.sessions)
        env = await restart(env)
        assert len(env.adapter.broker.states) == n
    finally:
        await close_env(env)


async def test_record_writes_of_one_client_land_in_the_order_asked(tmp_path):
    env = await open_env(str(tmp_path / "data"))
    try:
        w = RecordWriter(env.processor)
        await asyncio.gather(w.put("a", b"1"), w.put("b", b"1"), w.put("a", b"2"), w.put("b", None))
        assert await env.processor.kv_get(SESSIONS_NS, "a") == b"2"
        assert await env.processor.kv_get(SESSIONS_NS, "b") is None
        first = asyncio.ensure_future(w.put("c", b"1"))
        await asyncio.sleep(0)  # its write is in flight: the next ones go in the following batch
        await asyncio.gather(first, w.put("c", None))
        assert await env.processor.kv_get(SESSIONS_NS, "c") is None
    finally:
        await close_env(env)
