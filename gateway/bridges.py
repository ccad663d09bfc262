"""The `[[bridge]]` links of the gateway's TOML config, run inside `gateway start`
(docs/bridges.md): `gateway:mqtt` / `gateway:amqp` endpoints are this process's own listeners.
Under `--workers N` only the first worker (index 1) runs them (one client id per link and broker)."""

from __future__ import annotations

from collections.abc import Iterable

from adapters.base import Adapter
from bridge import Bridges, resolve

from .config import Settings

_ANY = ("", "0.0.0.0", "::")


def start_bridges(s: Settings, adapters: Iterable[Adapter], worker_index: int | None) -> Bridges | None:
    """Started links, or None when there are none to run here; ConfigError for a `gateway:`
    endpoint whose listener is not enabled."""
    if not s.bridge or (worker_index is not None and worker_index != 1):
        return None
    ports: dict[str, int] = {}
    for a in adapters:
        if a.name in ("mqtt", "amqp") and a.name not in ports:
            ports[a.name] = int(a.address.rsplit(":", 1)[1])
    host = "127.0.0.1" if s.host in _ANY else s.host
    bridges = Bridges([resolve(c, host, ports) for c in s.bridge])
    bridges.start()
    return bridges
