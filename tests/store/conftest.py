"""Shared fixtures for the store tests. Helpers live in support.py (next to this file)."""

from __future__ import annotations

import pytest

from tests.store.support import open_store


@pytest.fixture
async def make_store(tmp_path):
    """`await make_store(**config)`: open a Store (data_dir defaults to tmp_path/"data").

    Every store opened is closed at teardown."""
    opened = []

    async def factory(**kw):
        kw.setdefault("data_dir", str(tmp_path / "data"))
        s = await open_store(**kw)
        opened.append(s)
        return s

    yield factory
    for s in opened:
        await s.close()
