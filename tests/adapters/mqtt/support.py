"""Shared helpers of the MQTT server tests: the gateway core (tests/support.py) with an MqttAdapter
listening, restartable on the same data directory, aiomqtt factories and a raw-socket client."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import aiomqtt
import pytest

from adapters.mqtt import MqttAdapter
from adapters.mqtt.codec import Connack, Connect, Decoder, encode_connect
from messaging_processor import ClientContext
from tests.support import Core, T

V3 = aiomqtt.ProtocolVersion.V311
V5 = aiomqtt.ProtocolVersion.V5
VERSIONS = [pytest.param(V3, id="v311"), pytest.param(V5, id="v5")]
CTX = ClientContext("test", client_id="other-protocol")
STORE = {"default_queues": 2}  # StoreConfig keywords of the MQTT tests' core


class Env:
    """A Core with an MqttAdapter (`adapter`, listening on `port`)."""

    def __init__(self, core: Core, adapter: MqttAdapter) -> None:
        self.core = core
        self.store = core.store
        self.processor = core.processor
        self.adapter = adapter
        self.port = adapter.bound_port

    def client(self, version=V5, **kw) -> aiomqtt.Client:
        kw.setdefault("identifier", "c-" + uuid.uuid4().hex[:8])
        return aiomqtt.Client("127.0.0.1", self.port, protocol=version, **kw)


async def serve(core: Core, port: int = 0, **adapter_kw) -> Env:
    """Add an MqttAdapter listening on `port` (0: any) to `core`."""
    adapter_kw.setdefault("topic_scan_interval", 0.1)
    return Env(core, await core.add(MqttAdapter(core.processor, "127.0.0.1", port, **adapter_kw)))


async def open_env(data_dir: str, port: int = 0, **adapter_kw) -> Env:
    """Store + processor + MqttAdapter on `data_dir`, listening on `port` (0: any)."""
    return await serve(await Core.open(data_dir, **STORE), port, **adapter_kw)


async def restart(env: Env) -> Env:
    """Stop the gateway core and start it again on the same data directory and port."""
    return await serve(await env.core.restart(), env.port)


async def close_env(env: Env) -> None:
    await env.core.close()


async def drain_messages(c: aiomqtt.Client, n: int, timeout: float = 10.0) -> list[aiomqtt.Message]:
    """The messages `c` receives until it has `n` or `timeout` passed (fewer then: the caller's
    assertion shows what is missing)."""
    got: list[aiomqtt.Message] = []

    async def read() -> None:
        async for m in c.messages:
            got.append(m)
            if len(got) >= n:
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(read(), timeout)
    return got


async def next_message(client: aiomqtt.Client, timeout: float = T) -> aiomqtt.Message:
    async def first():
        async for m in client.messages:
            return m

    return await asyncio.wait_for(first(), timeout)


class Raw:
    """A minimal MQTT client over a raw socket, for exact packets and abrupt closes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int) -> None:
        self.reader, self.writer, self.version = reader, writer, version
        self.dec = Decoder("client", version=version)

    @classmethod
    async def open(cls, env: Env, version: int = 5) -> Raw:
        r, w = await asyncio.open_connection("127.0.0.1", env.port)
        return cls(r, w, version)

    @classmethod
    async def connect(cls, env: Env, client_id: str, version: int = 5, **kw) -> tuple[Raw, Connack]:
        raw = await cls.open(env, version)
        raw.send(encode_connect(Connect(client_id, version, **kw)))
        ack = await raw.recv()
        assert isinstance(ack, Connack), ack
        return raw, ack

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, timeout: float = T):
        """The next packet, or None at EOF."""
        while True:
            p = self.dec.next_packet()
            if p is not None:
                return p
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                return None
            self.dec.feed(data)

    async def recv_until_eof(self, timeout: float = T) -> list:
        out = []
        while (p := await self.recv(timeout)) is not None:
            out.append(p)
        return out

    def abort(self) -> None:
        self.writer.transport.abort()

    async def close(self) -> None:
        self.writer.close()


def make_cert(directory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1/localhost (openssl CLI): (cert path, key path)."""
    import subprocess
    from pathlib import Path

    d = Path(directory)
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


async def qos1_flood(pub: aiomqtt.Client, prefix: str, acked: list[int], window: int = 20) -> None:
    """Publish 0, 1, 2, ... at QoS 1 to `<prefix>/<i % 4>`, `window` at a time, appending each id
    to `acked` once its PUBACK came, until cancelled (or the broker goes away)."""

    async def publish(i: int) -> None:
        await pub.publish(f"{prefix}/{i % 4}", str(i).encode(), qos=1)  # returns on PUBACK
        acked.append(i)

    i = 0
    while True:
        await asyncio.gather(*(publish(i + k) for k in range(window)), return_exceptions=True)
        i += window
