"""MQTT ends of a link, over aiomqtt.

Source (what it has in flight is bounded by the broker: MQTT 5 Receive Maximum = `inflight`;
MQTT 3.1.1 by the broker's own limit, Mosquitto's `max_inflight_messages`, 20 by default):
subscribes to each rule's `from_prefix + filter` at its QoS with a persistent session by
default (fixed client id `bridge-<name>-src`, clean session off; MQTT 5: clean start off and the
longest session expiry), and PUBACKs a QoS 1 message only when the link calls `ack`, i.e. after the
destination confirmed it. aiomqtt 2.5 has no manual-ack switch of its own: paho's
`manual_ack_set(True)` is set on its client before CONNECT (the broker may send the session's
messages right after CONNACK), and `ack(mid, qos)` sends the PUBACK.

Sink: publishes at the endpoint's QoS (1 by default; QoS 0 has no confirmation, so it is at most
once) and returns on PUBACK, or raises when the connection drops first."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from .config import BridgeConfig, Endpoint
from .endpoints import Item, tls_context

_V5 = "5"
_NEVER_EXPIRES = 0xFFFFFFFF


def make_client(ep: Endpoint, client_id: str, persistent: bool, inflight: int) -> aiomqtt.Client:
    clean = not persistent if ep.clean_session is None else ep.clean_session
    kw: dict[str, Any] = {}
    if ep.mqtt_version == _V5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 0 if clean else _NEVER_EXPIRES
        props.ReceiveMaximum = min(inflight, 65535)  # the broker sends at most this many unacked
        kw |= {
            "protocol": aiomqtt.ProtocolVersion.V5,
            "clean_start": clean,
            "properties": props,
        }
    else:
        kw |= {"protocol": aiomqtt.ProtocolVersion.V311, "clean_session": clean}
    client = aiomqtt.Client(
        ep.host,
        ep.port,
        username=ep.username,
        password=ep.password(),
        identifier=ep.client_id or client_id,
        keepalive=ep.keepalive,
        tls_context=tls_context(ep),
        max_inflight_messages=inflight,
        timeout=10,
        **kw,
    )
    client.pending_calls_threshold = inflight + 10  # no warning for a full window
    return client


def disconnected(client: aiomqtt.Client) -> asyncio.Future[None]:
    """The future aiomqtt resolves when the connection is lost (private in aiomqtt 2.5)."""
    return client._disconnected  # noqa: SLF001


async def close(client: aiomqtt.Client) -> None:
    with contextlib.suppress(Exception):
        await client.__aexit__(None, None, None)
    gone = disconnected(client)
    if gone.done() and not gone.cancelled():
        gone.exception()  # retrieved: a lost connection is the link's to report, not asyncio's


class MqttSource:
    backlog: int | None = None  # MQTT cannot tell how many messages wait in the session

    def __init__(self, cfg: BridgeConfig) -> None:
        self.cfg = cfg
        self.client: aiomqtt.Client | None = None

    async def open(self) -> None:
        cfg = self.cfg
        client = make_client(cfg.source, f"bridge-{cfg.name}-src", True, cfg.inflight)
        client._client.manual_ack_set(True)  # noqa: SLF001 - before CONNECT: see the module docstring
        await client.__aenter__()
        self.client = client
        await client.subscribe([(r.subscription, r.qos) for r in cfg.rules])

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await close(client)

    async def items(self) -> AsyncIterator[Item]:
        assert self.client is not None
        gone = disconnected(self.client)
        props: Any
        async for m in self.client.messages:
            if gone.done():  # aiomqtt hands out what it had queued: its PUBACK can no longer be sent
                raise ConnectionError(f"{self.cfg.source.address()} closed the connection")
            headers: dict[str, Any] = {}
            content_type = None
            props = m.properties
            if props is not None:
                content_type = getattr(props, "ContentType", None)
                for k, v in getattr(props, "UserProperty", None) or ():
                    headers[k] = v
            body = m.payload if isinstance(m.payload, bytes | bytearray) else str(m.payload or "").encode()
            yield Item(str(m.topic), bytes(body), False, content_type, headers, token=(m.mid, m.qos))

    async def ack(self, item: Item) -> None:
        mid, qos = item.token
        if qos > 0 and self.client is not None:
            self.client._client.ack(mid, qos)  # noqa: SLF001


class MqttSink:
    def __init__(self, cfg: BridgeConfig) -> None:
        self.cfg = cfg
        self.client: aiomqtt.Client | None = None
        self._gone: asyncio.Future[None] | None = None

    async def open(self) -> None:
        cfg = self.cfg
        client = make_client(cfg.sink, f"bridge-{cfg.name}-dst", False, cfg.inflight)
        await client.__aenter__()
        self.client, self._gone = client, disconnected(client)

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await close(client)

    async def send(self, topic: str, item: Item) -> None:
        assert self.client is not None and self._gone is not None
        props = None
        if self.cfg.sink.mqtt_version == _V5 and (item.headers or item.content_type):
            props = Properties(PacketTypes.PUBLISH)
            if item.content_type:
                props.ContentType = item.content_type
            if item.headers:
                props.UserProperty = [(str(k), str(v)) for k, v in item.headers.items()]
        publish = asyncio.ensure_future(
            self.client.publish(topic, item.body, qos=self.cfg.sink.qos, properties=props, timeout=math.inf)
        )
        try:
            done, _ = await asyncio.wait(
                {publish, self._gone}, timeout=self.cfg.confirm_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not publish.done():  # cancelled, timed out or disconnected: never confirmed now
                publish.cancel()
        if publish in done:
            publish.result()
            return
        if self._gone in done:
            raise ConnectionError(f"{self.cfg.sink.address()} closed the connection before confirming")
        raise TimeoutError(f"{self.cfg.sink.address()} did not confirm in {self.cfg.confirm_timeout_s} s")
