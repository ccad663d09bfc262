"""The CloudEvents service on the gateway's HTTP port: its routers, the shared push client, the
subscriptions and optional idempotency, started and stopped with the HTTP listener."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from fastapi import APIRouter
from starlette.applications import Starlette

from adapters.base import Adapter
from adapters.limits import Limiter
from messaging_processor import ClientContext, MessagingProcessor

from . import ingest, pull, subscriptions
from .dedup import Deduplicator
from .event import Event
from .limits import IngestLimits
from .mapping import to_message
from .webhook import WebhookClient

log = logging.getLogger("adapters.cloudevents")


class CloudEvents:
    """`routers()` go into the HTTP app; `serve(http_adapter)` ties start/stop to the listener."""

    def __init__(
        self, processor: MessagingProcessor, *, dedup_window_s: float = 0.0, limiter: Limiter | None = None
    ) -> None:
        """`limiter`: the ingest's publish-rate limit (429 with Retry-After when over it; limits.py)."""
        self.processor = processor
        self.limits = (
            IngestLimits(limiter) if limiter is not None and limiter.settings.publish_limited else None
        )
        self.dedup = Deduplicator(processor, dedup_window_s) if dedup_window_s > 0 else None
        self.subscriptions = subscriptions.SubscriptionManager(self)
        self.ingest = ingest.IngestEndpoint(processor, self.store, self.limits)
        self._client: WebhookClient | None = None

    @property
    def client(self) -> WebhookClient:
        """The keep-alive client every push subscription shares (webhook.py)."""
        if self._client is None:
            self._client = WebhookClient(
                user_agent="msg-gateway-cloudevents", max_connections=256, max_idle_per_origin=64
            )
        return self._client

    def routers(self) -> list[APIRouter]:
        return [
            ingest.router(self.ingest),
            pull.router(self.processor),
            subscriptions.router(self.subscriptions),
        ]

    def serve(self, http: Adapter) -> ServedAdapter:
        """Attach to the HTTP listener. When it serves a Starlette app (the gateway's HttpAdapter),
        the ingest route is also put first in that app's routing table (ingest.put_first)."""
        app = getattr(http, "app", None)
        if isinstance(app, Starlette):
            ingest.put_first(app, self.ingest)
        return ServedAdapter(http, self)

    async def start(self) -> None:
        if self.dedup is not None:
            await self.dedup.start()
        await self.subscriptions.start()

    async def stop(self, grace: float) -> None:
        await self.subscriptions.stop(grace)
        if self.dedup is not None:
            await self.dedup.stop()
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def store(self, ctx: ClientContext, topic: str, events: Sequence[Event]) -> None:
        """Store the events (one processor send); returns once all are durable. With idempotency on,
        events already stored within the window are skipped."""
        p = self.processor
        if not events:
            await p.query_route(ctx, topic)  # 404 for an unknown topic, even for an empty batch
            return
        msgs = [to_message(topic, ev) for ev in events]
        if self.dedup is None:
            await p.send(ctx, msgs, receipts=False)
            return
        keep, keys = await self.dedup.claim(topic, events)
        try:
            if keep:
                await p.send(ctx, [msgs[i] for i in keep], receipts=False)
        except BaseException:
            self.dedup.release(keys)
            raise
        await self.dedup.commit(keys)


class ServedAdapter:
    """The HTTP listener with the CloudEvents service attached (Adapter protocol): the service starts
    once the port is bound and stops alongside the listener's drain."""

    def __init__(self, http: Adapter, service: CloudEvents) -> None:
        self.http = http
        self.service = service
        self.name = http.name

    @property
    def address(self) -> str:
        return self.http.address

    @property
    def listening(self) -> bool:
        return self.http.listening

    async def start(self) -> None:
        await self.http.start()
        try:
            await self.service.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await self.http.stop(0)
            raise

    async def stop(self, grace: float) -> None:
        stops = (self.http.stop(grace), self.service.stop(grace))
        results = await asyncio.gather(*stops, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                log.warning("stopping the HTTP listener / CloudEvents service failed: %r", r)
