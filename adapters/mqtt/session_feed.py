"""The change feed of the session index, for proxies that share their sessions (`--workers`).

Every proxy's dispatcher must know every persistent session's filters (session_routing.py): a
device attached to one worker subscribes, a publish through another worker must reach its queue.
Each change of a session's filters (SUBSCRIBE, UNSUBSCRIBE, end) is therefore also appended to the
compacted system topic `%MQTT_SUBS%` (key = client id, value = its queue and filters; no filters:
the session ended), and every proxy tails that topic and applies the changes of the others.

- At start a proxy reads the topic to its end before it listens, so its index is whole from its
  first publish on (compaction keeps it one record per session).
- A change is applied locally at once and appended before the SUBACK; another proxy applies it
  within one tail round trip (a long poll woken by the append). A message published through that
  other proxy in that window can miss a brand-new subscription, as in any broker cluster.
- A proxy skips the records it wrote itself in this run (it applied them when it made them), so
  a reread of an older change never undoes a newer one.

The records are derived state: the session records in the kv table stay the truth of what a
session is (persistence.py); the feed only tells the other proxies' dispatchers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import TYPE_CHECKING

from messaging_processor import ClientContext, ErrorKind, Message, MessagingProcessor, ProcessorError
from runtime.tasks import cancel_and_wait

from .subscription import make_sub

if TYPE_CHECKING:
    from .persistence import SessionState
    from .session_routing import SessionRoutes

log = logging.getLogger("adapters.mqtt")
FEED_TOPIC = "%MQTT_SUBS%"
READ_BATCH = 512


class SessionFeed:
    """Appends this proxy's index changes and applies the other proxies' (`start`, `publish`, `close`)."""

    def __init__(self, processor: MessagingProcessor, ctx: ClientContext, routes: SessionRoutes) -> None:
        self.processor = processor
        self.ctx = ctx
        self.routes = routes
        self.origin = uuid.uuid4().hex  # this proxy, this run
        self.positions: dict[int, int] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Read the feed to its end (the index whole), then follow it."""
        p = self.processor
        await p.send_internal(FEED_TOPIC, [], compacted=True, queues=1)
        _, end = await p.queue_offsets(FEED_TOPIC, 0)
        while self.positions.get(0, 0) < end:
            if not await self._read(0):
                break
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="mqtt session feed")

    async def publish(self, st: SessionState, ended: bool = False) -> None:
        """Tell the other proxies the session's filters now (none when it `ended`)."""
        if st.queue is None:
            return
        filters = [] if ended else [[f, int(s.nl)] for f, s in st.subs.items() if s.share is None]
        body = json.dumps({"o": self.origin, "q": st.queue, "f": filters}, separators=(",", ":"))
        await self.processor.send_internal(
            FEED_TOPIC, [Message(FEED_TOPIC, body.encode(), keys=(st.client_id,))]
        )

    async def _read(self, wait_ms: int) -> int:
        msgs = await self.processor.tail(
            self.ctx, FEED_TOPIC, self.positions, READ_BATCH, wait_ms, group=self.ctx.client_id
        )
        for m in msgs:
            self.positions[m.queue_id] = m.queue_offset + 1
            self._apply(m)
        return len(msgs)

    def _apply(self, m: Message) -> None:
        if not m.keys:
            return
        try:
            d = json.loads(m.body)
            if d.get("o") == self.origin:
                return
            subs = [make_sub(None, f, 1, False, bool(nl), 0, 0) for f, nl in d["f"]]
            queue = d["q"]
        except (ValueError, KeyError, TypeError):
            log.warning("mqtt session feed: unreadable record for %r skipped", m.keys[0])
            return
        self.routes.set(m.keys[0], queue, [s for s in subs if s is not None])

    async def _follow(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self._read(20_000)
                backoff = 0.1
            except ProcessorError as e:
                if e.kind is ErrorKind.TOPIC_NOT_FOUND:
                    self.positions.clear()
                log.warning("mqtt session feed read failed: %s", e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def close(self) -> None:
        await cancel_and_wait(self._task, errors=True)
