"""What a persistent MQTT session keeps between connections, and how it is saved.

A session is persistent when it outlives its connection: 3.1.1 CONNECT with Clean Session 0, or 5.0
with a Session Expiry Interval above 0. Its durable parts live in the processor's key-value table
(so they survive a gateway restart) and in the store:

    kv "mqtt.sessions" / <client id>      JSON {"v": version, "e": expiry s, "d": disconnected at
                                          (epoch s) or null, "g": consumer group, "q": its queue
                                          (absent: none), "s": [[filter, qos, no_local, rap, rh,
                                          sub id], ...]}
    kv "mqtt.qos2" / <len>:<client id>:i<packet id>   inbound QoS 2 stored, PUBREL not seen yet
    kv "mqtt.qos2" / <len>:<client id>:o<packet id>   outbound QoS 2 PUBREC seen, PUBCOMP not yet

Messages for the session: a session has its own consumer group (a new name per session
incarnation) and, in LOCAL mode (one process or `--workers`), its own queue, the store topic
`%SQ%<group>` ("q" in the record):
every send that matches one of its filters also stores the message there (the processor's
multi-dispatch, session_routing.py), so a message costs nothing for sessions it is not for and a
resume reads only its own queue. Whatever arrives while it is offline waits there, past the
group's committed offset. Without a queue (CLUSTER mode, whose stores take one topic per write;
and records saved before queues existed) the session reads every store topic its subscriptions
cover, filtering them (fanout.py).

Session records are written through one `RecordWriter` per processor: the records (and deletes)
asked for while a write is in flight go together in the next `kv_put_many` (one transaction, one
sync), so a reconnect storm costs a kv sync per batch of CONNECTs, not per CONNECT; each caller
still returns only once its record is durable, and a client id's writes land in the order asked.

Loading, expiring and ending sessions is registry.py's; the delivery loops are fanout.py's; the cap
on that backlog (`--mqtt-max-queued-messages` / `-bytes`) is offline_queue.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
import uuid
import weakref
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from messaging_processor import DeliveryLoop, MessagingProcessor

    from .roles import Connection
    from .subscription import Sub

SESSIONS_NS = "mqtt.sessions"
QOS2_NS = "mqtt.qos2"
NEVER = 0xFFFFFFFF  # Session Expiry Interval meaning "does not expire"
_GROUP_OK = re.compile(r"[^A-Za-z0-9_.-]")
# (topic, queue id) -> [lo, hi): offsets a session's delivery loop skips (offline_queue.py refuse-new)
SkipWindows = dict[tuple[str, int], tuple[int, int]]


def session_group(client_id: str) -> str:
    """A fresh consumer group name for one incarnation of a persistent session."""
    clean = _GROUP_OK.sub("_", client_id)[:120]
    digest = hashlib.sha1(client_id.encode()).hexdigest()[:8]
    return f"mqtt.s.{clean}.{digest}.{uuid.uuid4().hex[:8]}"


NO_IDS: frozenset[int] = frozenset()  # a QoS 2 id set until its first id


def qos2_prefix(client_id: str) -> str:
    return f"{len(client_id)}:{client_id}:"


def split_qos2_key(key: str) -> tuple[str, str] | None:
    """(client id, "i<packet id>" | "o<packet id>") of a "mqtt.qos2" key; None if malformed."""
    n, _, rest = key.partition(":")
    if n.isdigit() and rest[int(n) : int(n) + 1] == ":":
        return rest[: int(n)], rest[int(n) + 1 :]
    return None


class SessionState:
    """One persistent session: subscriptions, QoS 2 packet ids, the connection it is attached to
    (None while offline) and the delivery loops that run while it is attached. Compact: one is held
    per device, online or not (the QoS 2 id sets exist once used)."""

    __slots__ = (
        "client_id",
        "group",
        "version",
        "expiry",
        "disconnected_at",
        "subs",
        "awaiting_rel",
        "pubrel",
        "attached",
        "feeds",
        "wild",
        "queue",
        "queue_made",
        "skip",
        "expiry_timer",
        "will_timer",
        "pending_will",
        "detaching",
        "discarding",
        "discarded",
    )

    def __init__(self, client_id: str, group: str, version: int, expiry: int) -> None:
        self.client_id = client_id
        self.group = group
        self.version = version
        self.expiry = expiry
        self.disconnected_at: float | None = None
        self.subs: dict[str, Sub] = {}  # by filter as subscribed ($share/... included)
        self.awaiting_rel: set[int] | frozenset[int] = NO_IDS  # inbound QoS 2: stored, PUBREL not yet
        self.pubrel: set[int] | frozenset[int] = NO_IDS  # outbound QoS 2: PUBREC received, PUBCOMP not yet
        self.attached: Connection | None = None
        self.feeds: dict[str, DeliveryLoop] = {}  # store topic -> loop (while attached)
        self.wild = 0  # subscriptions whose first level is a wildcard (cover every store topic)
        self.queue: str | None = None  # its own store topic (session_routing.py), or None: reads topics
        self.queue_made = False  # whether `queue` exists in the store (made at the first subscription)
        self.skip: SkipWindows = {}  # refuse-new: offsets beyond the offline queue cap (offline_queue.py)
        self.expiry_timer: asyncio.TimerHandle | None = None
        self.will_timer: asyncio.TimerHandle | None = None
        self.pending_will: Any = None  # (ctx, will) waiting for its Will Delay Interval
        self.detaching: asyncio.Task | None = None
        self.discarding: asyncio.Future | None = None  # set while the registry discards it
        self.discarded = False

    def topics(self, all_topics: list[str]) -> set[str]:
        """The store topics this session's (non-shared) subscriptions cover: its queue if it has one."""
        from .mapping import store_topic_of_level

        if self.queue is not None:
            return {self.queue} if any(s.share is None for s in self.subs.values()) else set()
        if self.wild:
            return set(all_topics)
        return {store_topic_of_level(s.first) for s in self.subs.values() if s.share is None}

    def restore_qos2(self, marks: Iterable[str]) -> None:
        """Take back saved QoS 2 packet ids ("i<id>" inbound, "o<id>" outbound; bad ones skipped)."""
        for t in marks:
            with contextlib.suppress(ValueError, IndexError):
                pid = int(t[1:])
                if t[0] == "i":
                    self.received_qos2(pid)
                else:
                    self.released_qos2(pid)

    def received_qos2(self, pid: int) -> set[int]:
        """Inbound QoS 2 `pid` stored, its PUBREL not yet received; the set of such ids."""
        ids = self.awaiting_rel
        if type(ids) is frozenset:
            ids = self.awaiting_rel = set()
        ids.add(pid)  # type: ignore[union-attr]
        return ids  # type: ignore[return-value]

    def released_qos2(self, pid: int) -> None:
        """Outbound QoS 2 `pid`: PUBREC received, PUBCOMP not yet."""
        ids = self.pubrel
        if type(ids) is frozenset:
            ids = self.pubrel = set()
        ids.add(pid)  # type: ignore[union-attr]

    def record(self) -> bytes:
        subs = [[f, s.qos, int(s.nl), int(s.rap), s.rh, s.sub_id] for f, s in self.subs.items()]
        d: dict[str, Any] = {"v": self.version, "e": self.expiry, "d": self.disconnected_at, "g": self.group}
        if self.queue is not None:
            d["q"] = self.queue
        d["s"] = subs
        return json.dumps(d, separators=(",", ":")).encode()

    def remaining(self, now: float | None = None) -> float | None:
        """Seconds until the (offline) session expires; None if it never does."""
        if self.expiry >= NEVER:
            return None
        since = self.disconnected_at
        if since is None:
            return float(self.expiry)
        return self.expiry - ((time.time() if now is None else now) - since)


