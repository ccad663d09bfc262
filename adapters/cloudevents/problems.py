"""problem+json responses of the CloudEvents routes (the same shape as the gateway's other errors,
plus `errors`: every invalid attribute found), and the request identity."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.types import Scope

from messaging_processor import ANONYMOUS, ClientContext, Identity

from .validate import Problem

PROBLEM_TYPE = "application/problem+json"
ALLOW = "POST, OPTIONS"
# Where the HTTP port's authentication middleware (gateway/http/auth.py) leaves the verified
# Identity of a request; without it (auth off) the identity is read from the request's credentials.
IDENTITY_KEY = "msg.identity"
_TITLES = {
    400: "Bad Request",
    405: "Method Not Allowed",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
}


def problem(
    status: int,
    kind: str,
    detail: str,
    errors: Sequence[Problem] = (),
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, object] = {
        "type": "about:blank",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "kind": kind,
        "detail": detail,
    }
    if errors:
        body["errors"] = [p.as_dict() for p in errors]
    return JSONResponse(body, status_code=status, media_type=PROBLEM_TYPE, headers=headers)


def method_not_allowed() -> JSONResponse:
    return problem(405, "method_not_allowed", f"use one of {ALLOW}", headers={"Allow": ALLOW})


def identity(request: Request) -> Identity:
    """Credentials as the webhook spec passes them: `Authorization: Bearer <token>` (or Basic), or
    the `access_token` query parameter. The processor's authorizer decides what they allow."""
    return scope_identity(request.scope)


def scope_identity(scope: Scope) -> Identity:
    """`identity` of an ASGI scope."""
    auth = None
    for k, v in scope["headers"]:
        if k == b"authorization":
            auth = v.decode("latin-1")
            break
    if auth:
        scheme, _, value = auth.partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer" and value:
            return Identity(secret=value.strip(), mechanism="bearer")
        if scheme == "basic" and value:
            try:
                user, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return ANONYMOUS
            return Identity(username=user, secret=password, mechanism="plain")
    query = scope.get("query_string", b"")
    if b"access_token" in query:
        # as Starlette's query_params: blank values kept, the last one wins
        token = dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True)).get("access_token")
        if token:
            return Identity(secret=token, mechanism="bearer")
    return ANONYMOUS


def context(request: Request) -> ClientContext:
    """The processor context of one HTTP request."""
    return scope_context(request.scope)


def scope_context(scope: Scope) -> ClientContext:
    """`context` of an ASGI scope: the verified identity when authentication is on."""
    client = scope.get("client")
    remote = f"{client[0]}:{client[1]}" if client else ""
    ident = scope.get(IDENTITY_KEY) or scope_identity(scope)
    return ClientContext(protocol="http", client_id=remote, identity=ident, remote=remote)
