"""Bridges: links that move messages between the gateway and another MQTT or AMQP 0-9-1 broker,
at least once (docs/bridges.md). `config` and `topics` are pure, `link` is the sans-IO state of
a link, `mqtt` / `amqp` the protocol ends, `runner` the asyncio glue, `cli` `gateway bridge`."""

from .config import BridgeConfig, Endpoint, parse_bridges, resolve
from .runner import Bridges, Link

__all__ = ["BridgeConfig", "Bridges", "Endpoint", "Link", "parse_bridges", "resolve"]
