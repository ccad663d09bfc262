"""One AMQP connection: a state machine over the codec's events.

The asyncio glue (server.py) feeds received bytes to `Connection.feed` and gives the connection
`write(bytes)`, `close()` and reading pause/resume callables; channels (channel.py) do the rest.

States: HEADER (protocol header expected) -> START (connection.start sent, start-ok expected;
credentials checked by processor.authenticate, or its authorizer without security; what arrives
meanwhile waits, in order) -> TUNE (tune-ok expected) -> OPENING (connection.open expected; the
vhost checked) -> OPEN -> CLOSING (connection.close sent, close-ok expected) ->
CLOSED. Errors: a channel error closes the channel (channel.close, the connection stays usable),
any other closes the connection (connection.close, then the socket); framing errors that lose
sync with the byte stream close the socket at once. Writes of one event-loop tick are sent with one
transport write; heartbeats go out when nothing else did for half the interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from messaging_processor import (
    Action,
    ClientContext,
    ErrorKind,
    ProcessorError,
    Resource,
)
from runtime.deadlines import wheel_of
from runtime.events import LazyEvent

from . import codec as c
from . import events
from .channel import CLOSED as CH_CLOSED
from .channel import CLOSING as CH_CLOSING
from .channel import Channel, ChannelBroker
from .codec import (
    HEARTBEAT,
    AMQPError,
    Decoder,
    Heartbeat,
    Message,
    Method,
    ProtocolHeader,
    ReplyCode,
    encode_method,
)
from .login import Refused, log_in, mechanisms, offered
from .mapping import now_ms
from .publish import PublishAcl

if TYPE_CHECKING:
    from ..limits import ReadThrottle
    from .blocking import Blocking
    from .limits import ConnectionLimits
    from .queues import Queue
    from .routing import VHost

log = logging.getLogger("adapters.amqp")

HEADER, START, TUNE, OPENING, OPEN, CLOSING, CLOSED = range(7)
SERVER_PROPERTIES = {
    "product": "msg-gateway",
    "version": "0.1",
    "platform": "Python",
    "information": "AMQP 0-9-1 adapter of msg-gateway",
    "capabilities": {
        "publisher_confirms": True,
        "exchange_exchange_bindings": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
        "per_consumer_qos": True,
        "consumer_priorities": False,
        "direct_reply_to": True,
    },
    "cluster_name": "msg-gateway",
}


class SessionBroker(ChannelBroker, Protocol):
    """What a connection (and its channels) use of the broker (broker.py `Broker`): handed in by
    the glue (server.py), so that this module does not import the broker's."""

    blocking: Blocking
    max_inflight_publishes: int

    def connection_closed(self, conn: Connection) -> None: ...


