"""The remoting listener: remoting.server's frame server (decode, one task per request, replies)
with `RemotingService` as its dispatch, and what a 4.x client connection holds
(`ClientConnection`). See docs/remoting.md."""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_mod
from collections.abc import Awaitable

from adapters.limits import ClientMeter, Limiter
from adapters.listener import TcpAdapter, TcpListeners
from adapters.remoting import message_codec as wm
from adapters.remoting.limits import RemotingLimits
from adapters.remoting.mapping import to_wire
from adapters.remoting.message_codec import encode_message, offset_msg_id
from adapters.remoting.service import RemotingService
from messaging_processor import ClientContext, Identity, Message, MessagingProcessor
from messaging_processor.model import TransactionCheck
from messaging_processor.security import remoting_content
from remoting import RemotingCommand, RequestCode
from remoting.codes import SYSFLAG_TRANSACTION_PREPARED
from remoting.server import FrameConnection, FrameServer
from runtime.tasks import cancel_and_wait

log = logging.getLogger("adapters.remoting")
PROTOCOL = "remoting"


class ClientConnection:
    """What the request handlers know of one 4.x client connection: its addresses, client id and
    ClientContext, and the requests the broker sends it (consumer ids changed, transaction checks).
    The frames themselves are remoting.server's `FrameConnection`."""

    __slots__ = ("frame", "service", "client_id", "_ctx", "_access_key", "_verified", "counted", "meter")

    def __init__(self, frame: FrameConnection, service: RemotingService) -> None:
        self.frame = frame
        self.service = service
        self.client_id = ""
        self._ctx: ClientContext | None = None
        self._access_key = ""
        self._verified: dict[str, ClientContext] = {}  # AccessKey -> context of its verified principal
        self.counted = False  # counted against the connection limits (adapters/remoting/limits.py)
        self.meter: ClientMeter | None = None  # its publish-rate meter, made at its first send

    @property
    def remote(self) -> str:
        return self.frame.remote

    @property
    def local_host(self) -> str:
        return self.frame.local_host

    @property
    def closed(self) -> bool:
        return self.frame.closed

    def write(self, cmd: RemotingCommand) -> None:
        self.frame.write(cmd)

    async def verified_context(self, cmd: RemotingCommand) -> ClientContext:
        """Security on: verify the request's ACL 1.0 signature (on every request: it covers the ext
        fields and the body) and return this connection's context for its AccessKey, whose principal
        (and ACL decision cache) lives as long as the connection. ProcessorError(UNAUTHORIZED) when
        the signature, the key or both are wrong or missing."""
        ext = cmd.ext_fields
        ak = ext.get("AccessKey", "")
        ident = (
            Identity(
                username=ak, mechanism="remoting-acl", attributes=(("signature", ext.get("Signature", "")),)
            )
            if ak
            else Identity()
        )
        cid = self.client_id or self.remote
        probe = ClientContext(PROTOCOL, cid, ident, self.remote)
        await self.service.processor.authenticate(probe, remoting_content(ext, cmd.body))
        ctx = self._verified.get(ak)
        p = probe.identity.principal
        q = ctx.identity.principal if ctx is not None else None
        if ctx is None or q is None or p is None or q.revoked or q.user != p.user or ctx.client_id != cid:
            if len(self._verified) >= 8:
                self._verified.clear()
            self._verified[ak] = ctx = probe
        return ctx

    def context(self, cmd: RemotingCommand) -> ClientContext:
        """The ClientContext of this connection (AccessKey as the identity; not verified: security
        off)."""
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

    # ------------------------------------------------------------------ broker -> client
    def notify_consumer_ids_changed(self, group: str) -> None:
        self.frame.oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})

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
            self.frame.oneway(RequestCode.CHECK_TRANSACTION_STATE, ext, encode_message(wire))

        return check


class RemotingAdapter(TcpAdapter):
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
        ssl: ssl_mod.SSLContext | None = None,
        tls_required: bool = False,
        limiter: Limiter | None = None,
        reuse_port: bool = False,
    ) -> None:
        """`ssl`: TLS on the same port in permissive mode (a client's ClientHello is detected);
        plain clients are refused when `tls_required`. `limiter`: connection and publish limits."""
        super().__init__(
            processor,
            host,
            port,
            TcpListeners(
                host, port, ssl=ssl, permissive=True, tls_required=tls_required, reuse_port=reuse_port
            ),
        )
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
        self.limits = self.service.limits = RemotingLimits(limiter) if limiter is not None else None
        self.frames = FrameServer(
            self, name="remoting", log=log, max_frame_size=max_frame_size, accepting=False
        )
        self._housekeeping: asyncio.Task | None = None

    # ------------------------------------------------------------------ FrameHandler
    def opened(self, conn: FrameConnection) -> None:
        state = conn.state = ClientConnection(conn, self.service)
        if self.limits is not None:
            if conn.transport is not None and self.limits.limiter.in_fd_reserve("remoting", conn.transport):
                return
            peer = conn.transport.get_extra_info("peername") if conn.transport is not None else None
            state.counted = self.limits.accept(peer, conn.remote)
            if not state.counted:
                conn.close()

    def closed(self, conn: FrameConnection) -> None:
        if conn.state.counted and self.limits is not None:
            self.limits.closed()
        self.service.clients.connection_closed(conn.state)

    def dispatch(self, conn: FrameConnection, cmd: RemotingCommand) -> Awaitable[RemotingCommand | None]:
        return self.service.dispatch(conn.state, cmd)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await self.net.start(self.frames.protocol)
        self.service.bound(self.net.bound_port)
        self.service.hold.start()
        self._housekeeping = loop.create_task(self._expire_clients(), name="remoting client expiry")
        self.frames.accepting = True

    async def _expire_clients(self) -> None:
        while True:
            await asyncio.sleep(max(min(self.service.clients.expiry_s / 4, 10.0), 0.05))
            self.service.clients.expire()

    async def stop(self, grace: float) -> None:
        """Stop accepting; let running requests finish for up to `grace` s (held pulls are answered
        at once), then close every connection."""
        self.frames.accepting = False
        self.net.close()
        await self.service.hold.stop()  # held pulls answer now (PULL_NOT_FOUND)
        await self.frames.drain(grace)
        await self.service.batcher.drain()
        await cancel_and_wait(self._housekeeping)
        self.frames.abort()
        await self.net.wait_closed()
