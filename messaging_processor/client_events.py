"""Client lifecycle events of every protocol (docs/system-topics.md): one store topic, `%EVENTS%`,
that each protocol reads as it reads any topic.

An adapter calls the `ClientEvents` it was handed (`connected`, `disconnected` with a reason,
`subscribed`, `unsubscribed`, `auth_failed`); the call builds one message and appends it to a
buffer, nothing more (no await, no store call): a background task writes what is buffered with one
`send_internal` per batch, 5 ms after the first event of a batch. Without `--client-events`
adapters hold no emitter and pay one attribute test per connection event, none per message.
Clients of the processor's registry (gRPC, RocketMQ 4.x) are watched there (`registered`).

Each event is one message on `%EVENTS%` whose body is a JSON object (`body_of`), and whose
properties present it to each protocol with the conventions the adapters already read:

    mqtt.topic / mqtt.qos / mqtt.content_type   MQTT: `$events/<name>` (EMQX's event names), QoS 1
    tag                                         AMQP: the routing key on `amq.rabbitmq.event`
                                                (RabbitMQ's event exchange names); RocketMQ: the tag
    ce.id ce.source ce.type ce.subject ce.time  CloudEvents: `io.gateway.client.<kind>`
    ce.datacontenttype
    timestamp_in_ms, name, user, protocol,      headers as RabbitMQ's event exchange sends them
    peer_host, peer_port, vhost, reason, ...    (strings)

Copies for queues of their own that readers keep (a persistent MQTT session's queue) come from
the `copiers` an adapter registers (the processor's dispatchers leave `%` topics out): each names
the copies a batch needs, written right after the batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from store import Message

from .properties import (
    P_CE_DATACONTENTTYPE,
    P_CE_ID,
    P_CE_SOURCE,
    P_CE_SUBJECT,
    P_CE_TIME,
    P_CE_TYPE,
    P_CONTENT_TYPE,
    P_PATH,
    P_QOS,
)

if TYPE_CHECKING:
    from .model import ClientInfo
    from .processor import MessagingProcessor

log = logging.getLogger("messaging_processor.client_events")

EVENTS_TOPIC = "%EVENTS%"
MAX_PENDING = 10_000  # events buffered while a write is under way; beyond it new ones are dropped
BATCH = 256  # events per write
LINGER_S = 0.005  # a write waits this long for more events (one write for a burst of connects)


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of event and its name in each protocol."""

    name: str  # the body's "event"
    mqtt: str  # below `$events/`
    routing_key: str  # AMQP routing key, RocketMQ tag
    ce_type: str  # CloudEvents type


CONNECTED = Kind("client.connected", "client_connected", "connection.created", "io.gateway.client.connected")
DISCONNECTED = Kind(
    "client.disconnected", "client_disconnected", "connection.closed", "io.gateway.client.disconnected"
)
SUBSCRIBED = Kind(
    "client.subscribed", "session_subscribed", "consumer.created", "io.gateway.client.subscribed"
)
UNSUBSCRIBED = Kind(
    "client.unsubscribed", "session_unsubscribed", "consumer.deleted", "io.gateway.client.unsubscribed"
)
AUTH_FAILED = Kind(
    "client.auth_failed",
    "client_auth_failed",
    "user.authentication.failure",
    "io.gateway.client.auth_failed",
)
KINDS = (CONNECTED, DISCONNECTED, SUBSCRIBED, UNSUBSCRIBED, AUTH_FAILED)


def split_peer(peer: str) -> tuple[str, str]:
    """("host", "port") of "host:port" ("[v6]:port" and bare v6 addresses too)."""
    host, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        return peer, ""
    return host.strip("[]"), port


def rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def body_of(
    kind: Kind,
    ms: int,
    node: str,
    protocol: str,
    client_id: str,
    user: str | None,
    peer: str,
    fields: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON body of an event (docs/system-topics.md "Event bodies")."""
    body: dict[str, Any] = {
        "event": kind.name,
        "timestamp": ms,
        "node": node,
        "protocol": protocol,
        "client_id": client_id,
        "user": user,
        "peer": peer,
    }
    body.update(fields)
    return body


def event_message(kind: Kind, body: dict[str, Any]) -> Message:
    """The store message of an event whose body is `body` (see the module docstring)."""
    ms = body["timestamp"]
    host, port = split_peer(body["peer"])
    props = {
        P_PATH: "$events/" + kind.mqtt,
        P_QOS: "1",
        P_CONTENT_TYPE: "application/json",
        P_CE_ID: uuid.uuid4().hex,
        P_CE_SOURCE: f"/gateway/{body['node']}",
        P_CE_TYPE: kind.ce_type,
        P_CE_TIME: rfc3339(ms),
        P_CE_DATACONTENTTYPE: "application/json",
        "timestamp_in_ms": str(ms),
        "name": body["client_id"],
        "protocol": body["protocol"],
        "peer_host": host,
        "peer_port": port,
    }
    if body["client_id"]:
        props[P_CE_SUBJECT] = body["client_id"]
    if body["user"] is not None:
        props["user"] = body["user"]
    for k, v in body.items():
        if k not in _CORE and v is not None and isinstance(v, str | int | float | bool):
            props.setdefault(k, str(v).lower() if isinstance(v, bool) else str(v))
    data = json.dumps(body, separators=(",", ":")).encode()
    return Message(EVENTS_TOPIC, data, kind.routing_key, (), props, born_timestamp=ms)


Copier = Callable[[list[Message]], list[Message]]  # the copies a batch needs, on other `%` topics


async def send_with_copies(
    processor: MessagingProcessor, topic: str, messages: list[Message], copiers: list[Copier]
) -> None:
    """`send_internal` of `messages` to the `%` topic `topic` (made with one queue if missing: its
    messages stay in order), then of the copies `copiers` name for them, topic by topic."""
    await processor.send_internal(topic, messages, queues=1)
    by_topic: dict[str, list[Message]] = {}
    for copier in copiers:
        for m in copier(messages):
            by_topic.setdefault(m.topic, []).append(m)
    for t, msgs in by_topic.items():
        await processor.send_internal(t, msgs)


_CORE = frozenset(("event", "timestamp", "node", "protocol", "client_id", "user", "peer"))


class ClientEvents:
    """The emitter adapters call; writes the events to `%EVENTS%` in batches (module docstring)."""

    def __init__(self, processor: MessagingProcessor, node: str | None = None) -> None:
        self.processor = processor
        self.node = node or socket.gethostname()
        self.pending: list[Message] = []
        self.dropped = 0  # events lost to a full buffer or a failed write
        self.written = 0
        self.copiers: list[Copier] = []  # adapters' copies of the events (persistent MQTT sessions)
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Create the topic (so consumers may subscribe before the first event); watch the
        processor's client registry (the protocols whose clients register: gRPC, RocketMQ 4.x)."""
        await self.processor.send_internal(EVENTS_TOPIC, [], queues=1)  # (one queue: in order)
        self.processor.clients.watch = self.registered

    def registered(self, info: ClientInfo, gone: str | None) -> None:
        """A client of the registry came (`gone` None) or went ("unregistered", "expired")."""
        fields = {"kind": info.kind.value, "group": info.group, "language": info.language}
        if gone is None:
            self.connected(info.protocol, info.client_id, None, info.remote, **fields)
        else:
            self.disconnected(info.protocol, info.client_id, None, info.remote, gone, **fields)

    def connected(self, protocol: str, client_id: str, user: str | None, peer: str, **fields: Any) -> None:
        self.emit(CONNECTED, protocol, client_id, user, peer, fields)

    def disconnected(
        self, protocol: str, client_id: str, user: str | None, peer: str, reason: str, **fields: Any
    ) -> None:
        self.emit(DISCONNECTED, protocol, client_id, user, peer, {"reason": reason, **fields})

    def subscribed(
        self, protocol: str, client_id: str, user: str | None, peer: str, topic: str, **fields: Any
    ) -> None:
        self.emit(SUBSCRIBED, protocol, client_id, user, peer, {"topic": topic, **fields})

    def unsubscribed(
        self, protocol: str, client_id: str, user: str | None, peer: str, topic: str, **fields: Any
    ) -> None:
        self.emit(UNSUBSCRIBED, protocol, client_id, user, peer, {"topic": topic, **fields})

    def auth_failed(
        self, protocol: str, client_id: str, user: str | None, peer: str, reason: str, **fields: Any
    ) -> None:
        self.emit(AUTH_FAILED, protocol, client_id, user, peer, {"reason": reason, **fields})

    def emit(
        self,
        kind: Kind,
        protocol: str,
        client_id: str,
        user: str | None,
        peer: str,
        fields: Mapping[str, Any],
    ) -> None:
        """Buffer one event; the writer task takes it from there."""
        if self._closed:
            return
        if len(self.pending) >= MAX_PENDING:
            self.dropped += 1
            return
        ms = time.time_ns() // 1_000_000
        body = body_of(kind, ms, self.node, protocol, client_id, user, peer, fields)
        self.pending.append(event_message(kind, body))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        p = self.processor
        try:
            if not self._closed:
                await asyncio.sleep(LINGER_S)
            while self.pending:
                batch, self.pending = self.pending[:BATCH], self.pending[BATCH:]
                try:
                    await send_with_copies(p, EVENTS_TOPIC, batch, self.copiers)
                    self.written += len(batch)
                except Exception as e:  # noqa: BLE001 - events are best effort; the gateway goes on
                    self.dropped += len(batch)
                    log.warning("client events: %d event(s) not written: %s", len(batch), e)
        finally:
            self._task = None

    async def flush(self) -> None:
        """Wait until what was emitted so far is written."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def close(self) -> None:
        """Write what is buffered, then take no more events."""
        if self.processor.clients.watch == self.registered:
            self.processor.clients.watch = None
        await self.flush()
        self._closed = True


__all__ = ["ClientEvents", "EVENTS_TOPIC", "KINDS", "Kind", "body_of", "event_message", "send_with_copies"]
