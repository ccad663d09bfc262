"""The claims of unique sessions across `--workers` (gateway/workers/claims.py), over a real Unix
socket: a claim makes its worker the owner (evicting the one before), and a worker's release makes
the broker forget the key only while that worker still owns it; an MQTT server given the claims
releases a client id once its connection ended and its session is detached, so the broker keeps
one entry per connected client id, not one per id ever seen."""

from __future__ import annotations

import asyncio
import contextlib

import aiomqtt
import pytest

from gateway.workers import ClaimsBroker, ClaimsClient
from tests.adapters.mqtt.support import V3, V5, close_env, open_env
from tests.support import wait_until


@pytest.fixture
async def broker(tmp_path):
    b = ClaimsBroker()
    path = str(tmp_path / "claims.sock")
    await b.start(path)
    clients: list[ClaimsClient] = []

    async def client(evicted: list[str] | None = None) -> ClaimsClient:
        c = ClaimsClient()

        async def evict(name: str) -> None:
            if evicted is not None:
                evicted.append(name)

        c.evictors["mqtt"] = evict
        await c.connect(path)
        clients.append(c)
        return c

    b.client = client  # type: ignore[attr-defined]
    yield b
    for c in clients:
        await c.close()
    await b.close()


async def test_a_release_forgets_the_key_of_its_owner_only(broker) -> None:
    evicted_a: list[str] = []
    a = await broker.client(evicted_a)
    b = await broker.client()
    await a.claim("mqtt", "x")
    assert "mqtt:x" in broker.owners
    a.release("mqtt", "x")
    await wait_until(lambda: "mqtt:x" not in broker.owners)

    await a.claim("mqtt", "y")
    await b.claim("mqtt", "y")  # b takes y over: a is asked to evict it
    assert evicted_a == ["y"]
    owner_b = broker.owners["mqtt:y"]
    a.release("mqtt", "y")  # a's connection ended after the takeover: y stays b's
    await a.claim("mqtt", "z")  # (a's lines are handled in order: the release came before this)
    assert broker.owners["mqtt:y"] is owner_b
    b.release("mqtt", "y")
    await wait_until(lambda: "mqtt:y" not in broker.owners)


async def test_a_release_then_a_new_claim_of_the_same_key_keeps_it_owned(broker) -> None:
    a = await broker.client()
    await a.claim("mqtt", "x")
    a.release("mqtt", "x")
    await a.claim("mqtt", "x")
    assert "mqtt:x" in broker.owners


@pytest.mark.parametrize("persistent", [False, True], ids=["clean", "persistent"])
async def test_an_mqtt_client_id_is_released_when_its_connection_ends(broker, tmp_path, persistent) -> None:
    claims = await broker.client()
    env = await open_env(str(tmp_path / "data"), claims=claims.namespace("mqtt"))
    try:
        ids = [f"dev-{i}" for i in range(5)]
        for cid in ids:
            kw = {"clean_session": False} if persistent else {}
            async with env.client(version=V3, identifier=cid, **kw):
                assert f"mqtt:{cid}" in broker.owners
        await wait_until(lambda: not broker.owners)
        if persistent:  # the detached sessions are still there: a new connection resumes one
            async with env.client(version=V3, identifier=ids[0], clean_session=False):
                assert f"mqtt:{ids[0]}" in broker.owners
            await wait_until(lambda: not broker.owners)
    finally:
        await close_env(env)


async def test_a_connection_taken_over_on_the_same_worker_leaves_the_claim_to_the_new_one(
    broker, tmp_path
) -> None:
    claims = await broker.client()
    env = await open_env(str(tmp_path / "data"), claims=claims.namespace("mqtt"))
    registry = env.adapter.broker.registry
    try:
        first = env.client(version=V5, identifier="roamer")
        await first.__aenter__()
        old = registry.sessions["roamer"]
        async with env.client(version=V5, identifier="roamer"):  # takes "roamer" over here
            await asyncio.wait_for(old.closed_event.wait(), 10)
            assert "mqtt:roamer" in broker.owners  # the old one's end released nothing
        await wait_until(lambda: not broker.owners)
        with contextlib.suppress(aiomqtt.MqttError):  # (the takeover disconnected it)
            await first.__aexit__(None, None, None)
    finally:
        await close_env(env)
