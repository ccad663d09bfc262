"""The cap on what an offline persistent session has queued (`--mqtt-max-queued-messages`,
`--mqtt-max-queued-bytes`, `--mqtt-queue-full-policy`; docs/limits.md "MQTT").

Nothing is copied for an offline session (persistence.py): its queue is its consumer group's
backlog on the store topics its subscriptions cover, i.e. the messages past the group's committed
offsets that match its filters. The cap is applied when the session reattaches, before its delivery
loops start (an offline session costs the gateway no memory: the backlog is in the store, which
keeps it by its own retention whatever the offsets say):

- the offsets alone bound the backlog from above, so a backlog within the message cap (and no byte
  cap) costs one offset lookup per queue and nothing more;
- otherwise each queue is read, in windows, from the end backwards (drop-oldest) or from the
  committed offset forwards (refuse-new), keeping the messages the session's filters match, until
  that queue alone fills the caps; the candidates of all queues are merged by store time;
- drop-oldest (the default, as EMQX's mqueue) commits each queue's offset at its oldest kept message,
  so everything older is skipped by offsets alone; refuse-new (Mosquitto's behaviour: the newest
  beyond the cap are skipped for that session) keeps the oldest and records per queue a window of
  offsets its delivery loop skips (`skipped`).

Bytes are payload bytes (the body of each matching message, read anyway to match it), exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from messaging_processor import ClientContext, ErrorKind, Message, MessagingProcessor, ProcessorError

from .persistence import SessionState, SkipWindows

log = logging.getLogger("adapters.mqtt")

DROP_OLDEST = "drop-oldest"
REFUSE_NEW = "refuse-new"
WINDOW = 256  # messages read at once while looking for the cut

# (store timestamp, queue offset, payload bytes, topic, queue id)
_Candidate = tuple[int, int, int, str, int]


def skipped(windows: SkipWindows, m: Message) -> bool:
    """Whether `m` lies in a skip window (the newest beyond the cap, refuse-new)."""
    w = windows.get((m.topic, m.queue_id))
    return w is not None and w[0] <= m.queue_offset < w[1]


async def cap_backlog(
    processor: MessagingProcessor,
    ctx: ClientContext,
    st: SessionState,
    topics: list[str],
    wants: Callable[[Message], bool],
    max_messages: int,
    max_bytes: int,
    policy: str = DROP_OLDEST,
) -> int:
    """Bring session `st`'s backlog on `topics` (messages `wants` accepts) within the caps (0: none);
    returns how many matching messages are skipped, at least (the scan stops once a queue alone
    fills the caps, so older (drop-oldest) or newer (refuse-new) ones are not counted)."""
    st.skip = {}
    if not max_messages and not max_bytes:
        return 0
    ranges: list[tuple[str, int, int, int]] = []  # (topic, queue id, first unconsumed, end)
    upper = 0
    for topic in topics:
        try:
            route = await processor.query_route(ctx, topic)
        except ProcessorError as e:
            if e.kind is ErrorKind.TOPIC_NOT_FOUND:
                continue
            raise
        for q in route.queues:
            lo, hi = await processor.queue_offsets(topic, q.queue_id)
            start = max(await processor.committed_offset(st.group, topic, q.queue_id), lo)
            if start < hi:
                ranges.append((topic, q.queue_id, start, hi))
                upper += hi - start
    if not ranges or (not max_bytes and upper <= max_messages):
        return 0
    newest = policy == DROP_OLDEST
    found: list[_Candidate] = []
    for topic, qid, start, hi in ranges:
        found += await _scan(processor, ctx, topic, qid, start, hi, wants, max_messages, max_bytes, newest)
    # merge: newest first (drop-oldest) or oldest first (refuse-new); keep while within the caps
    found.sort(key=lambda c: (c[0], c[1]), reverse=newest)
    kept: dict[tuple[str, int], int] = {}  # (topic, queue) -> its last kept offset in scan order
    n = nbytes = 0
    for _ts, offset, size, topic, qid in found:
        if (max_messages and n >= max_messages) or (max_bytes and nbytes + size > max_bytes):
            break
        n += 1
        nbytes += size
        kept[(topic, qid)] = offset
    dropped = len(found) - n
    if not dropped:
        return 0
    for topic, qid, start, hi in ranges:
        last = kept.get((topic, qid))
        if newest:
            cut = hi if last is None else last
            if cut > start:
                await processor.commit_offset(ctx, st.group, topic, qid, cut)
        else:
            first_skipped = start if last is None else last + 1
            if first_skipped < hi:
                st.skip[(topic, qid)] = (first_skipped, hi)
    log.info(
        "mqtt %s: offline queue over its cap (%d messages, %d bytes): %s, at least %d skipped",
        st.client_id,
        max_messages,
        max_bytes,
        policy,
        dropped,
    )
    return dropped


async def _scan(
    processor: MessagingProcessor,
    ctx: ClientContext,
    topic: str,
    qid: int,
    start: int,
    hi: int,
    wants: Callable[[Message], bool],
    max_messages: int,
    max_bytes: int,
    newest: bool,
) -> list[_Candidate]:
    """The matching messages of one queue in [start, hi), from the end (`newest`) or the start,
    until this queue alone reaches the caps (the merge cannot keep more of it than that)."""
    out: list[_Candidate] = []
    nbytes = 0
    a, b = (max(start, hi - WINDOW), hi) if newest else (start, min(hi, start + WINDOW))
    while a < b:
        msgs = await processor.read(ctx, topic, qid, a, b, max_messages=b - a)
        if newest:
            msgs = msgs[::-1]
        for m in msgs:
            if wants(m):
                size = len(m.body)
                out.append((m.store_timestamp, m.queue_offset, size, topic, qid))
                nbytes += size
                if (max_messages and len(out) > max_messages) or (max_bytes and nbytes > max_bytes):
                    return out
        a, b = (max(start, a - WINDOW), a) if newest else (b, min(hi, b + WINDOW))
    return out


__all__ = ["DROP_OLDEST", "REFUSE_NEW", "SkipWindows", "cap_backlog", "skipped"]
