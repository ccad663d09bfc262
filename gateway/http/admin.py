"""Admin REST API: topics, consumer groups and connected clients.

Create is an upsert, as RocketMQ's updateTopic: POST of a new name answers 201, of an existing one
200 with the updated settings (fields left out keep their value). Queues are never removed, so
asking an existing topic for fewer queues than it has is a 409 conflict."""

from __future__ import annotations

import time
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from pydantic import BaseModel, Field

from messaging_processor import ErrorKind, MessagingProcessor, ProcessorError, RetryPolicy

from .deps import get_processor

router = APIRouter(prefix="/admin", tags=["admin"])

Processor = Annotated[MessagingProcessor, Depends(get_processor)]

_ERRORS = {
    400: {"description": "illegal name or bad request (problem+json)"},
    404: {"description": "no such topic or group (problem+json)"},
    503: {"description": "store full or unavailable (problem+json)"},
}


# ----------------------------------------------------------------------------- models
class TopicIn(BaseModel):
    name: str = Field(min_length=1, max_length=255)
    queues: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="queues on each store (CLUSTER mode: the topic has this many on every store node, "
        "as RocketMQ's `updateTopic -c`); default: the gateway's default_queues",
    )
    retention_ms: int | None = Field(None, ge=1, description="default: the store's retention")
    retention_bytes: int | None = Field(None, ge=1, description="default: no size limit")
    compacted: bool | None = Field(
        None,
        description="the latest record per message key wins; an empty body deletes its key "
        "(docs/store.md). Set at creation; default false",
    )


class Topic(BaseModel):
    name: str
    queues: int = Field(description="over all stores: the queues routes list")
    queues_per_store: int = Field(
        description="what `queues` of a create means; equal to `queues` in LOCAL mode"
    )
    retention_ms: int | None = None
    retention_bytes: int | None = None
    compacted: bool = False
    messages: int = Field(0, description="stored messages not yet removed by retention, all queues")
    read_queues: int = Field(
        0,
        description="over all stores: `queues` plus the queues a shrink sealed, readable until "
        "retention empties them (logic queues, docs/store.md)",
    )


class TopicUpdate(BaseModel):
    queues: int = Field(
        ge=1,
        le=1024,
        description="queues on each store from now on: grows or shrinks the topic without moving "
        "messages; a shrink seals the queues it leaves out (readable until retention empties "
        "them; docs/store.md)",
    )


class QueueOffsets(BaseModel):
    queue_id: int
    min_offset: int
    max_offset: int


class Backlog(BaseModel):
    backlog: int = Field(description="messages not yet acknowledged by the group")
    inflight: int = Field(description="messages popped and not yet acknowledged")


class TopicDetail(Topic):
    queue_offsets: list[QueueOffsets]
    groups: dict[str, Backlog] = Field(description="per consumer group that consumed the topic")


class GroupIn(BaseModel):
    name: str = Field(min_length=1, max_length=255)
    max_attempts: int | None = Field(None, ge=1, description="deliveries before the DLQ (default 16)")
    retry_initial_ms: int | None = Field(None, ge=0, description="first nack back-off (default 1000)")
    retry_multiplier: float | None = Field(None, ge=1.0, description="back-off growth (default 2.0)")
    retry_max_ms: int | None = Field(None, ge=0, description="back-off cap (default 60000)")


class Group(BaseModel):
    name: str
    max_attempts: int
    retry_initial_ms: int
    retry_multiplier: float
    retry_max_ms: int
    topics: dict[str, Backlog] = Field(default_factory=dict)


class Client(BaseModel):
    client_id: str
    protocol: str
    kind: str
    group: str
    topics: list[str]
    remote: str
    language: str = ""
    version: str = ""
    connected_at: float
    last_seen: float
    details: dict[str, str | int | bool] = Field(
        default_factory=dict, description="a consumer's protocol facts (see GET /admin/consumers)"
    )


class Consumer(BaseModel):
    protocol: str
    client_id: str
    group: str = Field(
        description='the consumer group it takes messages with ("": none, e.g. an MQTT clean session)'
    )
    topics: list[str] = Field(description='store topics it reads ("*": every topic)')
    remote: str
    since: float = Field(description="connected at, epoch seconds")
    connection: str = Field(
        description="its connection's id (DELETE /admin/connections/{id}), when it has one"
    )
    details: dict[str, str | int | bool] = Field(
        description="the protocol's own facts: AMQP queue, channel, consumer_tag, ack, prefetch, unacked; "
        "MQTT filter, qos, session, share; gRPC and 4.x kind"
    )


