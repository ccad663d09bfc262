"""Fixtures of the CloudEvents tests (helpers in support.py). One gateway (HTTP + MQTT) and one
webhook receiver per test module, on the module's event loop; each test gets a fresh topic."""

from __future__ import annotations

import itertools

import pytest_asyncio

from tests.adapters.cloudevents.support import MAX_BODY, Receiver, close_gateway, open_gateway

_topics = itertools.count(1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(tmp_path_factory):
    e = await open_gateway(str(tmp_path_factory.mktemp("gw") / "data"), max_body_size=MAX_BODY)
    yield e
    await close_gateway(e)


@pytest_asyncio.fixture(loop_scope="module")
async def env(gateway):
    """The module's gateway with a new topic of its own: `env.topic`, `env.url` (its events URL)."""
    gateway.topic = f"t{next(_topics)}"
    gateway.url = f"/topics/{gateway.topic}/events"
    await gateway.p.create_topic(gateway.topic)
    yield gateway
    gateway.p.auto_create_topics = False


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def _receiver():
    r = await Receiver().start()
    yield r
    await r.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def receiver(_receiver):
    """The module's webhook receiver, reset for this test."""
    _receiver.reset()
    return _receiver
