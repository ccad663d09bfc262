"""gRPC's answers to the gateway's connection and publish-rate limits (adapters/limits.py).

grpc.aio shows no connection to the application, so a gRPC "connection" is a client: its
`x-mq-client-id` (one per RocketMQ client instance, whatever channels it opens). A client is counted
from its first call until NotifyClientTermination or until it is idle for the processor's client
expiry (the adapter's sweep). Over a limit, the call is answered with Code 42900 TOO_MANY_REQUESTS in
the response's Status (unary calls and ReceiveMessage) or gRPC RESOURCE_EXHAUSTED (Telemetry);
SendMessage over the client's or user's publish rate likewise, nothing stored.

The limits wrap the service's handlers (`GrpcLimits.wrap`), only when a limiter is configured."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from adapters.grpc.codes import Code
from adapters.grpc.convert import peer_address
from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.service import MessagingService

from ..limits import PUBLISH_RATE, ClientMeter, Limiter

log = logging.getLogger("adapters.grpc")
PROTOCOL = "grpc"
MAX_CLIENTS_TRACKED = 1 << 20  # a bound on the client table whatever max_connections says


@dataclass(slots=True)
class _Client:
    user: str | None
    meter: ClientMeter | None
    last_seen: float = field(default_factory=time.monotonic)


def _host(peer: str) -> str:
    addr = peer_address(peer)
    return addr.rsplit(":", 1)[0].strip("[]") if ":" in addr else addr


def _client_id(context: Any) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == "x-mq-client-id":
            return v
    return ""


class GrpcLimits:
    """The clients counted by the limiter, and the handler wrappers that consult it."""

    def __init__(self, limiter: Limiter, service: MessagingService) -> None:
        self.limiter = limiter
        self.service = service
        self.clients: dict[str, _Client] = {}

    async def admit(self, context: Any, cid: str) -> tuple[str | None, _Client | None]:
        """(refusal text or None, the client's entry). A call without a client id passes (the service
        answers CLIENT_ID_REQUIRED)."""
        if not cid:
            return None, None
        c = self.clients.get(cid)
        if c is not None:
            c.last_seen = time.monotonic()
            return None, c
        lim = self.limiter
        why = lim.accept(PROTOCOL, _host(context.peer()))
        if why is None and len(self.clients) >= MAX_CLIENTS_TRACKED:
            lim.closed(PROTOCOL)
            why = "max_connections"
        if why is not None:
            return f"too many connections: {why.replace('_', ' ')} reached", None
        user = await self._verified_user(context)
        if not lim.login(PROTOCOL, user):
            lim.closed(PROTOCOL)
            return f"too many connections for user '{user}'", None
        c = self.clients[cid] = _Client(user, lim.meter(user))
        return None, c

    async def _verified_user(self, context: Any) -> str | None:
        """The user a call's signature proves (None without security, or when it does not verify:
        the service then refuses the call itself)."""
        svc = self.service
        if svc.processor.security is None:
            return None
        ctx = svc._ctx(context)
        if await svc._refused(ctx) is not None:
            return None
        return ctx.identity.username

    def forget(self, cid: str) -> None:
        c = self.clients.pop(cid, None)
        if c is not None:
            self.limiter.closed(PROTOCOL)
            self.limiter.logout(c.user)

    def expire(self, max_idle_s: float) -> None:
        cutoff = time.monotonic() - max_idle_s
        for cid in [cid for cid, c in self.clients.items() if c.last_seen < cutoff]:
            self.forget(cid)

    def publish_refusal(self, c: _Client | None, request: s.SendMessageRequest) -> str | None:
        if c is None or c.meter is None:
            return None
        msgs = request.messages
        wait = c.meter.try_take(len(msgs), sum([len(m.body) for m in msgs]))
        if wait <= 0.0:
            return None
        self.limiter.refusals[(PROTOCOL, PUBLISH_RATE)] += 1
        return f"publish rate over its limit; retry in {math.ceil(wait * 1000)} ms"

    # ------------------------------------------------------------------ handler wrappers
    def wrap(self, name: str, handler: Callable, client_streaming: bool, server_streaming: bool) -> Callable:
        """`handler` of method `name`, refusing over-limit calls first."""
        if client_streaming:  # Telemetry: no response message to put a Status in

            async def streams(request_iterator: Any, context: Any) -> Any:
                cid = _client_id(context)
                why, _ = await self.admit(context, cid)
                if why is not None:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{Code.TOO_MANY_REQUESTS} {why}")
                async for out in handler(request_iterator, context):
                    yield out

            return streams
        response_type = getattr(s, f"{name}Response")
        if server_streaming:  # ReceiveMessage: raw bytes out

            async def receive(request: Any, context: Any) -> Any:
                why, _ = await self.admit(context, _client_id(context))
                if why is not None:
                    yield response_type(status=_too_many(why)).SerializeToString()
                    return
                async for out in handler(request, context):
                    yield out

            return receive

        async def unary(request: Any, context: Any) -> Any:
            cid = _client_id(context)
            why, c = await self.admit(context, cid)
            if why is None and name == "SendMessage":
                why = self.publish_refusal(c, request)
            if why is not None:
                return response_type(status=_too_many(why))
            if name == "NotifyClientTermination":
                self.forget(cid)
            return await handler(request, context)

        return unary


def _too_many(text: str) -> d.Status:
    return d.Status(code=Code.TOO_MANY_REQUESTS, message=text)
