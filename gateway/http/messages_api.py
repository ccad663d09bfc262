"""Admin API of the message browser and the dead-letter queues: read a topic's messages by queue
and offset, look messages up by id or key, list a group's dead letters and send them back to their
topic (redrive). JSON only, for the console and `gateway message|dlq ...`.

Each message also comes with `views`: what a consumer of each protocol receives for it, as that
adapter's own outbound mapping builds it (`adapters/<protocol>/view.py`), so the console's "how a
consumer sees it" is the delivery path's answer, not a second implementation of it."""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, Field

from messaging_processor import Message, MessagingProcessor

from .deps import get_processor

router = APIRouter(prefix="/admin", tags=["messages"])

Processor = Annotated[MessagingProcessor, Depends(get_processor)]

MAX_COUNT = 1000  # messages per browse or DLQ page
MAX_REDRIVE_IDS = 10_000  # ids per redrive request

_ERRORS = {
    400: {"description": "bad request (problem+json)"},
    404: {"description": "no such topic, group or message (problem+json)"},
    503: {"description": "store unavailable (problem+json)"},
}


class StoredMessage(BaseModel):
    id: str = Field(description="the message id")
    topic: str
    queue: int
    offset: int = Field(description="queue offset")
    store_time: int = Field(description="epoch ms the store committed it")
    born_time: int = Field(description="epoch ms the producer sent it")
    keys: list[str]
    tag: str
    message_group: str
    properties: dict[str, str]
    body: str | None = Field(description="the body as UTF-8 text; null when it is not valid UTF-8")
    body_base64: str
    size: int = Field(description="bytes of the stored record")
    views: dict[str, Any] = Field(
        default_factory=dict,
        description="protocol -> what its consumer receives (byte strings as UTF-8 text, else "
        '{"base64": ...}; times in epoch units)',
    )


class DeadLetter(StoredMessage):
    original_topic: str | None = Field(description="where a redrive sends it (ORIGIN_TOPIC)")
    original_id: str | None = None
    original_queue: int | None = None
    original_offset: int | None = None
    reason: str | None = Field(None, description="why it was dead-lettered (DLQ_REASON)")
    attempts: int | None = Field(None, description="deliveries before the move (RECONSUME_TIMES)")
    redriven: bool
    redriven_id: str | None = Field(None, description="id of the message the redrive sent")


class RedriveIn(BaseModel):
    ids: list[str] | None = Field(
        None, max_length=MAX_REDRIVE_IDS, description="dead letter message ids; omitted: every pending one"
    )


class RedriveOut(BaseModel):
    redriven: int
    ids: list[str] = Field(description="the dead letters sent back, in order")
    new_ids: list[str] = Field(description="the ids of the messages sent, as `ids`")


View = Callable[[Message], dict[str, object]]


@functools.cache
def protocol_views() -> dict[str, View]:
    """protocol -> the adapter's view of a delivery, in the order the console shows them
    (imported on first use: the HTTP port does not load every adapter to start)."""
    from adapters.amqp.view import consumer_view as amqp_view
    from adapters.cloudevents.view import consumer_view as cloudevents_view
    from adapters.grpc.view import consumer_view as grpc_view
    from adapters.mqtt.view import consumer_view as mqtt_view

    return {"mqtt": mqtt_view, "amqp": amqp_view, "cloudevents": cloudevents_view, "grpc": grpc_view}


def jsonable(v: Any) -> Any:
    """A view's value as JSON: bytes as UTF-8 text (else {"base64": ...}), datetimes as epoch
    seconds, decimals as text, containers item by item."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, bytes | bytearray):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(v).decode()}
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, datetime.datetime):
        return v.timestamp()
    if isinstance(v, decimal.Decimal):
        return str(v)
    return str(v)


def views_of(m: Message) -> dict[str, Any]:
    """What each protocol's consumer receives for `m` (a view that fails says why instead)."""
    out: dict[str, Any] = {}
    for name, view in protocol_views().items():
        try:
            out[name] = jsonable(view(m))
        except Exception as e:  # noqa: BLE001 - one odd message must not break the browser
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    return out


