"""problem+json responses of the CloudEvents routes (the same shape as the gateway's other errors,
plus `errors`: every invalid attribute found), and the request identity."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from fastapi import Request
from fastapi.responses import JSONResponse

from messaging_processor import ANONYMOUS, ClientContext, Identity

from .validate import Problem

PROBLEM_TYPE = "application/problem+json"
ALLOW = "POST, OPTIONS"
_TITLES = {
    400: "Bad Request",
    405: "Method Not Allowed",
    413: "Content Too Large",
    415: "Unsupported Media Type",
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
    auth = request.headers.get("authorization")
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
    token = request.query_params.get("access_token")
    if token:
        return Identity(secret=token, mechanism="bearer")
    return ANONYMOUS


def context(request: Request) -> ClientContext:
    """The processor context of one HTTP request."""
    client = request.client
    remote = f"{client.host}:{client.port}" if client else ""
    return ClientContext(protocol="http", client_id=remote, identity=identity(request), remote=remote)
