"""The TCP listening sockets of one adapter: a plain server and, when a TLS context is given, a TLS
one on its own port. The adapters (MQTT, AMQP, remoting) keep their protocols and drain logic; this
holds what was the same in all of them: binding, the bound addresses, stop accepting, wait."""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_mod
from collections.abc import Callable


def _address(server: asyncio.Server) -> str:
    host, port = server.sockets[0].getsockname()[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class TcpListeners:
    """`start(factory)` binds `host:port` (and `host:tls_port` with `ssl`); `address`,
    `extra_listeners` ({tls_name: address}) and `bound_port` tell where; `close()` stops accepting,
    `wait_closed()` waits for the servers to be gone."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl: ssl_mod.SSLContext | None = None,
        tls_port: int = 0,
        tls_name: str = "tls",
    ) -> None:
        self.host = host
        self.port = port
        self.ssl = ssl
        self.tls_port = tls_port
        self.tls_name = tls_name
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None
        self.address = f"{host}:{port}"
        self.tls_address: str | None = None

    async def start(self, factory: Callable[[], asyncio.Protocol]) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(factory, self.host, self.port)
        self.address = _address(self._server)
        if self.ssl is not None:
            try:
                self._tls_server = await loop.create_server(factory, self.host, self.tls_port, ssl=self.ssl)
            except BaseException:
                self._server.close()
                raise
            self.tls_address = _address(self._tls_server)

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving()

    @property
    def extra_listeners(self) -> dict[str, str]:
        return {self.tls_name: self.tls_address} if self.tls_address else {}

    @property
    def bound_port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def close(self) -> None:
        """Stop accepting new connections (existing ones are the adapter's to close)."""
        for srv in (self._server, self._tls_server):
            if srv is not None:
                srv.close()

    async def wait_closed(self, timeout: float = 2.0) -> None:
        for srv in (self._server, self._tls_server):
            if srv is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(srv.wait_closed(), timeout)
        self._server = self._tls_server = None
