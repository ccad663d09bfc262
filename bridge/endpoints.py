"""What a link reads and writes, independent of the protocol: an `Item`, a `Source` (items in;
`ack` after the destination confirmed) and a `Sink` (`send` returns once the destination
confirmed). `bridge/mqtt.py` and `bridge/amqp.py` implement them; `open_source` / `open_sink`
pick one by the endpoint's protocol."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime import ConfigError
from runtime.tls import TlsError, client_context

from .config import BridgeConfig, Endpoint


@dataclass(slots=True)
class Item:
    topic: str  # MQTT form (an AMQP routing key with `/` and `.` swapped)
    body: bytes
    redelivered: bool = False
    content_type: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)  # AMQP properties, AMQP -> AMQP
    token: Any = None  # the source's handle for `ack`


class Source(Protocol):
    backlog: int | None

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def items(self) -> AsyncIterator[Item]: ...
    async def ack(self, item: Item) -> None: ...


class Sink(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def send(self, topic: str, item: Item) -> None: ...


def tls_context(ep: Endpoint) -> ssl.SSLContext | None:
    """The client context of a TLS endpoint: its CA (else the system's), its client certificate
    if any; hostname check off with `tls_insecure`."""
    if not ep.tls:
        return None
    try:
        ctx = client_context(ep.ca_file, ep.cert_file, ep.key_file)
    except TlsError as e:
        raise ConfigError(str(e)) from None
    if ep.tls_insecure:
        ctx.check_hostname = False
    return ctx


def open_source(cfg: BridgeConfig) -> Source:
    if cfg.source.protocol == "mqtt":
        from .mqtt import MqttSource

        return MqttSource(cfg)
    from .amqp import AmqpSource

    return AmqpSource(cfg)


def open_sink(cfg: BridgeConfig) -> Sink:
    if cfg.sink.protocol == "mqtt":
        from .mqtt import MqttSink

        return MqttSink(cfg)
    from .amqp import AmqpSink

    return AmqpSink(cfg)
