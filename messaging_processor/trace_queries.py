"""The queries of the message trace: the lifecycle of a message (by id, key or trace id) from the
records `TraceRecorder` (messaging_processor/tracing.py) writes to `%TRACE%`, and the keys they are
found by. `TraceQueries` is the recorder's query half."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from store import Message

from .trace_context import derivable_id, trace_id_of, traceparent_of

TRACE_TOPIC = "%TRACE%"
TRACE_KEY_PREFIX = "trace:"  # + trace id: the messages of a trace (a client's trace id)
SEQUENCE_KEY_PREFIX = "trace-seq:"  # + the first 29 hex digits of a trace id this gateway made
POSITION_KEY_PREFIX = "trace-pos:"  # + <topic>/<queue>/<offset >> 8>: events named by a receipt handle
CLO_KEY_PREFIX = "trace-clo:"  # + <commit log offset >> 16>: the events of the messages stored there
MESSAGE_KEY_PREFIX = "trace-msg:"  # + message id: events known only by message id
CLO_BITS = 16

# An event row: [event, time ms, protocol, client id, user, group, queue id, offset, attempt, detail,
# message id, traceparent, topic, commit log offset] (None where unknown)
Row = list[Any]


class TraceQueries:
    """Trace queries over the store's `get_by_id` and `get_by_key` (None: no key lookups)."""

    _get_by_id: Callable[[str], Awaitable[list[Message]]]
    _get_by_key: Callable[[str], Awaitable[list[Message]]] | None

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
        for r in await self._rows_by_key(CLO_KEY_PREFIX + str(clo >> CLO_BITS)):
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
                        out += send_events(r[1], r[2], r[3], r[4], res, rtp or tp)
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


def send_events(t_in: int, proto: str, client: str, user: str | None, res: Any, tp: str | None) -> list[Row]:
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
