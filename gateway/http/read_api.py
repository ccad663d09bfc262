"""Network read API: replayable offset range reads of topics, for analytics (the Spark source in
`analytics/`) and any offset-based reader. Executors on other machines read through it; nothing
outside the gateway opens store files.

    GET  /read/topics/{topic}/queues                              queue ids with min/max offsets
    GET  /read/topics/{topic}/queues/{queue_id}/messages    rows of [start, end): Arrow IPC or JSON lines
    GET  /read/topics/{topic}/offsets?timestamp=MS                per queue, first offset stored at/after MS
    GET  /read/groups/{group}/topics/{topic}/offsets              the group's committed offsets
    POST /read/groups/{group}/topics/{topic}/offsets              commit {"offsets": {"0": 12, ...}}

See docs/gateway.md ("Read API") and docs/analytics.md."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from messaging_processor import Action, ClientContext, ErrorKind, MessagingProcessor, ProcessorError, Resource

from . import read_records as rr
from .deps import get_processor

router = APIRouter(prefix="/read", tags=["read"])

Processor = Annotated[MessagingProcessor, Depends(get_processor)]
MAX_ROWS = 10_000_000  # largest `max` of one range request

_ERRORS = {
    400: {"description": "bad queue id, offsets or filter (problem+json)"},
    404: {"description": "no such topic (problem+json)"},
}


class QueueOffsets(BaseModel):
    queue_id: int
    min_offset: int = Field(description="first offset still stored")
    max_offset: int = Field(description="offset the next message will get: [min, max) are readable")


class TopicQueues(BaseModel):
    topic: str
    queues: list[QueueOffsets]


class QueueOffset(BaseModel):
    queue_id: int
    offset: int


class TopicOffsets(BaseModel):
    topic: str
    queues: list[QueueOffset]


class GroupOffsets(BaseModel):
    group: str
    topic: str
    queues: list[QueueOffset] = Field(description="committed offset per queue; -1: never committed")


class CommitIn(BaseModel):
    offsets: dict[int, int] = Field(
        description='queue id -> offset: everything below it is consumed, e.g. {"0": 1234, "1": 998}'
    )


def _context(request: Request) -> ClientContext:
    from adapters.cloudevents.problems import context

    return context(request)


async def _authorize(p: MessagingProcessor, ctx: ClientContext, topic: str, group: str | None = None) -> None:
    if p.authorizer is None:
        return
    await p.authorize(ctx.identity, Action.SUBSCRIBE, Resource("topic", topic))
    if group is not None:
        await p.authorize(ctx.identity, Action.SUBSCRIBE, Resource("group", group))


async def _queue_count(p: MessagingProcessor, ctx: ClientContext, topic: str) -> int:
    route = await p.query_route(ctx, topic, auto_create=False)
    return len(route.queues)


@router.get("/topics/{topic}/queues", response_model=TopicQueues, responses=_ERRORS)
async def list_queues(topic: str, request: Request, p: Processor) -> TopicQueues:
    """The topic's queues with their readable offset ranges."""
    ctx = _context(request)
    await _authorize(p, ctx, topic)
    out = []
    for q in range(await _queue_count(p, ctx, topic)):
        lo, hi = await p.queue_offsets(topic, q)
        out.append(QueueOffsets(queue_id=q, min_offset=lo, max_offset=hi))
    return TopicQueues(topic=topic, queues=out)


