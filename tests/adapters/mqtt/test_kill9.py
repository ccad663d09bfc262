"""The delivery guarantees of MQTT subscriptions across a kill -9 of a real `gateway start`:

- a persistent session (clean session off) gets every message the gateway acknowledged (PUBACK)
  to its publisher, after the restart too (at least once: a copy may come twice);
- a clean session gets what is stored while it is subscribed, read by offset from the store
  (adapters/mqtt/fanout.py): its position lives only in the proxy, so after the crash the client
  starts a new session that gets new messages only, nothing from before it subscribed again."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import aiomqtt

from tests.adapters.mqtt.support import V3, next_message, qos1_flood
from tests.gateway.support import start

EXTRA = ("--protocols", "mqtt,http", "--mqtt-port", "0")


def ops_log_bytes(tmp_path: Path) -> int:
    """Bytes of the store's consumer operations logs (store/consumer.py: offset commits, pops, acks)."""
    return sum(p.stat().st_size for p in (tmp_path / "data" / "consumers").glob("ops.*.log"))


def client(addr: str, ident: str, **kw) -> aiomqtt.Client:
    host, port = addr.rsplit(":", 1)
    return aiomqtt.Client(host, int(port), identifier=ident, protocol=V3, **kw)


async def kill9(proc, tasks: list[asyncio.Future], clients: tuple[aiomqtt.Client, ...]) -> None:
    """SIGKILL the gateway, wait for it, cancel the client tasks and close the clients."""
    proc.p.send_signal(signal.SIGKILL)
    await asyncio.to_thread(proc.p.wait, 10)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in clients:
        with contextlib.suppress(Exception):  # the connection is gone, whichever way it says so
            await c.__aexit__(None, None, None)


async def test_acknowledged_messages_reach_a_persistent_session_after_kill_9(tmp_path):
    proc, listeners = await asyncio.to_thread(start, tmp_path, *EXTRA)
    acked: list[int] = []
    live: list[bytes] = []
    try:
        addr = listeners["mqtt"]
        async with client(addr, "keeper", clean_session=False) as keeper:
            await keeper.subscribe("k9/#", qos=1)  # then offline: the session keeps the messages
        watcher = client(addr, "watcher")
        await watcher.__aenter__()
        await watcher.subscribe("k9/#", qos=1)
        pub = client(addr, "pub")
        await pub.__aenter__()

        async def watch() -> None:
            async for m in watcher.messages:
                live.append(m.payload)

        tasks = [asyncio.ensure_future(qos1_flood(pub, "k9", acked)), asyncio.ensure_future(watch())]
        while len(acked) < 300 or len(live) < 100:
            await asyncio.sleep(0.01)
        await kill9(proc, tasks, (pub, watcher))
    finally:
        proc.kill()
    # The clean session saw messages live, each once, oldest first per topic.
    seen = [int(p) for p in live]
    assert len(seen) == len(set(seen))
    for q in range(4):
        mine = [i for i in seen if i % 4 == q]
        assert mine == sorted(mine)

    proc, listeners = await asyncio.to_thread(start, tmp_path, *EXTRA)
    try:
        addr = listeners["mqtt"]
        async with client(addr, "watcher") as watcher, client(addr, "pub") as pub:
            await watcher.subscribe("k9/#", qos=1)
            async with client(addr, "keeper", clean_session=False) as keeper:
                got: set[int] = set()
                while not set(acked) <= got:
                    m = await next_message(keeper, timeout=30)
                    got.add(int(m.payload))
                    # (aiomqtt acknowledges each message as it is handed out)
            await pub.publish("k9/new", b"new", qos=1)
            m = await next_message(watcher)
            assert m.payload == b"new"  # the new clean session: nothing from before the crash
    finally:
        proc.kill()


async def test_a_connected_persistent_session_loses_nothing_across_kill_9(tmp_path):
    """A persistent QoS 1 session receiving (read by offset, progress committed periodically) when
    the gateway is killed: after the restart it gets every message acknowledged to the publisher
    that it had not received; of those it had, only the ones after the last commit come again."""
    proc, listeners = await asyncio.to_thread(start, tmp_path, *EXTRA)
    acked: list[int] = []
    before: list[int] = []
    try:
        addr = listeners["mqtt"]
        keeper = client(addr, "live-keeper", clean_session=False)
        await keeper.__aenter__()
        await keeper.subscribe("k9live/#", qos=1)
        pub = client(addr, "pub")
        await pub.__aenter__()

        async def keep() -> None:
            async for m in keeper.messages:  # (aiomqtt PUBACKs each as it is handed out)
                before.append(int(m.payload))

        tasks = [asyncio.ensure_future(qos1_flood(pub, "k9live", acked)), asyncio.ensure_future(keep())]
        while len(acked) < 600 or len(before) < 400:
            await asyncio.sleep(0.01)
        # the kill comes once a progress commit made after those deliveries is on disk (the store's
        # operations log grew: the session reads by offset, so only its commits write there); a
        # publish faster than the commit interval would otherwise have nothing committed to keep
        logged = ops_log_bytes(tmp_path)
        while ops_log_bytes(tmp_path) <= logged:
            await asyncio.sleep(0.01)
        await kill9(proc, tasks, (pub, keeper))
    finally:
        proc.kill()
    proc, listeners = await asyncio.to_thread(start, tmp_path, *EXTRA)
    try:
        async with client(listeners["mqtt"], "live-keeper", clean_session=False) as keeper:
            after: list[int] = []
            while not set(acked) <= set(before) | set(after):
                after.append(int((await next_message(keeper, timeout=30)).payload))
    finally:
        proc.kill()
    again = set(before) & set(after)
    assert len(again) < len(before)  # the progress committed before the crash held
