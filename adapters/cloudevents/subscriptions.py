"""Push subscriptions: `POST/GET/DELETE /subscriptions`, stored durably in the processor's kv table
(`ce.subscriptions/<id>` -> the SubscriptionRecord JSON) and restarted when the gateway starts."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import ValidationError

from messaging_processor import Action, ProcessorError, Resource

from .models import Subscription, SubscriptionIn, SubscriptionRecord
from .problems import context
from .push import MAX_ATTEMPTS, Dispatcher

if TYPE_CHECKING:
    from .push import PushDeps

log = logging.getLogger("adapters.cloudevents")
NS = "ce.subscriptions"
GROUP_PREFIX = "ce-sub-"


class SubscriptionManager:
    """The push subscriptions: stored in the key-value table, each run by a `Dispatcher` over
    `service` (the processor, the shared webhook client, the store of replies)."""

    def __init__(self, service: PushDeps) -> None:
        self.service = service
        self.dispatchers: dict[str, Dispatcher] = {}

    async def start(self) -> None:
        """Start every stored subscription."""
        for key, value in await self.service.processor.kv_scan(NS):
            try:
                rec = SubscriptionRecord.model_validate_json(value)
            except ValidationError as e:
                log.error("stored subscription %s is unreadable, skipped: %s", key, e)
                continue
            self._run(rec)
        if self.dispatchers:
            log.info("%d CloudEvents push subscription(s) started", len(self.dispatchers))

    async def stop(self, grace: float) -> None:
        dispatchers, self.dispatchers = list(self.dispatchers.values()), {}
        await asyncio.gather(*(d.stop(grace) for d in dispatchers), return_exceptions=True)

    def _run(self, rec: SubscriptionRecord) -> None:
        d = Dispatcher(self.service, rec)
        self.dispatchers[rec.id] = d
        d.start()

    async def create(self, spec: SubscriptionIn, request: Request) -> Subscription:
        p = self.service.processor
        ctx = context(request)
        # Deliveries pop as the push identity: the creator must be allowed to read the topic, and
        # to consume as the group it names (a generated group is the subscription's own).
        await p.authorize(ctx.identity, Action.SUBSCRIBE, Resource("topic", spec.topic))
        if spec.group is not None:
            await p.authorize(ctx.identity, Action.SUBSCRIBE, Resource("group", spec.group))
        route = await p.query_route(ctx, spec.topic)  # 404 for an unknown topic
        sid = uuid.uuid4().hex[:16]
        group = spec.group or GROUP_PREFIX + sid
        existed = spec.group is not None and await _group_exists(p, group)
        if not existed:
            await p.create_group(group, max_attempts=MAX_ATTEMPTS)
            if spec.start == "latest":
                for q in route.queues:
                    _, hi = await p.queue_offsets(spec.topic, q.queue_id)
                    await p.commit_offset(ctx, group, spec.topic, q.queue_id, hi)
        fields = spec.model_dump(exclude={"group"})
        rec = SubscriptionRecord(**fields, id=sid, group=group, created_at=time.time())
        await p.kv_put(NS, sid, rec.model_dump_json(by_alias=True).encode())
        self._run(rec)
        return self.view(rec.id)

    def visible(self, request: Request, sid: str) -> bool:
        """Whether the caller may see (and delete) the subscription: it may read its topic and
        group (always true with authentication off)."""
        d = self.dispatchers.get(sid)
        if d is None:
            return False
        ident = context(request).identity
        p = self.service.processor
        return p.permits(ident, Action.SUBSCRIBE, Resource("topic", d.sub.topic)) and p.permits(
            ident, Action.SUBSCRIBE, Resource("group", d.sub.group)
        )

    async def delete(self, sid: str) -> None:
        d = self.dispatchers.pop(sid, None)
        if d is None:
            raise HTTPException(404, f"no subscription {sid}")
        await d.stop(1.0)
        await self.service.processor.kv_delete(NS, sid)
        if d.sub.group == GROUP_PREFIX + sid:
            try:
                await self.service.processor.delete_group(d.sub.group)
            except ProcessorError as e:
                log.info("deleting group %s of subscription %s: %s", d.sub.group, sid, e)

    def view(self, sid: str) -> Subscription:
        d = self.dispatchers.get(sid)
        if d is None:
            raise HTTPException(404, f"no subscription {sid}")
        return Subscription(**d.sub.model_dump(), status=d.status())


async def _group_exists(p: object, group: str) -> bool:
    try:
        await p.get_group(group)  # type: ignore[attr-defined]
    except ProcessorError:
        return False
    return True


def router(m: SubscriptionManager) -> APIRouter:
    r = APIRouter(prefix="/subscriptions", tags=["cloudevents push"])
    errors = {
        400: {"description": "invalid subscription (problem+json)"},
        404: {"description": "unknown topic or subscription (problem+json)"},
    }

    @r.post(
        "", response_model=Subscription, status_code=201, responses=errors, summary="Create a subscription"
    )
    async def create(body: SubscriptionIn, request: Request, response: Response) -> Subscription:
        sub = await m.create(body, request)
        response.headers["Location"] = f"/subscriptions/{quote(sub.id, safe='')}"
        return sub

    @r.get("", response_model=list[Subscription], summary="List push subscriptions with their status")
    async def list_all(request: Request) -> list[Subscription]:
        return [m.view(sid) for sid in sorted(m.dispatchers) if m.visible(request, sid)]

    @r.get("/{sid}", response_model=Subscription, responses=errors, summary="A subscription and its status")
    async def get(sid: str, request: Request) -> Subscription:
        if sid in m.dispatchers and not m.visible(request, sid):
            raise HTTPException(404, f"no subscription {sid}")
        return m.view(sid)

    @r.delete("/{sid}", status_code=204, response_class=Response, responses=errors, summary="Delete one")
    async def delete(sid: str, request: Request) -> Response:
        if sid in m.dispatchers and not m.visible(request, sid):
            raise HTTPException(404, f"no subscription {sid}")
        await m.delete(sid)
        return Response(status_code=204)

    return r
