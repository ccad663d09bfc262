"""Message tracing: W3C `traceparent` handling and the per-message lifecycle record.

Every message has a W3C trace context (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`), but
only one a client sent is ever delivered: the store property `traceparent` is the client's, kept
and delivered exactly as sent (an invalid one too: it is then no trace context). A message without
a valid one has its context derived from its message id when it is traced (`traceparent_of`: trace
id = the last 32 hex digits of the id, span id = the last 16), so the send path makes and stores
nothing for it; only a message whose id is not hex (or copies of one publish that share one
properties dict) gets a new one, stored in the internal property `__TRACEPARENT`
(`GATEWAY_TRACEPARENT`), which no adapter delivers (the processor's `ensure_traceparents`).
Adapters map their protocol's field to and from the property `traceparent` only; the lifecycle
record, the trace API and the OTLP export use `traceparent_of`.

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
import itertools
import logging
import operator
import re
from collections.abc import Awaitable, Callable, Sequence
from random import getrandbits
from time import time_ns
from typing import Any

import orjson

from runtime.tasks import cancel_and_wait
from store import ALL, AppendResult, Message, PoppedMessage

from .model import ClientContext

log = logging.getLogger("messaging_processor.tracing")

TRACEPARENT = "traceparent"  # a client's W3C trace context, delivered as sent
GATEWAY_TRACEPARENT = "__TRACEPARENT"  # one this gateway made (non-hex id, shared copies): never delivered
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
# A message id a traceparent can be derived from: its last 32 characters hex (store-made ids, 4.x
# UNIQ_KEYs and RocketMQ 5 client ids are), the last 16 of them not all zero.
derivable_id = re.compile(r"[0-9A-Fa-f]{16}(?!0{16})[0-9A-Fa-f]{16}").fullmatch  # (of id[-32:])

# An event row: [event, time ms, protocol, client id, user, group, queue id, offset, attempt, detail,
# message id, traceparent, topic, commit log offset] (None where unknown)
Row = list[Any]


def valid_traceparent(value: str | None) -> bool:
    """Whether `value` is a W3C traceparent we keep (version 00 layout, non-zero ids)."""
    return value is not None and len(value) == 55 and match_traceparent(value) is not None


def new_traceparent() -> str:
    """A new sampled traceparent of this process (see `format_traceparent`)."""
    return format_traceparent(next_trace_sequence())


def derived_traceparent(message_id: str) -> str | None:
    """The traceparent of a message stored without one: from its id (None: the id is not hex)."""
    t = message_id[-32:]
    if derivable_id(t) is None:
        return None
    t = t.lower()
    return f"00-{t}-{t[16:]}-01"


def stored_context(props: dict[str, str]) -> str | None:
    """The trace context a message's properties hold: the client's valid `traceparent`, else the one
    this gateway made (`__TRACEPARENT`); None: it is derived from the message id."""
    tp = props.get(TRACEPARENT)
    if tp is not None and len(tp) == 55 and match_traceparent(tp) is not None:
        return tp
    return props.get(GATEWAY_TRACEPARENT)


def context_of(props: dict[str, str], message_id: str) -> str | None:
    """The trace context of a message with these properties and id: `stored_context`, else the one
    derived from its id (None: the id is not hex and nothing was stored)."""
    tp = stored_context(props)
    return derived_traceparent(message_id) if tp is None else tp


def traceparent_of(message: Message) -> str | None:
    """The trace context of a stored message (`context_of`): for the trace record and its export,
    never for a delivery (a consumer gets only the `traceparent` property a client sent)."""
    return context_of(message.properties, message.message_id)


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
                    group = _group_of_handle(handle)
                    head = (event, ctx, group)
                    if acks is None or head != last_h:
                        acks, last_h = [], head
                        add((["H", event, proto, client, user, group, acks], set()))
                    acks.append((clo, t, detail))
                    out[-1][1].add(CLO_KEY_PREFIX + str(clo >> _CLO_BITS))
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
        bits = _CLO_BITS
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
                full += _send_events(t, proto, client, user, res, tp)

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
            keys.add(CLO_KEY_PREFIX + str(clo >> _CLO_BITS))
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
        keys = {CLO_KEY_PREFIX + str(r[1] >> _CLO_BITS) for r in read}
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
        keys = {CLO_KEY_PREFIX + str(clo >> _CLO_BITS) for clo in clos}
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
        keys = {CLO_KEY_PREFIX + str(clo >> _CLO_BITS) for clo, _t, _d in items}
        out.append((("H", "acked", proto, client, user, group, items), keys))

    @staticmethod
    def _unknown_handle_row(
        out: list, full: list[Row] | None, t: int, proto: str, client: str, user: str | None,
        event: str, handle: str, new_handle: str | None, detail: str | None,
    ) -> None:  # fmt: skip
        """An event on a delivery this recorder did not see (popped before a restart, or through
        another proxy): the handle names the message's position."""
        where = _position_of_handle(handle)
        if where is None:
            return
        topic, qid, off = where
        row = (event, t, proto, client, user, _group_of_handle(handle), qid, off, None, detail, None, None,
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
        """The events (Rows) of the stored message `m`."""
        mid, clo, topic, qid, off = m.message_id, m.commitlog_offset, m.topic, m.queue_id, m.queue_offset
        tp = traceparent_of(m)

        def row(event: str, t: int, who: list, group: Any = None, at: bool = True, attempt: Any = None,
                detail: Any = None) -> Row:  # fmt: skip
            # `who`: [protocol, client id, user]; `at`: with the message's queue and offset
            return [event, t, *who, group, qid if at else None, off if at else None, attempt, detail, mid, tp,
                    topic, clo]  # fmt: skip

        out: list[list] = []
        for r in await self._rows_by_key(CLO_KEY_PREFIX + str(clo >> _CLO_BITS)):
            tag = r[0]
            if tag == "R":
                if any(a <= clo < z for a, z in r[5]):
                    stored_at = m.store_timestamp or r[1]
                    out.append(row("received", min(r[1], stored_at), r[2:5], at=False))
                    out.append(row("stored", stored_at, r[2:5]))
            elif tag == "D":
                for c, attempt, redelivery in r[6]:
                    if c == clo:
                        if redelivery:
                            out.append(row(redelivery, r[1], r[2:5], r[5], attempt=attempt - 1))
                        out.append(row("delivered", r[1], r[2:5], r[5], attempt=attempt))
            elif tag == "H":
                out += [row(r[1], t, r[2:5], r[5], detail=detail) for c, t, detail in r[6] if c == clo]
            elif tag == "S":  # (the older send row: one result and traceparent per message)
                for res, rtp in zip(r[5], r[6], strict=False):
                    if res[0] == mid and res[4] == clo:
                        out += _send_events(r[1], r[2], r[3], r[4], res, rtp or tp)
            elif r[13] == clo:
                out.append(r)
        where = [topic, qid, off]
        for r in await self._rows_by_key(f"{POSITION_KEY_PREFIX}{topic}/{qid}/{off >> 8}"):
            if len(r) == 14 and r[13] is None and [r[12], r[6], r[7]] == where:
                out.append(r)
        return out

    async def trace(self, message_id: str) -> dict[str, Any] | None:
        """The trace of a message (the admin API's JSON), None when nothing is known of it."""
        rows = [
            r
            for r in await self._rows_by_key(MESSAGE_KEY_PREFIX + message_id)
            if len(r) == 14 and r[10] == message_id and r[12] is None  # (known only by id)
        ]
        msg = None
        for m in await self._get_by_id(message_id):
            if m.message_id == message_id and not m.topic.startswith("%"):
                rows += await self._rows_of(m)
                msg = m
        return _trace_json(message_id, rows, msg)

    async def traces_of_trace_id(self, trace_id: str) -> list[dict[str, Any]]:
        """The traces of every message of a trace id: those stored with it (their send rows are
        keyed by it), and the message whose id it was derived from."""
        tid = trace_id.lower()
        ids: dict[str, None] = {}
        for key in (TRACE_KEY_PREFIX + tid, SEQUENCE_KEY_PREFIX + tid[:29]):
            for r in await self._rows_by_key(key):
                if r[0] == "R":
                    ids.update((mid, None) for mid, tp in r[6] if tp[3:35] == tid)
                elif r[0] == "S":
                    ids.update((res[0], None) for res, tp in zip(r[5], r[6], strict=False) if tp[3:35] == tid)
        if len(tid) == 32 and derivable_id(tid) is not None:
            for mid in (tid.upper(), "01" + tid.upper(), tid, "01" + tid):  # (store-made, RocketMQ 5 clients)
                for m in await self._get_by_id(mid):
                    if m.message_id == mid and not m.topic.startswith("%") and traceparent_of(m)[3:35] == tid:
                        ids[mid] = None
        return [t for mid in ids if (t := await self.trace(mid)) is not None]

    async def traces_of_key(self, key: str) -> list[dict[str, Any]]:
        """The traces of the messages whose key is `key` (the store's key index)."""
        if self._get_by_key is None:
            return []
        ids = dict.fromkeys(m.message_id for m in await self._get_by_key(key) if not m.topic.startswith("%"))
        return [t for mid in ids if (t := await self.trace(mid)) is not None]


def _send_events(t_in: int, proto: str, client: str, user: str | None, res: Any, tp: str | None) -> list[Row]:
    """The received and stored events (Rows) of one message of a send (`res`: its AppendResult)."""
    mid, topic, qid, off, clo, _size, at = res
    at = at or t_in
    return [
        ["received", min(t_in, at), proto, client, user, None, None, None, None, None, mid, tp, topic, clo],
        ["stored", at, proto, client, user, None, qid, off, None, None, mid, tp, topic, clo],
    ]


_TIE_RANK = {"received": 0, "stored": 1}


def _trace_json(message_id: str, rows: list, msg: Message | None) -> dict[str, Any] | None:
    if not rows:
        return None
    # by time; in one ms received and stored first (a subscriber reading by offset may record its
    # delivery before the send that is waiting for the fsync records those two), the others in the
    # order recorded (the sort is stable)
    rows.sort(key=lambda r: (r[1], _TIE_RANK.get(r[0], 2)))
    if msg is not None:
        tp, topic = traceparent_of(msg) or "", msg.topic
    else:
        tp = next((r[11] for r in rows if r[11]), None) or ""
        topic = next((r[12] for r in rows if r[12]), "")
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
