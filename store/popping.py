"""Pop consumption: `pop` hands out messages from any queue of a topic, invisible to the group until
acked or their invisible time ends (then handed out again, and after `max_attempts` moved to the
group's DLQ); `ack`, `change_invisible_time`, `nack`, `forward_to_dlq` act on a receipt handle.
FIFO message groups hold their queue while in flight. Long polling: pops wait in `LongPolling`
until a matching append, an ack or invisible time change, or a retry deadline. A record in a
tiered segment that is not cached (TieredRangeNotCached) ends a scan with what was handed out so
far; with nothing handed out, the pop fetches the range (`fetch_tiered`) and scans again, by the
rule of tier_reads.py."""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from time import time_ns

from .catalog import Catalog
from .config import DLQ_PREFIX, GroupConfig
from .consumequeue import ConsumeQueue
from .consumer import ConsumerProgress, GroupTopic, Inflight, QueueProgress
from .errors import InvalidReceiptHandle, StoreError, TieredRangeNotCached
from .filters import ALL, Filter
from .message import PATH_PROPERTY, AppendResult, Message, PoppedMessage, copy_with, now_ms
from .tier_reads import TierFetches

log = logging.getLogger("store")

PROP_ORIGIN_TOPIC = "ORIGIN_TOPIC"
PROP_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROP_ORIGIN_QUEUE = "ORIGIN_QUEUE_ID"
PROP_ORIGIN_OFFSET = "ORIGIN_QUEUE_OFFSET"
PROP_RECONSUME_TIMES = "RECONSUME_TIMES"
PROP_DLQ_REASON = "DLQ_REASON"


def encode_handle(seq: int, group: str, topic: str, qid: int, offset: int) -> str:
    """A receipt handle (decoded by `Popper._resolve`)."""
    return f"{seq:x} {qid} {offset} {topic} {group}"


class _Waiter:
    __slots__ = ("fut", "hashes", "has_predicate", "skip")

    def __init__(self, fut: asyncio.Future[None], f: Filter) -> None:
        self.fut = fut
        self.hashes = f.hashes
        self.has_predicate = f.predicate is not None
        self.skip = f.skip


