"""The frame server every remoting listener runs (the 4.x adapter, the name server, CLUSTER mode's
store node): thin asyncio glue around the sans-IO `Decoder`. Each listener supplies only a
`FrameHandler` (its dispatch and what it keeps per connection); this module does the rest:

- decode frames as bytes arrive; replies to our own oneway requests are dropped;
- run every request as its own task (a long poll must not hold up the requests behind it), at
  most `max_inflight` per connection: beyond that, and while the server is not `accepting`, a
  request is answered SYSTEM_BUSY (`[OVERLOAD] ...`) and a oneway request dropped;
- write the handler's reply (none for oneway requests), stop reading a client that does not read
  its replies (transport flow control), and close the connection on a codec error;
- `drain(grace)` lets running requests finish on shutdown, `abort()` closes every connection;
- with a cluster secret (`auth`, remoting/cluster_auth.py) a connection is served only once its
  first frame, the AUTH hello, checked out: any other first frame, a bad hello, or no hello within
  AUTH_TIMEOUT_S is refused (NO_PERMISSION), logged without the secret, and the connection closed;
- `serve_tcp(..., ssl=context)` serves TLS only (the name server's and store nodes' ports).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import ssl as ssl_mod
from collections.abc import Awaitable
from typing import Any, Protocol

from .cluster_auth import AUTH_CODE, AUTH_TIMEOUT_S, AuthRefused, ClusterAuth
from .codes import FLAG_ONEWAY, ResponseCode
from .command import MAX_FRAME_SIZE, Decoder, RemotingCodecError, RemotingCommand

MAX_INFLIGHT = 4096  # requests one connection may have running; more get SYSTEM_BUSY
_opaque = itertools.count(1)


class FrameHandler(Protocol):
    """What a listener supplies. `dispatch` answers one request (None: no reply); `opened` and
    `closed` see each connection come and go (`opened` may set `conn.state`)."""

    def dispatch(self, conn: FrameConnection, cmd: RemotingCommand) -> Awaitable[RemotingCommand | None]: ...

    def opened(self, conn: FrameConnection) -> None: ...

    def closed(self, conn: FrameConnection) -> None: ...


class FrameConnection(asyncio.Protocol):
    """One client connection of a `FrameServer`. `tasks` maps the opaque of each running request
    to its task (`cancel(opaque)` abandons one); `state` is the listener's per-connection object."""

    def __init__(self, server: FrameServer) -> None:
        self.server = server
        self.handler = server.handler
        self.decoder = Decoder(server.max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.remote = ""
        self.local_host = "127.0.0.1"
        self.closed = False
        self.tasks: dict[int, asyncio.Task] = {}
        self.state: Any = None
        self.authenticated = server.auth is None  # with a cluster secret: once its hello checked out
        self._auth_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")
        sock = transport.get_extra_info("sockname")
        if isinstance(sock, tuple):
            self.local_host = str(sock[0])
        self.server.connections.add(self)
        if not self.authenticated:
            self._auth_timer = asyncio.get_running_loop().call_later(
                self.server.auth_timeout_s, self._refuse, None, "no cluster authentication in time"
            )
        self.handler.opened(self)

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        try:
            for cmd in self.decoder:
                if cmd.is_response:  # replies to our oneway requests: nothing waits for them
                    continue
                if self.authenticated:
                    self._start(cmd)
                elif not self._authenticate(cmd):
                    return
        except RemotingCodecError as e:
            self.server.log.info("%s connection %s: %s; closing it", self.server.name, self.remote, e)
            self.close()

    def pause_writing(self) -> None:
        """The client does not read its replies fast enough: stop reading its requests."""
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self.server.connections.discard(self)
        self.handler.closed(self)
        for t in list(self.tasks.values()):
            t.cancel()

    # ------------------------------------------------------------------ cluster secret
    def _authenticate(self, cmd: RemotingCommand) -> bool:
        """Check the first frame of a connection that must authenticate; False: refused, closed."""
        auth = self.server.auth
        assert auth is not None
        try:
            if cmd.code != AUTH_CODE:
                raise AuthRefused("no cluster authentication")
            reply = auth.check_hello(cmd.ext_fields)
        except AuthRefused as e:
            self._refuse(cmd, str(e))
            return False
        self.authenticated = True
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self.write(cmd.response(ResponseCode.SUCCESS, None, reply))
        return True

    def _refuse(self, cmd: RemotingCommand | None, why: str) -> None:
        if self.closed:
            return
        self.server.log.warning("cluster peer %s refused: %s", self.remote, why)
        if cmd is not None and not cmd.is_oneway:
            self.write(cmd.response(ResponseCode.NO_PERMISSION, why))
        self.close()

    # ------------------------------------------------------------------ requests
    def _start(self, cmd: RemotingCommand) -> None:
        server = self.server
        if len(self.tasks) >= server.max_inflight or not server.accepting:
            if not cmd.is_oneway:
                why = "too many requests in flight" if server.accepting else "shutting down"
                self.write(cmd.response(ResponseCode.SYSTEM_BUSY, f"[OVERLOAD] {why}"))
            return
        t = asyncio.get_running_loop().create_task(self._serve(cmd))
        opaque = cmd.opaque
        self.tasks[opaque] = t

        def done(task: asyncio.Task) -> None:
            if self.tasks.get(opaque) is task:  # not a later request that reused the opaque
                del self.tasks[opaque]

        t.add_done_callback(done)

    async def _serve(self, cmd: RemotingCommand) -> None:
        resp = await self.handler.dispatch(self, cmd)
        if resp is not None and not cmd.is_oneway:
            self.write(resp)

    def cancel(self, opaque: int) -> None:
        """Abandon the running request `opaque` of this connection (its dispatch sees
        CancelledError and may still answer)."""
        t = self.tasks.get(opaque)
        if t is not None:
            t.cancel()

    # ------------------------------------------------------------------ writing
    def write(self, cmd: RemotingCommand) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(cmd.encode())

    def oneway(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"") -> None:
        """A server-initiated oneway request (no reply is awaited)."""
        self.write(
            RemotingCommand(code, next(_opaque) & 0x7FFFFFFF, FLAG_ONEWAY, ext_fields=ext or {}, body=body)
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class FrameServer:
    """The connections of one remoting listener. Pass `protocol` as the protocol factory to
    `loop.create_server` (or adapters' TcpListeners); set `accepting` once serving. `auth`: the
    cluster secret every connection must prove first (None: open, as for 4.x clients)."""

    def __init__(
        self,
        handler: FrameHandler,
        *,
        name: str,
        log: logging.Logger,
        max_frame_size: int = MAX_FRAME_SIZE,
        max_inflight: int = MAX_INFLIGHT,
        accepting: bool = True,
        auth: ClusterAuth | None = None,
        auth_timeout_s: float = AUTH_TIMEOUT_S,
    ) -> None:
        self.handler = handler
        self.name = name
        self.log = log
        self.max_frame_size = max_frame_size
        self.max_inflight = max_inflight
        self.accepting = accepting
        self.auth = auth  # a cluster secret: every connection authenticates first
        self.auth_timeout_s = auth_timeout_s
        self.connections: set[FrameConnection] = set()

    def protocol(self) -> FrameConnection:
        return FrameConnection(self)

    def running(self) -> list[asyncio.Task]:
        """The requests running on every connection."""
        return [t for c in self.connections for t in c.tasks.values()]

    async def drain(self, grace: float) -> None:
        """Wait up to `grace` s for the running requests to finish."""
        tasks = self.running()
        if tasks and grace > 0:
            await asyncio.wait(tasks, timeout=grace)

    def abort(self) -> None:
        """Close every connection at once (running requests are cancelled)."""
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()


async def serve_tcp(
    server: FrameServer, host: str, port: int, ssl: ssl_mod.SSLContext | None = None
) -> tuple[asyncio.Server, str]:
    """Listen on host:port for `server` (TLS only with `ssl`: a plain client's handshake fails and
    its connection is closed); the asyncio server and the bound `host:port`."""
    srv = await asyncio.get_running_loop().create_server(server.protocol, host, port, ssl=ssl)
    sock = srv.sockets[0].getsockname()
    return srv, f"{sock[0]}:{sock[1]}"


async def serve_unix(server: FrameServer, path: str) -> tuple[asyncio.Server, str]:
    """Listen on the Unix socket `path` for `server` (a stale socket file there is replaced);
    the asyncio server and its address `unix:PATH`. Who may connect is the path's directory's
    permissions' business."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    srv = await asyncio.get_running_loop().create_unix_server(server.protocol, path)
    return srv, f"unix:{path}"


async def close_tcp(srv: asyncio.Server | None, timeout: float = 2.0) -> None:
    """Stop accepting and wait (up to `timeout`) for the listening socket to close."""
    if srv is None:
        return
    srv.close()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(srv.wait_closed(), timeout)
