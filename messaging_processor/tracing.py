"""Message tracing: W3C `traceparent` handling and the per-message lifecycle record.

Every message carries its W3C trace context in the store property `traceparent`
(`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`): a valid one from the client is kept, any
other is replaced by a new one (the processor's `ensure_traceparents`). Adapters only map their
protocol's field to and from that property.

`TraceRecorder` keeps what happens to each message (received and stored, delivered, acked, nacked,
...) as compact records in the system topic `%TRACE%` (one queue, retention = the trace retention).
The processor hands it small tuples; they are buffered and written every 200 ms (or 512 events) with
one `append_many`, so the send path never waits on the trace. A record holds many events (orjson
rows) and the store's key index makes them findable: `trace:<trace id>` and a bucket of positions
(`<topic>/<queue>/<offset>`: the events after `stored` know only a receipt handle, which names the
position); a query by message id finds the message's position through the store's id index.

Hand-written rather than the OpenTelemetry SDK: the SDK exports spans to a collector, it does not
keep a queryable per-message history in our store, which is what the admin API answers from.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import operator
import re
from collections.abc import Awaitable, Callable, Sequence
from random import getrandbits
from time import time_ns
from typing import Any

import orjson

from store import AppendResult, Message, PoppedMessage

from .model import ClientContext

log = logging.getLogger("messaging_processor.tracing")

TRACEPARENT = "traceparent"
TRACE_TOPIC = "%TRACE%"
TRACE_KEY_PREFIX = "trace:"  # + trace id: the messages of a trace (a client's trace id)
SEQUENCE_KEY_PREFIX = "trace-seq:"  # + the first 29 hex digits of a trace id this gateway made
POSITION_KEY_PREFIX = "trace-pos:"  # + <topic>/<queue>/<offset >> 8>: events named by a receipt handle
CLO_KEY_PREFIX = "trace-clo:"  # + <commit log offset >> 16>: the events of the messages stored there
MESSAGE_KEY_PREFIX = "trace-msg:"  # + message id: events known only by message id
_CLO_BITS = 16
EVENTS = (
    "received",
    "stored",
    "delivered",
    "acked",
    "nacked",
    "invisible_time_changed",
    "expired",
    "retried",
    "dead_lettered",
    "redriven",
)
_MAX_RECORD_KEY_BYTES = 32_000  # a record's keys are joined into a u16-sized field
_MAX_RECORD_ROWS = 256
_MAX_HANDLES = 4096  # unsettled deliveries remembered (receipt handle -> message), oldest dropped (then
# an ack is recorded by the position its handle names: tests/limits/test_memory.py bounds the memory)
STORED, DELIVERED, HANDLED, EVENT = range(4)  # kinds of `TraceRecorder.pending` entries
# what a DELIVERED entry keeps of each popped message: its metadata, never its body (the buffer
# would otherwise hold every delivered body until the next write: tests/limits/test_memory.py).
# A C-level getter: `list(map(DELIVERED_FIELDS, popped))` runs no Python frame per message.
DELIVERED_FIELDS = operator.attrgetter(
    "message.topic",
    "message.queue_id",
    "message.queue_offset",
    "message.commitlog_offset",
    "message.properties",
    "message.reconsume_times",
    "message.message_id",
    "receipt_handle",
)
# C-level callables, so that the processor's hot path enters no Python frame of this module:
match_traceparent = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
).fullmatch  # (the length is checked first: 55)
# A traceparent this process makes: trace id = a random 64-bit prefix (per process) and a 64-bit
# sequence number, span id = the sequence number; flags 01 (sampled). Unique without a random draw
# per message, and indexable in buckets of 4096 (`SEQUENCE_KEY_PREFIX`) instead of one key each.
TRACE_ID_PREFIX = f"{getrandbits(64) | 1 << 63:016x}"
next_trace_sequence = itertools.count(1).__next__
format_traceparent = ("00-" + TRACE_ID_PREFIX + "{0:016x}-{0:016x}-01").format  # (sequence number)

# An event row: [event, time ms, protocol, client id, user, group, queue id, offset, attempt, detail,
# message id, traceparent, topic, commit log offset] (None where unknown)
Row = list[Any]


def valid_traceparent(value: str | None) -> bool:
    """Whether `value` is a W3C traceparent we keep (version 00 layout, non-zero ids)."""
    return value is not None and len(value) == 55 and match_traceparent(value) is not None


def new_traceparent() -> str:
    """A new sampled traceparent of this process (see `format_traceparent`)."""
    return format_traceparent(next_trace_sequence())


def trace_id_of(traceparent: str) -> str:
    """The 32 hex digit trace id of a (valid) traceparent."""
    return traceparent[3:35]


def position_of_handle(handle: str) -> str | None:
    """The position `<topic>/<queue>/<offset>` a receipt handle points at (store/popping.py
    `encode_handle`: `seq qid offset topic group`, in CLUSTER mode prefixed by `<node>@`)."""
    where = _position_of_handle(handle)
    return None if where is None else f"{where[0]}/{where[1]}/{where[2]}"


class TraceRecorder:
    """Buffers lifecycle events and writes them to `%TRACE%`; answers trace queries.

    `append_many`, `create_topic`, `get_topic`, `get_by_id` and `get_by_key` are the StoreClient's
    (passed one by one so tests can hand in fakes); `retention_ms` is the `%TRACE%` topic's."""

    def __init__(
        self,
        append_many: Callable[[list[Message]], Awaitable[list[AppendResult]]],
        create_topic: Callable[..., Awaitable[object]],
        get_topic: Callable[[str], Awaitable[object | None]],
        get_by_id: Callable[[str], Awaitable[list[Message]]],
        get_by_key: Callable[[str], Awaitable[list[Message]]] | None,
        *,
        retention_ms: int,
        flush_interval_s: float = 0.2,
        max_buffered: int = 512,
    ) -> None:
        self._append_many = append_many
        self._create_topic = create_topic
        self._get_topic = get_topic
        self._get_by_id = get_by_id
        self._get_by_key = get_by_key
        self.retention_ms = retention_ms
        self.flush_interval_s = flush_interval_s
        self.max_buffered = max_buffered
        self.pending: list[tuple] = []  # see "events" below
        # receipt handle -> (topic, queue id, offset, traceparent), for the events that know only a handle
        self._handles: dict[str, tuple[str, int, int, str | None]] = {}
        self._nacked: set[tuple[str, int, int]] = set()
        self.sinks: list[Callable[[list[Row]], None]] = []  # also handed every flushed batch (OTLP)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._topic_ready = False
        self.dropped = 0  # records lost because the store refused them

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Write what is buffered and stop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            self._wake.clear()
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - tracing never stops the gateway
                log.warning("writing the message trace failed: %s", e)

    def wake(self) -> None:
        """Write soon (the buffer is full)."""
        self._wake.set()

    # ------------------------------------------------------------------ events
    # The processor appends tuples to `pending` itself (a list append: no Python frame on its hot
    # path, docs/architecture.md); rows are built when they are written, in the order appended:
    #   (STORED, ms, ctx, traceparents, results)    a send stored messages with these at `results`
    #   (DELIVERED, ms, ctx, group, [DELIVERED_FIELDS(p) for p in popped])  a pop handed them to `group`
    #   (HANDLED, ms, ctx, event, handle, new handle | None, detail | None)
    #   (EVENT, ms, ctx, event, message id, detail | None)
    # and calls `wake()` when len(pending) reaches `max_buffered`. The methods below do the same.
    def stored(
        self, ctx: ClientContext, messages: Sequence[Message], results: Sequence[AppendResult]
    ) -> None:
        """A send stored `messages` (with `traceparent`s) at `results`: received + stored events."""
        tps = [m.properties.get(TRACEPARENT) or "" for m in messages]
        self._add((STORED, time_ns() // 1_000_000, ctx, tps, results))

    def delivered(self, ctx: ClientContext, group: str, popped: Sequence[PoppedMessage]) -> None:
        """A pop handed `popped` out to `group`; a redelivery is also `retried` (after a nack) or
        `expired` (its invisible time passed)."""
        self._add((DELIVERED, time_ns() // 1_000_000, ctx, group, list(map(DELIVERED_FIELDS, popped))))

    def handled(
        self,
        ctx: ClientContext,
        event: str,
        handle: str,
        new_handle: str | None = None,
        detail: str | None = None,
    ) -> None:
        """`event` (acked, nacked, invisible_time_changed, dead_lettered) on the delivery of `handle`."""
        self._add((HANDLED, time_ns() // 1_000_000, ctx, event, handle, new_handle, detail))

    def message_event(
        self, ctx: ClientContext, event: str, message_id: str, detail: str | None = None
    ) -> None:
        """`event` (e.g. redriven, dead_lettered) of the message `message_id` known only by its id."""
        self._add((EVENT, time_ns() // 1_000_000, ctx, event, message_id, detail))

    def _add(self, entry: tuple) -> None:
        self.pending.append(entry)
        if len(self.pending) >= self.max_buffered:
            self._wake.set()

    # ------------------------------------------------------------------ writing
    # A record's body is an orjson list of rows, its keys what finds them (few keys per message:
    # the key index is the costly part):
    #   ["S", received ms, protocol, client id, user, [AppendResult as a list, ...], [traceparent, ...]]
    #       one send; keyed by the commit log buckets of its messages (`trace-clo:<offset >> 16>`) and
    #       `trace:<trace id>` for a client's trace id, `trace-seq:<29 hex digits>` (4096 trace ids a
    #       key) for one made here
    #   Row (see `Row`, its last field the message's commit log offset)
    #       a later event; keyed by that commit log bucket, or, when only the receipt handle names
    #       the message (another proxy popped it), by `trace-pos:<topic>/<queue>/<offset >> 8>`; an
    #       event known only by message id by `trace-msg:<id>`
    def _take_rows(self) -> list[tuple[Any, Any]]:
        """The rows (with their record keys) of everything pending, which is then cleared."""
        pending, self.pending = self.pending, []
        out: list[tuple[Any, Any]] = []
        add = out.append
        for e in pending:
            kind, t, ctx = e[0], e[1], e[2]
            proto, client, user = ctx.protocol, ctx.client_id, ctx.identity.username or None
            if kind == STORED:
                tps, results = e[3], e[4]
                keys = {CLO_KEY_PREFIX + str(r[4] >> _CLO_BITS) for r in results}
                for tp in tps:  # (no per-message work but this: a made trace id is one slice compare)
                    if tp[3:19] == TRACE_ID_PREFIX:
                        keys.add(SEQUENCE_KEY_PREFIX + tp[3:32])
                    elif tp:
                        keys.add(TRACE_KEY_PREFIX + tp[3:35])
                add((("S", t, proto, client, user, list(map(tuple, results)), tps), keys))
            elif kind == DELIVERED:
                self._delivered_rows(out, t, proto, client, user, e[3], e[4])
            elif kind == HANDLED:
                self._handled_row(out, t, proto, client, user, *e[3:])
            else:
                event, mid, detail = e[3:]
                row = (event, t, proto, client, user, None, None, None, None, detail, mid, None, None, None)
                add((row, (MESSAGE_KEY_PREFIX + mid,)))
        return out

    def _delivered_rows(
        self, out: list, t: int, proto: str, client: str, user: str | None, group: str, popped: Sequence
    ) -> None:
        handles, nacked = self._handles, self._nacked
        for topic, qid, off, clo, props, reconsumed, mid, handle in popped:  # (DELIVERED_FIELDS)
            keys = (CLO_KEY_PREFIX + str(clo >> _CLO_BITS),)
            tp = props.get(TRACEPARENT)
            attempt = reconsumed + 1
            if attempt > 1:
                ev = "retried" if clo in nacked else "expired"
                nacked.discard(clo)
                out.append(((ev, t, proto, client, user, group, qid, off, attempt - 1, None, mid, tp,
                             topic, clo), keys))  # fmt: skip
            out.append((("delivered", t, proto, client, user, group, qid, off, attempt, None, mid,
                         tp, topic, clo), keys))  # fmt: skip
            if len(handles) >= _MAX_HANDLES:
                del handles[next(iter(handles))]
            handles[handle] = (topic, qid, off, tp, clo, mid)

    def _handled_row(
        self,
        out: list,
        t: int,
        proto: str,
        client: str,
        user: str | None,
        event: str,
        handle: str,
        new_handle: str | None,
        detail: str | None,
    ) -> None:
        known = self._handles.pop(handle, None)
        if known is None:  # popped before a restart, or through another proxy: the handle names it
            where = _position_of_handle(handle)
            if where is None:
                return
            topic, qid, off = where
            group = _group_of_handle(handle)
            row = (event, t, proto, client, user, group, qid, off, None, detail, None, None, topic, None)
            out.append((row, (f"{POSITION_KEY_PREFIX}{topic}/{qid}/{off >> 8}",)))
            return
        topic, qid, off, tp, clo, mid = known
        if new_handle is not None:
            self._handles[new_handle] = known
        if event == "nacked":
            if len(self._nacked) >= _MAX_HANDLES:
                self._nacked.clear()
            self._nacked.add(clo)
        row = (
            event,
            t,
            proto,
            client,
            user,
            _group_of_handle(handle),
            qid,
            off,
            None,
            detail,
            mid,
            tp,
            topic,
            clo,
        )
        out.append((row, (CLO_KEY_PREFIX + str(clo >> _CLO_BITS),)))

    @staticmethod
    def _records(rows: list[tuple[Any, Any]]) -> list[Message]:
        """Rows packed into records of at most 256 rows and ~32 KB of keys."""
        records: list[Message] = []
        i = 0
        while i < len(rows):
            n = min(_MAX_RECORD_ROWS, len(rows) - i)
            while True:
                part = rows[i : i + n]
                keys = dict.fromkeys(k for _, ks in part for k in ks)
                if n == 1 or sum(map(len, keys)) + len(keys) <= _MAX_RECORD_KEY_BYTES:
                    break
                n //= 2
            records.append(Message(TRACE_TOPIC, orjson.dumps([r for r, _ in part]), "", tuple(keys)))
            i += n
        return records

    async def flush(self) -> None:
        """Write every buffered event now (one `append_many`)."""
        if not self.pending:
            return
        rows = self._take_rows()
        for sink in self.sinks:
            try:
                sink([x for r, _ in rows for x in _expanded(r)])
            except Exception as e:  # noqa: BLE001 - an exporter never stops the record
                log.warning("message trace export failed: %s", e)
        records = self._records(rows)
        del rows
        if not self._topic_ready:
            if await self._get_topic(TRACE_TOPIC) is None:
                await self._create_topic(TRACE_TOPIC, 1, self.retention_ms, None)
            self._topic_ready = True
        try:
            await self._append_many(records)
        except Exception:
            self.dropped += len(records)
            self._topic_ready = False  # (deleted by an operator? made again by the next flush)
            raise

    # ------------------------------------------------------------------ queries
    async def _rows_by_key(self, key: str) -> list[list]:
        if self._get_by_key is None:
            return []
        out: list[list] = []
        for rec in await self._get_by_key(key):
            if rec.topic == TRACE_TOPIC:
                out.extend(orjson.loads(rec.body))
        return out

    async def _rows_of(self, m: Message) -> list[list]:
        """The rows of the stored message `m`, the events of a send as Rows."""
        mid, clo = m.message_id, m.commitlog_offset
        out: list[list] = []
        for r in await self._rows_by_key(CLO_KEY_PREFIX + str(clo >> _CLO_BITS)):
            if r[0] == "S":
                for res, tp in zip(r[5], r[6], strict=False):
                    if res[0] == mid and res[4] == clo:
                        out += _send_events(r, res, tp)
            elif r[13] == clo:
                out.append(r)
        at = [m.topic, m.queue_id, m.queue_offset]
        for r in await self._rows_by_key(
            f"{POSITION_KEY_PREFIX}{m.topic}/{m.queue_id}/{m.queue_offset >> 8}"
        ):
            if r[0] != "S" and r[13] is None and [r[12], r[6], r[7]] == at:
                out.append(r)
        return out

    async def trace(self, message_id: str) -> dict[str, Any] | None:
        """The trace of a message (the admin API's JSON), None when nothing is known of it."""
        rows = [
            r
            for r in await self._rows_by_key(MESSAGE_KEY_PREFIX + message_id)
            if r[0] != "S" and r[10] == message_id and r[12] is None  # (known only by id)
        ]
        for m in await self._get_by_id(message_id):
            if m.message_id == message_id and not m.topic.startswith("%"):
                rows += await self._rows_of(m)
        return _trace_json(message_id, rows)

    async def traces_of_trace_id(self, trace_id: str) -> list[dict[str, Any]]:
        """The traces of every message of a trace id."""
        tid = trace_id.lower()
        ids: dict[str, None] = {}
        for key in (TRACE_KEY_PREFIX + tid, SEQUENCE_KEY_PREFIX + tid[:29]):
            for r in await self._rows_by_key(key):
                if r[0] == "S":
                    ids.update((res[0], None) for res, tp in zip(r[5], r[6], strict=False) if tp[3:35] == tid)
        return [t for mid in ids if (t := await self.trace(mid)) is not None]

    async def traces_of_key(self, key: str) -> list[dict[str, Any]]:
        """The traces of the messages whose key is `key` (the store's key index)."""
        if self._get_by_key is None:
            return []
        ids = dict.fromkeys(m.message_id for m in await self._get_by_key(key) if not m.topic.startswith("%"))
        return [t for mid in ids if (t := await self.trace(mid)) is not None]


def _send_events(r: Any, res: Any, tp: str) -> list[Row]:
    """The received and stored events (Rows) of one message of a send row."""
    _, t_in, proto, client, user = r[:5]
    mid, topic, qid, off, clo, _size, at = res
    at = at or t_in
    return [
        ["received", min(t_in, at), proto, client, user, None, None, None, None, None, mid, tp, topic, clo],
        ["stored", at, proto, client, user, None, qid, off, None, None, mid, tp, topic, clo],
    ]


def _expanded(r: Any) -> list[Row]:
    """A send row as its messages' received and stored events; any other row as it is."""
    if r[0] != "S":
        return [r]
    return [e for res, tp in zip(r[5], r[6], strict=False) for e in _send_events(r, res, tp)]


def _trace_json(message_id: str, rows: list) -> dict[str, Any] | None:
    if not rows:
        return None
    rows.sort(key=lambda r: r[1])  # stable: events of one ms stay in the order recorded
    stored = next((r for r in rows if r[0] == "stored"), None)
    tp = (stored[11] if stored is not None else next((r[11] for r in rows if r[11]), None)) or ""
    topic = stored[12] if stored is not None else next((r[12] for r in rows if r[12]), "")
    return {
        "message_id": message_id,
        "trace_id": trace_id_of(tp) if tp else "",
        "traceparent": tp,
        "topic": topic,
        "events": [_event_json(r) for r in rows],
    }


def _position_of_handle(handle: str) -> tuple[str, int, int] | None:
    parts = handle.rpartition("@")[2].split(" ", 4)
    if len(parts) != 5:
        return None
    try:
        return parts[3], int(parts[1]), int(parts[2])
    except ValueError:
        return None


def _group_of_handle(handle: str) -> str | None:
    parts = handle.rpartition("@")[2].split(" ", 4)
    return parts[4] if len(parts) == 5 else None


def _event_json(r: Row) -> dict[str, Any]:
    return {
        "event": r[0],
        "time": r[1],
        "protocol": r[2],
        "client_id": r[3] or "",
        "user": r[4],
        "group": r[5],
        "queue_id": r[6],
        "offset": r[7],
        "attempt": r[8],
        "detail": r[9],
    }


def recorder_for(store: Any, retention_ms: int) -> TraceRecorder:
    """A TraceRecorder over a StoreClient. Key lookups use its `get_by_key` (LocalStoreClient's);
    a client without one (CLUSTER mode today) records but cannot answer."""
    by_key = getattr(store, "get_by_key", None)
    return TraceRecorder(
        store.append_many,
        store.create_topic,
        store.get_topic,
        store.get_by_id,
        by_key,
        retention_ms=retention_ms,
    )
