"""Delivery by offset for a consumer that does not compete (an MQTT persistent session): read the
topic from the group's committed offsets (`MessagingProcessor.tail`: no pop state, nothing to ack
per message), hand each message to a callback with at most `max_inflight` outstanding, and commit
the group's progress periodically and at stop: per queue, the lowest offset not yet done.

Guarantees: at least once. A message is done when the callback says it was delivered (the client
has it) or when `wants` leaves it out. The committed offset never passes a message that is not
done, so after a crash, a lost connection or a takeover by another proxy the group's next reader
gets every message not done, and the done ones since the last commit again (at most
`commit_interval_s` of them after a crash; none after a clean stop, which commits what is done).
A message the callback could not deliver (its connection went away) ends the reading: it and
what follows come again from the committed offset when the loop is started anew.

Cheaper than pop/ack (delivery.py) at every load: no pop state is written, one commit per queue
per interval replaces one ack per message. Consumers that need per-message redelivery, retries or
dead-lettering keep the pop loop."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import Protocol

from runtime.tasks import cancel_and_wait

from .commit_schedule import CommitSchedule
from .delivery import InflightBound, after_read_error
from .errors import ProcessorError
from .model import ClientContext, Message
from .processor import MessagingProcessor

log = logging.getLogger("messaging_processor.offset_delivery")

# True: delivered (or left out); False: not (its connection went away); a future: the answer later
# (e.g. when the client acknowledges). Synchronous, so a delivery costs no task.
Handler = Callable[[Message], "bool | asyncio.Future[bool]"]


class QueueProgress:
    """The offsets of one queue handed to the callback and not yet done, in order (both held only
    while something is out: an idle reader keeps no deque or set)."""

    __slots__ = ("outstanding", "done", "committed")

    def __init__(self, committed: int) -> None:
        self.outstanding: collections.deque[int] | None = None
        self.done: set[int] | None = None
        self.committed = committed  # what the store holds (-1: nothing committed yet)

    def add(self, offset: int) -> None:
        """`offset` handed out (offsets in order)."""
        out = self.outstanding
        if out is None:
            out = self.outstanding = collections.deque()
        out.append(offset)

    def finish(self, offset: int) -> None:
        out = self.outstanding
        if not out:
            return
        if out[0] == offset:
            out.popleft()
            done = self.done
            if done:
                while out and out[0] in done:
                    done.discard(out.popleft())
                if not done:
                    self.done = None
            if not out:
                self.outstanding = None
        elif self.done is None:
            self.done = {offset}
        else:
            self.done.add(offset)

    def point(self, next_read: int) -> int:
        """The offset to commit: the first not done, else the next to read."""
        return self.outstanding[0] if self.outstanding else next_read


class OffsetReader(Protocol):
    """A reader of `topic` by offset for `group` that keeps its own progress (OffsetDeliveryLoop,
    local_feed.py's LocalFeed): per queue id, the next offset to read and what is out."""

    processor: MessagingProcessor
    ctx: ClientContext
    group: str
    topic: str
    positions: dict[int, int]
    queues: dict[int, QueueProgress]


async def begin_at_committed(r: OffsetReader, *, from_start: bool = False) -> None:
    """Each queue of the topic at the group's committed offset. A queue never committed has no
    position (the read starts at its start) or, `from_start`, the position of its first offset."""
    p = r.processor
    route = await p.query_route(r.ctx, r.topic)
    for q in route.queues:
        at = await p.committed_offset(r.group, r.topic, q.queue_id)
        if at < 0 and from_start:
            at = (await p.queue_offsets(r.topic, q.queue_id))[0]
        r.queues[q.queue_id] = QueueProgress(at)
        if at >= 0:
            r.positions[q.queue_id] = at


async def commit_progress(r: OffsetReader) -> None:
    """Commit, per queue read, the first offset not done, else the next to read (only forward)."""
    p = r.processor
    for qid, qp in list(r.queues.items()):
        nxt = r.positions.get(qid)
        if nxt is None:
            continue
        at = qp.point(nxt)
        if at > qp.committed:
            await p.commit_offset(r.ctx, r.group, r.topic, qid, at)
            qp.committed = at


class OffsetDeliveryLoop:
    """Drives one consumer of `group` on `topic` by offset: `start()`, then `stop()`. `wants(m)`
    False leaves a message out (done without the callback); `gate` and `max_inflight_bytes` bound
    what is read ahead as in DeliveryLoop. `on_error` is called once with the ProcessorError that
    ended the loop (topic deleted, forbidden)."""

    __slots__ = (
        "bound",
        "processor",
        "ctx",
        "group",
        "topic",
        "handler",
        "wants",
        "long_poll_ms",
        "on_error",
        "gate",
        "positions",
        "queues",
        "_task",
        "_unwatch",
        "_watches",
        "_begun",
        "_stopped",
        "_pending",
        "_commits",
        "_stalled",
    )  # (one per persistent-session device, parked while idle)

    def __init__(
        self,
        processor: MessagingProcessor,
        ctx: ClientContext,
        group: str,
        topic: str,
        handler: Handler,
        *,
        wants: Callable[[Message], bool] | None = None,
        max_inflight: int = 32,
        long_poll_ms: int = 20_000,
        commit_interval_s: float = 0.2,
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
        self.wants = wants
        self.long_poll_ms = long_poll_ms
        self.on_error = on_error
        self.gate = gate
        self.positions: dict[int, int] = {}  # queue id -> next offset to read (missing: its start)
        self.queues: dict[int, QueueProgress] = {}
        self._task: asyncio.Task | None = None  # reading (None or done while parked)
        self._unwatch: Callable[[], None] | None = None  # parked: ends the store's watch
        self._watches = True  # caught up: park on a watch (False: the store offers none, long-poll)
        self._begun = False
        self._stopped = False
        self._pending: set[asyncio.Future[bool]] | None = None  # the handler's answers still to come
        self._commits = CommitSchedule(self.commit, commit_interval_s, group)
        self._stalled = False  # a message could not be delivered: read nothing more

    @property
    def inflight(self) -> int:
        return self.bound.count

    @property
    def running(self) -> bool:
        """Reading, or parked until the topic gets a record."""
        return self._unwatch is not None or (self._task is not None and not self._task.done())

    def start(self) -> OffsetDeliveryLoop:
        if self._task is None and not self._stopped:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"offset delivery {self.ctx.protocol} {self.group}/{self.topic}"
            )
        return self

    def _wake(self) -> None:
        """The parked loop's watch fired: read and hand out now, in this callback (run to
        completion: an idle device's lonely message costs no task), and park again when caught up;
        a task goes on when the read must be awaited, the bound or the gate is shut, or it is behind."""
        self._unwatch = None
        if self._stalled or self._stopped:
            return
        bound = self.bound
        gate = self.gate
        room = bound.ask() if bound.room.is_set() and (gate is None or gate.is_set()) else 0
        msgs = None
        if room:
            try:
                msgs = self.processor.tail_now(self.ctx, self.topic, self.positions, room, group=self.group)
            except ProcessorError:
                msgs = None  # (the task meets it again and handles it)
        if msgs is None:
            self._task = None
            self.start()
            return
        bound.read([len(m.body) for m in msgs])
        self._take(msgs)
        if self._stalled:
            return
        if len(msgs) < room:  # all there was (no await since the read): park again
            unwatch = self.processor.watch(self.topic, self._wake, self.positions)
            if unwatch is not None:
                self._unwatch = unwatch
                return
        self._task = None
        self.start()

    async def stop(self, drain_timeout: float = 5.0) -> None:
        """Stop reading; wait up to `drain_timeout` s for running callbacks, cancel the rest (their
        messages are not done), then commit what is done."""
        self._stopped = True
        self._unpark()
        await cancel_and_wait(self._task, errors=True)
        if self._pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.bound.idle.wait(), drain_timeout)
            for f in list(self._pending or ()):
                f.cancel()  # (its callback runs on the next iteration: not done)
            await asyncio.sleep(0)
        await self._commits.stop()  # (may stop a commit between queues: the last one covers them)
        try:
            await self.commit()
        except ProcessorError as e:  # the next reader starts from the last commit: at least once
            log.info("final commit of %s/%s failed: %s", self.group, self.topic, e)

    # ------------------------------------------------------------------ reading
    def _unpark(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()

    async def _run(self) -> None:
        """Read and hand out until caught up, then park: with a store that watches, the task ends
        and the store's watch starts the next one when the topic gets a record (an idle reader holds
        no task, no timer and no long poll); otherwise it long-polls."""
        backoff = 0.1
        bound = self.bound
        while True:
            try:
                if not self._begun:
                    await begin_at_committed(self)  # (a queue never committed: from its start)
                    self._begun = True
                await bound.room.wait()
                gate = self.gate
                if gate is not None and not gate.is_set():
                    await gate.wait()
                    continue
                room = bound.ask()
                if not room:
                    continue
                watches = self._watches
                wait_ms = 0 if watches else self.long_poll_ms
                msgs = await self.processor.tail(
                    self.ctx, self.topic, self.positions, room, wait_ms, group=self.group
                )
                if not msgs and watches:  # (no await since the read: nothing appended unseen)
                    unwatch = self.processor.watch(self.topic, self._wake, self.positions)
                    if unwatch is not None:
                        self._unwatch = unwatch
                        self._task = None  # (an idle reader keeps no finished task either)
                        return
                    self._watches = False
                    continue
                backoff = 0.1
            except ProcessorError as e:
                nxt = await after_read_error(e, f"read of {self.group}/{self.topic}", backoff, self.on_error)
                if nxt is None:
                    return
                backoff = nxt
                continue
            bound.read([len(m.body) for m in msgs])
            self._take(msgs)
            if self._stalled:
                return

    def _take(self, msgs: list[Message]) -> None:
        positions = self.positions
        queues = self.queues
        wants = self.wants
        handler = self.handler
        for m in msgs:
            if self._stalled:
                break
            qid, off = m.queue_id, m.queue_offset
            positions[qid] = off + 1
            qp = queues.get(qid)
            if qp is None:  # a queue added since the start
                qp = queues[qid] = QueueProgress(-1)
            if wants is not None and not wants(m):
                continue
            qp.add(off)
            self.bound.out(len(m.body))
            try:
                r = handler(m)
            except Exception:  # noqa: BLE001 - as not delivered: it comes again
                log.exception("delivery handler failed for %s", m.message_id)
                r = False
            if r is True or r is False:
                self._settle(m, qp, r)
            else:
                if self._pending is None:
                    self._pending = set()
                self._pending.add(r)
                r.add_done_callback(partial(self._answered, m, qp))
        if msgs:
            self._commits.changed()
        self.bound.update()

    def _answered(self, m: Message, qp: QueueProgress, f: asyncio.Future[bool]) -> None:
        pending = self._pending
        if pending is not None:
            pending.discard(f)
            if not pending:
                self._pending = None
        ok = False
        if not f.cancelled():
            e = f.exception()
            if e is None:
                ok = bool(f.result())
            else:
                log.error("delivery of %s failed: %r", m.message_id, e)
        self._settle(m, qp, ok)

    def _settle(self, m: Message, qp: QueueProgress, delivered: bool) -> None:
        if delivered:
            qp.finish(m.queue_offset)
            self._commits.changed()
        elif not self._stalled:
            self._stalled = True  # nothing more is read; what follows comes again later
            self._unpark()
            if self._task is not None and self._task is not asyncio.current_task():
                self._task.cancel()
        self.bound.settled(len(m.body))

    # ------------------------------------------------------------------ progress
    async def commit(self) -> None:
        """Commit, per queue, the first offset not done (only forward)."""
        await commit_progress(self)
