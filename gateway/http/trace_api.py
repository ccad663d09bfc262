"""Message trace endpoints of the admin API: the lifecycle of a message by id, by key, by trace id.

The records come from the processor's TraceRecorder (messaging_processor/tracing.py); the admin
API's authentication applies (paths under /admin). 404 problem+json when nothing is known, 501 when
tracing is off (`--trace-retention 0`)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from messaging_processor import ErrorKind, MessagingProcessor, ProcessorError
from messaging_processor.tracing import EVENTS, TraceRecorder

from .deps import get_processor

router = APIRouter(prefix="/admin", tags=["trace"])
Processor = Annotated[MessagingProcessor, Depends(get_processor)]

_ERRORS: dict[int | str, dict] = {
    404: {"description": "nothing is known of this message (problem+json)"},
    501: {"description": "message tracing is off (problem+json)"},
}

EventName = Literal[EVENTS]  # (Literal of a tuple: one literal per event name)


class TraceEvent(BaseModel):
    """One step of a message's life."""

    event: EventName
    time: int  # epoch ms
    protocol: str
    client_id: str
    user: str | None = None
    group: str | None = None
    queue_id: int | None = None
    offset: int | None = None
    attempt: int | None = None
    detail: str | None = None


class MessageTrace(BaseModel):
    """The lifecycle of one message, events by time. `traceparent` / `trace_id`: its trace context,
    the one its client sent or the one the gateway derived from its id or made (never delivered)."""

    message_id: str
    trace_id: str
    traceparent: str
    topic: str
    events: list[TraceEvent]


def _tracer(processor: MessagingProcessor) -> TraceRecorder:
    tracer = processor.tracer
    if tracer is None:
        raise ProcessorError(ErrorKind.UNSUPPORTED, "message tracing is off (--trace-retention 0)")
    return tracer


async def _flushed(processor: MessagingProcessor) -> TraceRecorder:
    """The recorder, with what it buffered written (a trace asked for now shows the latest events)."""
    tracer = _tracer(processor)
    await tracer.flush()
    return tracer


@router.get("/messages/trace", response_model=list[MessageTrace], responses=_ERRORS)
async def traces_by_key(processor: Processor, key: Annotated[str, Query(min_length=1)]) -> list[dict]:
    """The traces of the messages with key `key`."""
    traces = await (await _flushed(processor)).traces_of_key(key)
    if not traces:
        raise ProcessorError(ErrorKind.MESSAGE_NOT_FOUND, f"no traced message has key {key!r}")
    return traces


@router.get("/messages/{message_id}/trace", response_model=MessageTrace, responses=_ERRORS)
async def trace_of_message(processor: Processor, message_id: str) -> dict:
    """The trace of one message."""
    trace = await (await _flushed(processor)).trace(message_id)
    if trace is None:
        raise ProcessorError(ErrorKind.MESSAGE_NOT_FOUND, f"no trace of message {message_id}")
    return trace


@router.get("/traces/{trace_id}", response_model=list[MessageTrace], responses=_ERRORS)
async def traces_of_trace_id(processor: Processor, trace_id: str) -> list[dict]:
    """The traces of every message of a W3C trace id (32 hex digits)."""
    traces = await (await _flushed(processor)).traces_of_trace_id(trace_id)
    if not traces:
        raise ProcessorError(ErrorKind.MESSAGE_NOT_FOUND, f"no traced message has trace id {trace_id}")
    return traces
