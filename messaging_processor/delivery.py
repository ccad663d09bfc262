"""The delivery loop that push-style adapters (MQTT subscriptions, AMQP basic.consume, webhooks,
gRPC push consumers) use: pop with long polling, hand each message to a callback with at most
`max_inflight` outstanding, then ack / retry / requeue / dead-letter per the callback's answer.
A `gate` (an asyncio.Event, e.g. "the connection's write buffer is below its bound") is awaited
before each pop: while it is clear nothing more is taken from the store. `max_inflight_bytes` bounds
the body bytes of the deliveries in flight as `max_inflight` bounds their number (one is always
allowed); a pop then asks for about the bytes left, by the mean size seen so far, so it does not
overshoot by a whole batch of large messages (docs/limits.md "Memory per connection")."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable

from runtime.events import LazyEvent
from runtime.tasks import cancel_and_wait
from store import ALL, Filter

from .errors import ErrorKind, ProcessorError
from .model import ClientContext, Delivery
from .processor import MessagingProcessor

log = logging.getLogger("messaging_processor.delivery")


class Outcome(enum.Enum):
    ACK = "ack"  # done
    RETRY = "retry"  # redeliver after the group's back-off (nack)
    REQUEUE = "requeue"  # visible again now
    DLQ = "dlq"  # to the group's dead-letter topic now
    SETTLED = "settled"  # the callback already acked / nacked the handle itself


# The loop applies the outcome to the delivery's `receipt_handle` as the handler leaves it (a
# handler that changed the invisible time meanwhile puts the new handle there).
Handler = Callable[[Delivery], Awaitable[Outcome]]


class InflightBound:
    """What a delivery loop (this one, offset_delivery.py's) has handed out and not yet settled: a
    count bounded by `max_count` and, with `max_bytes`, the body bytes too (one message is always
    allowed); a read then asks for about the bytes left by the mean body size seen so far (the first
    for one), so it does not overshoot by a whole batch of large messages (docs/limits.md "Memory
    per connection"). `room` is set while more may be read, `idle` while nothing is out; `ask()` is
    how many to read next (0: full). Kept in this module: it is on every delivery's path."""

    __slots__ = ("max_bytes", "count", "held", "mean_size", "room", "idle", "_max_count")

    def __init__(self, max_count: int, max_bytes: int = 0) -> None:
        if max_count < 1:
            raise ValueError("max_inflight must be at least 1")
        self._max_count = max_count
        self.max_bytes = max_bytes  # 0: bytes not counted
        self.count = 0
        self.held = 0  # body bytes out (counted with max_bytes only)
        self.mean_size = 0  # of the bodies read (idem)
        self.room = LazyEvent()  # (no deque of waiters per idle reader)
        self.room.set()
        self.idle = LazyEvent()
        self.idle.set()

    @property
    def max_count(self) -> int:
        return self._max_count

    @max_count.setter
    def max_count(self, n: int) -> None:
        if n < 1:
            raise ValueError("max_inflight must be at least 1")
        self._max_count = n
        self.update()

    def ask(self) -> int:
        """How many to read now (0, with `room` cleared, when full)."""
        n = self._max_count - self.count
        mb = self.max_bytes
        if mb:
            if self.held >= mb:
                n = 0
            elif self.mean_size:
                n = min(n, max(1, (mb - self.held) // self.mean_size))
            else:
                n = min(n, 1)
        if n <= 0:
            self.room.clear()
            return 0
        return n

    def read(self, sizes: list[int]) -> None:
        """The body sizes of what a read returned (the mean follows them)."""
        if self.max_bytes and sizes:
            size = max(1, sum(sizes) // len(sizes))
            self.mean_size = (self.mean_size + size) // 2 if self.mean_size else size

    def out(self, size: int) -> None:
        """One message handed out (call `update()` after a batch)."""
        self.count += 1
        if self.max_bytes:
            self.held += size

    def settled(self, size: int) -> None:
        """One message settled."""
        self.count -= 1
        if self.max_bytes:
            self.held -= size
        self.update()

    def update(self) -> None:
        if self.count < self._max_count and (not self.max_bytes or self.held < self.max_bytes):
            self.room.set()
        else:
            self.room.clear()
        if self.count == 0:
            self.idle.set()
        else:
            self.idle.clear()


FATAL = frozenset(
    {
        ErrorKind.TOPIC_NOT_FOUND,
        ErrorKind.FORBIDDEN,
        ErrorKind.ILLEGAL_TOPIC,
        ErrorKind.ILLEGAL_GROUP,
        ErrorKind.UNAUTHORIZED,
    }
)  # read errors that end a delivery loop (the topic is gone, the reader may not read it)


async def after_read_error(
    e: ProcessorError, what: str, backoff: float, on_error: Callable[[ProcessorError], None] | None
) -> float | None:
    """A delivery loop's failed read: None when `e` ends the loop (FATAL: `on_error` is called),
    else the next back-off once this one is waited out (doubling up to 5 s)."""
    if e.kind in FATAL:
        log.info("delivery %s ends: %s", what, e)
        if on_error is not None:
            on_error(e)
        return None
    log.warning("%s failed: %s; retrying in %.1f s", what, e, backoff)
    await asyncio.sleep(backoff)
    return min(backoff * 2, 5.0)


class DeliveryLoop:
    """Drives one consumer: `start()`, then `stop()`. `max_inflight` may change while running
    (AMQP basic.qos); a handler that raises counts as RETRY. `on_error` is called once with the
    ProcessorError that ended the loop (topic deleted, forbidden)."""

    FATAL = FATAL

    def __init__(
        self,
        processor: MessagingProcessor,
        ctx: ClientContext,
        group: str,
        topic: str,
        handler: Handler,
        *,
        filter: Filter = ALL,
        max_inflight: int = 32,
        invisible_time_ms: int = 30_000,
        long_poll_ms: int = 20_000,
        batch: int = 32,
        on_error: Callable[[ProcessorError], None] | None = None,
        gate: asyncio.Event | None = None,
        max_inflight_bytes: int = 0,
    ) -> None:
        self.bound = InflightBound(max_inflight, max_inflight_bytes)  # (checks max_inflight >= 1)
        self.processor = processor
        self.ctx = ctx
        self.group = group
        self.topic = topic
        self.handler = handler
        self.filter = filter
        self.invisible_time_ms = invisible_time_ms
        self.long_poll_ms = long_poll_ms
        self.batch = batch
        self.on_error = on_error
        self.gate = gate  # pop only while it is set (None: always)
        self.max_inflight_bytes = max_inflight_bytes  # 0: not counted
        self._task: asyncio.Task | None = None
        self._handlers: set[asyncio.Task] = set()
        self._stopping = False
        # the acks of the deliveries settled in one event-loop iteration go to the store together
        # (one `ack_many`): the handles waiting, and the future their errors arrive on
        self._acks: list[str] | None = None
        self._acked: asyncio.Future[list[ProcessorError | None]] | None = None

    @property
    def inflight(self) -> int:
        return self.bound.count

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def max_inflight(self) -> int:
        return self.bound.max_count

    @max_inflight.setter
    def max_inflight(self, n: int) -> None:
        self.bound.max_count = n

    def start(self) -> DeliveryLoop:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"delivery {self.ctx.protocol} {self.group}/{self.topic}"
            )
        return self

    async def stop(self, drain_timeout: float = 5.0) -> None:
        """Stop popping; wait up to `drain_timeout` s for running handlers, then cancel them
        (their messages become visible again when their invisible time ends)."""
        self._stopping = True
        await cancel_and_wait(self._task, errors=True)
        if self._handlers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.bound.idle.wait(), drain_timeout)
            for t in list(self._handlers):
                t.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _run(self) -> None:
        backoff = 0.1
        bound = self.bound
        while not self._stopping:
            await bound.room.wait()
            gate = self.gate
            if gate is not None and not gate.is_set():
                await gate.wait()  # the connection is over its outbound bound: leave them in the store
                continue
            room = bound.ask()
            if not room:
                continue
            try:
                deliveries = await self.processor.pop(
                    self.ctx,
                    self.group,
                    self.topic,
                    filter=self.filter,
                    max_messages=min(room, self.batch),
                    invisible_time_ms=self.invisible_time_ms,
                    long_poll_ms=self.long_poll_ms,
                )
                backoff = 0.1
            except ProcessorError as e:
                nxt = await after_read_error(e, f"pop for {self.group}/{self.topic}", backoff, self.on_error)
                if nxt is None:
                    self._stopping = True
                    return
                backoff = nxt
                continue
            if self.max_inflight_bytes:
                bound.read([len(d.message.body) for d in deliveries])
            for d in deliveries:
                bound.out(len(d.message.body))
                t = asyncio.get_running_loop().create_task(self._deliver(d))
                self._handlers.add(t)
                t.add_done_callback(self._handlers.discard)
            bound.update()

    async def _ack(self, handle: str) -> None:
        """Ack `handle` together with the other deliveries settled in this event-loop iteration (an
        AMQP `multiple` ack, a burst of MQTT PUBACKs, a handler batch): the first one waits one
        iteration for the others to join, then acks them all with one `ack_many`."""
        if self._acks is not None:  # a batch is forming: join it
            i = len(self._acks)
            self._acks.append(handle)
            assert self._acked is not None
            err = (await asyncio.shield(self._acked))[i]
        else:
            batch = self._acks = [handle]
            done = self._acked = asyncio.get_running_loop().create_future()
            try:
                await asyncio.sleep(0)  # (the deliveries settled in this iteration run first)
                self._acks = self._acked = None
                errors = await self.processor.ack_many(self.ctx, batch)
            except BaseException as e:
                if self._acked is done:  # (not yet closed: no later batch has started)
                    self._acks = self._acked = None
                # the joiners' messages are not acked: redelivered after their invisible time
                if not isinstance(e, ProcessorError):
                    e = ProcessorError(ErrorKind.UNAVAILABLE, "ack cancelled")  # noqa: PLW2901
                done.set_result([e] * len(batch))
                raise
            done.set_result(errors)
            err = errors[0]
        if err is not None:
            raise err

    async def _deliver(self, d: Delivery) -> None:
        p, ctx = self.processor, self.ctx
        try:
            try:
                outcome = await self.handler(d)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failing handler means "try again later"
                log.exception("delivery handler failed for %s", d.message.message_id)
                outcome = Outcome.RETRY
            try:
                if outcome is Outcome.ACK:
                    await self._ack(d.receipt_handle)
                elif outcome is Outcome.RETRY:
                    await p.nack(ctx, d.receipt_handle)
                elif outcome is Outcome.REQUEUE:
                    await p.change_invisible_time(ctx, d.receipt_handle, 0)
                elif outcome is Outcome.DLQ:
                    await p.forward_to_dlq(ctx, d.receipt_handle, "rejected by consumer")
            except ProcessorError as e:
                # e.g. the handle expired while the handler ran: the message is redelivered anyway.
                log.info("settling %s (%s) failed: %s", d.message.message_id, outcome.value, e)
        finally:
            self.bound.settled(len(d.message.body))