# ----------------------------------------------------------------------------- helpers
M = TypeVar("M", bound=BaseModel)


def _view(model: type[M], obj: object, **extra: Any) -> M:
    """The API's `model` of a processor object (TopicInfo, GroupInfo, a consumer report, ...):
    each field the attribute of the same name, `extra` given instead (or as well)."""
    return model(**{f: getattr(obj, f) for f in model.model_fields if f not in extra}, **extra)


async def _existing_topic(p: MessagingProcessor, name: str) -> Topic | None:
    try:
        t = await p.get_topic(name)
    except ProcessorError as e:
        if e.kind is ErrorKind.TOPIC_NOT_FOUND:
            return None
        raise
    return _view(Topic, t)


async def _existing_group(p: MessagingProcessor, name: str) -> Group | None:
    try:
        g = await p.get_group(name)
    except ProcessorError as e:
        if e.kind is ErrorKind.GROUP_NOT_FOUND:
            return None
        raise
    return _group(g)


def _group(g: Any) -> Group:
    return _view(Group, g, topics={t: Backlog(**v) for t, v in g.topics.items()})


# ----------------------------------------------------------------------------- topics
@router.get("/topics", response_model=list[Topic])
async def list_topics(p: Processor) -> list[Topic]:
    """All topics except internal ones (dead-letter topics `%DLQ%<group>` are listed)."""
    out = []
    for t in await p.list_topics():
        found = await _existing_topic(p, t.name)
        if found is not None:  # deleted while we listed
            out.append(found)
    return out


@router.post(
    "/topics",
    response_model=Topic,
    status_code=201,
    responses={200: {"model": Topic, "description": "the topic existed and was updated"}, 409: {}, **_ERRORS},
)
async def create_topic(body: TopicIn, p: Processor, response: Response) -> Topic:
    old = await _existing_topic(p, body.name)
    queues, retention_ms, retention_bytes = body.queues, body.retention_ms, body.retention_bytes
    if old is not None:
        if queues is not None and queues < old.queues_per_store:
            raise HTTPException(
                409,
                f"topic {body.name} has {old.queues_per_store} queues per store; a create does not remove "
                f"queues (asked {queues}): `gateway topic update` (PATCH /admin/topics/{{name}}) shrinks it",
            )
        queues = queues or old.queues_per_store
        retention_ms = retention_ms if retention_ms is not None else old.retention_ms
        retention_bytes = retention_bytes if retention_bytes is not None else old.retention_bytes
        if body.compacted is not None and body.compacted != old.compacted:
            raise HTTPException(409, f"topic {body.name} exists; compaction is set when a topic is created")
        response.status_code = 200
    compacted = old.compacted if old is not None else bool(body.compacted)
    t = await p.create_topic(body.name, queues, retention_ms, retention_bytes, compacted)
    response.headers["Location"] = f"/admin/topics/{quote(t.name, safe='')}"
    return _view(Topic, t, messages=old.messages if old is not None else 0)


@router.get("/topics/{name}", response_model=TopicDetail, responses=_ERRORS)
async def get_topic(name: str, p: Processor) -> TopicDetail:
    """A topic with per-queue offsets and the backlog of every group that consumed it."""
    t = await p.get_topic(name)
    offsets = []
    for q in range(t.read_queues or t.queues):
        lo, hi = await p.queue_offsets(name, q)
        offsets.append(QueueOffsets(queue_id=q, min_offset=lo, max_offset=hi))
    groups = {g: Backlog(**c) for g, c in (await p.topic_consumers(name)).items()}
    return _view(TopicDetail, t, queue_offsets=offsets, groups=groups)


@router.patch("/topics/{name}", response_model=Topic, responses={409: {}, **_ERRORS})
async def update_topic(name: str, body: TopicUpdate, p: Processor) -> Topic:
    """Grow or shrink a topic's queues in place (logic queues): no message moves, offsets keep
    increasing, per-queue and per message group order hold; queues a shrink leaves out stay
    readable (routes list them READ) until retention has removed their messages (docs/store.md)."""
    old = await p.get_topic(name)
    if old.compacted and body.queues != old.queues_per_store:
        raise HTTPException(409, f"topic {name} is compacted: its queue count is fixed")
    t = await p.resize_topic(name, body.queues)
    found = await _existing_topic(p, t.name)
    assert found is not None
    return found


