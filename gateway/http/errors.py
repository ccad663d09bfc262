"""ProcessorError kinds -> HTTP status codes, and RFC 9457 problem+json bodies for every error."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from messaging_processor import ErrorKind, ProcessorError

PROBLEM_TYPE = "application/problem+json"

STATUS_BY_KIND: dict[ErrorKind, int] = {
    ErrorKind.BAD_REQUEST: 400,
    ErrorKind.ILLEGAL_TOPIC: 400,
    ErrorKind.ILLEGAL_GROUP: 400,
    ErrorKind.ILLEGAL_TAG: 400,
    ErrorKind.ILLEGAL_KEY: 400,
    ErrorKind.ILLEGAL_MESSAGE_GROUP: 400,
    ErrorKind.ILLEGAL_PROPERTY: 400,
    ErrorKind.ILLEGAL_DELIVERY_TIME: 400,
    ErrorKind.ILLEGAL_INVISIBLE_TIME: 400,
    ErrorKind.ILLEGAL_FILTER: 400,
    ErrorKind.ILLEGAL_POLLING_TIME: 400,
    ErrorKind.INVALID_RECEIPT_HANDLE: 400,
    ErrorKind.BODY_EMPTY: 400,
    ErrorKind.BODY_TOO_LARGE: 413,
    ErrorKind.PROPERTIES_TOO_LARGE: 413,
    ErrorKind.UNAUTHORIZED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.TOPIC_NOT_FOUND: 404,
    ErrorKind.GROUP_NOT_FOUND: 404,
    ErrorKind.MESSAGE_NOT_FOUND: 404,
    ErrorKind.TRANSACTION_NOT_FOUND: 404,
    ErrorKind.TOO_MANY_REQUESTS: 429,
    ErrorKind.STORE_FULL: 503,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.NOT_REPLICATED: 503,
    ErrorKind.UNSUPPORTED: 501,
    ErrorKind.INTERNAL: 500,
}

_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def problem(status: int, kind: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """A problem+json response: {type, title, status, kind, detail}."""
    body = {
        "type": "about:blank",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "kind": kind,
        "detail": detail,
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_TYPE, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    async def on_processor_error(request: Request, exc: ProcessorError) -> JSONResponse:
        status = STATUS_BY_KIND.get(exc.kind, 500)
        headers = {"Retry-After": "1"} if status in (429, 503) else None
        return problem(status, exc.kind.value, exc.message, headers)

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
        return problem(400, ErrorKind.BAD_REQUEST.value, "; ".join(parts) or "invalid request")

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = (
            "conflict" if exc.status_code == 409 else "not_found" if exc.status_code == 404 else "http_error"
        )
        return problem(exc.status_code, kind, str(exc.detail), getattr(exc, "headers", None))

    app.add_exception_handler(ProcessorError, on_processor_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
