"""HttpAdapter: serves the FastAPI app with uvicorn inside the gateway's event loop.

The gateway owns signals, so uvicorn's own signal capture is switched off; the listening socket is
bound here first so that a busy port raises OSError from `start()` instead of uvicorn's sys.exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator

import uvicorn
from fastapi import FastAPI

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


def bind_tcp(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening, non-blocking TCP socket on (host, port); raises OSError (busy port, bad address)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def format_address(sockname: tuple) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class HttpAdapter:
    """The HTTP listener (health, metrics, admin and read API, CloudEvents): an adapters.base.Adapter."""

    name = "http"

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 8082, *, access_log: bool = False):
        self.app = app
        self.host = host
        self.port = port
        self.access_log = access_log
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task | None = None
        self._address = f"{host}:{port}"

    @property
    def address(self) -> str:
        return self._address

    @property
    def listening(self) -> bool:
        s, t = self._server, self._task
        return s is not None and t is not None and s.started and not s.should_exit and not t.done()

    async def start(self) -> None:
        sock = bind_tcp(self.host, self.port)
        self._address = format_address(sock.getsockname())
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,
            access_log=self.access_log,
            server_header=False,
        )
        server = self._server = _EmbeddedServer(config)
        task = self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        up = asyncio.ensure_future(server.up.wait())
        try:
            await asyncio.wait({task, up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
        if task.done():
            sock.close()
            exc = task.exception() if not task.cancelled() else None
            raise RuntimeError(f"HTTP server on {self._address} did not start: {exc!r}")

    async def stop(self, grace: float) -> None:
        """Stop accepting now, let in-flight requests finish for up to `grace` s, then close."""
        server, task = self._server, self._task
        if server is None or task is None or task.done():
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