def _give_up(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class _Notice:
    """What a watch (`LongPolling.watch`) holds in place of a waiter's future: the first wake-up
    calls `callback` once, soon after (never inside the append path), and ends the watch."""

    __slots__ = ("polls", "topic", "callback", "waiter", "fired")

    def __init__(self, polls: LongPolling, topic: str, callback: Callable[[], object]) -> None:
        self.polls = polls
        self.topic = topic
        self.callback: Callable[[], object] | None = callback
        self.waiter: _Waiter | None = None
        self.fired = False

    def done(self) -> bool:
        return self.fired or self.callback is None

    def set_result(self, _: object) -> None:
        if not self.done():  # (called while the waiters are iterated: leave the set alone)
            self.fired = True
            self.polls.loop.call_soon(self._fire)

    def _fire(self) -> None:
        cb = self.callback
        if cb is not None:
            self.cancel()
            cb()

    def cancel(self) -> None:
        """End the watch without calling back (nothing once it has called back)."""
        self.callback = None
        w, self.waiter = self.waiter, None
        if w is not None:
            self.polls.forget(self.topic, w)


class LongPolling:
    """Pops waiting for a topic. The append path wakes those whose filter may match a new record.
    A topic's waiters are one `_Waiter` or, from the second on, a set of them: most watched topics
    (a persistent session's queue) have one, and an empty set costs 216 bytes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # by topic (the append path reads it directly: `topic in waiters`)
        self.waiters: dict[str, _Waiter | set[_Waiter]] = {}

    def _add(self, topic: str, w: _Waiter) -> None:
        ws = self.waiters.get(topic)
        if ws is None:
            self.waiters[topic] = w
        elif type(ws) is _Waiter:
            self.waiters[topic] = {ws, w}
        else:
            ws.add(w)  # type: ignore[union-attr]

    async def wait(self, topic: str, f: Filter, give_up: float, next_due: int | None) -> None:
        """Sleep until woken, `give_up` (monotonic seconds) or `next_due` (epoch ms), if sooner."""
        timeout = give_up - time.monotonic()
        if next_due is not None:
            timeout = min(timeout, max((next_due - now_ms()) / 1000, 0.001))
        if timeout <= 0:
            return
        w = _Waiter(self.loop.create_future(), f)
        self._add(topic, w)
        # a timer that resolves the future as a wake-up does (asyncio.wait_for costs about 6 µs
        # more per call: its own future, task wrapper and callbacks, on every pop that waits)
        timer = self.loop.call_later(timeout, _give_up, w.fut)
        try:
            await w.fut
        finally:
            timer.cancel()
            self.forget(topic, w)

    def watch(self, topic: str, callback: Callable[[], object]) -> Callable[[], None]:
        """Call `callback` once (soon after, from the loop) when `topic` is next woken: a record
        appended, the store closing. Costs one small object and no task or timer while it waits, for
        a reader that has caught up and must not hold a task per topic (many idle subscribers).
        Returns the function that ends the watch unfired. A record appended before the call does
        not fire it: watch right after a read that found nothing, with no await in between (the
        append path wakes on this loop's thread)."""
        n = _Notice(self, topic, callback)
        n.waiter = w = _Waiter(n, ALL)  # type: ignore[arg-type]
        self._add(topic, w)
        return n.cancel

    def forget(self, topic: str, w: _Waiter) -> None:
        """Take `w` out of `topic`'s waiters; the topic's entry goes with its last waiter."""
        ws = self.waiters.get(topic)
        if ws is None:
            return
        if type(ws) is _Waiter:
            if ws is w:
                del self.waiters[topic]
            return
        ws.discard(w)  # type: ignore[union-attr]
        if len(ws) == 1:  # type: ignore[arg-type]
            self.waiters[topic] = next(iter(ws))  # type: ignore[call-overload]
        elif not ws:
            del self.waiters[topic]

    def wake_topics(self, touched: dict[str, set[int]]) -> None:
        """`wake` for each topic of a written batch, with the tag hashes it got."""
        for topic, hashes in touched.items():
            self.wake(topic, hashes)

    def wake(self, topic: str, hashes: set[int] | None) -> None:
        """Wake the pops of `topic` that may want a record with one of these tag hashes (None: all)."""
        ws = self.waiters.get(topic)
        if ws is None:
            return
        for w in (ws,) if type(ws) is _Waiter else ws:  # type: ignore[union-attr]
            if w.fut.done():
                continue
            if hashes is not None and w.skip is not None and all(map(w.skip, hashes)):
                continue  # only records its filter passes over unread
            if hashes is None or w.hashes is None or w.has_predicate or not w.hashes.isdisjoint(hashes):
                w.fut.set_result(None)

    def wake_all(self) -> None:
        for ws in list(self.waiters.values()):
            for w in (ws,) if type(ws) is _Waiter else list(ws):  # type: ignore[arg-type]
                if not w.fut.done():
                    w.fut.set_result(None)


class Popper:
    """Pop consumption over the catalog's queues and the groups' progress. `closed` (set when the
    store closes) ends long polls."""

    def __init__(
        self,
        catalog: Catalog,
        progress: ConsumerProgress,
        read_message: Callable[[int, int], Message | None],
        submit: Callable[..., asyncio.Future[AppendResult]],
        polls: LongPolling,
        metrics: dict[str, int],
    ) -> None:
        self.catalog = catalog
        self.topic_queues = catalog.readable_queues  # read directly on the hot path, as appends do
        self.progress = progress
        self.read_message = read_message
        self.submit = submit
        self.polls = polls
        self.metrics = metrics
        self.dead_letters: Counter[tuple[str, str]] = Counter()  # (group, topic) -> moved to the DLQ
        self.closed = False
        # told of each message a pop moves to the DLQ after its group's last attempt (the message
        # trace records it): (group, message, reason)
        self.on_dead_letter: Callable[[str, Message, str], None] | None = None
        # tiered storage: brings a missed range into the cache (Store.fetch_tiered)
        self.fetch_tiered: Callable[[TieredRangeNotCached], Awaitable[None]] | None = None

    async def pop(
        self,
        group: str,
        topic: str,
        max_messages: int = 32,
        invisible_time_ms: int = 30_000,
        filter: Filter = ALL,
        wait_ms: int = 0,
    ) -> list[PoppedMessage]:
        """`Store.pop`: hand out up to `max_messages` visible messages from any queue, invisible
        until acked or `invisible_time_ms` passes. With `wait_ms`, wait (long polling) for a
        matching message."""
        if max_messages < 1:
            raise ValueError("max_messages must be positive")
        if invisible_time_ms < 0:
            raise ValueError("invisible_time_ms must not be negative")
        gconf = self.catalog.group(group)
        self.catalog.topic(topic, create=False)
        give_up = time.monotonic() + wait_ms / 1000
        fetches: TierFetches | None = None
        while True:
            try:
                out, dlq = self._pop_now(gconf, topic, max_messages, invisible_time_ms, filter)
            except TieredRangeNotCached as miss:  # nothing handed out: fetch the range, scan again
                fetches = fetches or TierFetches()
                await fetches.fetch(miss, self.fetch_tiered)
                continue
            for st, qid, offset, msg in dlq:
                try:
                    await self._to_dlq(gconf.name, st, qid, offset, msg, "max attempts reached")
                    if self.on_dead_letter is not None:
                        self.on_dead_letter(gconf.name, msg, "max attempts reached")
                except StoreError:
                    raise
                except Exception as e:  # noqa: BLE001 - the message stays for a later try
                    log.warning("moving %s:%d:%d to the DLQ failed: %s", st.topic, qid, offset, e)
            if out or time.monotonic() >= give_up or self.closed:
                if not out and dlq and time.monotonic() < give_up:
                    continue
                self.metrics["pops"] += len(out)
                return out
            await self.polls.wait(topic, filter, give_up, self.progress.get(group, topic).next_deadline())

    def _pop_now(
        self, gconf: GroupConfig, topic: str, max_n: int, invisible: int, f: Filter
    ) -> tuple[list[PoppedMessage], list]:
        progress = self.progress
        # (a dict read first: `get` also creates, with a log record, what pops see the first time)
        st = progress.states.get((gconf.name, topic)) or progress.get(gconf.name, topic)
        now = time_ns() // 1_000_000  # (now_ms inlined: one call less per pop)
        out: list[PoppedMessage] = []
        dlq: list = []
        heap = st.retry_heap
        # 1. messages whose invisible time is over
        while heap and heap[0][0] <= now and len(out) < max_n:
            deadline, seq, qid, offset = heapq.heappop(heap)
            q = st.queues.get(qid)
            inf = q.inflight.get(offset) if q else None
            if inf is None or inf.seq != seq:
                continue  # stale heap entry
            cq = self.catalog.cqs.get((topic, qid))
            if cq is None or offset < cq.min_offset:
                progress.done(st, qid, offset)  # deleted by retention
                continue
            clo, size, _th, _ts = cq.entry(offset)
            try:
                msg = self.read_message(clo, size)
            except TieredRangeNotCached:
                heapq.heappush(heap, (deadline, seq, qid, offset))  # (still due: taken next time)
                if out or dlq:
                    return out, dlq
                raise
            if msg is None:
                progress.done(st, qid, offset)
                continue
            if inf.attempts >= gconf.max_attempts:
                inf.seq = progress.next_seq()  # nobody else picks it while it moves to the DLQ
                dlq.append((st, qid, offset, msg))
                continue
            new_seq = progress.next_seq()
            progress.changed(st, qid, offset, new_seq, now + invisible, inf.attempts + 1)
            msg.reconsume_times = inf.attempts - 1
            out.append(
                PoppedMessage(msg, encode_handle(new_seq, gconf.name, topic, qid, offset), now + invisible)
            )
            self.metrics["redeliveries"] += 1
        # 2. new messages, round robin over queues
        if len(out) < max_n:
            qs = self.topic_queues.get(topic) or self.catalog.readable(topic)
            hashes = f.hashes
            n = len(qs)
            start = st.rr % n
            st.rr += 1
            queues = st.queues
            for k in range(n):
                if len(out) >= max_n:
                    break
                cq = qs[(start + k) % n]
                q = queues.get(cq.queue_id)
                if q is not None and q.cursor >= cq.max_offset:  # (then also >= min_offset)
                    continue  # nothing new in this queue (the common case at low rates: skip the call)
                try:
                    self._pop_queue(st, q, cq, gconf.name, topic, max_n, invisible, f, hashes, now, out)
                except TieredRangeNotCached:  # (its cursor stays at the record: nothing is skipped)
                    if out or dlq:
                        return out, dlq  # what was handed out so far is in flight: return it
                    st.rr -= 1  # the scan after the fetch starts at this queue again: progress
                    raise
        return out, dlq

    def _pop_queue(
        self,
        st: GroupTopic,
        q: QueueProgress | None,
        cq: ConsumeQueue,
        group: str,
        topic: str,
        max_n: int,
        invisible: int,
        f: Filter,
        hashes: frozenset[int] | None,
        now: int,
        out: list[PoppedMessage],
    ) -> None:
        progress = self.progress
        qid = cq.queue_id
        skip = f.skip
        t = self.catalog.topic_configs.get(topic)
        epochs = t.epochs if t is not None and t.epochs else None
        if q is None:
            q = st.queue(qid)
        if q.cursor < cq.min_offset:
            progress.committed(st, qid, cq.min_offset)
        while len(out) < max_n and q.cursor < cq.max_offset:
            base = q.cursor
            for i, (clo, size, th, _ts) in enumerate(cq.entries(base, max_n - len(out))):
                offset = base + i
                if (hashes is not None and th not in hashes) or (skip is not None and skip(th)):
                    progress.done(st, qid, offset)
                    continue
                msg = self.read_message(clo, size)
                if msg is None or not (f.takes_all or f.matches(msg)):
                    progress.done(st, qid, offset)
                    continue
                mg = msg.message_group
                if mg and mg in st.fifo_busy:
                    return  # FIFO: this queue waits until the group's previous message is done
                if epochs is not None and self._held_back(st, topic, epochs, qid, offset, msg):
                    return  # its group's (path's) earlier messages in its previous queue go first
                inf = progress.handed_out(st, qid, offset, now + invisible, mg)
                if inf.attempts > 1:  # a previous primary may have handed it out (take_over)
                    msg.reconsume_times = max(msg.reconsume_times, inf.attempts - 1)
                out.append(
                    PoppedMessage(msg, encode_handle(inf.seq, group, topic, qid, offset), inf.deadline)
                )
                if len(out) >= max_n:
                    return

    def _held_back(
        self, st: GroupTopic, topic: str, epochs: list, qid: int, offset: int, msg: Message
    ) -> bool:
        """Logic queues: whether a message must wait because its message group (else its MQTT
        path) went to another queue before a change of the topic's queue count that it was stored
        after, and this group has not yet done everything that queue held at the change."""
        key = msg.message_group or (msg.properties.get(PATH_PROPERTY) if msg.properties else None)
        if not key:
            return False  # no order to keep across queues
        h = zlib.crc32(key.encode())
        readable = self.catalog.topic_configs[topic].readable
        for old_count, ends in epochs:
            if qid < len(ends) and offset < ends[qid]:
                continue  # stored before this change
            prev = h % old_count
            if prev == qid or prev >= readable:
                continue  # the same queue (its own order), or a sealed queue no longer listed
            end = ends[prev]
            pq = st.queues.get(prev)
            if pq is not None and pq.ack_wm >= end:
                continue
            cq = self.catalog.cqs.get((topic, prev))
            if cq is not None and cq.min_offset >= end:
                continue  # retention removed what it held
            return True
        return False

    def _resolve(self, handle: str) -> tuple[GroupTopic, int, int, Inflight]:
        try:
            seq, qid, offset, topic, group = handle.split(" ")
            seq, qid, offset = int(seq, 16), int(qid), int(offset)
        except ValueError:
            raise InvalidReceiptHandle(f"malformed receipt handle {handle!r}") from None
        st = self.progress.states.get((group, topic))
        q = st.queues.get(qid) if st else None
        inf = q.inflight.get(offset) if q else None
        if inf is None or inf.seq != seq:
            raise InvalidReceiptHandle("receipt handle is expired or already acknowledged")
        return st, qid, offset, inf

    def ack(self, handle: str) -> None:
        """`Store.ack`: a popped message is done for its group."""
        st, qid, offset, inf = self._resolve(handle)
        self.progress.done(st, qid, offset)
        self.metrics["acks"] += 1
        if inf.message_group:
            self.polls.wake(st.topic, None)

    def ack_many(self, handles: Sequence[str]) -> list[InvalidReceiptHandle | None]:
        """`Store.ack_many`: `ack` each handle; per handle None or the error (the others still
        count). The waiting pops of a topic with message groups are woken once."""
        out: list[InvalidReceiptHandle | None] = []
        woken: set[str] = set()
        done = self.progress.done
        for handle in handles:
            try:
                st, qid, offset, inf = self._resolve(handle)
            except InvalidReceiptHandle as e:
                out.append(e)
                continue
            done(st, qid, offset)
            out.append(None)
            if inf.message_group:
                woken.add(st.topic)
        self.metrics["acks"] += out.count(None)
        for topic in woken:
            self.polls.wake(topic, None)
        return out

    def change_invisible_time(self, handle: str, invisible_time_ms: int) -> str:
        if invisible_time_ms < 0:
            raise ValueError("invisible_time_ms must not be negative")
        st, qid, offset, inf = self._resolve(handle)
        seq = self.progress.next_seq()
        self.progress.changed(st, qid, offset, seq, now_ms() + invisible_time_ms)
        self.polls.wake(st.topic, None)  # waiting pops recompute their next retry deadline
        return encode_handle(seq, st.group, st.topic, qid, offset)

    def nack(self, handle: str) -> str:
        st, _qid, _offset, inf = self._resolve(handle)
        delay = self.catalog.group(st.group).retry.delay_ms(inf.attempts)
        return self.change_invisible_time(handle, delay)

    async def forward_to_dlq(self, handle: str, reason: str = "forwarded") -> AppendResult:
        fetches = TierFetches()
        while True:
            st, qid, offset, inf = self._resolve(handle)
            clo, size, _th, _ts = self.catalog.queue(st.topic, qid).entry(offset)
            try:
                msg = self.read_message(clo, size)
                break
            except TieredRangeNotCached as miss:  # an old message: read it before the handle ends
                await fetches.fetch(miss, self.fetch_tiered)
        inf.seq = self.progress.next_seq()  # the handle stops working now, not after the append
        return await self._to_dlq(st.group, st, qid, offset, msg, reason)

    async def _to_dlq(
        self, group: str, st: GroupTopic, qid: int, offset: int, msg: Message, reason: str
    ) -> AppendResult:
        inf = st.queue(qid).inflight.get(offset)
        props = dict(msg.properties)
        props.update(
            {
                PROP_ORIGIN_TOPIC: msg.topic,
                PROP_ORIGIN_MESSAGE_ID: msg.message_id,
                PROP_ORIGIN_QUEUE: str(qid),
                PROP_ORIGIN_OFFSET: str(offset),
                PROP_RECONSUME_TIMES: str(inf.attempts if inf else 0),
                PROP_DLQ_REASON: reason,
            }
        )
        dlq_topic = DLQ_PREFIX + group
        self.catalog.topic(dlq_topic, create=True)
        copy = copy_with(msg, topic=dlq_topic, properties=props, queue_id=-1, message_group="")
        try:
            res = await self.submit(copy, now_ms())
        except BaseException:
            if inf is not None and offset in st.queue(qid).inflight:
                inf.seq = self.progress.next_seq()  # visible again at its deadline: retried later
                st.track(qid, offset, inf)
            raise
        self.progress.done(st, qid, offset)
        self.metrics["dlq"] += 1
        self.dead_letters[(group, st.topic)] += 1
        if inf is not None and inf.message_group:
            self.polls.wake(st.topic, None)
        return res
