"""The offline queue cap of persistent MQTT sessions (`--mqtt-max-queued-messages`, `-bytes`,
`--mqtt-queue-full-policy`), with aiomqtt: a session subscribes at QoS 1, goes away, messages are
published, and on its return it gets the newest (drop-oldest) or the oldest (refuse-new) within the
cap, everything when under it; messages its filters do not match do not count."""

from __future__ import annotations

import asyncio
import time
import uuid

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.mqtt import MqttCaps
from tests.adapters.mqtt.support import V3, V5, Env, close_env, next_message, open_env
from tests.tls.support import port_of, start_gateway

T = 10.0


def caps(n: int = 0, nbytes: int = 0, policy: str = "drop-oldest") -> MqttCaps:
    return MqttCaps(max_queued_messages=n, max_queued_bytes=nbytes, queue_full_policy=policy)


@pytest.fixture
async def env(request, tmp_path):
    e = await open_env(str(tmp_path / "data"), caps=request.param)
    yield e
    await close_env(e)


def session(env: Env | GatewayEnv, cid: str, version: int = V5) -> aiomqtt.Client:
    if version == V3:
        return env.client(V3, identifier=cid, clean_session=False)
    p = Properties(PacketTypes.CONNECT)
    p.SessionExpiryInterval = 600
    return env.client(V5, identifier=cid, clean_start=False, properties=p)


async def subscribe_and_leave(env: Env | GatewayEnv, cid: str, filt: str, version: int = V5) -> None:
    async with session(env, cid, version) as c:
        await c.subscribe(filt, qos=1)


async def publish(env: Env | GatewayEnv, items: list[tuple[str, bytes]]) -> None:
    async with env.client(V5) as pub:
        for topic, payload in items:
            await pub.publish(topic, payload, qos=1)


async def receive_all(c: aiomqtt.Client, quiet: float = 0.7) -> list[bytes]:
    """Every message until none came for `quiet` seconds (the backlog arrives in one burst)."""
    out = []
    while True:
        try:
            out.append((await next_message(c, quiet)).payload)
        except TimeoutError:
            return out


def numbered(topic: str, n: int, start: int = 0) -> list[tuple[str, bytes]]:
    return [(topic, b"m%02d" % i) for i in range(start, start + n)]


def uid() -> str:
    return "q-" + uuid.uuid4().hex[:8]


@pytest.mark.parametrize("env", [caps(10)], indirect=True)
@pytest.mark.parametrize("version", [V5, V3])
@pytest.mark.parametrize("resubscribe", [False, True])
async def test_drop_oldest_keeps_the_newest(env, version, resubscribe):
    cid = uid()
    await subscribe_and_leave(env, cid, "dq/#", version)
    await publish(env, numbered("dq/a", 50))
    async with session(env, cid, version) as c:
        if resubscribe:  # as many clients do on every connect: what is kept stays the same
            await c.subscribe("dq/#", qos=1)
        assert await receive_all(c) == [b"m%02d" % i for i in range(40, 50)]
        await publish(env, numbered("dq/a", 1, 50))  # connected: not capped, delivered as usual
        assert (await next_message(c, T)).payload == b"m50"


@pytest.mark.parametrize("env", [caps(10, policy="refuse-new")], indirect=True)
async def test_refuse_new_keeps_the_oldest(env):
    cid = uid()
    await subscribe_and_leave(env, cid, "rq/#")
    await publish(env, numbered("rq/a", 50))
    async with session(env, cid) as c:
        assert await receive_all(c) == [b"m%02d" % i for i in range(10)]
        await publish(env, numbered("rq/a", 1, 50))  # newer than the skipped ones: delivered
        assert (await next_message(c, T)).payload == b"m50"


@pytest.mark.parametrize("env", [caps(10)], indirect=True)
async def test_a_session_under_the_cap_gets_everything(env):
    cid = uid()
    await subscribe_and_leave(env, cid, "uq/#")
    await publish(env, numbered("uq/a", 7))
    async with session(env, cid) as c:
        assert await receive_all(c) == [b"m%02d" % i for i in range(7)]


@pytest.mark.parametrize("env", [caps(10)], indirect=True)
async def test_messages_the_filters_do_not_match_do_not_count(env):
    cid = uid()
    await subscribe_and_leave(env, cid, "fq/mine")
    # 30 others on the same store topic "fq": the offsets alone would say 35 are queued
    await publish(env, numbered("fq/other", 30) + numbered("fq/mine", 5))
    async with session(env, cid) as c:
        assert await receive_all(c) == [b"m%02d" % i for i in range(5)]


@pytest.mark.parametrize("env", [caps(nbytes=100)], indirect=True)
async def test_byte_cap_keeps_the_newest_that_fit(env):
    cid = uid()
    await subscribe_and_leave(env, cid, "bq/#")
    await publish(env, [("bq/a", b"%02d" % i + b"x" * 18) for i in range(50)])  # 20 bytes each
    async with session(env, cid) as c:
        assert [p[:2] for p in await receive_all(c)] == [b"%02d" % i for i in range(45, 50)]


@pytest.mark.parametrize("env", [caps(10)], indirect=True)
async def test_drop_oldest_across_queues_keeps_the_newest_by_time(env):
    """Paths hash to different queues of the store topic: the cut is by store time across them."""
    cid = uid()
    await subscribe_and_leave(env, cid, "xq/#")
    paths = [f"xq/{i}" for i in range(8)]
    await publish(env, [(paths[i % 8], b"old%02d" % i) for i in range(40)])
    t0 = int(time.time() * 1000)
    while int(time.time() * 1000) <= t0:  # the newer ones get a later store time in ms
        await asyncio.sleep(0.001)
    await publish(env, [(paths[i % 8], b"new%02d" % i) for i in range(10)])
    async with session(env, cid) as c:
        got = await receive_all(c)
    assert sorted(got) == [b"new%02d" % i for i in range(10)]


async def test_gateway_flags_reach_the_adapter(tmp_path):
    """`gateway start --mqtt-max-queued-messages 3 --mqtt-queue-full-policy refuse-new`, end to end."""
    proc = await asyncio.to_thread(
        start_gateway,
        tmp_path,
        *(
            "--mqtt-max-queued-messages",
            "3",
            "--mqtt-queue-full-policy",
            "refuse-new",
            "--auto-create-topics",
        ),
        protocols="mqtt",
    )
    try:
        env = GatewayEnv(port_of(proc.listeners["mqtt"]))
        cid = uid()
        await subscribe_and_leave(env, cid, "gq/#")
        await publish(env, numbered("gq/a", 8))
        async with session(env, cid) as c:
            assert await receive_all(c) == [b"m%02d" % i for i in range(3)]
    finally:
        assert await asyncio.to_thread(proc.stop) == 0


class GatewayEnv:
    """The part of Env these tests use, for a gateway process."""

    def __init__(self, port: int) -> None:
        self.port = port

    def client(self, version=V5, **kw) -> aiomqtt.Client:
        kw.setdefault("identifier", uid())
        return aiomqtt.Client("127.0.0.1", self.port, protocol=version, **kw)
