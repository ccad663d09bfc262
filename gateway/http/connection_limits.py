"""The HTTP listener's connection limits (adapters/limits.py, docs/limits.md): a connection over the
listener's limit or its address's connection rate is answered `503 Service Unavailable` with
`Retry-After` (to its first request) and closed; uvicorn never sees it.

uvicorn has `limit_concurrency`, but it counts requests and tasks, not connections, answers without
`Retry-After` and knows nothing of source addresses: this subclasses the HTTP protocol class uvicorn
chose (h11 or httptools) instead, so a refusal costs one write and no request parsing."""

from __future__ import annotations

import asyncio
from typing import Any

from adapters.limits import Limiter, host_of

PROTOCOL = "http"
RETRY_AFTER_S = 1
REFUSED_WAIT_S = 5.0  # a refused connection that sends no request is closed after this
_BODY = b"too many connections; retry later\n"
REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %d\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (RETRY_AFTER_S, len(_BODY), _BODY)
)


def limited(protocol_class: type[asyncio.Protocol], limiter: Limiter) -> type[asyncio.Protocol]:
    """`protocol_class` that asks `limiter` before serving a connection."""

    class LimitedHttpProtocol(protocol_class):  # type: ignore[valid-type, misc]
        _refused: Any = None  # the transport of a refused connection
        _counted = False

        def connection_made(self, transport: Any) -> None:
            if limiter.accept(PROTOCOL, host_of(transport.get_extra_info("peername"))) is not None:
                # answered once the request arrives (a reply before it could be lost to a reset)
                self._refused = transport
                asyncio.get_running_loop().call_later(REFUSED_WAIT_S, transport.close)
                return
            self._counted = True
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            if self._refused is None:
                super().data_received(data)
            elif not self._refused.is_closing():
                self._refused.write(REFUSED)
                self._refused.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused is not None:
                return
            if self._counted:
                self._counted = False
                limiter.closed(PROTOCOL)
            super().connection_lost(exc)

    return LimitedHttpProtocol