def parse_record(client_id: str, value: bytes) -> tuple[SessionState, list[list[Any]]]:
    """A SessionState (without Sub objects) and its raw subscription list from a kv record."""
    d = json.loads(value)
    st = SessionState(client_id, d["g"], d.get("v", 4), d.get("e", NEVER))
    st.disconnected_at = d.get("d")
    st.queue = d.get("q")
    return st, d.get("s", [])


class RecordWriter:
    """Group commit of session records: `put` queues a record (None: delete it) for the next
    `kv_put_many` and returns once that write is durable (raising what it raised)."""

    __slots__ = ("processor", "_pending", "_done", "_writing", "_task")

    def __init__(self, processor: MessagingProcessor) -> None:
        self.processor = processor
        self._pending: dict[str, bytes | None] = {}
        self._done: asyncio.Future[None] | None = None  # settles when the pending batch is written
        self._writing = False
        self._task: asyncio.Task[None] | None = None

    async def put(self, client_id: str, value: bytes | None) -> None:
        self._pending.pop(client_id, None)  # (re-inserted last: a dict keeps its writes in order)
        self._pending[client_id] = value
        done = self._done
        if done is None:
            done = self._done = asyncio.get_running_loop().create_future()
        if not self._writing:
            self._writing = True
            self._task = asyncio.get_running_loop().create_task(self._write())
        await asyncio.shield(done)

    async def _write(self) -> None:
        try:
            while self._pending:
                batch, done = self._pending, self._done
                self._pending, self._done = {}, None
                try:
                    await self.processor.kv_put_many(SESSIONS_NS, batch)
                except Exception as e:  # noqa: BLE001 - every waiter of the batch gets it
                    if done is not None and not done.done():
                        done.set_exception(e)
                        done.exception()  # (retrieved: a waiter may have been cancelled)
                else:
                    if done is not None and not done.done():
                        done.set_result(None)
        finally:
            self._writing = False


_writers: weakref.WeakKeyDictionary[Any, RecordWriter] = weakref.WeakKeyDictionary()


def record_writer(processor: MessagingProcessor) -> RecordWriter:
    """The session record writer of `processor` (one per processor, so one per proxy)."""
    w = _writers.get(processor)
    if w is None:
        w = _writers[processor] = RecordWriter(processor)
    return w


async def save(processor: MessagingProcessor, st: SessionState) -> None:
    """Write the session record (not once the session is discarded); durable on return."""
    if not st.discarded:
        await record_writer(processor).put(st.client_id, st.record())


async def delete_record(processor: MessagingProcessor, client_id: str) -> None:
    """Delete a session record, after any write of it asked for earlier."""
    await record_writer(processor).put(client_id, None)


def qos2_mark(
    processor: MessagingProcessor, st: SessionState, direction: str, pid: int, on: bool
) -> Awaitable[Any]:
    """Record (or forget) a QoS 2 packet id of a persistent session in the kv table."""
    key = f"{qos2_prefix(st.client_id)}{direction}{pid}"
    return processor.kv_put(QOS2_NS, key, b"") if on else processor.kv_delete(QOS2_NS, key)
