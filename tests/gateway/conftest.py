"""Fixtures of the gateway tests (helpers in support.py)."""

from __future__ import annotations

import pytest

from tests.gateway.support import started


@pytest.fixture(autouse=True)
def _no_leftover_gateways():
    yield
    while started:
        started.pop().kill()
