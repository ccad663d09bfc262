"""One MQTT connection's session: a small state machine over decoded packets.

The asyncio glue (server.py) feeds received bytes to `Session.feed` and gives the session two
callables, `write(bytes)` and `close()`; everything protocol-level happens here, everything shared
between connections in the parts of `Broker` (broker.py): the session registry (takeover,
persistent sessions), subscriptions, the publisher (store sends, retained messages).

States: CONNECTING (waiting for CONNECT; the codec refuses anything else), AUTHORIZING (CONNECT
being checked; packets that arrive meanwhile are kept and handled after the CONNACK), CONNECTED,
CLOSED. Replies that need the store (PUBACK/PUBREC after a durable send, SUBACK after the fan-out
is positioned) are produced by tasks but written in the order their requests arrived.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from messaging_processor import (
    ClientContext,
)
from runtime.deadlines import wheel_of
from runtime.events import LazyEvent

from . import acks
from .closing import connection_lost, on_disconnect
from .codec import (
    MQTT_5,
    PINGRESP,
    Connect,
    Decoder,
    Disconnect,
    MQTTCodecError,
    OutboundAliases,
    PropertyId,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Subscribe,
    Unsubscribe,
    encode_disconnect,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
    encode_unsuback,
)
from .codec.packets import Pingreq
from .connect import handle_connect
from .limits import admit_batch, admit_publish
from .mapping import P_CLIENT, to_message
from .persistence import qos2_mark
from .states import AUTHORIZING, CLOSED, CONNECTED, CONNECTING

__all__ = ["AUTHORIZING", "CLOSED", "CONNECTED", "CONNECTING", "Session"]

if TYPE_CHECKING:
    from ..limits import ReadThrottle
    from .limits import SessionLimits
    from .persistence import SessionState
    from .roles import SessionHost
    from .subscription import Sub
    from .token_expiry import TokenExpiry

log = logging.getLogger("adapters.mqtt")


class _Reply:
    __slots__ = ("data", "after", "done")

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.after: Callable[[], None] | None = None
        self.done = False


_NO_IDS: frozenset[int] = frozenset()  # `awaiting_rel` until the first inbound QoS 2 PUBLISH


class Session:
    """One connection's protocol state. Idle, it holds no timer, task, deque or event waiters of its
    own (docs/performance.md "Idle device memory"): keep-alive is a slot of the loop's deadline wheel
    (runtime/deadlines.py); the reply queue, outbound queue, task set and QoS 2 id set exist only
    while in use (an empty tuple / frozenset stands for them otherwise)."""

    __slots__ = (
        "broker",
        "cert_user",
        "transport",
        "_wbuf",
        "remote",
        "loop",
        "decoder",
        "state",
        "version",
        "client_id",
        "ctx",
        "since",
        "messages_in",
        "messages_out",
        "will",
        "keep_alive",
        "last_rx",
        "subs",
        "pstate",
        "nl_count",
        "expiry",
        "max_out",
        "awaiting_rel",
        "inflight",
        "queue",
        "send_quota",
        "aliases_out",
        "_next_pid",
        "_backlog",
        "_replies",
        "_tasks",
        "_ka_slot",
        "_token_expiry",
        "_normal_disconnect",
        "_closed_event",
        "limits",
        "throttle",
        "_writable",
    )

    def __init__(
        self,
        broker: SessionHost,
        transport: Any,
        remote: str = "",
        cert_user: str | None = None,
    ) -> None:
        self.broker = broker
        self.cert_user = cert_user  # the CN of a verified client certificate, when it names the user
        self.transport = transport  # what the session needs of it: write(bytes), close()
        self._wbuf: list[bytes] | None = None  # writes of one event-loop tick, sent with one syscall
        self.remote = remote
        self.loop = asyncio.get_running_loop()
        self.decoder = Decoder(max_packet_size=broker.max_packet_size)
        self.state = CONNECTING
        self.version = 4
        self.client_id = ""
        self.ctx = ClientContext("mqtt", remote=remote)
        self.since = time.time()  # connected at (the console's connections page)
        self.messages_in = 0  # PUBLISH packets received
        self.messages_out = 0  # PUBLISH packets sent
        self.will: Any = None
        self.keep_alive = 0
        self.last_rx = self.loop.time()
        self.subs: dict[str, Sub] = {}  # clean sessions only (persistent ones: pstate.subs)
        self.pstate: SessionState | None = None  # set while attached to a persistent session
        self.nl_count = 0  # No Local subscriptions: while > 0 publishes carry the client id
        self.expiry = 0  # Session Expiry Interval in force (s)
        self.max_out = 0  # the client's Maximum Packet Size (0: no limit)
        self.awaiting_rel: set[int] | frozenset[int] = _NO_IDS  # inbound QoS 2 ids between PUBREC and PUBREL
        self.inflight: dict[int, list[Any]] = {}  # outbound id -> [qos, done future, pubrec seen]
        self.queue: deque[tuple] | tuple = ()  # outbound QoS > 0 beyond the client's receive maximum
        self.send_quota = 65535  # the client's Receive Maximum (5.0)
        self.aliases_out: OutboundAliases | None = None  # topic aliases we send (client's maximum > 0)
        self._next_pid = 1
        self._backlog: list[Any] | None = None
        self._replies: deque[_Reply] | tuple = ()
        self._tasks: set[asyncio.Task] | tuple = ()
        self._ka_slot: int | None = None  # this session's slot in the keep-alive wheel
        self._token_expiry: TokenExpiry | None = None  # a device token's exp (token_expiry.py)
        self._normal_disconnect = False
        self._closed_event: LazyEvent | None = None  # made when someone waits for the close
        self.limits: SessionLimits | None = None  # connection and publish-rate limits (limits.py)
        self.throttle: ReadThrottle | None = None  # set at CONNECT when publish rates are limited
        self._writable: LazyEvent | None = None  # `writable`, made on first use

    # ------------------------------------------------------------------ output
    def _write(self, data: bytes) -> None:
        buf = self._wbuf
        if buf is None:
            self._wbuf = [data]
            self.loop.call_soon(self._flush_writes)
        else:
            buf.append(data)

    def _flush_writes(self) -> None:
        buf = self._wbuf
        if not buf or self.state == CLOSED:
            return
        self._wbuf = None
        self.transport.write(buf[0] if len(buf) == 1 else b"".join(buf))

    # ------------------------------------------------------------------ input
    def feed(self, data: bytes) -> None:
        if self.state == CLOSED:
            return
        self.last_rx = self.loop.time()
        batch: list[Publish] | None = None  # plain QoS 0/1 PUBLISHes of this read: one store send
        pkts, error = self.decoder.receive(data)
        try:
            for pkt in pkts:
                if self._backlog is not None:
                    self._backlog.append(pkt)
                    continue
                if type(pkt) is Publish and pkt.qos < 2 and not pkt.retain:
                    if batch is None:
                        batch = [pkt]
                    else:
                        batch.append(pkt)
                    continue
                if batch:
                    self._publish_batch(batch)
                    batch = None
                self.handle(pkt)
                if self.state == CLOSED:
                    return
            if error is not None:
                raise error
        except MQTTCodecError as e:
            if batch:
                self._publish_batch(batch)
            log.info("mqtt %s (%s): %s; closing", self.client_id or "-", self.remote, e)
            resp = e.response()
            if resp:
                self._write(resp)
            self.close()
            return
        if batch:
            self._publish_batch(batch)

    def handle(self, pkt: Any) -> None:
        t = type(pkt)
        if t is Publish:
            self._on_publish(pkt)
        elif t is Puback:
            self._on_puback(pkt.packet_id)
        elif t is Pubrel:
            self._on_pubrel(pkt.packet_id)
        elif t is Pubrec:
            self._on_pubrec(pkt)
        elif t is Pubcomp:
            self._on_puback(pkt.packet_id)
        elif t is Pingreq:
            self._reply_now(PINGRESP)
        elif t is Subscribe:
            self._reply_later(self.broker.subscriptions.subscribe(self, pkt))
        elif t is Unsubscribe:
            self._reply_later(self._unsubscribe(pkt))
        elif t is Disconnect:
            on_disconnect(self, pkt)
        elif t is Connect:
            self.state = AUTHORIZING
            self._backlog = []
            self._spawn(handle_connect(self, pkt))
        else:  # AUTH: no enhanced authentication in this slice
            self.close(ReasonCode.BAD_AUTHENTICATION_METHOD)

    # ------------------------------------------------------------------ ordered replies
    def _reply_now(self, data: bytes) -> None:
        if not self._replies:
            self._write(data)
        else:  # a non-empty deque
            r = _Reply()
            r.data = data
            r.done = True
            self._replies.append(r)

    def _reply_later(self, coro: Awaitable[tuple[bytes | None, Callable[[], None] | None]]) -> None:
        r = _Reply()
        if not self._replies:
            self._replies = deque()
        self._replies.append(r)

        async def run() -> None:
            try:
                r.data, r.after = await coro
            except Exception:  # noqa: BLE001
                log.exception("mqtt %s: request failed", self.client_id)
                r.data = None
            r.done = True
            if r.data is None:
                self.close(ReasonCode.UNSPECIFIED_ERROR)
                return
            self._flush()

        self._spawn(run())

    def _flush(self) -> None:
        q = self._replies
        while q and q[0].done:
            r = q.popleft()  # type: ignore[union-attr]
            if self.state == CLOSED:
                continue
            if r.data:
                self._write(r.data)
            if r.after is not None:
                r.after()
        if not q:
            self._replies = ()  # released until the next reply that waits

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task:
        t = self.loop.create_task(coro)  # type: ignore[arg-type]
        tasks = self._tasks
        if not tasks:
            tasks = self._tasks = set()
        tasks.add(t)  # type: ignore[union-attr]
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task) -> None:
        tasks = self._tasks
        if t in tasks:
            tasks.discard(t)  # type: ignore[union-attr]
            if not tasks:
                self._tasks = ()

    def deadline(self) -> None:
        """The keep-alive wheel's check (runtime/deadlines.py): nothing received for 1.5 x the
        keep-alive closes the connection (3.1.1 3.1.2.10, 5.0 3.1.2.10), else the next check is due
        1.5 x keep-alive after the last packet received."""
        self._ka_slot = None
        if self.state == CLOSED:
            return
        limit = self.keep_alive * 1.5
        idle = self.loop.time() - self.last_rx
        if idle >= limit:
            log.info("mqtt %s: keep-alive timeout after %.1f s", self.client_id, idle)
            self.close(ReasonCode.KEEP_ALIVE_TIMEOUT)
        else:
            self._ka_slot = wheel_of(self.loop).schedule(self, self.last_rx + limit)

    # ------------------------------------------------------------------ inbound PUBLISH
    def _on_publish(self, p: Publish) -> None:
        if self.throttle is not None and not admit_publish(self, p):
            return
        self.messages_in += 1
        qos = p.qos
        pid = p.packet_id
        if qos == 2:
            ids = self.awaiting_rel
            if pid in ids:  # a retransmission: already stored
                self._reply_now(encode_pubrec(pid, 0, self.version))
                return
            st = self.pstate
            if st is not None:  # (the same set as the persistent session's)
                ids = self.awaiting_rel = st.received_qos2(pid)
            else:
                if type(ids) is frozenset:
                    ids = self.awaiting_rel = set()
                ids.add(pid)  # type: ignore[union-attr]
        msg = to_message(p.topic, p.payload, qos, p.retain, p.properties if self.version == MQTT_5 else None)
        if self.nl_count:
            msg.properties[P_CLIENT] = self.client_id
        if qos == 1 and not p.retain:
            r = _Reply()
            if not self._replies:
                self._replies = deque()
            q = self._replies
            q.append(r)  # type: ignore[union-attr]  # (first: the answer may come at once)
            if self.broker.publisher.publish_nowait(self.ctx, msg, partial(self._puback, r, pid)):
                return
            q.pop()  # type: ignore[union-attr]
            if not q:
                self._replies = ()
        send = self.broker.publisher.publish(self.ctx, msg, p.retain)
        if qos == 0:
            self._spawn(send)
        else:
            self._reply_later(acks.answer(self, send, qos, pid, qos2_mark))

    def _puback(self, r: _Reply, pid: int, rc: int) -> None:
        """The answer to a QoS 1 PUBLISH stored without a task (Publisher.publish_nowait)."""
        r.data = acks.puback(self.version, pid, rc)
        r.done = True
        if r.data is None:
            self.close(ReasonCode.UNSPECIFIED_ERROR)
            return
        self._flush()

    def _publish_batch(self, pkts: list[Publish]) -> None:
        """Store consecutive non-retained QoS 0/1 PUBLISHes with one processor send (they share one
        group commit and one task); their PUBACKs go out together, in order."""
        if len(pkts) == 1:
            self._on_publish(pkts[0])
            return
        if self.throttle is not None and not admit_batch(self, pkts):
            for p in pkts:  # over the hard quota: what fits is stored, the rest refused, in order
                self._on_publish(p)
            return
        v5 = self.version == MQTT_5
        cid = self.client_id if self.nl_count else None
        msgs = []
        acks = []
        for i, p in enumerate(pkts):
            m = to_message(p.topic, p.payload, p.qos, False, p.properties if v5 else None)
            if cid is not None:
                m.properties[P_CLIENT] = cid
            msgs.append(m)
            if p.qos:
                acks.append((i, p.packet_id))
        send = self.broker.publisher.publish_many(self.ctx, msgs)
        if acks:
            self._reply_later(self._ack_many(send, acks))
        else:
            self._spawn(send)

    async def _ack_many(
        self, send: Awaitable[list[int]], pids: list[tuple[int, int]]
    ) -> tuple[bytes | None, None]:
        return acks.pubacks(self.version, await send, pids), None

    def _on_pubrel(self, pid: int) -> None:
        known = pid in self.awaiting_rel
        if known:
            self.awaiting_rel.discard(pid)  # type: ignore[union-attr]
        st = self.pstate
        if known and st is not None:
            self._spawn(qos2_mark(self.broker.processor, st, "i", pid, False))
        rc = 0 if known or self.version != MQTT_5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        self._reply_now(encode_pubcomp(pid, rc, self.version))

    # ------------------------------------------------------------------ outbound PUBLISH
    def deliver(
        self,
        path: str,
        body: bytes,
        qos: int,
        retain: bool,
        props: dict | None,
        done: asyncio.Future | None = None,
    ) -> None:
        """Send a message to this client (QoS already capped by the subscription). `done`, if
        given, gets True once the client acknowledged it (at once for QoS 0), False if the
        connection ends first."""
        if self.state != CONNECTED:
            if done is not None and not done.done():
                done.set_result(False)
            return
        self.messages_out += 1
        v = self.version
        if v != MQTT_5:
            props = None
        if not qos:
            if self.aliases_out is None:
                data = encode_publish(path, body, 0, None, retain, False, v, props)
            else:
                data = self._encode_aliased(path, body, 0, None, retain, props)
            if not self.max_out or len(data) <= self.max_out:
                self._write(data)
            if done is not None and not done.done():
                done.set_result(True)
            return
        if len(self.inflight) >= self.send_quota:
            if not self.queue:
                self.queue = deque()
            self.queue.append((path, body, qos, retain, props, done, time.monotonic()))  # type: ignore[union-attr]
            return
        pid = self._alloc_pid()
        if self.aliases_out is None:
            data = encode_publish(path, body, qos, pid, retain, False, v, props)
        else:
            data = self._encode_aliased(path, body, qos, pid, retain, props)
        if self.max_out and len(data) > self.max_out:  # too big for this client: discarded (5.0 3.1.2.25)
            if done is not None and not done.done():
                done.set_result(True)
            return
        self.inflight[pid] = [qos, done, False]
        self._write(data)

    def _encode_aliased(
        self, path: str, body: bytes, qos: int, pid: int | None, retain: bool, props: dict | None
    ) -> bytes:
        """A 5.0 PUBLISH with a topic alias (codec/aliases.py): the topic only on an alias's first
        use. A new alias whose PUBLISH is too big for the client (and so not sent) is given back."""
        aliases = self.aliases_out
        assert aliases is not None
        alias, known = aliases.assign(path)
        pp = {**props, PropertyId.TOPIC_ALIAS: alias} if props else {PropertyId.TOPIC_ALIAS: alias}
        data = encode_publish("" if known else path, body, qos, pid, retain, False, MQTT_5, pp)
        if not known and self.max_out and len(data) > self.max_out:
            aliases.forget(path)
        return data

    def _alloc_pid(self) -> int:
        pid = self._next_pid
        inflight = self.inflight
        while pid in inflight:
            pid = pid + 1 if pid < 0xFFFF else 1
        self._next_pid = pid + 1 if pid < 0xFFFF else 1
        return pid

    def _on_puback(self, pid: int) -> None:
        e = self.inflight.pop(pid, None)
        if e is None:
            return
        st = self.pstate
        if e[2] and st is not None and pid in st.pubrel:  # PUBCOMP of a persistent session's QoS 2
            st.pubrel.discard(pid)  # type: ignore[union-attr]
            self._spawn(qos2_mark(self.broker.processor, st, "o", pid, False))
        done = e[1]
        if done is not None and not done.done():
            done.set_result(True)
        if self.queue:
            self._send_queued()

    def _send_queued(self) -> None:
        """Fill the window from the queue, oldest first, skipping what expired while it waited
        (5.0 3.3.2-5: dropped, as handled; 3.3.2-6: the Message Expiry Interval sent is what is
        left of it)."""
        queue = self.queue
        while queue and len(self.inflight) < self.send_quota and self.state == CONNECTED:
            path, body, qos, retain, props, done, since = queue.popleft()  # type: ignore[union-attr]
            left = props.get(PropertyId.MESSAGE_EXPIRY_INTERVAL) if props else None
            if left is not None:
                waited = time.monotonic() - since
                if waited >= left:
                    if done is not None and not done.done():
                        done.set_result(True)
                    continue
                props = {**props, PropertyId.MESSAGE_EXPIRY_INTERVAL: left - int(waited)}
            self.deliver(path, body, qos, retain, props, done)
        if not self.queue:
            self.queue = ()  # released until the client's window is full again

    def _on_pubrec(self, p: Pubrec) -> None:
        e = self.inflight.get(p.packet_id)
        if p.reason_code >= 0x80:  # the client refused it: done
            self._on_puback(p.packet_id)
            return
        if e is not None and not e[2]:
            e[2] = True
            # The client owns the message now: the store may forget it, PUBREL must survive instead.
            st = self.pstate
            if st is not None:
                st.released_qos2(p.packet_id)
                self._spawn(qos2_mark(self.broker.processor, st, "o", p.packet_id, True))
            done = e[1]
            if done is not None and not done.done():
                done.set_result(True)
            e[1] = None
        self._write(encode_pubrel(p.packet_id, 0 if e is not None else 0x92, self.version))

    # ------------------------------------------------------------------ UNSUBSCRIBE / DISCONNECT
    async def _unsubscribe(self, u: Unsubscribe) -> tuple[bytes, None]:
        codes = []
        for f in u.topic_filters:
            codes.append(0 if await self.broker.subscriptions.unsubscribe(self, f) else 0x11)
        return encode_unsuback(u.packet_id, codes, self.version), None

    # ------------------------------------------------------------------ closing
    def close(self, reason: int | None = None) -> None:
        """Close the connection; for 5.0 send DISCONNECT `reason` first (if given and connected)."""
        if self.state == CLOSED:
            return
        if reason is not None and self.version == MQTT_5 and self.state == CONNECTED:
            self._write(encode_disconnect(reason, MQTT_5))
        self._flush_writes()
        self.transport.close()
        self.connection_lost()

    def connection_lost(self) -> None:
        """The transport is gone (idempotent): closing.py's `connection_lost`."""
        connection_lost(self)

    @property
    def writable(self) -> LazyEvent:
        """Clear while the transport's write buffer is over --max-outbound-bytes-per-connection
        (server.py): delivery loops do not pop, clean-session fan-out skips this session
        (docs/limits.md). Made on first use (set)."""
        ev = self._writable
        if ev is None:
            ev = self._writable = LazyEvent()
            ev.set()
        return ev

    def set_writable(self) -> None:
        """The write buffer drained (or the connection ended): release what waits for room."""
        if self._writable is not None:
            self._writable.set()

    @property
    def closed_event(self) -> LazyEvent:
        """Set once the connection is closed (made on first use: idle sessions hold none)."""
        ev = self._closed_event
        if ev is None:
            ev = self._closed_event = LazyEvent()
            if self.state == CLOSED:
                ev.set()
        return ev
