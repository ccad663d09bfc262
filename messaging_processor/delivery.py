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


Handler = Callable[[Delivery], Awaitable[Outcome]]


class DeliveryLoop:
    """Drives one consumer: `start()`, then `stop()`. `max_inflight` may change while running
    (AMQP basic.qos); a handler that raises counts as RETRY. `on_error` is called once with the
    ProcessorError that ended the loop (topic deleted, forbidden)."""

    FATAL = frozenset(
        {
            ErrorKind.TOPIC_NOT_FOUND,
            ErrorKind.FORBIDDEN,
            ErrorKind.ILLEGAL_TOPIC,
            ErrorKind.ILLEGAL_GROUP,
            ErrorKind.UNAUTHORIZED,
        }
    )

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
        if max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
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
        self._max_held = max_inflight_bytes or 1 << 62
        self._held = 0  # body bytes in flight (counted with max_inflight_bytes only)
        self._mean_size = 0  # of the bodies popped (idem)
        self._max_inflight = max_inflight
        self._inflight = 0
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None
        self._handlers: set[asyncio.Task] = set()
        self._stopping = False
        # the acks of the deliveries settled in one event-loop iteration go to the store together
        # (one `ack_many`): the handles waiting, and the future their errors arrive on
        self._acks: list[str] | None = None
        self._acked: asyncio.Future[list[ProcessorError | None]] | None = None

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def max_inflight(self) -> int:
        return self._max_inflight

    @max_inflight.setter
    def max_inflight(self, n: int) -> None:
        if n < 1:
            raise ValueError("max_inflight must be at least 1")
        self._max_inflight = n
        self._update_room()

    def _update_room(self) -> None:
        if self._inflight < self._max_inflight and self._held < self._max_held:
            self._room.set()
        else:
            self._room.clear()
        if self._inflight == 0:
            self._idle.set()
        else:
            self._idle.clear()

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
                await asyncio.wait_for(self._idle.wait(), drain_timeout)
            for t in list(self._handlers):
                t.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _run(self) -> None:
        backoff = 0.1
        while not self._stopping:
            await self._room.wait()
            room = self._max_inflight - self._inflight
            if room <= 0:
                self._room.clear()
                continue
            gate = self.gate
            if gate is not None and not gate.is_set():
                await gate.wait()  # the connection is over its outbound bound: leave them in the store
                continue
            if self.max_inflight_bytes:
                if self._held >= self._max_held:
                    self._room.clear()
                    continue
                if self._mean_size:
                    room = min(room, max(1, (self._max_held - self._held) // self._mean_size))
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
                if e.kind in self.FATAL:
                    log.info("delivery %s/%s ends: %s", self.group, self.topic, e)
                    self._stopping = True
                    if self.on_error is not None:
                        self.on_error(e)
                    return
                log.warning(
                    "pop for %s/%s failed: %s; retrying in %.1f s", self.group, self.topic, e, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if self.max_inflight_bytes and deliveries:
                size = sum(len(d.message.body) for d in deliveries)
                self._held += size
                size = max(1, size // len(deliveries))
                self._mean_size = (self._mean_size + size) // 2 if self._mean_size else size
            for d in deliveries:
                self._inflight += 1
                t = asyncio.get_running_loop().create_task(self._deliver(d))
                self._handlers.add(t)
                t.add_done_callback(self._handlers.discard)
            self._update_room()

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
            self._inflight -= 1
            if self.max_inflight_bytes:
                self._held -= len(d.message.body)
            self._update_room()
