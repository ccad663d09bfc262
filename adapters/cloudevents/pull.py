"""Pull consumption over HTTP: pop events for a consumer group, then ack or nack them by receipt handle.

`POST .../pop` answers a JSON batch (`application/cloudevents-batch+json`, possibly `[]`), or with
`Accept: application/cloudevents+json` one structured event (204 when none arrived). Each event
carries its receipt handle in the extension attribute `receipthandle` (it replaces one the event may
have had)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response

from messaging_processor import ProcessorError

from . import codec
from .mapping import from_message
from .models import (
    AckResult,
    CloudEventJSON,
    HandleFailure,
    HandlesRequest,
    NackRequest,
    NackResult,
    PopRequest,
    inline_schema,
)
from .problems import context

if TYPE_CHECKING:
    from messaging_processor import MessagingProcessor

BASE = "/topics/{topic}/subscriptions/{group}"
HANDLE_ATTR = "receipthandle"

_EVENT = inline_schema(CloudEventJSON)
_POP_RESPONSES: dict[int | str, dict] = {
    200: {
        "description": "the popped events, each with its `receipthandle`",
        "content": {
            codec.BATCH: {"schema": {"type": "array", "items": _EVENT}},
            codec.STRUCTURED: {"schema": _EVENT},
        },
    },
    204: {"description": "structured Accept and no event arrived within wait_ms"},
    400: {"description": "illegal group, topic or parameters (problem+json)"},
    404: {"description": "unknown topic (problem+json)"},
}


def _failure(handle: str, e: Exception) -> HandleFailure:
    if isinstance(e, ProcessorError):
        return HandleFailure(receipt_handle=handle, kind=e.kind.value, detail=e.message)
    return HandleFailure(receipt_handle=handle, kind="internal", detail=str(e))


def router(p: MessagingProcessor) -> APIRouter:
    r = APIRouter(tags=["cloudevents pull"])

    @r.post(BASE + "/pop", response_class=Response, responses=_POP_RESPONSES, summary="Pop events")
    async def pop(topic: str, group: str, request: Request, body: PopRequest | None = None) -> Response:
        body = body or PopRequest()
        accept = request.headers.get("accept", "")
        single = codec.STRUCTURED in accept and codec.BATCH not in accept
        deliveries = await p.pop(
            context(request),
            group,
            topic,
            max_messages=1 if single else body.max_events,
            invisible_time_ms=body.invisible_time_ms,
            long_poll_ms=body.wait_ms,
        )
        events = []
        for d in deliveries:
            ev = from_message(d.message)
            ev.attributes[HANDLE_ATTR] = d.receipt_handle
            events.append(ev)
        if single:
            if not events:
                return Response(status_code=204)
            return Response(codec.encode_structured(events[0]), media_type=codec.STRUCTURED)
        return Response(codec.encode_batch(events), media_type=codec.BATCH)

    @r.post(BASE + "/ack", response_model=AckResult, summary="Acknowledge popped events")
    async def ack(topic: str, group: str, body: HandlesRequest, request: Request) -> AckResult:
        ctx = context(request)
        handles = body.receipt_handles
        try:  # (one store call for the whole batch)
            results: list[Exception | None] = list(await p.ack_many(ctx, handles))
        except ProcessorError as e:
            results = [e] * len(handles)
        failed = [_failure(h, e) for h, e in zip(handles, results, strict=True) if e is not None]
        return AckResult(acked=len(results) - len(failed), failed=failed)

    @r.post(
        BASE + "/nack",
        response_model=NackResult,
        summary="Give popped events back (retry after the group's back-off, or change their invisible time)",
    )
    async def nack(topic: str, group: str, body: NackRequest, request: Request) -> NackResult:
        ctx = context(request)
        if body.invisible_time_ms is None:
            calls = [p.nack(ctx, h) for h in body.receipt_handles]
        else:
            calls = [p.change_invisible_time(ctx, h, body.invisible_time_ms) for h in body.receipt_handles]
        results = await asyncio.gather(*calls, return_exceptions=True)
        handles: list[str | None] = []
        failed = []
        for h, res in zip(body.receipt_handles, results, strict=True):
            if isinstance(res, Exception):
                failed.append(_failure(h, res))
                handles.append(None)
            else:
                handles.append(res)  # type: ignore[arg-type]
        return NackResult(receipt_handles=handles, failed=failed)

    return r
