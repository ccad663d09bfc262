"""POST /topics/{topic}/events: binary, structured and batched CloudEvents in; 202 once stored.

OPTIONS answers the webhook abuse-protection handshake (`WebHook-Allowed-Origin`/`-Rate` when
`WebHook-Request-Origin` is present, else 405); other methods get 405 with `Allow`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response

from . import codec
from .models import CloudEventJSON, Problem, inline_schema
from .problems import ALLOW, context, method_not_allowed, problem

if TYPE_CHECKING:
    from .service import CloudEvents

ENVELOPE = 64 * 1024  # what a request may carry beyond its data: attributes, JSON framing


def request_limit(max_body_size: int) -> int:
    """The largest request body: room for one event whose data is max_body_size bytes in any mode
    (base64 in structured mode makes it 4/3 larger) plus 64 KiB of attributes."""
    return -(-max_body_size * 4 // 3) + ENVELOPE


PATH = "/topics/{topic}/events"

_EVENT_SCHEMA = inline_schema(CloudEventJSON)
_BINARY_HEADERS = [
    {"name": f"ce-{n}", "in": "header", "required": False, "schema": {"type": "string"}, "description": d}
    for n, d in (
        ("specversion", "binary mode: 1.0"),
        ("id", "binary mode: event id"),
        ("source", "binary mode: URI-reference"),
        ("type", "binary mode: event type"),
        ("subject", "binary mode, optional; likewise ce-time, ce-dataschema and ce-<extension>"),
    )
]
_OPENAPI = {
    "parameters": _BINARY_HEADERS,
    "requestBody": {
        "required": False,
        "description": "Binary mode: the body is `data`, Content-Type its `datacontenttype`, attributes "
        "are percent-encoded `ce-*` headers. Structured and batched modes: the JSON event format.",
        "content": {
            codec.STRUCTURED: {"schema": _EVENT_SCHEMA},
            codec.BATCH: {"schema": {"type": "array", "items": _EVENT_SCHEMA}},
            "*/*": {"schema": {"type": "string", "format": "binary"}},
        },
    },
}
_PROBLEM = {"content": {"application/problem+json": {"schema": inline_schema(Problem)}}}
_RESPONSES: dict[int | str, dict] = {
    202: {"description": "every event of the request is stored (per the store's flush policy)"},
    400: {"description": "malformed JSON or invalid event(s); `errors` lists each problem", **_PROBLEM},
    404: {"description": "unknown topic (and auto-create is off)", **_PROBLEM},
    405: {"description": "method other than POST / OPTIONS", **_PROBLEM},
    413: {"description": "body over 4/3 max_body_size + 64 KiB, data over max_body_size, or too many events"},
    415: {"description": "an event format other than JSON", **_PROBLEM},
}


async def read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None when it is over `limit` bytes (checked before reading when a
    Content-Length is given)."""
    length = request.headers.get("content-length")
    if length is not None:
        try:
            if int(length) > limit:
                return None
        except ValueError:
            return None
        return await request.body()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def router(service: CloudEvents) -> APIRouter:
    r = APIRouter(tags=["cloudevents"])
    processor = service.processor

    @r.post(
        PATH,
        status_code=202,
        response_class=Response,
        responses=_RESPONSES,
        openapi_extra=_OPENAPI,
        summary="Publish CloudEvents (binary, structured or batched mode)",
    )
    async def publish(topic: str, request: Request) -> Response:
        limits = processor.limits
        limit = request_limit(limits.max_body_size)
        body = await read_body(request, limit)
        if body is None:
            return problem(413, "body_too_large", f"request body over {limit} bytes")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        try:
            events = codec.decode(headers, body, max_events=limits.max_batch)
        except codec.CodecError as e:
            return problem(e.status, e.kind, str(e), e.problems)
        await service.store(context(request), topic, events)
        return Response(status_code=202)

    @r.options(
        PATH,
        status_code=200,
        response_class=Response,
        summary="CloudEvents webhook handshake (abuse protection)",
        responses={
            200: {"description": "granted: WebHook-Allowed-Origin and WebHook-Allowed-Rate headers"},
            405: {"description": "no WebHook-Request-Origin header", **_PROBLEM},
        },
    )
    async def handshake(topic: str, request: Request) -> Response:
        origin = request.headers.get("webhook-request-origin")
        if not origin:
            return method_not_allowed()
        return Response(
            status_code=200,
            headers={"Allow": ALLOW, "WebHook-Allowed-Origin": origin, "WebHook-Allowed-Rate": "*"},
        )

    @r.api_route(PATH, methods=["GET", "HEAD", "PUT", "PATCH", "DELETE"], include_in_schema=False)
    async def other(topic: str) -> Response:
        return method_not_allowed()

    return r
