"""Fixtures of the MQTT server tests (helpers in support.py)."""

from __future__ import annotations

import pytest

from tests.adapters.mqtt.support import close_env, open_env


@pytest.fixture
async def env(tmp_path):
    e = await open_env(str(tmp_path / "data"))
    yield e
    await close_env(e)
