"""Shared helpers of the AMQP server tests: the gateway core (tests/support.py) with an AmqpAdapter
listening, restartable on the same data directory, client factories and a raw-frame client; and
what the codec tests derive from their samples (samples.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import aio_pika
import pika

from adapters.amqp import AmqpAdapter
from adapters.amqp.codec import methods as m
from messaging_processor import ClientContext, MessagingProcessor
from messaging_processor.store_client import LocalStoreClient
from tests.support import Core, T

CTX = ClientContext("test", client_id="other-protocol")


def store_kw(flush: str = "async") -> dict:
    """StoreConfig keywords of the AMQP tests' core."""
    return {"flush": flush, "segment_size": 8 << 20}


class Env:
    """A Core with an AmqpAdapter (`adapter`, listening on `port`, `url`)."""

    def __init__(self, core: Core, adapter: AmqpAdapter) -> None:
        self.core = core
        self.store = core.store
        self.processor = core.processor
        self.adapter = adapter
        self.port = adapter.bound_port
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"

    async def connect(self, **kw) -> aio_pika.abc.AbstractRobustConnection:
        return await aio_pika.connect(self.url, timeout=T, **kw)

    def pika_params(self, **kw) -> pika.ConnectionParameters:
        kw.setdefault("blocked_connection_timeout", T)
        return pika.ConnectionParameters(
            "127.0.0.1", self.port, credentials=pika.PlainCredentials("guest", "guest"), **kw
        )

    def blocking(self, **kw) -> pika.BlockingConnection:
        return pika.BlockingConnection(self.pika_params(**kw))


async def open_env(
    data_dir: str, port: int = 0, flush: str = "async", *, auth: bool = False, **adapter_kw
) -> Env:
    """Store + processor + AmqpAdapter on `data_dir`, listening on `port` (0: any); `auth`: with
    authentication and the ACL on (users and rules through `env.core.security`)."""
    core = await Core.open(data_dir, auth=auth, **store_kw(flush))
    return Env(core, await core.add(AmqpAdapter(core.processor, "127.0.0.1", port, **adapter_kw)))


async def open_env_with_mqtt_and_grpc(data_dir: str) -> Env:
    """`open_env` plus an MqttAdapter (`env.mqtt_port`) and a GrpcAdapter (`env.stub`, a
    MessagingService stub) on the same processor, for messages that cross protocols."""
    import grpc

    from adapters.grpc import GrpcAdapter
    from adapters.grpc.generated import service_pb2_grpc
    from adapters.mqtt import MqttAdapter

    e = await open_env(data_dir)
    mqtt = await e.core.add(MqttAdapter(e.processor, "127.0.0.1", 0, topic_scan_interval=0.1))
    e.mqtt_port = mqtt.bound_port  # type: ignore[attr-defined]
    g = await e.core.add(GrpcAdapter(e.processor, host="127.0.0.1", port=0))
    channel = grpc.aio.insecure_channel(g.address)
    e.core.on_close(channel.close)
    e.stub = service_pb2_grpc.MessagingServiceStub(channel)  # type: ignore[attr-defined]
    return e


async def close_env(env: Env) -> None:
    await env.core.close()


@contextlib.asynccontextmanager
async def another_proxy(
    env: Env, setup: Callable[[AmqpAdapter], None] = lambda adapter: None
) -> AsyncIterator[AmqpAdapter]:
    """Another proxy over env's store, as a second worker or CLUSTER proxy is: its own
    MessagingProcessor (so its own cache of known topics) and AmqpAdapter; `setup` runs before it
    starts."""
    processor = MessagingProcessor(LocalStoreClient(env.store))
    await processor.start()
    adapter = AmqpAdapter(processor, "127.0.0.1", 0)
    setup(adapter)
    await adapter.start()
    try:
        yield adapter
    finally:
        await adapter.stop(1.0)
        await processor.close()


