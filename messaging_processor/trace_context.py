"""W3C trace contexts of messages: which one a message has, and which one is delivered.

Every message has a W3C trace context (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`), but
only one a client sent is ever delivered: the store property `traceparent` is the client's, kept
and delivered exactly as sent (an invalid one too: it is then no trace context). A message without
a valid one has its context derived from its message id when it is traced (`traceparent_of`: trace
id = the last 32 hex digits of the id, span id = the last 16), so the send path makes and stores
nothing for it; only a message whose id is not hex (or copies of one publish that share one
properties dict) gets a new one, stored in the internal property `__TRACEPARENT`
(`GATEWAY_TRACEPARENT`), which no adapter delivers (`ensure_traceparents`, on the send path).
Adapters map their protocol's field to and from the property `traceparent` only; the lifecycle
record (messaging_processor/tracing.py), the trace API and the OTLP export use `traceparent_of`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from random import getrandbits

from store import Message

TRACEPARENT = "traceparent"  # a client's W3C trace context, delivered as sent
GATEWAY_TRACEPARENT = "__TRACEPARENT"  # one this gateway made (non-hex id, shared copies): never delivered
# C-level callables, so that the send path (`ensure_traceparents`) calls no other Python function:
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
    where = handle_position(handle)
    return None if where is None else f"{where[0]}/{where[1]}/{where[2]}"


def handle_position(handle: str) -> tuple[str, int, int] | None:
    """(topic, queue id, offset) a receipt handle names; None when it is no handle."""
    parts = handle.rpartition("@")[2].split(" ", 4)
    if len(parts) != 5:
        return None
    try:
        return parts[3], int(parts[1]), int(parts[2])
    except ValueError:
        return None


def handle_group(handle: str) -> str | None:
    """The consumer group a receipt handle names."""
    parts = handle.rpartition("@")[2].split(" ", 4)
    return parts[4] if len(parts) == 5 else None


def ensure_traceparents(messages: Sequence[Message]) -> list[tuple[int, str]] | None:
    """[(index, traceparent)] of the messages of a send that carry a trace context (None: none does).
    A client's `traceparent` stays as sent (an invalid one is no context); a message without one is
    traced by its id (`derived_traceparent`), unless the id is not hex or its properties dict is shared
    with the message before (copies of one publish: one trace): those get a new one, in place, in the
    internal `__TRACEPARENT`. C-level callables only: one Python frame per send."""
    out = None
    prev = None
    for i, m in enumerate(messages):
        p = m.properties
        tp = p.get(TRACEPARENT)
        if tp is None or len(tp) != 55 or match_traceparent(tp) is None:
            tp = p.get(GATEWAY_TRACEPARENT)  # (an invalid client one is kept as sent, not followed)
        if tp is None:
            mid = m.message_id
            if p is not prev and (not mid or derivable_id(mid[-32:]) is not None):
                prev = p
                continue
            tp = p[GATEWAY_TRACEPARENT] = format_traceparent(next_trace_sequence())
            if p is prev:  # (the copy before shares it)
                out = out or []
                out.append((i - 1, tp))
        prev = p
        out = out or []
        out.append((i, tp))
    return out
