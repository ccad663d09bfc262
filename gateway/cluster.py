"""CLUSTER mode wiring of `gateway start --mode cluster` (docs/cluster.md): the proxy's network
StoreClient over the store nodes the name server lists, and the proxy's own registration with
the name server (REGISTER_PROXY: its endpoints per protocol, renewed every `lease_period_s`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Sequence

from adapters.base import Adapter
from gateway.config import Settings
from messaging_processor.remote_store import ClusterStoreClient

log = logging.getLogger("gateway")

START_WAIT_S = 10.0  # a proxy started with its stores waits this long for the first live node


async def open_cluster_store(settings: Settings) -> ClusterStoreClient:
    """A started ClusterStoreClient (it may have no live node yet: sends fail UNAVAILABLE until
    one registers)."""
    assert settings.namesrv
    client = ClusterStoreClient(
        settings.namesrv,
        settings.cluster_name,
        refresh_s=settings.route_refresh_s,
        namesrv_grace_s=settings.lease_period_s,
    )
    await client.start(wait_s=START_WAIT_S)
    live = [n.name for n in client.live()]
    if live:
        log.info("cluster %s: store nodes %s", settings.cluster_name, ", ".join(live))
    else:
        log.warning(
            "cluster %s: no live store node yet (name server %s)", settings.cluster_name, settings.namesrv
        )
    return client


class ProxyRegistration:
    """Registers this proxy's endpoints with the name server(s) and keeps the lease."""

    def __init__(self, settings: Settings, adapters: Sequence[Adapter]) -> None:
        from namesrv.client import NameServerClient

        assert settings.namesrv
        self.settings = settings
        self.name = settings.proxy_name or f"proxy-{socket.gethostname()}-{os.getpid()}"
        host = settings.advertise_host or settings.host
        self.endpoints = {}
        for a in adapters:
            port = a.address.rsplit(":", 1)[1]
            self.endpoints[a.name] = f"{host}:{port}"
        self.client = NameServerClient(settings.namesrv)
        self._task: asyncio.Task | None = None

    async def register(self) -> None:
        await self.client.register_proxy(
            name=self.name,
            endpoints=self.endpoints,
            cluster=self.settings.cluster_name,
            attributes={"mode": "cluster"},
            timeout_ms=int(self.settings.lease_expiry_s * 1000),
        )

    def start(self) -> None:
        self._task = self.client.keep_registered(self.register, self.settings.lease_period_s)
        log.info("proxy %s registers %s with the name server", self.name, self.endpoints)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.unregister_proxy(self.name), 2.0)
        await self.client.close()
