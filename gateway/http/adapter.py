"""HttpAdapter: serves the FastAPI app with uvicorn inside the gateway's event loop, over HTTP and,
with a TLS context, over HTTPS on a second port (a second uvicorn server sharing the app, whose
context is the one given, so that a certificate reload reaches it).

The gateway owns signals, so uvicorn's own signal capture is switched off; the listening socket is
bound here first so that a busy port raises OSError from `start()` instead of uvicorn's sys.exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Generator

import uvicorn
from fastapi import FastAPI

from adapters.limits import Limiter
from adapters.listener import bind_tcp

from .connection_limits import limited

log = logging.getLogger("gateway.http")


class _EmbeddedServer(uvicorn.Server):
    """uvicorn.Server that leaves signal handling to its host and reports when it is up."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.up.set()


def format_address(sockname: tuple) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HttpAdapter:
    """The HTTP listener (health, metrics, admin and read API, CloudEvents): an adapters.base.Adapter.
    With `ssl`, the same app is also served over HTTPS on `tls_port` (`extra_listeners["https"]`)."""

    name = "http"

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 8082,
        *,
        access_log: bool = False,
        ssl: ssl.SSLContext | None = None,
        tls_port: int = 8443,
        limiter: Limiter | None = None,
        reuse_port: bool = False,
    ):
        """`limiter`: connection limits (over them: 503 with Retry-After, connection_limits.py)."""
        self.app = app
        self.limiter = limiter
        self.host = host
        self.port = port
        self.access_log = access_log
        self.ssl = ssl
        self.tls_port = tls_port
        self.reuse_port = reuse_port  # SO_REUSEPORT: the workers of `gateway start --workers` share the port
        self._servers: list[tuple[_EmbeddedServer, asyncio.Task]] = []
        self._address = f"{host}:{port}"
        self._tls_address: str | None = None

    @property
    def address(self) -> str:
        return self._address

    @property
    def _server(self) -> _EmbeddedServer | None:
        """The plain HTTP server (tests look at its state)."""
        return self._servers[0][0] if self._servers else None

    @property
    def extra_listeners(self) -> dict[str, str]:
        return {"https": self._tls_address} if self._tls_address else {}

    @property
    def listening(self) -> bool:
        return bool(self._servers) and all(
            s.started and not s.should_exit and not t.done() for s, t in self._servers
        )

    async def start(self) -> None:
        sock = bind_tcp(self.host, self.port, reuse_port=self.reuse_port)
        self._address = format_address(sock.getsockname())
        await self._serve(sock, None)
        if self.ssl is not None:
            tls_sock = bind_tcp(self.host, self.tls_port, reuse_port=self.reuse_port)
            self._tls_address = format_address(tls_sock.getsockname())
            await self._serve(tls_sock, self.ssl)

    async def _serve(self, sock: socket.socket, context: ssl.SSLContext | None) -> None:
        address = format_address(sock.getsockname())
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,
            access_log=self.access_log,
            server_header=False,
            ssl_context_factory=(lambda _config, _default: context) if context is not None else None,
        )
        if self.limiter is not None:
            config.load()
            config.http_protocol_class = limited(config.http_protocol_class, self.limiter)
        server = _EmbeddedServer(config)
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        up = asyncio.ensure_future(server.up.wait())
        try:
            await asyncio.wait({task, up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
        if task.done():
            sock.close()
            exc = task.exception() if not task.cancelled() else None
            raise RuntimeError(f"HTTP server on {address} did not start: {exc!r}")
        self._servers.append((server, task))

    async def stop(self, grace: float) -> None:
        """Stop accepting now, let in-flight requests finish for up to `grace` s, then close."""
        servers, self._servers = self._servers, []
        await asyncio.gather(*(self._stop_one(s, t, grace) for s, t in servers))

    @staticmethod
    async def _stop_one(server: _EmbeddedServer, task: asyncio.Task, grace: float) -> None:
        if task.done():
            return
        server.config.timeout_graceful_shutdown = max(grace, 0.01)
        server.should_exit = True
        try:
            # uvicorn notices should_exit within 0.1 s, then waits up to `grace` and cancels the rest.
            await asyncio.wait_for(asyncio.shield(task), grace + 2.0)
        except TimeoutError:
            log.warning("HTTP server did not stop within %.1f s; closing it", grace + 2.0)
            server.force_exit = True
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        except Exception as e:  # noqa: BLE001 - a crash while stopping must not abort the shutdown
            log.warning("HTTP server failed while stopping: %r", e)
