"""Pop and ack, kept in memory, for a queue that only this process reads (an AMQP exclusive queue):
the messages are read by offset (`MessagingProcessor.tail`: no pop state in the store, nothing to
ack there per message), the deliveries not yet settled and the requeued ones are kept here, and the
queue's progress (per queue id, the first offset not done) is committed every second and at close.

It has the calls a delivery loop and an adapter make on the processor for one queue (`pop`, `ack`,
`ack_many`, `change_invisible_time`, `nack`), so a DeliveryLoop runs over it unchanged; several
consumers may pop at once (they compete here, each message handed to one of them). Requeued
messages (`change_invisible_time(handle, 0)`, `nack`) come before new ones, with their delivery
attempt counted up; an invisible time has no effect (nobody else reads the queue).

Guarantees: what the store guarantees for its messages; what is delivered and not yet acked lives
only here. That is enough for a queue that ends with its owner (an exclusive queue is deleted when
its connection closes, and a restarted gateway deletes the ones of connections it lost), and it is
why only such queues use it: a queue that outlives its reader keeps pop/ack in the store."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Sequence
from time import time_ns

from runtime.tasks import cancel_and_wait
from store import ALL, Filter

from .commit_schedule import CommitSchedule
from .errors import ErrorKind, ProcessorError
from .model import ClientContext, Delivery, Message
from .offset_delivery import QueueProgress, begin_at_committed, commit_progress
from .processor import MessagingProcessor

COMMIT_INTERVAL_S = 1.0


class _Held:
    """A message handed out (or requeued) and not yet done."""

    __slots__ = ("message", "attempts")

    def __init__(self, message: Message, attempts: int) -> None:
        self.message = message
        self.attempts = attempts  # deliveries so far


class LocalFeed:
    def __init__(
        self,
        processor: MessagingProcessor,
        ctx: ClientContext,
        group: str,
        topic: str,
        *,
        commit_interval_s: float = COMMIT_INTERVAL_S,
    ) -> None:
        self.processor = processor
        self.ctx = ctx  # reads are traced (and authorized) as this client's
        self.group = group
        self.topic = topic
        self.positions: dict[int, int] = {}  # queue id -> next offset to read
        self.queues: dict[int, QueueProgress] = {}
        self.held: dict[str, _Held] = {}  # receipt handle -> delivered, not yet settled
        self.requeued: collections.deque[_Held] = collections.deque()
        self.closed = False
        self._next_handle = 0
        self._begin_lock = asyncio.Lock()
        self._begun = False
        self._requeue = asyncio.Event()  # set when a message is requeued (ends a waiting pop)
        self._commits = CommitSchedule(self.commit, commit_interval_s, group)

    # ------------------------------------------------------------------ reading
    async def _begin(self) -> None:
        """Positions at the group's committed offsets (never committed: the queue's start)."""
        async with self._begin_lock:
            if not self._begun:
                await begin_at_committed(self, from_start=True)
                self._begun = True

    async def pop(
        self,
        ctx: ClientContext,
        group: str,
        topic: str,
        *,
        filter: Filter = ALL,  # noqa: A002 - MessagingProcessor.pop's name; a queue reads everything
        max_messages: int = 32,
        invisible_time_ms: int = 30_000,
        long_poll_ms: int = 0,
    ) -> list[Delivery]:
        """Up to `max_messages` deliveries: requeued ones first, then new ones; with `long_poll_ms`,
        waits that long for one (a requeue ends the wait)."""
        if not self._begun:
            await self._begin()
        while True:
            self._check_open()
            out = self._from_requeued(max_messages, invisible_time_ms)
            if out:
                return out
            msgs = await self._read(max_messages, 0)
            out = self._hand_out(msgs, max_messages, invisible_time_ms)
            if out or long_poll_ms <= 0:
                return out
            self._requeue.clear()
            msgs = await self._wait(max_messages, long_poll_ms)
            if msgs is None:  # a requeue: take it
                continue
            return self._hand_out(msgs, max_messages, invisible_time_ms)

    async def _wait(self, max_messages: int, long_poll_ms: int) -> list[Message] | None:
        """New messages (empty when none came in time) or None when a requeue came first. Others
        may pop meanwhile (`_hand_out` drops what they took)."""
        read = asyncio.ensure_future(self._read(max_messages, long_poll_ms))
        woken = asyncio.ensure_future(self._requeue.wait())
        try:
            await asyncio.wait((read, woken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            if not read.done():
                await cancel_and_wait(read, errors=True)
        if read.cancelled():
            return None
        return read.result()

    def _read(self, max_messages: int, wait_ms: int) -> Awaitable[list[Message]]:
        p = self.processor
        return p.tail(self.ctx, self.topic, self.positions, max_messages, wait_ms, group=self.group)

    def _hand_out(self, msgs: Sequence[Message], max_messages: int, invisible_time_ms: int) -> list[Delivery]:
        """Deliveries of the messages not taken yet, at most `max_messages` (a read of several
        stores may return more: the rest are read again, their positions are not moved)."""
        positions, queues, held = self.positions, self.queues, self.held
        until = time_ns() // 1_000_000 + invisible_time_ms
        out: list[Delivery] = []
        for m in msgs:
            if len(out) >= max_messages:
                break
            qid, off = m.queue_id, m.queue_offset
            if off < positions.get(qid, 0):
                continue  # another pop took it meanwhile (or a purge passed it)
            positions[qid] = off + 1
            qp = queues.get(qid)
            if qp is None:  # a queue id added since the start
                qp = queues[qid] = QueueProgress(-1)
            qp.add(off)
            handle = self._handle()
            held[handle] = _Held(m, 1)
            out.append(Delivery(m, handle, until, 1))
        return out

    def _from_requeued(self, max_messages: int, invisible_time_ms: int) -> list[Delivery]:
        rq = self.requeued
        if not rq:
            return []
        until = time_ns() // 1_000_000 + invisible_time_ms
        out = []
        while rq and len(out) < max_messages:
            h = rq.popleft()
            h.attempts += 1
            handle = self._handle()
            self.held[handle] = h
            out.append(Delivery(h.message, handle, until, h.attempts))
        return out

    def _handle(self) -> str:
        self._next_handle += 1
        return f"local:{self.topic}:{self._next_handle}"

    # ------------------------------------------------------------------ settling
    def _take(self, handle: str) -> _Held:
        h = self.held.pop(handle, None)
        if h is None:
            raise ProcessorError(ErrorKind.INVALID_RECEIPT_HANDLE, "unknown or settled receipt handle")
        return h

    def _done(self, m: Message) -> None:
        qp = self.queues.get(m.queue_id)
        if qp is not None:
            qp.finish(m.queue_offset)
        self._commits.changed()

    async def ack(self, ctx: ClientContext, handle: str) -> None:
        self._done(self._take(handle).message)

    async def ack_many(self, ctx: ClientContext, handles: Sequence[str]) -> list[ProcessorError | None]:
        out: list[ProcessorError | None] = []
        for handle in handles:
            try:
                self._done(self._take(handle).message)
                out.append(None)
            except ProcessorError as e:
                out.append(e)
        return out

    async def change_invisible_time(self, ctx: ClientContext, handle: str, invisible_time_ms: int) -> str:
        """0: requeue now (the handle is settled); otherwise nothing to do (the handle stays)."""
        if invisible_time_ms > 0:
            if handle not in self.held:
                raise ProcessorError(ErrorKind.INVALID_RECEIPT_HANDLE, "unknown or settled receipt handle")
            return handle
        self.requeued.append(self._take(handle))
        self._requeue.set()
        return handle

    async def nack(self, ctx: ClientContext, handle: str) -> str:
        """Requeue now (a failed handler)."""
        return await self.change_invisible_time(ctx, handle, 0)

    async def forward_to_dlq(self, ctx: ClientContext, handle: str, reason: str) -> None:
        """Dropped: a queue dead-letters through its adapter (AMQP's x-dead-letter-exchange)."""
        await self.ack(ctx, handle)

    # ------------------------------------------------------------------ counting, purging
    def position(self, queue_id: int) -> int:
        return self.positions.get(queue_id, -1)

    async def ready(self) -> int:
        """Messages ready for delivery: requeued ones and those not read yet."""
        if not self._begun:
            await self._begin()
        n = len(self.requeued)
        for qid in list(self.positions):
            _, hi = await self.processor.queue_offsets(self.topic, qid)
            n += max(hi - self.positions.get(qid, hi), 0)
        return n

    async def purge(self) -> int:
        """Drop the ready messages (delivered ones stay); how many there were."""
        if not self._begun:
            await self._begin()
        n = 0
        for qid in list(self.positions):
            _, hi = await self.processor.queue_offsets(self.topic, qid)
            if hi > self.positions[qid]:
                n += hi - self.positions[qid]
                self.positions[qid] = hi
        while self.requeued:
            self._done(self.requeued.popleft().message)
            n += 1
        self._commits.changed()
        return n

    # ------------------------------------------------------------------ progress
    async def commit(self) -> None:
        """Per queue id, the first offset not done (else the next to read) to the store."""
        await commit_progress(self)

    async def close(self) -> None:
        """Stop: pops fail from now on; what is held is forgotten (the queue is going away)."""
        self.closed = True
        self._requeue.set()
        await self._commits.stop()
        self.held.clear()
        self.requeued.clear()

    def _check_open(self) -> None:
        if self.closed:
            raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"queue {self.topic} is gone")
