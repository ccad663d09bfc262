"""Request-scoped accessors for what the app was built with."""

from __future__ import annotations

from fastapi import Request

from adapters.base import Adapter
from messaging_processor import MessagingProcessor


def get_processor(request: Request) -> MessagingProcessor:
    """FastAPI dependency: the processor this app serves."""
    return request.app.state.processor


def get_listeners(request: Request) -> list[Adapter]:
    """The gateway's enabled listeners (empty when the app runs without a gateway)."""
    return list(request.app.state.listeners())
