"""The FastAPI app of the HTTP port: health, metrics, admin, read API and shadow routes here;
protocol routes (CloudEvents, adapters/cloudevents) are mounted as extra routers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from fastapi import APIRouter, FastAPI

from adapters.base import Adapter
from messaging_processor import MessagingProcessor

from . import admin, console, health, messages_api, metrics, read_api, security_api, shadows, trace_api
from .auth import AuthMiddleware
from .errors import install_error_handlers

ListenerSource = Callable[[], Iterable[Adapter]]


def _no_listeners() -> list[Adapter]:
    return []


def create_app(
    processor: MessagingProcessor,
    extra_routers: Sequence[APIRouter] = (),
    *,
    listeners: ListenerSource = _no_listeners,
    title: str = "msg-gateway",
) -> FastAPI:
    """Build the app over `processor`. `listeners()` returns the gateway's enabled adapters (for
    /healthz and the listener gauge); `extra_routers` are included after the built-in ones. With
    `processor.security` set (auth on), requests are authenticated first (auth.py)."""
    app = FastAPI(
        title=title,
        summary="Health, Prometheus metrics, admin, read and device shadow APIs of the messaging gateway.",
        version="0.1.0",
    )
    app.state.processor = processor
    app.state.listeners = listeners
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(admin.router)
    app.include_router(trace_api.router)  # before messages_api: /admin/messages/trace is no id
    app.include_router(messages_api.router)
    app.include_router(security_api.router)
    app.include_router(read_api.router)
    app.include_router(shadows.router)
    app.include_router(console.router)
    for router in extra_routers:
        app.include_router(router)
    if processor.security is not None:  # auth on: every route but /healthz needs credentials
        app.add_middleware(AuthMiddleware, processor=processor)
    return app
