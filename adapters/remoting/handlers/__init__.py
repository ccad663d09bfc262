"""Request handlers of the remoting listener, one module per concern; `HANDLERS` maps every
request code the gateway serves to its coroutine `handler(service, request)`."""

from __future__ import annotations

from typing import Any

from . import client, pop, pull, retry, route, send

HANDLERS: dict[int, Any] = {}
for _m in (route, client, send, retry, pull, pop):
    HANDLERS.update(_m.HANDLERS)

__all__ = ["HANDLERS"]