@router.delete("/topics/{name}", status_code=204, response_class=Response, responses=_ERRORS)
async def delete_topic(name: str, p: Processor) -> Response:
    await p.delete_topic(name)
    return Response(status_code=204)


class Compaction(BaseModel):
    queues: int = Field(description="queues compacted")
    records_in: int
    records_kept: int
    bytes_in: int
    bytes_kept: int
    seconds: float


@router.post("/compaction", response_model=Compaction, responses=_ERRORS)
async def compact(p: Processor) -> Compaction:
    """Compact every compacted topic now over the closed commit log segments (it also runs in the
    background every 30 s): older records of a key, and tombstones past `tombstone_retention`, go."""
    return _view(Compaction, await p.compact())


# ----------------------------------------------------------------------------- groups
@router.get("/groups", response_model=list[Group])
async def list_groups(p: Processor) -> list[Group]:
    """Consumer groups (internal `%...` groups excluded) with backlog and in-flight per topic."""
    return [_group(g) for g in await p.list_groups()]


@router.post(
    "/groups",
    response_model=Group,
    status_code=201,
    responses={200: {"model": Group, "description": "the group existed and was updated"}, **_ERRORS},
)
async def create_group(body: GroupIn, p: Processor, response: Response) -> Group:
    old = await _existing_group(p, body.name)
    base = RetryPolicy()
    max_attempts = 16
    if old is not None:
        base = RetryPolicy(old.retry_initial_ms, old.retry_multiplier, old.retry_max_ms)
        max_attempts = old.max_attempts
        response.status_code = 200
    retry = RetryPolicy(
        body.retry_initial_ms if body.retry_initial_ms is not None else base.initial_ms,
        body.retry_multiplier if body.retry_multiplier is not None else base.multiplier,
        body.retry_max_ms if body.retry_max_ms is not None else base.max_ms,
    )
    g = await p.create_group(
        body.name, body.max_attempts if body.max_attempts is not None else max_attempts, retry
    )
    response.headers["Location"] = f"/admin/groups/{quote(g.name, safe='')}"
    out = _group(g)
    if old is not None:
        out.topics = old.topics
    return out


@router.get("/groups/{name}", response_model=Group, responses=_ERRORS)
async def get_group(name: str, p: Processor) -> Group:
    return _group(await p.get_group(name))


@router.delete("/groups/{name}", status_code=204, response_class=Response, responses=_ERRORS)
async def delete_group(name: str, p: Processor) -> Response:
    await p.delete_group(name)
    return Response(status_code=204)


# ----------------------------------------------------------------------------- clients
@router.get("/clients", response_model=list[Client])
async def list_clients(
    p: Processor, protocol: Annotated[str | None, Query(description="only this protocol")] = None
) -> list[Client]:
    """The processor's client registry: who is connected through which protocol, as what (the
    AMQP and MQTT consumers as their adapters report them, kind `consumer`)."""
    out = [Client(**c.as_dict()) for c in p.clients.list(protocol=protocol)]
    now = time.time()
    for r in p.clients.reported_consumers():
        if protocol is None or r.protocol == protocol:
            out.append(
                Client(
                    client_id=r.client_id,
                    protocol=r.protocol,
                    kind="consumer",
                    group=r.group,
                    topics=sorted(r.topics),
                    remote=r.remote,
                    connected_at=r.since,
                    last_seen=now,
                    details=r.details,
                )
            )
    return out


@router.get("/consumers", response_model=list[Consumer])
async def list_consumers(
    p: Processor,
    group: Annotated[str | None, Query(description="only this consumer group's")] = None,
    topic: Annotated[str | None, Query(description="only those reading this topic")] = None,
) -> list[Consumer]:
    """Live consumers of every protocol: AMQP basic.consume consumers (per queue), MQTT
    subscriptions (per client, shared ones with their share's group), gRPC and 4.x consumers."""
    return [
        _view(Consumer, r, topics=sorted(r.topics)) for r in p.clients.consumers(group=group, topic=topic)
    ]
