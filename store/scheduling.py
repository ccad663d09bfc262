"""Messages held back in a system topic, then released to their real topic: delayed messages wait in
`%SCHEDULE%` for a timer at their delivery time; transactional half messages wait in `%HALF%` until
`end_transaction` commits or rolls them back, and are checked back while unresolved. What is still
held is found again at open from the system groups' progress."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from collections.abc import Awaitable, Callable, Iterator

from . import codec
from .catalog import Catalog
from .commitlog import CommitLog
from .config import HALF_TOPIC, SCHEDULE_TOPIC, SYSTEM_TIMER_GROUP, SYSTEM_TXN_GROUP, StoreConfig
from .consumer import ConsumerProgress
from .errors import StoreError, TransactionNotFound
from .message import AppendResult, Message, MessageType, copy_with, now_ms

log = logging.getLogger("store")

PROP_REAL_TOPIC = "__REAL_TOPIC"
PROP_REAL_QUEUE = "__REAL_QID"
PROP_REAL_ORDER_KEY = "__REAL_ORDER_KEY"  # its `order_key` (not a record field), when it has one
PROP_TXN_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"

Submit = Callable[..., asyncio.Future[AppendResult]]  # the append path's `submit(msg, now)`


def hold(msg: Message, catalog: Catalog) -> Message:
    """A transactional message as a half message, a message due later as a scheduled one, each
    carrying its real topic, queue and order key as properties."""
    txn = msg.msg_type == MessageType.TRANSACTION
    catalog.topic(msg.topic)  # the real topic must exist (or be auto-created) now
    props = dict(msg.properties)
    props[PROP_REAL_TOPIC] = msg.topic
    props[PROP_REAL_QUEUE] = str(msg.queue_id)
    if msg.order_key and msg.order_key != msg.message_group:  # (a group is stored: it is its own key)
        props[PROP_REAL_ORDER_KEY] = msg.order_key
    return Message(
        topic=HALF_TOPIC if txn else SCHEDULE_TOPIC,
        body=msg.body,
        tag=msg.tag,
        keys=msg.keys,
        properties=props,
        message_group=msg.message_group,
        deliver_at=msg.deliver_at,
        message_id=msg.message_id,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        queue_id=0,
        msg_type=MessageType.TRANSACTION if txn else MessageType.DELAY,
    )


def release(held: Message, catalog: Catalog) -> Message:
    """The real message held under a system topic (delay or transaction)."""
    props = dict(held.properties)
    topic = props.pop(PROP_REAL_TOPIC)
    qid = int(props.pop(PROP_REAL_QUEUE, "-1"))
    key = props.pop(PROP_REAL_ORDER_KEY, None) or held.message_group
    if topic not in catalog.topic_configs:
        catalog.topic(topic, create=True)
    return copy_with(
        held,
        topic=topic,
        properties=props,
        queue_id=qid,
        msg_type=MessageType.NORMAL if not held.message_group else MessageType.FIFO,
        order_key=key,
    )


def _still_held(
    catalog: Catalog, progress: ConsumerProgress, commitlog: CommitLog, topic: str, group: str
) -> Iterator[tuple[int, int, Message]]:
    """(queue offset, commit log offset, message) of each record of a system topic not yet done."""
    cq = catalog.cqs.get((topic, 0))
    if cq is None:
        return
    q = progress.get(group, topic).queue(0)
    start = max(q.ack_wm, cq.min_offset)
    for i, (clo, size, _th, _ts) in enumerate(cq.entries(start, cq.max_offset - start)):
        off = start + i
        if off not in q.done:
            yield off, clo, codec.decode(commitlog.read(clo, size), 0, clo)


class DelayedMessages:
    """The delay timer: a heap of (deliver at, queue offset, commit log offset) of `%SCHEDULE%`."""

    def __init__(
        self,
        catalog: Catalog,
        commitlog: CommitLog,
        progress: ConsumerProgress,
        read_message: Callable[[int, int], Message | None],
        get_by_id: Callable[[str], list[Message]],
        submit: Submit,
        flush_progress: Callable[[], Awaitable[None]],
    ) -> None:
        self.catalog = catalog
        self.commitlog = commitlog
        self.progress = progress
        self.read_message = read_message
        self.get_by_id = get_by_id
        self.submit = submit
        self.flush_progress = flush_progress
        self.heap: list[tuple[int, int, int]] = []  # (deliver_at, queue offset, clo)
        self.delivering: list[int] = []  # commit log offsets of delayed messages being delivered
        self.wake = asyncio.Event()

    def rebuild(self) -> None:
        """At open: the delayed messages not yet delivered."""
        heap = self.heap
        held = _still_held(self.catalog, self.progress, self.commitlog, SCHEDULE_TOPIC, SYSTEM_TIMER_GROUP)
        for off, clo, msg in held:
            heap.append((msg.deliver_at, off, clo))
        heapq.heapify(heap)

    def held(self) -> list[int]:
        """Commit log offsets of the delayed messages not yet delivered (retention keeps them)."""
        return [clo for _when, _off, clo in self.heap] + self.delivering

    def schedule(self, res: AppendResult) -> None:
        """A `%SCHEDULE%` record is readable: time it."""
        msg = self.read_message(res.commitlog_offset, res.size)
        heapq.heappush(self.heap, (msg.deliver_at, res.queue_offset, res.commitlog_offset))
        if self.heap[0][2] == res.commitlog_offset:
            self.wake.set()

    async def run(self) -> None:
        """The timer task: deliver what is due, sleep until the next is (or one sooner is scheduled)."""
        heap = self.heap
        while True:
            self.wake.clear()
            timeout = None if not heap else max((heap[0][0] - now_ms()) / 1000, 0)
            if timeout is None or timeout > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout)
                continue
            due = []
            now = now_ms()
            while heap and heap[0][0] <= now:
                due.append(heapq.heappop(heap))
            try:
                await self._deliver(due)
            except Exception:
                log.exception("delayed delivery failed; retrying in 1 s")
                for item in due:
                    heapq.heappush(heap, (item[0] + 1000, item[1], item[2]))
                await asyncio.sleep(1)

    async def _deliver(self, due: list[tuple[int, int, int]]) -> None:
        self.delivering = [clo for _when, _qoff, clo in due]  # retention keeps their segments
        try:
            await self._deliver_due(due)
        finally:
            self.delivering = []

    async def _deliver_due(self, due: list[tuple[int, int, int]]) -> None:
        st = self.progress.get(SYSTEM_TIMER_GROUP, SCHEDULE_TOPIC)
        batch: set[str] = set()
        futs, offs = [], []
        for _when, qoff, clo in due:
            if clo < self.commitlog.min_offset:
                self.progress.done(st, 0, qoff)
                continue
            held = self.read_message(clo, codec.record_size_at(self.commitlog.read(clo, 4), 0))
            real = release(held, self.catalog)
            if real.message_id in batch or any(
                m.topic == real.topic and m.commitlog_offset > clo for m in self.get_by_id(real.message_id)
            ):
                # delivered before a crash, not yet marked done; or a copy left by a crash during
                # a retention move (`move`)
                self.progress.done(st, 0, qoff)
                continue
            batch.add(real.message_id)
            futs.append(self.submit(real, now_ms()))
            offs.append(qoff)
        for qoff, res in zip(offs, await asyncio.gather(*futs), strict=True):
            del res
            self.progress.done(st, 0, qoff)

    async def move(self, below: int, now: int) -> None:
        """Copy the delayed messages held in commit log segments below `below` (and not due yet)
        to the head of the log, and mark the old records delivered, so that retention can delete
        those segments: a message delayed past the retention period is kept until it is due.

        A crash between the copy and the mark leaves both pending; delivery then skips the second
        (the real message is found by id after it, see `_deliver_due`)."""
        heap = self.heap
        moving = [e for e in heap if e[2] < below and e[0] > now]
        if not moving:
            return
        moved = set(moving)
        heap[:] = [e for e in heap if e not in moved]
        heapq.heapify(heap)
        futs, olds = [], []
        for e in moving:
            held = self.read_message(e[2], codec.record_size_at(self.commitlog.read(e[2], 4), 0))
            if held is None:  # unreadable: leave it where it is (retention keeps its segment)
                heapq.heappush(heap, e)
                continue
            try:
                futs.append(self.submit(copy_with(held, queue_id=0), now))
            except StoreError:
                heapq.heappush(heap, e)
                continue
            olds.append(e)
        results = await asyncio.gather(*futs, return_exceptions=True)
        st = self.progress.get(SYSTEM_TIMER_GROUP, SCHEDULE_TOPIC)
        for e, r in zip(olds, results, strict=True):
            if isinstance(r, BaseException):
                heapq.heappush(heap, e)  # not copied: the old record stays and is delivered
            else:
                self.progress.done(st, 0, e[1])
        await self.flush_progress()  # the old records are done on disk before their segment goes
        log.info("retention: moved %d delayed messages forward", len(olds))


class Transactions:
    """Half messages of `%HALF%`: ended by `end`, checked back (`check`) while unresolved."""

    def __init__(
        self,
        config: StoreConfig,
        catalog: Catalog,
        commitlog: CommitLog,
        progress: ConsumerProgress,
        get_message: Callable[[int], Message],
        get_by_id: Callable[[str], list[Message]],
        submit: Submit,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.commitlog = commitlog
        self.progress = progress
        self.get_message = get_message
        self.get_by_id = get_by_id
        self.submit = submit
        self.heap: list[tuple[int, int, int]] = []  # (next check at, queue offset, clo)
        self.checks: dict[int, int] = {}  # checks so far, by commit log offset
        self.resolving: set[int] = set()  # half messages whose commit append is under way
        self.checker: Callable[[Message], Awaitable[None] | None] | None = None

    def rebuild(self) -> None:
        """At open: the half messages not yet resolved."""
        heap = self.heap
        timeout = self.config.transaction_timeout_ms
        held = _still_held(self.catalog, self.progress, self.commitlog, HALF_TOPIC, SYSTEM_TXN_GROUP)
        for off, clo, msg in held:
            heap.append((msg.store_timestamp + timeout, off, clo))
        heapq.heapify(heap)

    def held(self) -> list[int]:
        """Commit log offsets of the unresolved half messages (retention keeps them)."""
        return [clo for _when, _off, clo in self.heap]

    def track(self, res: AppendResult) -> None:
        """A `%HALF%` record is readable: check it back once `transaction_timeout_ms` has passed."""
        first_check = res.store_timestamp + self.config.transaction_timeout_ms
        heapq.heappush(self.heap, (first_check, res.queue_offset, res.commitlog_offset))

    async def end(self, transaction_id: int | str, commit: bool) -> AppendResult | None:
        clo, qoff, msg = self._find_half(transaction_id)
        if clo in self.resolving:
            raise TransactionNotFound(f"transaction {transaction_id} is being resolved")
        st = self.progress.get(SYSTEM_TXN_GROUP, HALF_TOPIC)
        res = None
        self.resolving.add(clo)
        try:
            if commit:
                res = await self.submit(release(msg, self.catalog), now_ms())
        finally:
            self.resolving.discard(clo)
        self.progress.done(st, 0, qoff)
        self.checks.pop(clo, None)
        return res

    def _find_half(self, transaction_id: int | str) -> tuple[int, int, Message]:
        if isinstance(transaction_id, str):
            cands = [m for m in self.get_by_id(transaction_id) if m.topic == HALF_TOPIC]
            if not cands:
                raise TransactionNotFound(transaction_id)
            msg = cands[-1]
        else:
            try:
                msg = self.get_message(transaction_id)
            except (KeyError, codec.CorruptRecord, ValueError):
                raise TransactionNotFound(str(transaction_id)) from None
            if msg.topic != HALF_TOPIC:
                raise TransactionNotFound(str(transaction_id))
        q = self.progress.get(SYSTEM_TXN_GROUP, HALF_TOPIC).queue(0)
        off = msg.queue_offset
        if off < q.ack_wm or off in q.done:
            raise TransactionNotFound(f"transaction {transaction_id} is already resolved")
        return msg.commitlog_offset, off, msg

    async def check(self) -> None:
        """Periodic: ask `checker` about each half message due for a check; roll back those
        unresolved after `transaction_max_checks` checks."""
        heap = self.heap
        now = now_ms()
        st = self.progress.get(SYSTEM_TXN_GROUP, HALF_TOPIC)
        q = st.queue(0)
        while heap and heap[0][0] <= now:
            _when, qoff, clo = heapq.heappop(heap)
            if qoff < q.ack_wm or qoff in q.done:
                continue
            n = self.checks.get(clo, 0) + 1
            if n > self.config.transaction_max_checks or clo < self.commitlog.min_offset:
                log.warning("transaction at %d unresolved after %d checks: rolled back", clo, n - 1)
                self.progress.done(st, 0, qoff)
                self.checks.pop(clo, None)
                continue
            self.checks[clo] = n
            heapq.heappush(heap, (now + self.config.transaction_check_interval_ms, qoff, clo))
            if self.checker is not None:
                msg = self.get_message(clo)
                msg.properties[PROP_TXN_CHECK_TIMES] = str(n)
                try:
                    r = self.checker(msg)
                    if asyncio.iscoroutine(r):
                        await r
                except Exception:
                    log.exception("transaction check callback failed")