class Connection:
    def __init__(
        self,
        broker: SessionBroker,
        write: Callable[[bytes], Any],
        close: Callable[[], Any],
        remote: str = "",
        pause_reading: Callable[[], Any] | None = None,
        resume_reading: Callable[[], Any] | None = None,
        *,
        heartbeat: int = 60,
        frame_max: int = c.DEFAULT_FRAME_MAX,
        channel_max: int = 2047,
        cert_user: str | None = None,
    ) -> None:
        """`cert_user`: the CN of a verified client certificate (AMQPS); SASL EXTERNAL is then offered
        and logs in as that user."""
        self.broker = broker
        self.cert_user = cert_user
        self._transport_write = write
        self._close = close
        self._pause = pause_reading
        self._resume = resume_reading
        self.remote = remote
        self.loop = asyncio.get_running_loop()
        self.decoder = Decoder(decode_properties=False, keep_body_size=broker.max_body_size)
        self.state = HEADER
        self.ctx = ClientContext("amqp", remote=remote)
        self.since = time.time()  # connected at (the console's connections page)
        self.messages_in = 0  # basic.publish received
        self.messages_out = 0  # basic.deliver sent
        # what consumers pop with: `ctx` itself, or with authentication on the same user as an
        # in-process identity (the adapter checks `subscribe` on the queue; its store group is the
        # mapping's own, not something ACL rules name)
        self.pop_ctx = self.ctx
        self.publish_acl: PublishAcl | None = None  # with authentication on: what it may publish to
        self.vhost_obj: VHost | None = None
        self.channels: dict[int, Channel] = {}
        self.exclusive_queues: set[Queue] = set()
        self.heartbeat = heartbeat
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.cancel_notify = False
        self.blocked_notify = False
        self.writable = LazyEvent()
        self.writable.set()
        # --max-outbound-bytes-per-connection (server.py sets it): consumers' delivery loops pop only while
        # `writable` (docs/limits.md "Memory per connection"); 0: not bounded
        self.max_outbound_bytes = 0
        self.last_rx = self.loop.time()
        self.last_tx = self.last_rx
        self._wbuf: list[bytes] = []
        self._tasks: set[asyncio.Task] = set()
        self._backlog: list[Any] | None = None
        self._timer: asyncio.TimerHandle | None = self.loop.call_later(10.0, self._handshake_timeout)
        self._inflight = 0
        self._paused = False
        self.closed_event = LazyEvent()
        self._tick_slot: int | None = None  # the heartbeat tick's slot in the loop's deadline wheel
        self.limits: ConnectionLimits | None = None  # connection and publish-rate limits (limits.py)
        self.throttle: ReadThrottle | None = None  # set at login when publish rates are limited
        self.announced = False  # client events: connection.created was emitted (events.py)
        self.close_reason: tuple[str, int | None, str | None] | None = None  # ... and why it ends

    @property
    def ended(self) -> bool:
        """The connection is closing or closed."""
        return self.state >= CLOSING

    # ------------------------------------------------------------------ output
    def write(self, data: bytes) -> None:
        if self.state == CLOSED:
            return
        if not self._wbuf:
            self.loop.call_soon(self._flush_writes)
        self._wbuf.append(data)

    def _flush_writes(self) -> None:
        buf = self._wbuf
        if not buf or self.state == CLOSED:
            return
        self._wbuf = []
        self.last_tx = self.loop.time()
        self._transport_write(buf[0] if len(buf) == 1 else b"".join(buf))

    def spawn(self, coro: Any) -> asyncio.Task:
        t = self.loop.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def publishes_started(self, n: int) -> None:
        self._inflight += n
        if not self._paused and self._inflight > self.broker.max_inflight_publishes and self._pause:
            self._paused = True
            self._pause()

    def publishes_done(self, n: int) -> None:
        self._inflight -= n
        if self._paused and self._inflight <= self.broker.max_inflight_publishes // 2:
            self._paused = False
            if self._resume is not None and self.state != CLOSED:
                self._resume()

    # ------------------------------------------------------------------ input
    def feed(self, data: bytes) -> None:
        if self.state == CLOSED:
            return
        self.last_rx = self.loop.time()
        dec = self.decoder
        batch: list[Message] | None = None
        bch = 0
        try:
            dec.feed(data)
            while True:
                ev = dec.next_event()
                if ev is None:
                    break
                if type(ev) is Message:
                    if batch is not None:
                        if ev.channel == bch:
                            batch.append(ev)
                            continue
                        self._publish(bch, batch)
                    batch = [ev]
                    bch = ev.channel
                    continue
                if batch is not None:
                    self._publish(bch, batch)
                    batch = None
                self._handle(ev)
                if self.state == CLOSED:
                    return
        except AMQPError as e:
            if batch is not None:
                self._publish(bch, batch)
            self.fail(e)
            return
        except Exception as e:  # noqa: BLE001 - a bug closes this connection, not the listener
            log.exception("amqp %s: internal error", self.remote)
            self.fail(AMQPError(ReplyCode.INTERNAL_ERROR, f"{type(e).__name__}: {e}"))
            return
        if batch is not None:
            self._publish(bch, batch)

    def _publish(self, number: int, batch: list[Message]) -> None:
        if self._backlog is not None:  # the handshake is not done yet: in order, after it
            self._backlog.append((number, batch))
            return
        ch = self.channels.get(number)
        if ch is None:
            if self.state == OPEN:
                self.fail(AMQPError(ReplyCode.CHANNEL_ERROR, f"expected 'channel.open' on channel {number}"))
            return
        if self.throttle is not None:
            self.throttle.charge(len(batch), sum([len(m.body) for m in batch]))
        ch.handle(batch)

    def _handle(self, ev: Any) -> None:
        t = type(ev)
        if t is Heartbeat:
            return
        if self._backlog is not None:
            self._backlog.append(ev)
            return
        if t is Method:
            if ev.channel:
                self._channel_method(ev)
            else:
                self._connection_method(ev.method)
        elif t is ProtocolHeader:
            self.state = START
            start = c.ConnectionStart(
                0,
                9,
                SERVER_PROPERTIES,
                b" ".join(mechanisms(self.broker.processor, self.cert_user)),
                b"en_US",
            )
            self.write(encode_method(0, start))

    def _channel_method(self, ev: Method) -> None:
        if self.state != OPEN:
            if self.state != CLOSING:
                self.fail(AMQPError(ReplyCode.COMMAND_INVALID, f"{ev.method.NAME} before connection.open"))
            return
        n = ev.channel
        m = ev.method
        ch = self.channels.get(n)
        if type(m) is c.ChannelOpen:
            if ch is not None:
                self.fail(
                    AMQPError(
                        ReplyCode.CHANNEL_ERROR,
                        f"second 'channel.open' seen on channel {n}",
                        class_id=20,
                        method_id=10,
                    )
                )
            elif self.channel_max and len(self.channels) >= self.channel_max:
                # RabbitMQ counts open channels against channel_max, whatever their numbers
                self.fail(
                    AMQPError(
                        ReplyCode.NOT_ALLOWED,
                        f"number of channels opened ({len(self.channels)}) has reached the "
                        f"negotiated channel_max ({self.channel_max})",
                        class_id=20,
                        method_id=10,
                    )
                )
            else:
                self.channels[n] = Channel(self, n)
                self.write(encode_method(n, c.ChannelOpenOk()))
            return
        if ch is None:
            self.fail(
                AMQPError(
                    ReplyCode.CHANNEL_ERROR,
                    f"expected 'channel.open' on channel {n}",
                    class_id=m.CLASS_ID,
                    method_id=m.METHOD_ID,
                )
            )
            return
        if ch.state == CH_CLOSING:  # we closed it: only the client's close / close-ok count
            if type(m) is c.ChannelCloseOk:
                self.channel_closed(ch)
            elif type(m) is c.ChannelClose:
                self.write(encode_method(n, c.ChannelCloseOk()))
                self.channel_closed(ch)
            return
        ch.handle(ev)

    def channel_closed(self, ch: Channel) -> None:
        ch.state = CH_CLOSED
        if self.channels.get(ch.number) is ch:
            del self.channels[ch.number]

    # ------------------------------------------------------------------ connection class
    def _connection_method(self, m: Any) -> None:
        t = type(m)
        st = self.state
        if t is c.ConnectionClose:
            log.debug("amqp %s: client closes: %s %s", self.remote, m.reply_code, m.reply_text)
            self.close_reason = self.close_reason or ("normal", m.reply_code, m.reply_text)
            self.write(encode_method(0, c.ConnectionCloseOk()))
            self.close()
        elif t is c.ConnectionCloseOk:
            if st == CLOSING:
                self.close()
        elif st == START and t is c.ConnectionStartOk:
            self._backlog = []
            self.spawn(self._start_ok(m))
        elif st == TUNE and t is c.ConnectionTuneOk:
            self._tune_ok(m)
        elif st == OPENING and t is c.ConnectionOpen:
            self._backlog = []
            self.spawn(self._open(m))
        elif st == OPEN and t is c.ConnectionUpdateSecret:
            self.write(encode_method(0, c.ConnectionUpdateSecretOk()))
        elif st != CLOSING:
            self.fail(
                AMQPError(
                    ReplyCode.COMMAND_INVALID,
                    f"{m.NAME} not expected now",
                    class_id=m.CLASS_ID,
                    method_id=m.METHOD_ID,
                )
            )

    def _resume_backlog(self) -> None:
        backlog, self._backlog = self._backlog, None
        for ev in backlog or ():
            if self.state in (CLOSING, CLOSED):
                return
            if type(ev) is tuple:  # (channel, publishes); after a new wait they queue up again
                self._publish(*ev)
            else:
                self._handle(ev)

    async def _start_ok(self, m: c.ConnectionStartOk) -> None:
        caps = m.client_properties.get("capabilities") if isinstance(m.client_properties, dict) else None
        if isinstance(caps, dict):
            self.cancel_notify = bool(caps.get("consumer_cancel_notify"))
            self.blocked_notify = bool(caps.get("connection.blocked"))
        mech = m.mechanism
        p = self.broker.processor
        if not offered(p, self.cert_user, mech):
            self._refuse(ReplyCode.COMMAND_INVALID, f"unknown authentication mechanism '{mech}'")
            return
        if self.limits is not None and (why := self.limits.refused()) is not None:
            self._refuse(ReplyCode.NOT_ALLOWED, why)
            return
        try:  # (argon2 runs in a thread meanwhile: what the client sends waits in the backlog)
            await log_in(self, p, mech, m.response, self.cert_user)
        except Refused as e:
            if self.broker.events is not None:
                events.auth_failed(self, mech, e.user)
            self._refuse(ReplyCode.ACCESS_REFUSED, e.text)
            return
        if self.state != START:
            return
        if self.limits is not None and (why := self.limits.login(self)) is not None:
            self._refuse(ReplyCode.NOT_ALLOWED, why)
            return
        self.state = TUNE
        self.write(encode_method(0, c.ConnectionTune(self.channel_max, self.frame_max, self.heartbeat)))
        self._resume_backlog()

    def _tune_ok(self, m: c.ConnectionTuneOk) -> None:
        fm = m.frame_max or self.frame_max
        if fm < c.FRAME_MIN_SIZE or fm > self.frame_max:
            self._refuse(
                ReplyCode.NOT_ALLOWED,
                f"frame_max {m.frame_max} outside [{c.FRAME_MIN_SIZE}, {self.frame_max}]",
            )
            return
        self.frame_max = fm
        self.decoder.frame_max = fm
        if m.channel_max:
            self.channel_max = min(self.channel_max, m.channel_max)
        self.heartbeat = m.heartbeat
        self.state = OPENING

    async def _open(self, m: c.ConnectionOpen) -> None:
        vhost = m.virtual_host or "/"
        p = self.broker.processor
        identity = self.ctx.identity
        try:
            if p.security is not None:
                if not p.may_open_vhost(identity, vhost):
                    p.metrics.acl_denials[("amqp", Action.CONNECT.value)] += 1
                    raise ProcessorError(ErrorKind.FORBIDDEN, "vhost refused")
            else:
                await p.authorize(identity, Action.CONNECT, Resource("vhost", vhost))
        except ProcessorError:
            self._refuse(
                ReplyCode.NOT_ALLOWED,
                f"access to vhost '{vhost}' refused for user '{identity.username or ''}'",
            )
            return
        if self.state != OPENING:
            return
        self.vhost_obj = self.broker.registry.vhost(vhost)
        self.state = OPEN
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self.write(encode_method(0, c.ConnectionOpenOk()))
        if self.broker.events is not None:
            events.connected(self)
        self.broker.blocking.join(self)  # connection.blocked now if the store refuses writes
        self._arm_timer()
        self._resume_backlog()

    def _refuse(self, code: int, text: str) -> None:
        """Refuse the connection during the handshake: connection.close, then the socket."""
        log.info("amqp %s: %s", self.remote, text)
        self.write(AMQPError(code, text, class_id=10, method_id=11).response())
        self._backlog = None
        self.close()

    def _handshake_timeout(self) -> None:
        self._timer = None
        if self.state < OPEN:
            log.info("amqp %s: handshake timeout", self.remote)
            self.close()

    # ------------------------------------------------------------------ heartbeats, renewals
    def _arm_timer(self) -> None:
        """Heartbeats every half interval; invisible-time renewals four times per invisible time. One
        wheel ticks every connection (runtime/deadlines.py), not a TimerHandle each."""
        hb = self.heartbeat
        period = min(5.0, self.broker.invisible_time_ms / 4000)
        if hb:
            period = min(period, hb / 2)
        self._tick_slot = wheel_of(self.loop).schedule(self, self.loop.time() + period)

    def _cancel_tick(self) -> None:
        if self._tick_slot is not None:
            wheel_of(self.loop).cancel(self, self._tick_slot)
            self._tick_slot = None

    def deadline(self) -> None:
        """The heartbeat tick: the wheel's call, `period` after `_arm_timer`."""
        self._tick_slot = None
        if self.state not in (OPEN, CLOSING):
            return
        now = self.loop.time()
        hb = self.heartbeat
        if hb:
            if now - self.last_rx > 2 * hb:
                log.info("amqp %s: missed heartbeats from client, timeout: %ds", self.remote, hb)
                self.close_reason = ("heartbeat_timeout", None, None)
                self.close()
                return
            if now - self.last_tx >= hb / 2 and not self._wbuf:
                self.write(HEARTBEAT)
        ms = now_ms()
        for ch in list(self.channels.values()):
            if ch.unacked:
                ch.renew(ms)
        self._arm_timer()

    def set_blocked(self, reason: str | None) -> None:
        if self.blocked_notify and self.state == OPEN:
            self.write(
                encode_method(
                    0, c.ConnectionBlocked(reason) if reason is not None else c.ConnectionUnblocked()
                )
            )

    # ------------------------------------------------------------------ errors and closing
    def fail(self, e: AMQPError) -> None:
        """A protocol error: channel errors close the channel, others the connection."""
        if self.state in (CLOSING, CLOSED):
            if e.fatal:
                self.close()
            return
        if e.soft and e.channel:
            ch = self.channels.get(e.channel)
            if ch is not None:
                ch.fail(e)
                return
        log.info("amqp %s: %r; closing the connection", self.remote, e)
        if self.close_reason is None:
            self.close_reason = ("error", int(e.code), e.text)
        self.write(e.response())
        if e.fatal or self.state < OPEN:
            self.close()
            return
        self.state = CLOSING
        self.decoder.closing = True
        self._release()
        self._cancel_tick()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(5.0, self.close)

    def close_by_admin(self) -> None:
        """An administrator closes the connection: connection.close 320 CONNECTION_FORCED."""
        self.close_reason = ("kicked", int(ReplyCode.CONNECTION_FORCED), "closed by an administrator")
        self.fail(AMQPError(ReplyCode.CONNECTION_FORCED, "closed by an administrator"))

    def close(self) -> None:
        """Close the socket (after what was written) and release everything."""
        if self.state == CLOSED:
            return
        self._flush_writes()
        self.state = CLOSED
        self._close()
        self.connection_lost()

    def connection_lost(self) -> None:
        """The transport is gone (idempotent)."""
        self.state = CLOSED
        self._cancel_tick()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._release()
        if self.announced:
            events.closed(self)
        self.closed_event.set()

    def _release(self) -> None:
        for ch in list(self.channels.values()):
            ch.release()
            ch.state = CH_CLOSED
        self.channels.clear()
        self.broker.connection_closed(self)