def _stored(m: Message) -> dict:
    try:
        text: str | None = m.body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        "id": m.message_id,
        "topic": m.topic,
        "queue": m.queue_id,
        "offset": m.queue_offset,
        "store_time": m.store_timestamp,
        "born_time": m.born_timestamp,
        "keys": list(m.keys),
        "tag": m.tag,
        "message_group": m.message_group,
        "properties": dict(m.properties),
        "body": text,
        "body_base64": base64.b64encode(m.body).decode(),
        "size": m.size or len(m.body),
        "views": views_of(m),
    }


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _dead_letter(m: Message, new_id: str | None) -> DeadLetter:
    p = m.properties
    return DeadLetter(
        **_stored(m),
        original_topic=p.get("ORIGIN_TOPIC") or p.get("RETRY_TOPIC"),
        original_id=p.get("ORIGIN_MESSAGE_ID"),
        original_queue=_int(p.get("ORIGIN_QUEUE_ID")),
        original_offset=_int(p.get("ORIGIN_QUEUE_OFFSET")),
        reason=p.get("DLQ_REASON"),
        attempts=_int(p.get("RECONSUME_TIMES")),
        redriven=new_id is not None,
        redriven_id=new_id or None,
    )


@router.get("/topics/{topic}/messages", response_model=list[StoredMessage], responses=_ERRORS)
async def browse_topic(
    topic: str,
    p: Processor,
    queue: Annotated[int | None, Query(ge=0, description="one queue; default: every queue")] = None,
    offset: Annotated[int | None, Query(ge=0, description="first offset; default: each queue's min")] = None,
    count: Annotated[int, Query(ge=1, le=MAX_COUNT)] = 20,
) -> list[StoredMessage]:
    """Messages of a topic by queue and offset (all queues: merged by store time)."""
    return [StoredMessage(**_stored(m)) for m in await p.browse(topic, queue, offset, count)]


@router.get("/messages", response_model=list[StoredMessage], responses=_ERRORS)
async def find_messages(
    p: Processor, key: Annotated[str, Query(min_length=1, description="a message key")]
) -> list[StoredMessage]:
    """Every stored record with this key (retry and dead-letter copies included)."""
    return [StoredMessage(**_stored(m)) for m in await p.find_by_key(key)]


@router.get("/messages/{message_id}", response_model=list[StoredMessage], responses=_ERRORS)
async def get_message(message_id: str, p: Processor) -> list[StoredMessage]:
    """The records with this message id: the message, and its retry or dead-letter copies."""
    found = await p.get_message_by_id(message_id)
    if not found:
        raise HTTPException(404, f"no message {message_id}")
    return [StoredMessage(**_stored(m)) for m in found]


@router.get("/dlq/{group}", response_model=list[DeadLetter], responses=_ERRORS)
async def list_dead_letters(
    group: str,
    p: Processor,
    count: Annotated[int, Query(ge=1, le=MAX_COUNT)] = 100,
    pending: Annotated[bool, Query(description="only those not redriven yet")] = False,
) -> list[DeadLetter]:
    """The group's dead letters (store topic `%DLQ%<group>`), oldest first."""
    return [_dead_letter(m, new) for m, new in await p.dead_letters(group, count, pending_only=pending)]


@router.post("/dlq/{group}/redrive", response_model=RedriveOut, responses=_ERRORS)
async def redrive(group: str, p: Processor, body: RedriveIn | None = None) -> RedriveOut:
    """Send dead letters back to their original topic as new messages; each is sent at most once
    (a second redrive skips it). Without `ids`, every dead letter not redriven yet."""
    sent = await p.redrive(group, body.ids if body is not None else None)
    return RedriveOut(redriven=len(sent), ids=[a for a, _ in sent], new_ids=[b for _, b in sent])
