"""The remoting listener: thin asyncio glue (one `RemotingConnection` per TCP connection) around
the sans-IO codec and `RemotingService`. See docs/remoting.md."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

from adapters.listener import TcpListeners
from adapters.remoting.codec import (
    FLAG_ONEWAY,
    Decoder,
    RemotingCodecError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    encode_message,
    offset_msg_id,
)
from adapters.remoting.codec import message as wm
from adapters.remoting.codec.codes import SYSFLAG_TRANSACTION_PREPARED
from adapters.remoting.mapping import to_wire
from adapters.remoting.service import RemotingService
from messaging_processor import ClientContext, Identity, Message, MessagingProcessor
from messaging_processor.model import TransactionCheck

log = logging.getLogger("adapters.remoting")
PROTOCOL = "remoting"
MAX_INFLIGHT = 4096  # requests one connection may have running; more get SYSTEM_BUSY
_opaque = itertools.count(1)


class RemotingConnection(asyncio.Protocol):
    """One client connection: decode frames, run each request as a task, write the replies."""

    def __init__(self, adapter: RemotingAdapter) -> None:
        self.adapter = adapter
        self.service = adapter.service
        self.decoder = Decoder(adapter.max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.remote = ""
        self.local_host = "127.0.0.1"
        self.client_id = ""
        self.closed = False
        self.tasks: set[asyncio.Task] = set()
        self._ctx: ClientContext | None = None
        self._access_key = ""

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")
        sock = transport.get_extra_info("sockname")
        if isinstance(sock, tuple):
            self.local_host = str(sock[0])
        self.adapter.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        try:
            for cmd in self.decoder:
                if cmd.is_response:
                    continue  # replies to our oneway notifications: nothing waits for them
                self._start(cmd)
        except RemotingCodecError as e:
            log.info("remoting connection %s: %s; closing it", self.remote, e)
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
        self.adapter.connections.discard(self)
        self.service.clients.connection_closed(self)
        for t in list(self.tasks):
            t.cancel()

    # ------------------------------------------------------------------ requests
    def _start(self, cmd: RemotingCommand) -> None:
        if len(self.tasks) >= MAX_INFLIGHT or not self.adapter.accepting:
            if not cmd.is_oneway:
                why = "too many requests in flight" if self.adapter.accepting else "shutting down"
                self.write(cmd.response(ResponseCode.SYSTEM_BUSY, f"[OVERLOAD] {why}"))
            return
        t = asyncio.get_running_loop().create_task(self._serve(cmd))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def _serve(self, cmd: RemotingCommand) -> None:
        resp = await self.service.dispatch(self, cmd)
        if resp is not None:
            self.write(resp)

    def context(self, cmd: RemotingCommand) -> ClientContext:
        """The ClientContext of this connection (AccessKey as the identity; not verified)."""
        ak = cmd.ext_fields.get("AccessKey", "")
        if (
            self._ctx is None
            or ak != self._access_key
            or self._ctx.client_id != (self.client_id or self.remote)
        ):
            self._access_key = ak
            ident = (
                Identity(
                    username=ak,
                    secret=cmd.ext_fields.get("Signature") or None,
                    mechanism="rocketmq-acl-hmac-sha1",
                )
                if ak
                else Identity()
            )
            self._ctx = ClientContext(PROTOCOL, self.client_id or self.remote, ident, self.remote)
        return self._ctx

    def write(self, cmd: RemotingCommand) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(cmd.encode())

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ broker -> client
    def _oneway(self, code: int, ext: dict[str, str], body: bytes = b"") -> None:
        self.write(RemotingCommand(code, next(_opaque) & 0x7FFFFFFF, FLAG_ONEWAY, ext_fields=ext, body=body))

    def notify_consumer_ids_changed(self, group: str) -> None:
        self._oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})

    def transaction_checker(self, group: str) -> TransactionCheck:
        """The hook the processor calls for an unresolved half message of producer group `group`:
        CHECK_TRANSACTION_STATE (oneway) with the half message; the producer answers with
        END_TRANSACTION. Raises (the processor then asks another producer) when the message is
        not this group's or the connection is gone."""

        async def check(msg: Message, transaction_id: str) -> None:
            if self.closed:
                raise ConnectionError("producer connection closed")
            if msg.properties.get(wm.PROPERTY_PRODUCER_GROUP) != group:
                raise LookupError(f"half message is not from producer group {group}")
            svc = self.service
            clo = int(transaction_id)
            extra = {wm.PROPERTY_TRANSACTION_PREPARED: "true"}
            wire = to_wire(msg, svc.store_host, extra=extra, sys_flag=SYSFLAG_TRANSACTION_PREPARED)
            wire.commitlog_offset = clo
            tx_id = msg.properties.get(wm.PROPERTY_TRANSACTION_ID) or msg.message_id
            ext = {
                "topic": msg.topic,
                "tranStateTableOffset": str(max(msg.queue_offset, 0)),
                "commitLogOffset": str(clo),
                "msgId": msg.message_id,
                "transactionId": tx_id,
                "offsetMsgId": offset_msg_id(svc.store_host[0], svc.store_host[1], clo),
            }
            self._oneway(RequestCode.CHECK_TRANSACTION_STATE, ext, encode_message(wire))

        return check


class RemotingAdapter:
    """RocketMQ 4.x remoting listener: name server and broker for 4.x clients (the Adapter protocol
    of adapters/base.py). Clients use `namesrvAddr=<host>:<port>`."""

    name = "remoting"

    def __init__(
        self,
        processor: MessagingProcessor,
        host: str = "127.0.0.1",
        port: int = 8080,
        *,
        advertise_host: str | None = None,
        broker_name: str = "gateway",
        cluster_name: str = "DefaultCluster",
        default_queues: int = 8,
        max_frame_size: int = 16 * 1024 * 1024,
        client_expiry_s: float = 120.0,
        hold_interval: float = 0.1,
    ) -> None:
        self.processor = processor
        self.host = host
        self.port = port
        self.max_frame_size = max_frame_size
        self.service = RemotingService(
            processor,
            host=host,
            advertise_host=advertise_host,
            broker_name=broker_name,
            cluster_name=cluster_name,
            default_queues=default_queues,
            client_expiry_s=client_expiry_s,
            hold_interval=hold_interval,
        )
        self.connections: set[RemotingConnection] = set()
        self.accepting = False
        self.net = TcpListeners(host, port)
        self._housekeeping: asyncio.Task | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await self.net.start(lambda: RemotingConnection(self))
        self.service.bound(self.net.bound_port)
        self.service.hold.start()
        self._housekeeping = loop.create_task(self._expire_clients(), name="remoting client expiry")
        self.accepting = True

    async def _expire_clients(self) -> None:
        while True:
            await asyncio.sleep(max(min(self.service.clients.expiry_s / 4, 10.0), 0.05))
            self.service.clients.expire()

    @property
    def listening(self) -> bool:
        return self.net.listening

    @property
    def address(self) -> str:
        return self.net.address

    @property
    def bound_port(self) -> int:
        return self.service.port

    async def stop(self, grace: float) -> None:
        """Stop accepting; let running requests finish for up to `grace` s (held pulls are answered
        at once), then close every connection."""
        self.accepting = False
        self.net.close()
        await self.service.hold.stop()  # held pulls answer now (PULL_NOT_FOUND)
        tasks = [t for c in self.connections for t in c.tasks]
        if tasks and grace > 0:
            await asyncio.wait(tasks, timeout=grace)
        await self.service.batcher.drain()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()
        await self.net.wait_closed()
