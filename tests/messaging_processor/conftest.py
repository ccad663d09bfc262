"""Fixtures of the processor tests."""

from __future__ import annotations

import pytest

from messaging_processor import LocalStoreClient, MessagingProcessor
from store import Store, StoreConfig


@pytest.fixture
async def proc(tmp_path):
    """(a started MessagingProcessor, its Store) over a fresh store with topic `t` (one queue)."""
    store = await Store.open(StoreConfig(data_dir=str(tmp_path / "data"), segment_size=1 << 20))
    p = MessagingProcessor(LocalStoreClient(store), auto_create_topics=True)
    await p.start()
    await p.create_topic("t", queues=1)
    yield p, store
    await p.close()
    await store.close()
