"""Fixtures of the gRPC adapter tests (helpers in support.py): the gateway core (tests/support.py) with
a GrpcAdapter on an ephemeral port, and a grpc.aio stub."""

from __future__ import annotations

import grpc
import pytest

from adapters.grpc import GrpcAdapter
from adapters.grpc.generated import service_pb2_grpc
from tests.adapters.grpc.support import Gateway
from tests.support import Core


@pytest.fixture
async def gw(tmp_path):
    core = await Core.open(
        str(tmp_path / "data"),
        default_queues=4,
        transaction_timeout_ms=300,
        transaction_check_interval_ms=100,
    )
    try:
        adapter = await core.add(GrpcAdapter(core.processor, host="127.0.0.1", port=0))
        channel = grpc.aio.insecure_channel(adapter.address)
        core.on_close(channel.close)
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        yield Gateway(core.store, core.processor, adapter, channel, stub)
    finally:
        await core.close()
