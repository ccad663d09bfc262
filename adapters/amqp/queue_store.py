"""A queue's store topic and consumer group: creation (a new queue starts empty, its group positioned
at the end of its topic), the count of ready messages, purge and removal. An exclusive queue with
its own topic is read through a LocalFeed (pop/ack in memory over offset reads): only its owning
connection reads it and it ends with that connection, so its deliveries need no state in the store."""

from __future__ import annotations

import contextlib

from messaging_processor import ClientContext, LocalFeed, MessagingProcessor, ProcessorError

from .queues import Queue

MAX_ATTEMPTS = 1_000_000  # AMQP queues redeliver without limit (x-delivery-limit is ours to apply)


class QueueStore:
    __slots__ = ("processor", "ctx")

    def __init__(self, processor: MessagingProcessor, ctx: ClientContext) -> None:
        self.processor = processor
        self.ctx = ctx

    async def topic_exists(self, topic: str) -> bool:
        try:
            await self.processor.get_topic(topic)
        except ProcessorError:
            return False
        return True

    async def create(self, q: Queue) -> None:
        """The queue's topic (unless it uses an existing one) and group; ProcessorError on failure."""
        p = self.processor
        if q.own_topic:
            await p.create_topic(q.topic, queues=1)
        await p.create_group(q.topic, max_attempts=MAX_ATTEMPTS)
        await self.position_at_end(q)

    async def position_at_end(self, q: Queue) -> None:
        p = self.processor
        route = await p.query_route(self.ctx, q.topic)
        for r in route.queues:
            _, hi = await p.queue_offsets(q.topic, r.queue_id)
            await p.commit_offset(self.ctx, q.group, q.topic, r.queue_id, hi)

    def feed(self, q: Queue, ctx: ClientContext) -> LocalFeed | None:
        """The LocalFeed of an exclusive queue just created by the connection of `ctx` (None for a
        queue over an existing topic: others may read that topic's group too)."""
        return LocalFeed(self.processor, ctx, q.group, q.topic) if q.own_topic else None

    async def ready_count(self, q: Queue) -> int:
        if q.feed is not None:
            try:
                return await q.feed.ready()
            except ProcessorError:
                return 0
        try:
            backlog, inflight = await self.processor.backlog(q.group, q.topic)
        except ProcessorError:
            return 0
        return max(backlog - inflight, 0)

    async def purge(self, q: Queue) -> int:
        if q.feed is not None:
            try:
                return await q.feed.purge()
            except ProcessorError:
                return 0
        n = await self.ready_count(q)
        with contextlib.suppress(ProcessorError):
            await self.position_at_end(q)
        return n

    async def drop(self, q: Queue) -> None:
        """Remove the queue's messages, its group and, if it created it, its topic."""
        p = self.processor
        if q.feed is not None:
            await q.feed.close()
        with contextlib.suppress(ProcessorError):
            await self.position_at_end(q)
        with contextlib.suppress(ProcessorError):
            await p.delete_group(q.group)
        if q.own_topic:
            with contextlib.suppress(ProcessorError):
                await p.delete_topic(q.topic)
