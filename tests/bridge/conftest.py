"""Fixtures of the bridge tests: a Mosquitto per test (it starts in milliseconds), one RabbitMQ
per test module (it takes seconds: tests use queue names of their own), an in-process gateway,
and helpers to build a link config and wait for counts (tests/bridge/peers.py starts the peers)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from bridge import Bridges
from bridge.config import parse_bridge
from tests.bridge.peers import MOSQUITTO, Mosquitto, RabbitMQ, rabbitmq_script
from tests.support import running_gateway

needs_mosquitto = pytest.mark.skipif(
    not os.access(MOSQUITTO, os.X_OK), reason="mosquitto missing: make install-system"
)
needs_rabbitmq = pytest.mark.skipif(
    rabbitmq_script() is None, reason="rabbitmq-server missing: make install-system"
)


@pytest.fixture
def mosquitto(tmp_path) -> Iterator[Mosquitto]:
    m = Mosquitto(tmp_path / "mosquitto", autosave_changes=1000).start()
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory) -> Iterator[RabbitMQ]:
    """One RabbitMQ per module, with a TLS listener too (`tls_port`; `ca` and `client`: the test CA
    and a client certificate it issued)."""
    from tests.tls.certs import TestCa

    ca = TestCa(tmp_path_factory.mktemp("rabbitmq-ca"))
    server = ca.server("rabbitmq", 20)
    r = RabbitMQ(tmp_path_factory.mktemp("rabbitmq"), tls=(ca.cert, server.cert, server.key))
    r.ca, r.client = ca, ca.client("bridge")  # type: ignore[attr-defined]
    r.start()
    try:
        yield r
    finally:
        r.stop()


def ports(gw: Any) -> dict[str, int]:
    return {a.name: int(a.address.rsplit(":", 1)[1]) for a in gw.adapters}


@pytest.fixture
async def gateway(tmp_path) -> AsyncIterator[Any]:
    async with running_gateway(str(tmp_path / "gw"), ("mqtt", "amqp"), auto_create_topics=True) as g:
        g.ports = ports(g)
        yield g


def link(name: str, source: dict, sink: dict, topics: list | None = None, **kw: Any) -> Any:
    raw: dict[str, Any] = {"name": name, "from": source, "to": sink, **kw}
    if topics is not None:
        raw["topic"] = topics
    return parse_bridge(raw)


@contextlib.asynccontextmanager
async def running(*configs: Any, timeout: float = 10.0) -> AsyncIterator[Bridges]:
    """In-process links, started and up (both sides connected) before the body runs."""
    b = Bridges(configs)
    b.start()
    try:
        await asyncio.wait_for(asyncio.gather(*(lnk.up.wait() for lnk in b.links)), timeout)
        yield b
    finally:
        await b.stop()
