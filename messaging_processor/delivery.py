"""The delivery loop that push-style adapters (MQTT subscriptions, AMQP basic.consume, webhooks,
gRPC push consumers) use: pop with long polling, hand each message to a callback with at most
`max_inflight` outstanding, then ack / retry / requeue / dead-letter per the callback's answer."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Awaitable, Callable

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
        self._max_inflight = max_inflight
        self._inflight = 0
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None
        self._handlers: set[asyncio.Task] = set()
        self._stopping = False

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
        if self._inflight < self._max_inflight:
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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
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
            for d in deliveries:
                self._inflight += 1
                t = asyncio.get_running_loop().create_task(self._deliver(d))
                self._handlers.add(t)
                t.add_done_callback(self._handlers.discard)
            self._update_room()

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
                    await p.ack(ctx, d.receipt_handle)
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
            self._update_room()