@router.get(
    "/topics/{topic}/queues/{queue_id}/messages",
    responses={
        200: {
            "description": "rows of the range; headers X-Start-Offset (first offset read), "
            "X-Next-Offset (where the next read continues), X-Min-Offset, X-Max-Offset",
            "content": {rr.ARROW_STREAM: {}, rr.NDJSON: {}},
        },
        **_ERRORS,
    },
)
async def read_messages(
    topic: str,
    queue_id: int,
    request: Request,
    p: Processor,
    start: Annotated[int | None, Query(ge=0, description="first offset (default: the queue's min)")] = None,
    end: Annotated[
        int | None, Query(ge=0, description="end offset, exclusive (default: the queue's max)")
    ] = None,
    max_rows: Annotated[
        int, Query(alias="max", ge=1, le=MAX_ROWS, description="at most this many offsets")
    ] = 10_000,
    path: Annotated[
        str | None, Query(description="MQTT topic filter (devices/+/telemetry) or glob (devices/*/t*)")
    ] = None,
    fmt: Annotated[
        Literal["arrow", "jsonl"] | None,
        Query(
            alias="format", description="arrow (Arrow IPC stream) or jsonl; default from Accept, else jsonl"
        ),
    ] = None,
) -> StreamingResponse:
    """Messages with offsets in [start, min(end, start + max)), clamped to what is stored: the same
    request returns the same rows while they are retained. X-Next-Offset is the offset after the
    range read (rows filtered out by `path` count as read)."""
    ctx = _context(request)
    await _authorize(p, ctx, topic)
    if queue_id < 0 or queue_id >= await _queue_count(p, ctx, topic):
        raise ProcessorError(ErrorKind.BAD_REQUEST, f"topic {topic} has no queue {queue_id}")
    try:
        pf = rr.PathFilter.parse(path) if path else None
    except ValueError as e:
        raise ProcessorError(ErrorKind.BAD_REQUEST, str(e)) from None
    if fmt is None:
        fmt = "arrow" if rr.ARROW_STREAM in request.headers.get("accept", "") else "jsonl"
    lo, hi = await p.queue_offsets(topic, queue_id)
    first = lo if start is None else start
    if first < hi:
        first = max(first, lo)
    stop = min(hi if end is None else end, hi, first + max_rows)
    stop = stop if stop > first else first
    headers = {
        "X-Start-Offset": str(first),
        "X-Next-Offset": str(stop),
        "X-Min-Offset": str(lo),
        "X-Max-Offset": str(hi),
        "Cache-Control": "no-store",
    }
    batches = await _started(rr.iter_batches(p, ctx, topic, queue_id, first, stop, pf))
    if fmt == "arrow":
        return StreamingResponse(_arrow_body(batches), media_type=rr.ARROW_STREAM, headers=headers)
    return StreamingResponse(_jsonl_body(batches), media_type=rr.NDJSON, headers=headers)


async def _started(batches: AsyncIterator) -> AsyncIterator:
    """`batches` with its first batch read before the response starts: a failure there (say
    tiered storage unreachable) is answered with its status instead of a cut-off 200 stream."""
    first = await anext(batches, None)

    async def chained() -> AsyncIterator:
        if first is not None:
            yield first
            async for b in batches:
                yield b

    return chained()


async def _arrow_body(batches: AsyncIterator) -> AsyncIterator[bytes]:
    yield rr.arrow_schema_message()
    async for batch in batches:
        if batch.num_rows:
            yield rr.arrow_batch_message(batch)
    yield rr.arrow_end()


async def _jsonl_body(batches: AsyncIterator) -> AsyncIterator[bytes]:
    async for batch in batches:
        if batch.num_rows:
            yield rr.batch_to_jsonl(batch)


@router.get("/topics/{topic}/offsets", response_model=TopicOffsets, responses=_ERRORS)
async def offsets_for_time(
    topic: str,
    request: Request,
    p: Processor,
    timestamp: Annotated[int, Query(ge=0, description="epoch milliseconds")],
) -> TopicOffsets:
    """Per queue, the first offset stored at or after `timestamp` (the max offset when none is)."""
    ctx = _context(request)
    await _authorize(p, ctx, topic)
    out = [
        QueueOffset(queue_id=q, offset=await p.search_offset(topic, q, timestamp))
        for q in range(await _queue_count(p, ctx, topic))
    ]
    return TopicOffsets(topic=topic, queues=out)


@router.get("/groups/{group}/topics/{topic}/offsets", response_model=GroupOffsets, responses=_ERRORS)
async def committed_offsets(group: str, topic: str, request: Request, p: Processor) -> GroupOffsets:
    """The group's committed offset per queue (-1 for a queue it never committed or consumed)."""
    ctx = _context(request)
    await _authorize(p, ctx, topic, group)
    out = [
        QueueOffset(queue_id=q, offset=await p.committed_offset(group, topic, q))
        for q in range(await _queue_count(p, ctx, topic))
    ]
    return GroupOffsets(group=group, topic=topic, queues=out)


@router.post("/groups/{group}/topics/{topic}/offsets", response_model=GroupOffsets, responses=_ERRORS)
async def commit_offsets(
    group: str, topic: str, body: CommitIn, request: Request, p: Processor
) -> GroupOffsets:
    """Commit the group's progress: for each queue given, everything below the offset is consumed
    (offsets past the queue's max are clamped to it). The group is created when new. Answers the
    committed offsets of every queue."""
    ctx = _context(request)
    await _authorize(p, ctx, topic, group)
    n = await _queue_count(p, ctx, topic)
    for q, off in body.offsets.items():
        if not 0 <= q < n:
            raise ProcessorError(ErrorKind.BAD_REQUEST, f"topic {topic} has no queue {q}")
        if off < 0:
            raise ProcessorError(ErrorKind.BAD_REQUEST, f"offset {off} of queue {q} is negative")
    for q, off in sorted(body.offsets.items()):
        await p.commit_offset(ctx, group, topic, q, off)
    return await committed_offsets(group, topic, request, p)
