"""`RemotingService`: the request handlers' shared state and the dispatcher.

Each request runs as `handler(service, request) -> RemotingCommand | None` (None: no reply, e.g.
a oneway request; the handlers see this service and the connection through the protocols of
requests.py); the dispatcher turns `HeaderError`, `RemotingError` and `ProcessorError` into
responses with their codes, unknown codes into REQUEST_CODE_NOT_SUPPORTED, and never answers a
oneway request."""

from __future__ import annotations

import logging
import socket
import time
from typing import TYPE_CHECKING

from adapters.remoting import access
from adapters.remoting.batcher import SendBatcher
from adapters.remoting.clients import ClientTable
from adapters.remoting.errors import RemotingError, code_of
from adapters.remoting.handlers import HANDLERS
from adapters.remoting.hold import PullHold
from adapters.remoting.pop_handles import PopHandles
from adapters.remoting.requests import Connection, Handler, Request
from messaging_processor import (
    ClientContext,
    Identity,
    MessagingProcessor,
    Permission,
    ProcessorError,
    RetryPolicy,
)
from remoting import HeaderError, RemotingCommand, RequestCode, ResponseCode, request_name

if TYPE_CHECKING:
    from adapters.remoting.limits import RemotingLimits

log = logging.getLogger("adapters.remoting")
_WILDCARD = ("", "0.0.0.0", "::", "[::]")


def _resolve_ipv4(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "127.0.0.1"


class RemotingService:
    """Everything the handlers share: processor, clients, long polling, send batching, addresses."""

    def __init__(
        self,
        processor: MessagingProcessor,
        *,
        host: str,
        advertise_host: str | None = None,
        broker_name: str = "gateway",
        cluster_name: str = "DefaultCluster",
        default_queues: int = 8,
        client_expiry_s: float = 120.0,
        hold_interval: float = 0.1,
        max_pull_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.processor = processor
        self.host = host
        self.advertise_host = advertise_host
        self.broker_name = broker_name
        self.cluster_name = cluster_name
        self.default_queues = default_queues
        self.max_pull_bytes = max_pull_bytes
        self.port = 0  # set by the adapter once bound
        self.clients = ClientTable(processor, client_expiry_s)
        self.hold = PullHold(processor, hold_interval)
        self.batcher = SendBatcher(processor)
        self.limits: RemotingLimits | None = None  # connection and publish limits (set by the adapter)
        self.handlers: dict[int, Handler] = dict(HANDLERS)
        self._queue_counts: dict[str, tuple[tuple[int, int], float]] = {}
        self.group_policies: dict[str, tuple[tuple[int, RetryPolicy], float]] = {}  # retry.py
        self.pop_handles = PopHandles()
        self.store_host: tuple[str, int] = ("127.0.0.1", 0)

    def bound(self, port: int) -> None:
        """The listener is bound: fix the address put in message ids and stored-message records."""
        self.port = port
        h = self.advertise_host or ("127.0.0.1" if self.host in _WILDCARD else self.host)
        self.store_host = (_resolve_ipv4(h.strip("[]")), port)

    def broker_address(self, conn: Connection | None = None) -> str:
        """host:port clients are told to use: --advertise-host, else the bound host, else (bound to a
        wildcard) the local address the client reached."""
        host = self.advertise_host
        if not host:
            host = self.host if self.host not in _WILDCARD else (conn.local_host if conn else "127.0.0.1")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self.port}"

    # ------------------------------------------------------------------ topics
    async def queue_counts(
        self, ctx: ClientContext, topic: str, *, auto_create: bool | None = None
    ) -> tuple[int, int]:
        """(read, write) queue counts of `topic` (cached for a few seconds): a shrink (logic
        queues) leaves sealed queues readable, not writable; ProcessorError(TOPIC_NOT_FOUND)."""
        hit = self._queue_counts.get(topic)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        route = await self.processor.query_route(ctx, topic, auto_create=auto_create)
        counts = (len(route.queues), sum(1 for q in route.queues if q.permission & Permission.WRITE))
        if len(self._queue_counts) > 10_000:
            self._queue_counts.clear()
        self._queue_counts[topic] = (counts, now + 5.0)
        return counts

    def forget_topic(self, topic: str) -> None:
        self._queue_counts.pop(topic, None)

    # ------------------------------------------------------------------ dispatch
    async def _secured(self, conn: Connection, cmd: RemotingCommand) -> Request | RemotingCommand:
        """Security on: the request with its verified context, or the NO_PERMISSION answer (a bad
        signature or key: "authentication failed" whatever was wrong; a denied resource: which)."""
        proc = self.processor
        try:
            ctx = await conn.verified_context(cmd)
        except ProcessorError as e:
            return cmd.response(ResponseCode.NO_PERMISSION, e.message)
        ident = ctx.identity
        checks, own_retry = access.needs(cmd)
        for action, resource in checks:
            if not proc.permits(ident, action, resource):
                return cmd.response(ResponseCode.NO_PERMISSION, f"no permission to {action.value} {resource}")
        if cmd.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            t = cmd.ext_fields.get("topic", "")
            if not access.may_route(proc, ident, t):
                return cmd.response(
                    ResponseCode.NO_PERMISSION, f"no permission to publish or subscribe topic:{t}"
                )
        if own_retry:  # the group check passed: its retry topic is read and written as the proxy's own
            ctx = ClientContext(
                ctx.protocol, ctx.client_id, Identity(ident.username, mechanism="internal"), ctx.remote
            )
        return Request(conn, cmd, ctx)

    async def dispatch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        if self.processor.security is None:
            req = Request(conn, cmd, conn.context(cmd))
        else:
            secured = await self._secured(conn, cmd)
            if not isinstance(secured, Request):
                return None if cmd.is_oneway else secured
            req = secured
        handler = self.handlers.get(cmd.code)
        try:
            if handler is None:
                resp: RemotingCommand | None = req.reply(
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request type {cmd.code} not supported"
                )
            else:
                resp = await handler(self, req)
        except HeaderError as e:
            resp = req.reply(e.code, str(e))
        except RemotingError as e:
            resp = req.reply(e.code, e.remark)
        except ProcessorError as e:
            resp = req.reply(code_of(e), e.message)
        except Exception as e:  # noqa: BLE001 - answer, never drop the connection for one request
            log.exception("remoting %s from %s failed", request_name(cmd.code), conn.remote)
            resp = req.reply(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
        if cmd.is_oneway:
            return None
        return resp
