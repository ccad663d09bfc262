"""A replica's link to its primary (docs/cluster.md, "Replica groups"): the one loop both
replication streams run. Connect to the primary's store protocol (proving the cluster secret,
over TLS when configured), run the stream's session until it fails, log why, close the connection,
wait `retry_s` and connect again, until stopped.

`Follower` (the commit log, cluster/replication.py) and `StateFollower` (consumer progress,
key-value data and the catalog, cluster/state_replication.py) are its subclasses: each says what a
session does (`_session`), which errors end one (`errors`) and how it logs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import ClassVar

from remoting import parse_host_port
from remoting.client import RemotingClient, RemotingClientError
from remoting.cluster_auth import ClusterAuth
from runtime.tasks import cancel_and_wait
from store import Store


async def connect_primary(
    primary: str, auth: ClusterAuth | None, tls: ssl.SSLContext | None
) -> RemotingClient:
    """A replica's connection to its primary's store protocol (`host:port`), proving the cluster
    secret and speaking TLS when configured (log and state replication each keep one)."""
    host, port = parse_host_port(primary, 10911)
    return await RemotingClient.connect(host, port, timeout=5.0, auth=auth, ssl=tls)


class FollowerLoop:
    """One replication stream of a replica: `start()` runs its loop as a task, `stop()` ends it.
    `ready` is set by the session while it is in step with the primary and cleared when it ends."""

    stream: ClassVar[str]  # the stream's name in the log lines
    task: ClassVar[str]  # ... and in its task's name
    log: ClassVar[logging.Logger]
    errors: ClassVar[tuple[type[Exception], ...]] = (OSError, RemotingClientError, TimeoutError, ValueError)

    def __init__(
        self,
        store: Store,
        name: str,
        primary: str,
        *,
        wait_ms: int = 1000,
        retry_s: float = 0.5,
        auth: ClusterAuth | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.primary = primary  # host:port of the primary's store protocol
        self.wait_ms = wait_ms
        self.retry_s = retry_s
        self.auth = auth  # the cluster secret: the connection to the primary proves it
        self.tls = tls  # a client context: the primary is spoken to over TLS
        self.ready = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"{self.task} {self.primary}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task, errors=True)
        self._task = None

    async def _run(self) -> None:
        while True:
            client = None
            try:
                client = await connect_primary(self.primary, self.auth, self.tls)
                await self._session(client)
            except self.errors as e:
                self._failed(e)
            finally:
                self.ready.clear()
                if client is not None:
                    with contextlib.suppress(Exception):
                        await client.close()
            await asyncio.sleep(self._retry_delay())

    async def _session(self, client: RemotingClient) -> None:
        """Follow the primary over `client` until an error ends it (it does not return otherwise)."""
        raise NotImplementedError

    def _failed(self, e: Exception) -> None:
        self.log.warning("replica %s: %s from %s: %s", self.name, self.stream, self.primary, e)

    def _retry_delay(self) -> float:
        return self.retry_s
