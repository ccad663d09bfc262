"""Device shadow API on the HTTP port (messaging_processor/shadows.py, docs/shadows.md):

    GET    /shadows/{topic}          the topic's shadows: key, version, timestamp
    GET    /shadows/{topic}/{key}    the document; ETag "<version>"
    PUT    /shadows/{topic}/{key}    JSON merge patch {"state": {"desired"|"reported": ...}, "version"?}
                                     (application/merge-patch+json or application/json); If-Match
    DELETE /shadows/{topic}/{key}    delete (If-Match optional)

Reads need subscribe on path `T/K/shadow`, writes publish on `T/K/shadow/update` (the paths an
MQTT device uses). Errors are problem+json; a version mismatch is 409 (the body's `version`) or
412 (If-Match)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from adapters.cloudevents.problems import context
from messaging_processor import ErrorKind, MessagingProcessor, ProcessorError
from messaging_processor.shadows import (
    Shadow,
    ShadowError,
    ShadowNotFound,
    ShadowService,
    VersionConflict,
    status_of,
)

from .deps import get_processor
from .errors import problem

router = APIRouter(prefix="/shadows", tags=["shadows"])

Processor = Annotated[MessagingProcessor, Depends(get_processor)]
PATCH_TYPES = ("application/merge-patch+json", "application/json")

_ERRORS = {
    400: {"description": "bad key or update (problem+json)"},
    404: {"description": "no such topic or shadow (problem+json)"},
    409: {"description": "topic not compacted, version conflict (problem+json)"},
}


class ShadowSummary(BaseModel):
    key: str
    version: int
    timestamp: int


class ShadowList(BaseModel):
    topic: str
    shadows: list[ShadowSummary]


class ShadowDocument(BaseModel):
    state: dict
    version: int
    timestamp: int


def _service(p: MessagingProcessor) -> ShadowService:
    return ShadowService.for_processor(p)


def _refused(e: ShadowError, if_match: bool = False) -> JSONResponse:
    status = 412 if if_match and isinstance(e, VersionConflict) else status_of(e)
    headers = None
    if isinstance(e, VersionConflict) and e.current:
        headers = {"ETag": f'"{e.current}"'}
    return problem(status, e.kind, e.message, headers)


def _document(shadow: Shadow, status: int = 200) -> JSONResponse:
    return JSONResponse(
        shadow.document(),
        status_code=status,
        headers={"ETag": f'"{shadow.version}"', "Cache-Control": "no-store"},
    )


def _expected(if_match: str | None) -> int | None:
    """The version an If-Match names (None: no header or `*`)."""
    if if_match is None or if_match.strip() == "*":
        return None
    tag = if_match.strip().removeprefix("W/").strip('"')
    try:
        v = int(tag)
    except ValueError:
        raise ProcessorError(ErrorKind.BAD_REQUEST, 'If-Match must be one ETag "<version>" or *') from None
    if v < 0:
        raise ProcessorError(ErrorKind.BAD_REQUEST, "If-Match version is negative")
    return v


@router.get("/{topic}", response_model=ShadowList, responses=_ERRORS)
async def list_shadows(topic: str, request: Request, p: Processor) -> ShadowList | JSONResponse:
    """The shadows of compacted topic `topic` the caller may read, by key."""
    try:
        shadows = await _service(p).list(context(request), topic)
    except ShadowError as e:
        return _refused(e)
    return ShadowList(
        topic=topic,
        shadows=[ShadowSummary(key=s.key, version=s.version, timestamp=s.timestamp) for s in shadows],
    )


@router.get("/{topic}/{key}", response_model=ShadowDocument, responses=_ERRORS)
async def get_shadow(topic: str, key: str, request: Request, p: Processor) -> JSONResponse:
    """The shadow document; its ETag is the version."""
    try:
        return _document(await _service(p).get(context(request), topic, key))
    except ShadowError as e:
        return _refused(e)


@router.put(
    "/{topic}/{key}",
    response_model=ShadowDocument,
    responses={**_ERRORS, 412: {"description": "If-Match names another version"}, 415: {}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {t: {"schema": {"type": "object"}} for t in PATCH_TYPES},
        }
    },
)
async def update_shadow(
    topic: str,
    key: str,
    request: Request,
    p: Processor,
    if_match: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    """Merge-patch the shadow's state (RFC 7396: null deletes a member); version + 1. 201 when the
    shadow is new, else 200; the new document either way. A change of `desired` is published to
    MQTT path `<topic>/<key>/shadow/desired`."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in PATCH_TYPES:
        return problem(415, "unsupported_media_type", f"use {' or '.join(PATCH_TYPES)}")
    body = await request.body()
    if len(body) > p.limits.max_body_size:
        raise ProcessorError(ErrorKind.BODY_TOO_LARGE, "the update is larger than the body size limit")
    expected = _expected(if_match)
    svc = _service(p)
    ctx = context(request)
    try:
        if if_match is not None and expected is None:  # If-Match: * -> the shadow must exist
            await svc.get(ctx, topic, key)
        shadow = await svc.update(ctx, topic, key, body, expected)
    except ShadowNotFound as e:
        return problem(412, e.kind, e.message) if if_match is not None else _refused(e)
    except ShadowError as e:
        return _refused(e, if_match=if_match is not None)
    return _document(shadow, 201 if shadow.version == 1 else 200)


@router.delete("/{topic}/{key}", status_code=204, responses={**_ERRORS, 412: {}})
async def delete_shadow(
    topic: str,
    key: str,
    request: Request,
    p: Processor,
    if_match: Annotated[str | None, Header()] = None,
) -> Response:
    """Delete the shadow (a tombstone); a later PUT starts again at version 1."""
    try:
        await _service(p).delete(context(request), topic, key, _expected(if_match))
    except ShadowError as e:
        return _refused(e, if_match=if_match is not None)
    return Response(status_code=204)
