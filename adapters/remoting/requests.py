"""What a request handler is handed: the `Request` (the command, its client context, its
connection) and the `Service` state it reads, the service and the connection as protocols.

A handler is `handler(service, request) -> RemotingCommand | None` (None: no reply). The handlers
import this module only, never `service.py` (which composes them) or `server.py` (whose
`ClientConnection` is the connection)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from adapters.remoting.clients import Conn
from remoting import Ext, RemotingCommand, ResponseCode

if TYPE_CHECKING:
    from adapters.limits import ClientMeter
    from adapters.remoting.batcher import SendBatcher
    from adapters.remoting.clients import ClientTable
    from adapters.remoting.hold import PullHold
    from adapters.remoting.limits import RemotingLimits
    from adapters.remoting.pop_handles import PopHandles
    from messaging_processor import ClientContext, MessagingProcessor, RetryPolicy


class Connection(Conn, Protocol):
    """What the handlers and the dispatcher know of one 4.x client connection."""

    client_id: str
    meter: ClientMeter | None  # its publish-rate meter, made at its first send
    local_host: str

    def context(self, cmd: RemotingCommand) -> ClientContext: ...
    async def verified_context(self, cmd: RemotingCommand) -> ClientContext: ...


@dataclass(slots=True)
class Request:
    conn: Connection
    cmd: RemotingCommand
    ctx: ClientContext

    @property
    def ext(self) -> Ext:
        return Ext(self.cmd.ext_fields)

    def ok(
        self, ext_fields: dict[str, str] | None = None, body: bytes = b"", remark: str | None = None
    ) -> RemotingCommand:
        return self.cmd.response(ResponseCode.SUCCESS, remark, ext_fields, body)

    def reply(
        self,
        code: int,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        return self.cmd.response(code, remark, ext_fields, body)


class Service(Protocol):
    """The shared state the handlers read and change (`service.RemotingService` is it)."""

    processor: MessagingProcessor
    broker_name: str
    cluster_name: str
    default_queues: int
    max_pull_bytes: int
    store_host: tuple[str, int]
    limits: RemotingLimits | None
    clients: ClientTable
    hold: PullHold
    batcher: SendBatcher
    pop_handles: PopHandles
    group_policies: dict[str, tuple[tuple[int, RetryPolicy], float]]

    def broker_address(self, conn: Connection | None = None) -> str: ...

    async def queue_counts(
        self, ctx: ClientContext, topic: str, *, auto_create: bool | None = None
    ) -> tuple[int, int]: ...

    def forget_topic(self, topic: str) -> None: ...


Handler = Callable[[Service, Request], Awaitable[RemotingCommand | None]]
