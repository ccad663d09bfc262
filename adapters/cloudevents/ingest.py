"""POST /topics/{topic}/events: binary, structured and batched CloudEvents in; 202 once stored.

OPTIONS answers the webhook abuse-protection handshake (`WebHook-Allowed-Origin`/`-Rate` when
`WebHook-Request-Origin` is present, else 405); other methods get 405 with `Allow`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from messaging_processor import ClientContext

from . import codec
from .event import Event
from .models import CloudEventJSON, Problem, inline_schema
from .problems import ALLOW, method_not_allowed, problem, scope_context

if TYPE_CHECKING:
    from messaging_processor import MessagingProcessor

    from .limits import IngestLimits

StoreEvents = Callable[[ClientContext, str, Sequence[Event]], Awaitable[None]]

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
    429: {"description": "over the publish rate (docs/limits.md); `Retry-After` says when to retry"},
    415: {"description": "an event format other than JSON", **_PROBLEM},
}


class _Disconnected(Exception):
    """The client went away before the request body was complete."""


async def read_body(receive: Receive, content_length: bytes | str | None, limit: int) -> bytes | None:
    """The request body, or None when it is over `limit` bytes (checked before reading when a
    Content-Length is given). Raises _Disconnected when the client leaves first."""
    if content_length is not None:
        try:
            if int(content_length) > limit:
                return None
        except ValueError:
            return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_ACCEPTED_START = {"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"0")]}
_EMPTY_BODY = {"type": "http.response.body", "body": b""}


class IngestEndpoint:
    """POST /topics/{topic}/events as a raw ASGI app.

    It is registered as a plain Starlette route ahead of the documented FastAPI route of the same
    path (which does the same through `handle`), so the hot path skips FastAPI's per-request
    machinery (dependency solving, a Request object, response classes): the request's headers are
    read straight from the ASGI scope and the 202 is two prebuilt messages. Errors are the same:
    codec errors answer problem+json here, a ProcessorError propagates to the app's handler.

    `store(ctx, topic, events)` stores a request's events (the service's, with its idempotency);
    `limits` is the publish-rate limit, None when off."""

    def __init__(
        self, processor: MessagingProcessor, store: StoreEvents, limits: IngestLimits | None
    ) -> None:
        self.processor = processor
        self.store = store
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[str, str]] = []
        content_length = None
        for k, v in scope["headers"]:
            if k == b"content-length":
                content_length = v
            elif k == b"content-type" or k.startswith(b"ce-"):
                headers.append((k.decode("latin-1"), v.decode("latin-1")))
        processor = self.processor
        limit = request_limit(processor.limits.max_body_size)
        try:
            body = await read_body(receive, content_length, limit)
        except _Disconnected:
            return
        response = await self.handle(scope, headers, body)
        if response is None:
            await send(_ACCEPTED_START)
            await send(_EMPTY_BODY)
        else:
            await response(scope, receive, send)

    async def handle(
        self, scope: Scope, headers: list[tuple[str, str]], body: bytes | None
    ) -> Response | None:
        """None once the events are stored (answer 202), else the error response."""
        processor = self.processor
        if body is None:
            limit = request_limit(processor.limits.max_body_size)
            return problem(413, "body_too_large", f"request body over {limit} bytes")
        try:
            events = codec.decode(headers, body, max_events=processor.limits.max_batch)
        except codec.CodecError as e:
            return problem(e.status, e.kind, str(e), e.problems)
        limits = self.limits
        if limits is not None and (wait := limits.retry_after(scope, len(events), len(body))):
            return problem(
                429, "too_many_requests", "publish rate over its limit", headers={"Retry-After": str(wait)}
            )
        await self.store(scope_context(scope), scope["path_params"]["topic"], events)
        return None


def raw_route(endpoint: IngestEndpoint) -> Route:
    return Route(PATH, endpoint, methods=["POST"], include_in_schema=False)


def put_first(app: Starlette, endpoint: IngestEndpoint) -> None:
    """Put the raw ingest route at the head of the app's routing table. The gateway's app routes
    health, metrics and the admin API first, and FastAPI matches every route of an included router
    in turn (no prefix shortcut): ~25 µs per request before the ingest route is reached. Other
    methods on the path still fall through to the routes of `router()` (handshake, 405)."""
    app.router.routes.insert(0, raw_route(endpoint))


def router(endpoint: IngestEndpoint) -> APIRouter:
    r = APIRouter(tags=["cloudevents"])
    # The raw ASGI route serves every POST; the FastAPI route below documents it (OpenAPI) and
    # would serve it the same way should the raw one ever be removed.
    r.add_route(PATH, endpoint, methods=["POST"], include_in_schema=False)

    @r.post(
        PATH,
        status_code=202,
        response_class=Response,
        responses=_RESPONSES,
        openapi_extra=_OPENAPI,
        summary="Publish CloudEvents (binary, structured or batched mode)",
    )
    async def publish(topic: str, request: Request) -> Response:
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.headers.raw
            if k == b"content-type" or k.startswith(b"ce-")
        ]
        limit = request_limit(endpoint.processor.limits.max_body_size)
        try:
            body = await read_body(request.receive, request.headers.get("content-length"), limit)
        except _Disconnected:
            return Response(status_code=400)
        response = await endpoint.handle(request.scope, headers, body)
        return Response(status_code=202) if response is None else response

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
