"""Message tracing: the per-message lifecycle record (which trace context a message has, and which
one is delivered: messaging_processor/trace_context.py, re-exported here).

`TraceRecorder` keeps what happens to each message (received and stored, delivered, acked, nacked,
...) as compact records in the system topic `%TRACE%` (one queue, retention = the trace retention).
The processor hands it small tuples; they are buffered and written every 200 ms (or 512 events) with
one `append_many`, so the send path never waits on the trace. A record holds many rows (orjson) and
the store's key index makes them findable by commit log position (`trace-clo:<offset >> 16>`): a
send is one row naming the commit log ranges it filled, a pop one row of (offset, attempt) pairs, an
ack one pair in a row of acks; a query finds the message (by id, key or trace id) and then its rows.

Hand-written rather than the OpenTelemetry SDK: the SDK exports spans to a collector, it does not
keep a queryable per-message history in our store, which is what the admin API answers from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
from collections.abc import Awaitable, Callable, Sequence
from time import time_ns
from typing import Any

import orjson

from runtime.tasks import cancel_and_wait
from store import ALL, AppendResult, Message, PoppedMessage

from .model import ClientContext
from .trace_context import (
    GATEWAY_TRACEPARENT,
    TRACE_ID_PREFIX,
    TRACEPARENT,
    context_of,
    derivable_id,
    derived_traceparent,
    format_traceparent,
    handle_group,
    handle_position,
    match_traceparent,
    new_traceparent,
    next_trace_sequence,
    position_of_handle,
    stored_context,
    trace_id_of,
    traceparent_of,
    valid_traceparent,
)
from .trace_queries import (
    CLO_BITS,
    CLO_KEY_PREFIX,
    MESSAGE_KEY_PREFIX,
    POSITION_KEY_PREFIX,
    SEQUENCE_KEY_PREFIX,
    TRACE_KEY_PREFIX,
    TRACE_TOPIC,
    Row,
    TraceQueries,
    send_events,
)

__all__ = [  # (the trace context helpers are imported from here too)
    "DELIVERED_FIELDS",
    "EVENTS",
    "GATEWAY_TRACEPARENT",
    "TRACE_TOPIC",
    "TRACEPARENT",
    "TraceRecorder",
    "context_of",
    "derivable_id",
    "derived_traceparent",
    "format_traceparent",
    "match_traceparent",
    "new_traceparent",
    "next_trace_sequence",
    "position_of_handle",
    "recorder_for",
    "stored_context",
    "trace_id_of",
    "traceparent_of",
    "valid_traceparent",
]

log = logging.getLogger("messaging_processor.tracing")

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
# kinds of `TraceRecorder.pending` entries
STORED, DELIVERED, HANDLED, EVENT, PULLED, COMMITTED, TAILED = range(7)
_MAX_PULLED = 4096  # per group and queue: pulled offsets remembered until a commit passes them
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
# what a PULLED entry keeps of each message read by a pull consumer (4.x PULL_MESSAGE)
PULLED_FIELDS = operator.attrgetter(
    "queue_offset", "commitlog_offset", "reconsume_times", "properties", "message_id"
)
# what a TAILED entry keeps of each message a tail read got (MessagingProcessor.tail)
TAILED_FIELDS = operator.attrgetter(
    "topic", "queue_id", "queue_offset", "commitlog_offset", "properties", "message_id"
)


class TraceRecorder(TraceQueries):
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
        read: Callable[..., Awaitable[list[Message]]] | None = None,
        flush_interval_s: float = 0.2,
        max_buffered: int = 512,
    ) -> None:
        self._append_many = append_many
        self._create_topic = create_topic
        self._get_topic = get_topic
        self._get_by_id = get_by_id
        self._get_by_key = get_by_key
        self._read = read  # the StoreClient's `read`: the message of an event known by its position
        self.retention_ms = retention_ms
        self.flush_interval_s = flush_interval_s
        self.max_buffered = max_buffered
        self.pending: list[tuple] = []  # see "events" below
        # receipt handle -> (topic, queue id, offset, traceparent), for the events that know only a handle
        self._handles: dict[str, tuple[str, int, int, str | None]] = {}
        self._nacked: set[tuple[str, int, int]] = set()
        # (group, topic, queue) -> {offset: commit log offset} of pulled messages not yet committed
        self._pulled: dict[tuple[str, str, int], dict[int, int]] = {}
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
        await cancel_and_wait(self._task)
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
    #   (STORED, ms, ctx, [(index, traceparent), ...] | None, results)  a send stored messages at
    #       `results`; those at `index` with that (explicit) traceparent, the others derive theirs
    #   (DELIVERED, ms, ctx, group, [DELIVERED_FIELDS(p) for p in popped])  a pop handed them to `group`
    #   (HANDLED, ms, ctx, event, handle, new handle | None, detail | None)
    #   (EVENT, ms, ctx, event, message id, detail | None, traceparent | None)
    #   (PULLED, ms, ctx, group, topic, queue id, [PULLED_FIELDS(m) for m in read])  a pull consumer
    #       (reading by offset) got these; (COMMITTED, ms, ctx, group, topic, queue id, offset) it
    #       committed its offset: the pulled messages below it are `acked`
    #   (TAILED, ms, ctx, group, [TAILED_FIELDS(m) for m in read])  a subscriber that does not
    #       compete read these by offset: `delivered` and `acked` at once
    # and calls `wake()` when len(pending) reaches `max_buffered`. The methods below do the same.
    def stored(
        self, ctx: ClientContext, messages: Sequence[Message], results: Sequence[AppendResult]
    ) -> None:
        """A send stored `messages` at `results`: received + stored events."""
        explicit = [(i, tp) for i, m in enumerate(messages) if (tp := stored_context(m.properties))]
        self._add((STORED, time_ns() // 1_000_000, ctx, explicit, results))

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
        self,
        ctx: ClientContext,
        event: str,
        message_id: str,
        detail: str | None = None,
        traceparent: str | None = None,
    ) -> None:
        """`event` (e.g. redriven, dead_lettered) of the message `message_id` known only by its id
        (`traceparent`: its trace context, `traceparent_of`, when the caller has the message)."""
        self._add((EVENT, time_ns() // 1_000_000, ctx, event, message_id, detail, traceparent))

    def pulled(
        self, ctx: ClientContext, group: str, topic: str, queue_id: int, read: Sequence[Message]
    ) -> None:
        """A pull consumer of `group` read `read` (by offset) to consume them: delivered events."""
        self._add(
            (PULLED, time_ns() // 1_000_000, ctx, group, topic, queue_id, list(map(PULLED_FIELDS, read)))
        )

    def tailed(self, ctx: ClientContext, group: str, read: Sequence[Message]) -> None:
        """A subscriber that does not compete read `read` by offset (MessagingProcessor.tail):
        delivered to `group` and acked at once (nothing is left to ack)."""
        self._add((TAILED, time_ns() // 1_000_000, ctx, group, list(map(TAILED_FIELDS, read))))

    def committed(self, ctx: ClientContext, group: str, topic: str, queue_id: int, offset: int) -> None:
        """`group` committed its offset of a queue: the messages it pulled below it are acked."""
        self._add((COMMITTED, time_ns() // 1_000_000, ctx, group, topic, queue_id, offset))

    def _add(self, entry: tuple) -> None:
        self.pending.append(entry)
        if len(self.pending) >= self.max_buffered:
            self._wake.set()

    # ------------------------------------------------------------------ writing
    # A record's body is an orjson list of rows, its keys what finds them (few keys per record:
    # the key index is the costly part). Every row is keyed by the commit log buckets
    # (`trace-clo:<offset >> 16>`) of the messages it names; the message (found by id, key or trace
    # id) gives its topic, queue, offset, id and trace context, so no row repeats them:
    #   ["R", ms, protocol, client id, user, [[first, end], ...], [[message id, traceparent], ...]]
    #       one send: it stored the messages whose commit log offsets lie in [first, end) (each
    #       range holds only this send's records: consecutive results, sizes adding up); the second
    #       list names the messages stored with a traceparent (a client's: also keyed
    #       `trace:<trace id>`; one made here: `trace-seq:<first 29 hex digits of its trace id>`)
    #   ["D", ms, protocol, client id, user, group, [[commit log offset, attempt, redelivery], ...]]
    #       one pop; redelivery "retried" (after a nack) or "expired", else None
    #   ["H", event, protocol, client id, user, group, [[commit log offset, ms, detail], ...]]
    #       consecutive acks (nacks, ...) of one client and group
    #   Row (see `Row`): an event known only by the position a receipt handle names (another proxy
    #       popped it; keyed `trace-pos:<topic>/<queue>/<offset >> 8>`) or by message id
    #       (`trace-msg:<id>`)
    # (Records written before these rows hold "S" rows and a Row per event: still read.)
    def _take_rows(self, expand: bool = False) -> tuple[list[tuple[Any, Any]], list[Row]]:
        """The rows (with their record keys) of everything pending, which is then cleared; with
        `expand`, also every event as a full Row (for the exporters)."""
        pending, self.pending = self.pending, []
        out: list[tuple[Any, Any]] = []
        full: list[Row] = []
        add = out.append
        acks: list | None = None  # the items of the "H" row being filled
        last_h: tuple = ()
        for e in pending:
            kind, t, ctx = e[0], e[1], e[2]
            proto, client, user = ctx.protocol, ctx.client_id, ctx.identity.username or None
            if kind == HANDLED:
                known = self._handles.pop(e[4], None)
                if known is not None:
                    event, handle, new_handle, detail = e[3:]
                    topic, qid, off, tp, clo, mid = known
                    if new_handle is not None:
                        self._handles[new_handle] = known
                    if event == "nacked":
                        if len(self._nacked) >= _MAX_HANDLES:
                            self._nacked.clear()
                        self._nacked.add(clo)
                    group = handle_group(handle)
                    head = (event, ctx, group)
                    if acks is None or head != last_h:
                        acks, last_h = [], head
                        add((["H", event, proto, client, user, group, acks], set()))
                    acks.append((clo, t, detail))
                    out[-1][1].add(CLO_KEY_PREFIX + str(clo >> CLO_BITS))
                    if expand:
                        full.append([event, t, proto, client, user, group, qid, off, None, detail, mid,
                                     tp or derived_traceparent(mid), topic, clo])  # fmt: skip
                    continue
                self._unknown_handle_row(out, full if expand else None, t, proto, client, user, *e[3:])
            elif kind == STORED:
                self._send_row(out, full if expand else None, t, proto, client, user, e[3], e[4])
            elif kind == DELIVERED:
                self._delivered_row(out, full if expand else None, t, proto, client, user, e[3], e[4])
            elif kind == PULLED:
                self._pulled_row(out, full if expand else None, t, proto, client, user, *e[3:])
            elif kind == COMMITTED:
                self._committed_row(out, full if expand else None, t, proto, client, user, *e[3:])
            elif kind == TAILED:
                self._tailed_row(out, full if expand else None, t, proto, client, user, e[3], e[4])
            else:
                event, mid, detail, tp = e[3:]
                row = [event, t, proto, client, user, None, None, None, None, detail, mid, tp, None, None]
                add((row, (MESSAGE_KEY_PREFIX + mid,)))
                if expand:
                    full.append(row)
            acks = None
        return out, full

    @staticmethod
    def _send_row(
        out: list, full: list[Row] | None, t: int, proto: str, client: str, user: str | None,
        explicit: Sequence[tuple[int, str]] | None, results: Sequence[AppendResult],
    ) -> None:  # fmt: skip
        first = results[0]
        last = results[-1]
        if last[4] + last[5] - first[4] == sum(r[5] for r in results):  # (the usual case: one range)
            runs = [(first[4], last[4] + last[5])]
        else:
            runs = []
            for r in results:
                clo, end = r[4], r[4] + r[5]
                if runs and runs[-1][0] <= clo <= runs[-1][1]:
                    runs[-1][1] = max(runs[-1][1], end)
                else:
                    runs.append([clo, end])
        bits = CLO_BITS
        keys = {CLO_KEY_PREFIX + str(b) for a, z in runs for b in range(a >> bits, ((z - 1) >> bits) + 1)}
        tagged = []
        for i, tp in explicit or ():
            tagged.append((results[i][0], tp))
            made = tp[3:19] == TRACE_ID_PREFIX
            keys.add(SEQUENCE_KEY_PREFIX + tp[3:32] if made else TRACE_KEY_PREFIX + tp[3:35])
        out.append((("R", t, proto, client, user, runs, tagged), keys))
        if full is not None:
            tps = dict(explicit or ())
            for i, res in enumerate(results):  # (the others' contexts derive from their ids)
                tp = tps.get(i) or derived_traceparent(res[0])
                full += send_events(t, proto, client, user, res, tp)

    def _delivered_row(
        self, out: list, full: list[Row] | None, t: int, proto: str, client: str, user: str | None,
        group: str, popped: Sequence,
    ) -> None:  # fmt: skip
        handles, nacked = self._handles, self._nacked
        items = []
        keys = set()
        for topic, qid, off, clo, props, reconsumed, mid, handle in popped:  # (DELIVERED_FIELDS)
            redelivery = None
            if reconsumed:
                redelivery = "retried" if clo in nacked else "expired"
                nacked.discard(clo)
            items.append((clo, reconsumed + 1, redelivery))
            keys.add(CLO_KEY_PREFIX + str(clo >> CLO_BITS))
            tp = None if full is None else context_of(props, mid)  # (only the exporters need it)
            if len(handles) >= _MAX_HANDLES:
                del handles[next(iter(handles))]
            handles[handle] = (topic, qid, off, tp, clo, mid)
            if full is not None:
                if redelivery:
                    full.append([redelivery, t, proto, client, user, group, qid, off, reconsumed, None, mid,
                                 tp, topic, clo])  # fmt: skip
                full.append(["delivered", t, proto, client, user, group, qid, off, reconsumed + 1, None, mid,
                             tp, topic, clo])  # fmt: skip
        out.append((("D", t, proto, client, user, group, items), keys))

    def _pulled_row(
        self, out: list, full: list[Row] | None, t: int, proto: str, client: str, user: str | None,
        group: str, topic: str, qid: int, read: Sequence[tuple],
    ) -> None:  # fmt: skip
        items = [(r[1], r[2] + 1, None) for r in read]  # (PULLED_FIELDS)
        keys = {CLO_KEY_PREFIX + str(r[1] >> CLO_BITS) for r in read}
        out.append((("D", t, proto, client, user, group, items), keys))
        key = (group, topic, qid)
        pulled = self._pulled.pop(key, None) or {}
        self._pulled[key] = pulled  # (most recently pulled last: the oldest key goes first)
        if full is None:
            pulled.update((r[0], r[1]) for r in read)
        else:  # (the exporters: what the ack at the commit needs too)
            for off, clo, reconsumed, props, mid in read:
                tp = context_of(props, mid)
                pulled[off] = (clo, tp, mid)
                full.append(["delivered", t, proto, client, user, group, qid, off, reconsumed + 1, None, mid,
                             tp, topic, clo])  # fmt: skip
        while len(pulled) > _MAX_PULLED:
            del pulled[next(iter(pulled))]
        while len(self._pulled) > _MAX_PULLED:
            del self._pulled[next(iter(self._pulled))]

    @staticmethod
    def _tailed_row(
        out: list, full: list[Row] | None, t: int, proto: str, client: str, user: str | None,
        group: str, read: Sequence[tuple],
    ) -> None:  # fmt: skip
        clos = [r[3] for r in read]  # (TAILED_FIELDS)
        keys = {CLO_KEY_PREFIX + str(clo >> CLO_BITS) for clo in clos}
        out.append((("D", t, proto, client, user, group, [(clo, 1, None) for clo in clos]), keys))
        out.append((("H", "acked", proto, client, user, group, [(clo, t, None) for clo in clos]), set(keys)))
        if full is not None:
            for topic, qid, off, clo, props, mid in read:
                tp = context_of(props, mid)
                for event, attempt in (("delivered", 1), ("acked", None)):
                    full.append([event, t, proto, client, user, group, qid, off, attempt, None, mid,
                                 tp, topic, clo])  # fmt: skip

    def _committed_row(
        self, out: list, full: list[Row] | None, t: int, proto: str, client: str, user: str | None,
        group: str, topic: str, qid: int, offset: int,
    ) -> None:  # fmt: skip
        pulled = self._pulled.get((group, topic, qid))
        if not pulled:
            return
        done = [off for off in pulled if off < offset]
        if not done:
            return
        items = []
        for off in done:
            v = pulled.pop(off)  # commit log offset, or (it, traceparent, message id) for the exporters
            if type(v) is tuple:
                clo, tp, mid = v
                if full is not None:
                    full.append(["acked", t, proto, client, user, group, qid, off, None, "offset committed",
                                 mid, tp, topic, clo])  # fmt: skip
            else:
                clo = v
            items.append((clo, t, "offset committed"))
        keys = {CLO_KEY_PREFIX + str(clo >> CLO_BITS) for clo, _t, _d in items}
        out.append((("H", "acked", proto, client, user, group, items), keys))

    @staticmethod
    def _unknown_handle_row(
        out: list, full: list[Row] | None, t: int, proto: str, client: str, user: str | None,
        event: str, handle: str, new_handle: str | None, detail: str | None,
    ) -> None:  # fmt: skip
        """An event on a delivery this recorder did not see (popped before a restart, or through
        another proxy): the handle names the message's position."""
        where = handle_position(handle)
        if where is None:
            return
        topic, qid, off = where
        row = (event, t, proto, client, user, handle_group(handle), qid, off, None, detail, None, None,
               topic, None)  # fmt: skip
        out.append((row, (f"{POSITION_KEY_PREFIX}{topic}/{qid}/{off >> 8}",)))
        if full is not None:  # (its message and context are looked up before the export: `_known`)
            full.append(list(row))

    async def _known(self, full: list[Row]) -> None:
        """Fill in the message id, trace context and commit log offset of the exported events known
        only by the position a receipt handle named (read from the store: rare, after a restart)."""
        if self._read is None:
            return
        for r in full:
            if r[11] is None and r[10] is None and r[12] is not None and r[7] is not None:
                try:
                    found = await self._read(r[12], r[6], r[7], r[7] + 1, 1, ALL)
                except Exception as e:  # noqa: BLE001 - an export never stops the record
                    log.debug("trace export: message at %s/%s/%s not read: %s", r[12], r[6], r[7], e)
                    continue
                for m in found:
                    if m.queue_offset == r[7]:
                        r[10], r[11], r[13] = m.message_id, traceparent_of(m), m.commitlog_offset

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
        rows, full = self._take_rows(expand=bool(self.sinks))
        if full:
            await self._known(full)
        for sink in self.sinks:
            try:
                sink(full)
            except Exception as e:  # noqa: BLE001 - an exporter never stops the record
                log.warning("message trace export failed: %s", e)
        del full
        records = self._records(rows)
        del rows
        if not records:  # (e.g. offset commits past no pulled message)
            return
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


def recorder_for(store: Any, retention_ms: int) -> TraceRecorder:
    """A TraceRecorder over a StoreClient (LOCAL or CLUSTER: both look messages up by key)."""
    return TraceRecorder(
        store.append_many,
        store.create_topic,
        store.get_topic,
        store.get_by_id,
        store.get_by_key,
        retention_ms=retention_ms,
        read=store.read,
    )
