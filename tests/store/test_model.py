"""Stateful model test: random sequences of append / read / pop / ack / change_invisible_time /
commit_offset / clock advance / close+reopen, checked against a small in-memory model.

The store's clocks (`support.install_clock`: `now_ms`, or `time_ns` where a hot path inlines it)
are replaced by a fake one, so invisible-time expiry and the DLQ are deterministic; each example
runs in its own event loop and temporary directory.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from store import InvalidReceiptHandle, Message
from store.message import now_ms as real_now_ms
from tests.store.support import append, crash_copy, install_clock, open_store, read_queue

pytestmark = pytest.mark.timeout(120)

TOPICS = ("T0", "T1")
QUEUES = 2
GROUP = "G"  # pop consumer
OFFSET_GROUP = "C"  # offset-based consumer
MAX_ATTEMPTS = 2
DLQ = "%DLQ%" + GROUP
SEG = 8 * 1024  # small: segments roll over within an example


class FakeClock:
    def __init__(self) -> None:
        self.t = real_now_ms()

    def __call__(self) -> int:
        return self.t


@dataclass
class Msg:
    body: bytes
    topic: str
    qid: int
    qoff: int
    message_id: str
    state: str = "new"  # new | inflight | acked | dlq
    deadline: int = 0
    deliveries: int = 0
    handle: str = ""


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.mkdtemp(prefix="store-model-")
        self.clock = FakeClock()
        self._restore_clock = install_clock(self.clock)
        self.store = None
        self.queues = {t: [[] for _ in range(QUEUES)] for t in TOPICS}  # bodies per queue
        self.msgs: dict[bytes, Msg] = {}
        self.stale: list[str] = []  # handles that must be rejected
        self.committed: dict[tuple[str, int], int] = {}
        self.dlq_seen = 0
        self.counter = 0

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    async def _open(self):
        s = await open_store(
            data_dir=self.dir,
            segment_size=SEG,
            checkpoint_interval_ms=50,
            consumer_log_flush_ms=20,
            consumer_checkpoint_ops=25,
            default_queues=QUEUES,
        )
        for t in TOPICS:
            s.create_topic(t, queues=QUEUES)
        s.create_group(GROUP, max_attempts=MAX_ATTEMPTS)
        return s

    @initialize(n=st.integers(3, 10))
    def start(self, n) -> None:
        self.store = self.run(self._open())
        for i in range(n):
            self.append(TOPICS[i % 2], -1, 1, 20)

    def teardown(self) -> None:
        try:
            if self.store is not None:
                self.run(self.store.close())
        finally:
            self._restore_clock()
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ model helpers
    def _visible(self, topic: str) -> set[bytes]:
        now = self.clock.t
        return {
            m.body
            for m in self.msgs.values()
            if m.topic == topic
            and (
                m.state == "new"
                or m.state == "inflight"
                and m.deadline <= now
                and m.deliveries < MAX_ATTEMPTS
            )
        }

    def _dlq_due(self, topic: str) -> set[bytes]:
        now = self.clock.t
        return {
            m.body
            for m in self.msgs.values()
            if m.topic == topic
            and m.state == "inflight"
            and m.deadline <= now
            and m.deliveries >= MAX_ATTEMPTS
        }

    def _inflight(self) -> list[Msg]:
        return sorted((m for m in self.msgs.values() if m.state == "inflight"), key=lambda m: m.body)

    # ------------------------------------------------------------------ rules
    @rule(
        topic=st.sampled_from(TOPICS),
        qid=st.sampled_from([-1, -1, 0, 1]),
        n=st.integers(1, 6),
        size=st.sampled_from([0, 10, 300, 1500]),
    )
    def append(self, topic, qid, n, size):
        msgs = []
        for _ in range(n):
            self.counter += 1
            msgs.append(
                Message(
                    topic,
                    f"{self.counter:06d}".encode() + b"b" * size,
                    queue_id=qid,
                    tag=f"tag{self.counter % 3}",
                    keys=(f"k{self.counter}",),
                )
            )

        async def append_all():
            return await asyncio.gather(*[append(self.store, m) for m in msgs])

        results = self.run(append_all())
        for m, r in zip(msgs, results, strict=True):
            q = self.queues[topic][r.queue_id]
            assert r.topic == topic and (qid < 0 or r.queue_id == qid)
            assert r.queue_offset == len(q), (r, len(q))
            q.append(m.body)
            self.msgs[m.body] = Msg(m.body, topic, r.queue_id, r.queue_offset, r.message_id)

    @rule(
        topic=st.sampled_from(TOPICS),
        n=st.integers(1, 8),
        invisible=st.sampled_from([100, 500, 2000]),
        advance=st.sampled_from([0, 0, 150, 600, 2500]),
    )
    def pop(self, topic, n, invisible, advance):
        self.clock.t += advance  # most pops come a while after the previous step
        visible = self._visible(topic)
        due = self._dlq_due(topic)
        popped = self.run(self.store.pop(GROUP, topic, max_messages=n, invisible_time_ms=invisible))
        assert len(popped) <= n
        bodies = [p.message.body for p in popped]
        assert len(set(bodies)) == len(bodies), "a message handed out twice by one pop"
        for p in popped:
            m = self.msgs.get(p.message.body)
            assert m is not None and m.body in visible, (
                f"popped {p.message.body[:6]} in state {m and m.state}"
            )
            assert p.message.topic == topic and (p.message.queue_id, p.message.queue_offset) == (
                m.qid,
                m.qoff,
            )
            assert p.reconsume_times == m.deliveries
            assert p.invisible_until == self.clock.t + invisible
            if m.handle:
                self.stale.append(m.handle)
                event("redelivered")
            m.state, m.deadline, m.deliveries, m.handle = (
                "inflight",
                self.clock.t + invisible,
                m.deliveries + 1,
                p.receipt_handle,
            )
        self._collect_dlq(due)
        if len(popped) < n:  # not limited by max_messages: everything visible was handed out
            assert set(bodies) == visible
            assert not self._dlq_due(topic), (
                "messages past max attempts were neither delivered nor dead-lettered"
            )

    @rule(topic=st.sampled_from(TOPICS))
    def expire_all_and_pop(self, topic):
        """Past every deadline: all in-flight messages come back (or go to the DLQ)."""
        self.pop(topic, 8, 500, 5001)

    def _collect_dlq(self, due: set[bytes]) -> None:
        if DLQ not in {t.name for t in self.store.topics()}:
            return
        new = read_queue(self.store, DLQ, 0, start=self.dlq_seen)
        for d in new:
            m = self.msgs.get(d.body)
            assert m is not None and d.body in due, f"dead-lettered {d.body[:6]} before its time"
            assert d.properties["ORIGIN_MESSAGE_ID"] == m.message_id
            assert d.properties["ORIGIN_TOPIC"] == m.topic
            assert d.properties["RECONSUME_TIMES"] == str(MAX_ATTEMPTS)
            self.stale.append(m.handle)
            m.state = "dlq"
            event("dead-lettered")
        self.dlq_seen += len(new)

    @precondition(lambda self: any(m.state == "inflight" for m in self.msgs.values()))
    @rule(data=st.data())
    def ack(self, data):
        m = data.draw(st.sampled_from(self._inflight()))
        self.store.ack(m.handle)
        self.stale.append(m.handle)
        m.state, m.handle = "acked", ""

    @precondition(lambda self: any(m.state == "inflight" for m in self.msgs.values()))
    @rule(data=st.data(), ms=st.sampled_from([0, 100, 1000, 5000]))
    def change_invisible_time(self, data, ms):
        m = data.draw(st.sampled_from(self._inflight()))
        new = self.store.change_invisible_time(m.handle, ms)
        assert new != m.handle
        self.stale.append(m.handle)
        m.handle, m.deadline = new, self.clock.t + ms

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data())
    def stale_handle_is_rejected(self, data):
        h = data.draw(st.sampled_from(self.stale))
        with pytest.raises(InvalidReceiptHandle):
            self.store.ack(h)
        with pytest.raises(InvalidReceiptHandle):
            self.store.change_invisible_time(h, 10)

    @rule(ms=st.sampled_from([50, 100, 400, 1000, 2500]))
    def advance_clock(self, ms):
        self.clock.t += ms

    @rule(topic=st.sampled_from(TOPICS), qid=st.integers(0, QUEUES - 1), offset=st.integers(-2, 30))
    def commit_offset(self, topic, qid, offset):
        self.store.commit_offset(OFFSET_GROUP, topic, qid, offset)
        self.committed[(topic, qid)] = max(min(offset, len(self.queues[topic][qid])), 0)

    @rule(
        topic=st.sampled_from(TOPICS),
        qid=st.integers(0, QUEUES - 1),
        start=st.integers(-1, 30),
        length=st.integers(0, 12),
        max_messages=st.integers(1, 40),
    )
    def read_range(self, topic, qid, start, length, max_messages):
        q = self.queues[topic][qid]
        got = self.store.read(topic, qid, start, start + length, max_messages=max_messages)
        want = q[max(start, 0) : max(start + length, 0)][:max_messages]
        assert [m.body for m in got] == want
        assert [m.queue_offset for m in got] == list(range(max(start, 0), max(start, 0) + len(want)))

    @rule()
    def reopen(self):
        if any(m.state == "inflight" for m in self.msgs.values()):
            event("reopen with messages in flight")
        self.run(self.store.close())
        self.store = None
        self.store = self.run(self._open())

    @rule()
    def crash_and_recover(self):
        """Reopen from a copy of the files as a crash right now would leave them (progress flushed)."""
        crashed = tempfile.mkdtemp(prefix="store-model-crash-")
        shutil.rmtree(crashed)
        self.run(crash_copy(self.store, crashed))
        self.run(self.store.close())
        self.store = None
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = crashed
        self.store = self.run(self._open())

    # ------------------------------------------------------------------ invariants
    @invariant()
    def queues_match(self):
        if self.store is None:
            return
        for t in TOPICS:
            for q in range(QUEUES):
                assert self.store.min_offset(t, q) == 0
                assert self.store.max_offset(t, q) == len(self.queues[t][q])
                assert [m.body for m in read_queue(self.store, t, q)] == self.queues[t][q]

    @invariant()
    def progress_matches(self):
        if self.store is None:
            return
        for t in TOPICS:
            ms = [m for m in self.msgs.values() if m.topic == t]
            assert self.store.inflight_count(GROUP, t) == sum(m.state == "inflight" for m in ms)
            assert self.store.backlog(GROUP, t) == sum(m.state in ("new", "inflight") for m in ms)
            for q in range(QUEUES):
                assert self.store.committed_offset(OFFSET_GROUP, t, q) == self.committed.get((t, q), -1)


StoreMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=False,
)
TestStoreModel = StoreMachine.TestCase
