"""Fixtures: a Store + MessagingProcessor + GrpcAdapter on an ephemeral port, and a grpc.aio stub."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import grpc
import pytest

from adapters.grpc import GrpcAdapter
from adapters.grpc.generated import service_pb2_grpc
from messaging_processor import LocalStoreClient, MessagingProcessor
from store import Store, StoreConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Gateway:
    store: Store
    processor: MessagingProcessor
    adapter: GrpcAdapter
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.MessagingServiceStub


@pytest.fixture
async def gw(tmp_path):
    store = await Store.open(
        StoreConfig(
            data_dir=str(tmp_path / "data"),
            auto_create_topics=False,
            default_queues=4,
            transaction_timeout_ms=300,
            transaction_check_interval_ms=100,
        )
    )
    processor = MessagingProcessor(LocalStoreClient(store))
    await processor.start()
    adapter = GrpcAdapter(processor, host="127.0.0.1", port=0)
    await adapter.start()
    channel = grpc.aio.insecure_channel(adapter.address)
    try:
        yield Gateway(store, processor, adapter, channel, service_pb2_grpc.MessagingServiceStub(channel))
    finally:
        await channel.close()
        await adapter.stop(1.0)
        await processor.close()
        await store.close()
