"""A CLUSTER mode proxy's links to the cluster (docs/cluster.md): its network StoreClient over the
store nodes the name server lists, and its own registration with the name server (REGISTER_PROXY:
its endpoints per protocol, renewed every `lease_period_s`). `gateway start --mode cluster` builds
both from its settings (gateway/server.py). With `auth` (the cluster secret) every connection to
the name server and the store nodes authenticates first (docs/security.md, "Closed cluster")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from dataclasses import dataclass, field

from namesrv.client import NameServerClient
from remoting.cluster_auth import ClusterAuth
from runtime.tasks import cancel_and_wait

from .membership import StaticNodes
from .remote_store import ClusterStoreClient

log = logging.getLogger("gateway")

START_WAIT_S = 10.0  # a proxy started with its stores waits this long for the first live node
REFILL_FLOOR_S = 5.0  # a name server younger than this may not list every live node yet


@dataclass(frozen=True)
class ProxyConfig:
    """What a proxy needs to find its stores and register itself."""

    namesrv: str  # name server address(es), "host:port;host:port"
    cluster_name: str = "DefaultCluster"
    route_refresh_s: float = 5.0
    lease_period_s: float = 30.0
    lease_expiry_s: float = 120.0
    proxy_name: str | None = None  # default proxy-<host>-<pid>
    auth: ClusterAuth | None = field(default=None, repr=False)  # the cluster secret, if any
    # a client context: name servers and store nodes are spoken to over TLS (None: in clear)
    tls: ssl.SSLContext | None = field(default=None, repr=False)


async def open_cluster_store(config: ProxyConfig) -> ClusterStoreClient:
    """A started ClusterStoreClient (it may have no live node yet: sends fail UNAVAILABLE until
    one registers)."""
    client = ClusterStoreClient(
        config.namesrv,
        config.cluster_name,
        refresh_s=config.route_refresh_s,
        # a restarted name server lists every live node within one of their lease periods (within
        # a second or so for nodes that renew at once, RETRY_S: the floor covers slow ones)
        namesrv_grace_s=max(2 * config.lease_period_s, REFILL_FLOOR_S),
        auth=config.auth,
        tls=config.tls,
    )
    await client.start(wait_s=START_WAIT_S)
    live = [n.name for n in client.live()]
    if live:
        log.info("cluster %s: store nodes %s", config.cluster_name, ", ".join(live))
    else:
        log.warning(
            "cluster %s: no live store node yet (name server %s)", config.cluster_name, config.namesrv
        )
    return client


WORKER_NODE = "local"  # the one store node of `gateway start --workers`


async def open_worker_store(unix_path: str) -> ClusterStoreClient:
    """`gateway start --workers`: a worker's StoreClient over the local store process listening on
    the Unix socket `unix_path` (no name server: the node list is fixed); OSError when it does not
    answer within START_WAIT_S. Its connection is re-opened within a second should it break."""
    listing = StaticNodes(WORKER_NODE, {WORKER_NODE: f"unix:{unix_path}"})
    client = ClusterStoreClient(listing, WORKER_NODE, refresh_s=1.0, namesrv_grace_s=1.0)
    await client.start(wait_s=START_WAIT_S)
    if not client.live():
        await client.close()
        raise OSError(f"the store process does not answer on {unix_path}")
    return client


class ProxyRegistration:
    """Registers this proxy's `endpoints` ({protocol: "host:port"}) with the name server(s) and
    keeps the lease."""

    def __init__(self, config: ProxyConfig, endpoints: dict[str, str]) -> None:
        self.config = config
        self.name = config.proxy_name or f"proxy-{socket.gethostname()}-{os.getpid()}"
        self.endpoints = dict(endpoints)
        self.client = NameServerClient(config.namesrv, auth=config.auth, tls=config.tls)
        self._task: asyncio.Task | None = None

    async def register(self) -> None:
        await self.client.register_proxy(
            name=self.name,
            endpoints=self.endpoints,
            cluster=self.config.cluster_name,
            attributes={"mode": "cluster"},
            timeout_ms=int(self.config.lease_expiry_s * 1000),
        )

    def start(self) -> None:
        self._task = self.client.keep_registered(self.register, self.config.lease_period_s)
        log.info("proxy %s registers %s with the name server", self.name, self.endpoints)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.unregister_proxy(self.name), 2.0)
        await self.client.close()
