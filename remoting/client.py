"""A small asyncio remoting client: request/response by opaque, oneway requests, and a callback for
requests the server sends (CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED).

Used by the name server's clients (store nodes and proxies registering, see namesrv/client.py),
CLUSTER mode's store connections and by tests. Not a RocketMQ client library: no routes, no
rebalancing. `connect(..., auth=ClusterAuth)` proves the cluster secret before anything else is
sent and checks the server's proof (remoting/cluster_auth.py); `connect(..., ssl=context)` speaks
TLS, verifying the server's certificate for `host` as the context says. A host `unix:PATH` connects
to the Unix socket PATH instead."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl as ssl_mod
from collections.abc import Awaitable, Callable

from remoting import FLAG_ONEWAY, Decoder, RemotingCodecError, RemotingCommand, ResponseCode
from remoting.cluster_auth import AUTH_CODE, AuthRefused, ClusterAuth

log = logging.getLogger("remoting.cluster_auth")
UNIX_PREFIX = "unix:"  # a host of this form names a Unix socket path; the port is then unused
ServerRequestHandler = Callable[[RemotingCommand], Awaitable[RemotingCommand | None] | None]


class RemotingClientError(ConnectionError):
    pass


class ClusterAuthError(RemotingClientError):
    """The cluster handshake failed: the peer refused us, or does not hold the secret."""


def _time_out(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class RemotingClient:
    """One connection. `await RemotingClient.connect(host, port)`, then `invoke` / `oneway`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_request: ServerRequestHandler | None = None,
        *,
        language: str = "PYTHON",
        version: int = 401,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.on_request = on_request
        self.language = language
        self.version = version
        self.requests: list[RemotingCommand] = []  # server-initiated requests seen (for tests)
        self.server_requests: asyncio.Queue[RemotingCommand] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._opaque = itertools.count(1)
        self._decoder = Decoder()
        self._reader_task = asyncio.get_running_loop().create_task(self._read())
        self.closed = asyncio.Event()

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        on_request: ServerRequestHandler | None = None,
        *,
        timeout: float = 5.0,
        auth: ClusterAuth | None = None,
        ssl: ssl_mod.SSLContext | None = None,
        **kw: object,
    ) -> RemotingClient:
        """Open a connection (over TLS with `ssl`: ssl.SSLError when the handshake fails); with
        `auth`, authenticated (ClusterAuthError when refused)."""
        if host.startswith(UNIX_PREFIX):  # a local store node on a Unix socket (`gateway start --workers`)
            opening = asyncio.open_unix_connection(host[len(UNIX_PREFIX) :])
        else:
            opening = asyncio.open_connection(
                host, port, ssl=ssl, server_hostname=host if ssl is not None else None
            )
        r, w = await asyncio.wait_for(opening, timeout)
        client = cls(r, w, on_request, **kw)  # type: ignore[arg-type]
        if auth is not None:
            try:
                await client.authenticate(auth, f"{host}:{port}", timeout)
            except BaseException:
                await client.close()
                raise
        return client

    async def authenticate(self, auth: ClusterAuth, peer: str, timeout: float = 5.0) -> None:
        """The cluster handshake: send the hello, check the server's answer. One warning line
        (without the secret) and ClusterAuthError when either side refuses."""
        hello = auth.hello()
        try:
            r = await self.invoke(AUTH_CODE, dict(hello), timeout=timeout)
        except RemotingClientError as e:
            why = f"connection closed during the cluster authentication ({e})"
        else:
            if r.code == ResponseCode.SUCCESS:
                try:
                    auth.check_welcome(hello, r.ext_fields)
                    return
                except AuthRefused as e:
                    why = str(e)
            elif r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                why = "it takes no cluster authentication (started without a cluster secret?)"
            else:
                why = f"{r.remark or 'refused'} (code {r.code})"
        log.warning("cluster peer %s refused: %s", peer, why)
        raise ClusterAuthError(f"cluster peer {peer} refused: {why}")

    def command(
        self, code: int, ext: dict[str, object] | None = None, body: bytes = b"", *, oneway: bool = False
    ) -> RemotingCommand:
        fields = {k: str(v) for k, v in (ext or {}).items() if v is not None}
        return RemotingCommand(
            code,
            next(self._opaque),
            FLAG_ONEWAY if oneway else 0,
            self.language,
            self.version,
            ext_fields=fields,
            body=body,
        )

    async def invoke(
        self,
        code_or_cmd: int | RemotingCommand,
        ext: dict[str, object] | None = None,
        body: bytes = b"",
        *,
        timeout: float = 10.0,
        raw: bytes | None = None,
    ) -> RemotingCommand:
        """Send a request and wait for its response. `raw`: send these bytes as the frame instead
        (for tests of what clients send), matched by the opaque of `code_or_cmd`."""
        cmd = (
            code_or_cmd if isinstance(code_or_cmd, RemotingCommand) else self.command(code_or_cmd, ext, body)
        )
        if self.closed.is_set():
            raise RemotingClientError("connection closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        self._pending[cmd.opaque] = fut
        # a timer that fails the future (asyncio.wait_for costs about 6 µs more per request)
        timer = loop.call_later(timeout, _time_out, fut)
        try:
            self.writer.write(raw if raw is not None else cmd.encode())
            return await fut
        finally:
            timer.cancel()
            self._pending.pop(cmd.opaque, None)

    def oneway(self, code: int, ext: dict[str, object] | None = None, body: bytes = b"") -> None:
        self.writer.write(self.command(code, ext, body, oneway=True).encode())

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def _read(self) -> None:
        try:
            while True:
                data = await self.reader.read(1 << 16)
                if not data:
                    break
                self._decoder.feed(data)
                for cmd in self._decoder:
                    if cmd.is_response:
                        fut = self._pending.pop(cmd.opaque, None)
                        if fut is not None and not fut.done():
                            fut.set_result(cmd)
                    else:
                        self.requests.append(cmd)
                        self.server_requests.put_nowait(cmd)
                        if self.on_request is not None:
                            await self._answer(cmd)
        except (ConnectionError, RemotingCodecError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed.set()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(RemotingClientError("connection closed"))

    async def _answer(self, cmd: RemotingCommand) -> None:
        assert self.on_request is not None
        resp = self.on_request(cmd)
        if asyncio.iscoroutine(resp) or isinstance(resp, asyncio.Future):
            resp = await resp
        if resp is not None and not cmd.is_oneway:
            self.writer.write(resp.encode())

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader_task
