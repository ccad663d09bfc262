"""AMQP <-> RocketMQ 5 gRPC in one gateway core: a message published with aio-pika is received by a
gRPC consumer (our generated stubs over a real socket), and a gRPC send reaches an AMQP consumer.
The rule (docs/amqp.md): AMQP queue Q is store topic Q."""

from __future__ import annotations

import aio_pika
import grpc
import pytest

from adapters.grpc import GrpcAdapter
from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2_grpc
from tests.adapters.amqp.support import close_env, get_message, open_env
from tests.adapters.grpc.support import ack, msg, receive, send


@pytest.fixture
async def both(tmp_path):
    env = await open_env(str(tmp_path / "data"))
    grpc_adapter = await env.core.add(GrpcAdapter(env.processor, host="127.0.0.1", port=0))
    channel = grpc.aio.insecure_channel(grpc_adapter.address)
    env.core.on_close(channel.close)
    yield env, service_pb2_grpc.MessagingServiceStub(channel)
    await close_env(env)


async def test_amqp_publish_is_received_over_grpc(both):
    env, stub = both
    conn = await env.connect()
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("orders", durable=True)
        await ch.default_exchange.publish(
            aio_pika.Message(b"from-amqp", headers={"color": "red"}, delivery_mode=2), routing_key="orders"
        )
    st, msgs, _ = await receive(stub, "billing", "orders", poll_ms=2000)
    assert st.code == d.Code.OK and [m.body for m in msgs] == [b"from-amqp"]
    assert msgs[0].topic.name == "orders"
    r = await ack(stub, "billing", "orders", msgs[0].system_properties.receipt_handle)
    assert r.status.code == d.Code.OK


async def test_grpc_send_reaches_an_amqp_consumer(both):
    env, stub = both
    conn = await env.connect()
    async with conn:
        ch = await conn.channel()
        q = await ch.declare_queue("inbox", durable=True)  # the queue (and its topic) exist first
        r = await send(stub, msg("inbox", b"from-grpc", tag="T1"))
        assert r.status.code == d.Code.OK, r.status
        m = await get_message(q)
        assert m.body == b"from-grpc"
        await m.ack()