async def get_message(
    queue: aio_pika.abc.AbstractQueue, timeout: float = T
) -> aio_pika.abc.AbstractIncomingMessage:
    """The next message of a queue (polled with basic.get: no consumer left behind)."""

    async def poll():
        while True:
            m = await queue.get(fail=False)
            if m is not None:
                return m
            await asyncio.sleep(0.02)

    return await asyncio.wait_for(poll(), timeout)


async def drain(queue: aio_pika.abc.AbstractQueue, n: int, timeout: float = T) -> list:
    """The next `n` messages of a queue through a consumer (acked), in delivery order."""
    out: list = []
    async with queue.iterator() as it:
        async with asyncio.timeout(timeout):
            async for m in it:
                await m.ack()
                out.append(m)
                if len(out) == n:
                    break
    return out


def collect(into: list):
    """An aio-pika consumer callback appending each message to `into`."""

    async def on_message(m) -> None:
        into.append(m)

    return on_message


@contextlib.asynccontextmanager
async def channel(env: Env, **kw):
    conn = await env.connect()
    try:
        ch = await conn.channel(**kw)
        yield ch
    finally:
        await conn.close()


class Raw:
    """A minimal AMQP client over a raw socket (our codec, client side), for exact frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from adapters.amqp.codec import Decoder

        self.reader, self.writer = reader, writer
        self.dec = Decoder("client", expect_header=False, frame_max=0)

    @classmethod
    async def open(cls, env: Env) -> Raw:
        r, w = await asyncio.open_connection("127.0.0.1", env.port)
        return cls(r, w)

    @classmethod
    async def connect(
        cls,
        env: Env,
        *,
        frame_max: int = 131072,
        mechanism: str = "PLAIN",
        response=None,
        client_properties: dict | None = None,
    ) -> Raw:
        """Handshake up to connection.open-ok."""
        from adapters.amqp.codec import (
            PROTOCOL_HEADER,
            ConnectionOpen,
            ConnectionOpenOk,
            ConnectionStart,
            ConnectionStartOk,
            ConnectionTune,
            ConnectionTuneOk,
        )

        raw = await cls.open(env)
        raw.send(PROTOCOL_HEADER)
        start = await raw.recv()
        assert isinstance(start.method, ConnectionStart), start
        resp = b"\x00guest\x00guest" if response is None else response
        raw.method(0, ConnectionStartOk(client_properties or {"product": "raw"}, mechanism, resp))
        tune = await raw.recv()
        assert isinstance(tune.method, ConnectionTune), tune
        raw.method(0, ConnectionTuneOk(tune.method.channel_max, frame_max, 0))
        raw.method(0, ConnectionOpen("/"))
        ok = await raw.recv()
        assert isinstance(ok.method, ConnectionOpenOk), ok
        return raw

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def method(self, channel: int, m) -> None:
        from adapters.amqp.codec import encode_method

        self.send(encode_method(channel, m))

    async def recv(self, timeout: float = T):
        """The next event (Method, Message, Heartbeat), or None at EOF."""
        while True:
            ev = self.dec.next_event()
            if ev is not None:
                return ev
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                return None
            self.dec.feed(data)

    async def recv_until_eof(self, timeout: float = T) -> list:
        out = []
        while (ev := await self.recv(timeout)) is not None:
            out.append(ev)
        return out

    async def read_raw_until_eof(self, timeout: float = T) -> bytes:
        out = b""
        while data := await asyncio.wait_for(self.reader.read(65536), timeout):
            out += data
        return out

    async def close(self) -> None:
        self.writer.close()


def channel_for(method: m.AMQPMethod) -> int:
    """Channel 0 for connection methods, 1 otherwise."""
    return 0 if method.CLASS_ID == 10 else 1


def role_decoding(method: m.AMQPMethod) -> str:
    """The decoder role that accepts `method` ("server" if clients send it)."""
    return "server" if method.SENDER in ("client", "both") else "client"
