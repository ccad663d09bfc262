"""Name server for RocketMQ clients, store nodes and proxies (`gateway namesrv`, docs/namesrv.md):
brokers (store nodes) register their topics under a lease, proxies their endpoints; clients ask
for topic routes. Soft state only: a restarted name server is refilled by the next heartbeats.

Exports (imported lazily, so that `gateway --help` stays cheap): NameServer, NameServerClient,
NameServerError, NamesrvSettings, RouteInfo, TopicQueues."""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "NameServer": "server",
    "NameServerClient": "client",
    "NameServerError": "client",
    "NamesrvSettings": "config",
    "RouteInfo": "routeinfo",
    "TopicQueues": "routeinfo",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'namesrv' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"namesrv.{mod}"), name)
