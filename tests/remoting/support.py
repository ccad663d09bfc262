"""Helpers of the remoting tests: an in-process gateway core (Store + processor + RemotingAdapter,
optionally the MQTT adapter) restartable on the same data directory, and a raw remoting client."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from adapters.remoting import RemotingAdapter
from adapters.remoting.message_codec import encode_properties
from messaging_processor import ClientContext, LocalStoreClient, MessagingProcessor
from remoting import RemotingCommand, RequestCode, ResponseCode
from remoting.client import RemotingClient
from store import Store, StoreConfig

CTX = ClientContext("test", client_id="other-protocol")
T = 10.0  # seconds any single awaited event may take


@dataclass
class Env:
    store: Store
    processor: MessagingProcessor
    adapter: RemotingAdapter
    extra: list = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.adapter.bound_port

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def client(self, **kw) -> RemotingClient:
        return await RemotingClient.connect("127.0.0.1", self.port, **kw)


async def open_env(
    data_dir: str,
    port: int = 0,
    *,
    auto_create: bool = True,
    queues: int = 2,
    mqtt: bool = False,
    grpc: bool = False,
    amqp: bool = False,
    store_kw: dict | None = None,
    **adapter_kw,
) -> Env:
    config = StoreConfig(
        data_dir=data_dir, auto_create_topics=False, default_queues=queues, **(store_kw or {})
    )
    store = await Store.open(config)
    processor = MessagingProcessor(LocalStoreClient(store), auto_create_topics=auto_create)
    await processor.start()
    adapter_kw.setdefault("hold_interval", 0.05)
    adapter = RemotingAdapter(processor, "127.0.0.1", port, default_queues=queues, **adapter_kw)
    await adapter.start()
    env = Env(store, processor, adapter)
    if mqtt:
        from adapters.mqtt import MqttAdapter

        m = MqttAdapter(processor, "127.0.0.1", 0, topic_scan_interval=0.05)
        await m.start()
        env.extra.append(m)
    if grpc:
        from adapters.grpc import GrpcAdapter

        g = GrpcAdapter(processor, host="127.0.0.1", port=0)
        await g.start()
        env.extra.append(g)
    if amqp:
        from adapters.amqp import AmqpAdapter

        a = AmqpAdapter(processor, "127.0.0.1", 0)
        await a.start()
        env.extra.append(a)
    return env


async def close_env(env: Env) -> None:
    for a in env.extra:
        await a.stop(1.0)
    await env.adapter.stop(1.0)
    await env.processor.close()
    await env.store.close()


def send_v2_fields(
    topic: str, props: dict[str, str], *, queue_id: int = 0, group: str = "PG", **extra
) -> dict:
    """SEND_MESSAGE_V2 extFields as ali-ons sends them (JSON numbers and booleans)."""
    fields = {
        "a": group, "b": topic, "c": "TBW102", "d": 4, "e": queue_id, "f": 0,
        "g": 1_700_000_000_000, "h": 0, "i": encode_properties(props), "j": 0, "k": False,
    }  # fmt: skip
    fields.update(extra)
    return fields


def raw_request(
    code: int, opaque: int, ext: dict, body: bytes = b"", *, version: int = 121, flag: int = 0
) -> bytes:
    """A request frame with extFields exactly as given (numbers stay JSON numbers)."""
    head = json.dumps(
        {
            "code": code,
            "extFields": ext,
            "flag": flag,
            "language": "JAVA",
            "opaque": opaque,
            "version": version,
        }
    ).encode()
    import struct

    return struct.pack(">II", 4 + len(head) + len(body), len(head)) + head + body


async def send(
    client: RemotingClient, topic: str, body: bytes, props: dict[str, str] | None = None, **kw
) -> RemotingCommand:
    """SEND_MESSAGE_V2 through a raw frame (JSON-number extFields); returns the response."""
    cmd = client.command(RequestCode.SEND_MESSAGE_V2)
    frame = raw_request(
        RequestCode.SEND_MESSAGE_V2, cmd.opaque, send_v2_fields(topic, props or {}, **kw), body
    )
    return await client.invoke(cmd, raw=frame)


async def wait_until(cond, timeout: float = T) -> None:
    async def poll():
        while not cond():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


__all__ = [
    "CTX",
    "Env",
    "ResponseCode",
    "T",
    "close_env",
    "open_env",
    "raw_request",
    "send",
    "send_v2_fields",
    "wait_until",
]
