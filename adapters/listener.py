"""The TCP listening sockets of one adapter: a plain server and, when a TLS context is given, a TLS
one on its own port, or (`permissive`) TLS on the plain port itself. The adapters (MQTT, AMQP,
remoting) keep their protocols and drain logic; this holds what was the same in all of them:
binding, the bound addresses, stop accepting, wait (`TcpListeners`), and what each tells the
gateway of them (`TcpAdapter`, the base of their adapter classes).

Permissive mode (RocketMQ's `tls.server.mode=permissive`) looks at each connection's first byte
before any protocol sees it: a TLS handshake record (0x16) is served over TLS, anything else in
clear unless `tls_required` (then the connection is closed and logged). asyncio servers cannot
look before the protocol reads, so this accepts itself: `sock_accept`, wait until readable,
`recv(1, MSG_PEEK)` (the byte stays in the socket), then `connect_accepted_socket` with or
without the context."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl as ssl_mod
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.tls import TLS_RECORD_HANDSHAKE

if TYPE_CHECKING:
    from messaging_processor import MessagingProcessor

log = logging.getLogger("adapters.listener")
SNIFF_TIMEOUT_S = 30.0  # a connection that sends nothing for this long is closed


def _address(server: asyncio.Server) -> str:
    host, port = server.sockets[0].getsockname()[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class TcpAdapter:
    """The listener half of the Adapter protocol (adapters/base.py) for an adapter that listens on
    `net`, its TcpListeners (MQTT, AMQP, remoting): the processor, the configured `host` and `port`,
    whether it listens, where, and the port it bound. The adapter starts `net` in its `start`,
    closes it first in its `stop` and waits for it last."""

    def __init__(self, processor: MessagingProcessor, host: str, port: int, net: TcpListeners) -> None:
        self.processor = processor
        self.host = host
        self.port = port
        self.net = net

    @property
    def listening(self) -> bool:
        return self.net.listening

    @property
    def address(self) -> str:
        return self.net.address

    @property
    def extra_listeners(self) -> dict[str, str]:
        """Listeners besides `address` (the TLS one when a certificate is configured)."""
        return self.net.extra_listeners

    @property
    def bound_port(self) -> int:
        return self.net.bound_port


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
        permissive: bool = False,
        tls_required: bool = False,
        reuse_port: bool = False,
    ) -> None:
        self.host = host
        self.reuse_port = reuse_port  # SO_REUSEPORT: the workers of `gateway start --workers` share the port
        self.port = port
        self.ssl = ssl
        self.tls_port = tls_port
        self.tls_name = tls_name
        self.permissive = permissive and ssl is not None
        self.tls_required = tls_required
        self._server: asyncio.Server | SniffingServer | None = None
        self._tls_server: asyncio.Server | None = None
        self.address = f"{host}:{port}"
        self.tls_address: str | None = None

    async def start(self, factory: Callable[[], asyncio.Protocol]) -> None:
        loop = asyncio.get_running_loop()
        if self.permissive:
            assert self.ssl is not None
            sniffing = SniffingServer(
                bind_tcp(self.host, self.port, reuse_port=self.reuse_port),
                factory,
                self.ssl,
                self.tls_required,
            )
            sniffing.start()
            self._server = sniffing
            self.address = sniffing.address
            return
        self._server = await loop.create_server(factory, self.host, self.port, reuse_port=self.reuse_port)
        self.address = _address(self._server)
        if self.ssl is not None:
            try:
                self._tls_server = await loop.create_server(
                    factory, self.host, self.tls_port, ssl=self.ssl, reuse_port=self.reuse_port
                )
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


def bind_tcp(host: str, port: int, backlog: int = 2048, *, reuse_port: bool = False) -> socket.socket:
    """A listening, non-blocking TCP socket on (host, port); raises OSError (busy port, bad address).
    `reuse_port`: SO_REUSEPORT, several processes listen on the port and the kernel spreads the
    connections."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class SniffingServer:
    """Accepts on `sock` and hands each connection to `factory`: over TLS (`ctx`) when its first
    byte starts a TLS handshake, else in clear, or closed when `tls_required`. Has the part of
    asyncio.Server's interface TcpListeners uses (`is_serving`, `close`, `wait_closed`)."""

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        ctx: ssl_mod.SSLContext,
        tls_required: bool,
        sniff_timeout: float = SNIFF_TIMEOUT_S,
    ) -> None:
        self.sock = sock
        self.factory = factory
        self.ctx = ctx
        self.tls_required = tls_required
        self.sniff_timeout = sniff_timeout
        host, port = sock.getsockname()[:2]
        self.address = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
        self._accepting: asyncio.Task | None = None
        self._pending: set[asyncio.Task] = set()

    def start(self) -> None:
        self._accepting = asyncio.get_running_loop().create_task(
            self._accept(), name=f"accept {self.address}"
        )

    def is_serving(self) -> bool:
        return self._accepting is not None and not self._accepting.done()

    def close(self) -> None:
        """Stop accepting; connections not yet handed over are closed."""
        for t in (self._accepting, *self._pending):
            if t is not None:
                t.cancel()
        self.sock.close()

    async def wait_closed(self) -> None:
        tasks = [t for t in (self._accepting, *self._pending) if t is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(self.sock)
            except OSError as e:  # EMFILE and the like: try again shortly
                log.warning("%s: accept failed: %s", self.address, e)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._hand_over(conn, peer))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _hand_over(self, conn: socket.socket, peer: tuple) -> None:
        loop = asyncio.get_running_loop()
        who = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        try:
            conn.setblocking(False)
            first = await asyncio.wait_for(_peek(conn), self.sniff_timeout)
            if not first:
                conn.close()
            elif first[0] == TLS_RECORD_HANDSHAKE:
                await loop.connect_accepted_socket(self.factory, conn, ssl=self.ctx)
            elif self.tls_required:
                log.info("%s: plain connection from %s refused: TLS is required", self.address, who)
                conn.close()
            else:
                await loop.connect_accepted_socket(self.factory, conn)
        except (OSError, ssl_mod.SSLError, TimeoutError, ConnectionError) as e:
            log.info("%s: connection from %s closed before it was served: %r", self.address, who, e)
            conn.close()
        except asyncio.CancelledError:
            conn.close()
            raise


async def _peek(conn: socket.socket) -> bytes:
    """The first byte the peer sent, left in the socket (b"" when it closed without sending)."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    fd = conn.fileno()
    loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
    try:
        await readable
    finally:
        loop.remove_reader(fd)
    try:
        return conn.recv(1, socket.MSG_PEEK)
    except ConnectionError:
        return b""
