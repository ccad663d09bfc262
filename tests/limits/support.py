"""What the limits tests share: a Core (tests/support.py) whose listeners share one Limiter, and a
raw MQTT CONNECT for clients that are not worth a library."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from adapters.limits import Limiter, LimitSettings
from adapters.mqtt import MqttAdapter
from adapters.mqtt.codec import Connect, encode_connect
from tests.support import Core


@contextlib.asynccontextmanager
async def core_with(tmp_path, *, auth: bool = False) -> AsyncIterator[Core]:
    core = await Core.open(str(tmp_path / "data"), auth=auth, flush="async", auto_create_topics=True)
    try:
        yield core
    finally:
        await core.close()


async def add_mqtt(core: Core, limiter: Limiter) -> int:
    adapter = await core.add(MqttAdapter(core.processor, "127.0.0.1", 0, limiter=limiter))
    return adapter.bound_port


def limiter(**kw) -> Limiter:
    return Limiter(LimitSettings(**kw))


def connect_packet(client_id: str, level: int = 4) -> bytes:
    return encode_connect(Connect(client_id, protocol_level=level, keep_alive=0))
