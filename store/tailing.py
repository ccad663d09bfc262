"""Tail reads: offset reads of a whole topic for subscribers that do not compete (the MQTT
clean-session fan-out, a store node's tail), with no pop state and nothing to ack. `tail` waits
for an append when it finds nothing and brings in a tiered range it reaches (tier_reads.py);
`tail_now` reads at once; `watch` calls back at the topic's next record (LongPolling.watch). The
records are read by reading.py; the Store binds these methods as its own."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .catalog import Catalog
from .errors import TieredRangeNotCached
from .filters import ALL
from .message import Message
from .popping import LongPolling
from .reading import Reader
from .tier_reads import TierFetches

T = TypeVar("T")


class Tails:
    """Tail reads over the catalog's queues; `closed` (set when the store closes) ends waits."""

    def __init__(
        self,
        reader: Reader,
        catalog: Catalog,
        polls: LongPolling,
        fetch_tiered: Callable[[TieredRangeNotCached], Awaitable[None]],
    ) -> None:
        self.reader = reader
        self.catalog = catalog
        self.polls = polls
        self.fetch_tiered = fetch_tiered
        self.closed = False

    async def tail(
        self, topic: str, positions: dict[int, int], max_messages: int = 128, wait_ms: int = 0
    ) -> list[Message]:
        """`Store.tail`: up to `max_messages` messages of `topic` at or after each queue's position
        (queue id -> next offset; a queue missing from `positions` is read from its first retained
        offset); with none there, wait up to `wait_ms` for an append to the topic. The caller keeps
        its positions and moves each past the messages it got (`Message.queue_offset` + 1)."""
        return await self._wait(self.reader.tail, topic, positions, max_messages, wait_ms)

    async def tail_records(
        self, topic: str, positions: dict[int, int], max_messages: int = 128, wait_ms: int = 0
    ) -> list[tuple[int, bytes]]:
        """`Store.tail_records`: `tail` as (commit log offset, record bytes as stored) pairs, for a
        store node to send on without decoding and encoding each message (codec.decode reads a
        record)."""
        return await self._wait(self.reader.tail_records, topic, positions, max_messages, wait_ms)

    async def _wait(
        self,
        read: Callable[[str, dict[int, int], int], list[T]],
        topic: str,
        positions: dict[int, int],
        max_messages: int,
        wait_ms: int,
    ) -> list[T]:
        if max_messages < 1:
            raise ValueError("max_messages must be positive")
        self.catalog.topic(topic, create=False)
        give_up = time.monotonic() + wait_ms / 1000
        fetches: TierFetches | None = None
        while True:
            try:
                out = read(topic, positions, max_messages)
            except TieredRangeNotCached as miss:  # a queue read from its start reached a tiered range
                fetches = fetches or TierFetches()
                await fetches.fetch(miss, self.fetch_tiered)
                continue
            if out or self.closed or time.monotonic() >= give_up:
                return out
            await self.polls.wait(topic, ALL, give_up, None)
            self.catalog.topic(topic, create=False)  # (deleted meanwhile: TopicNotFound)

    def tail_now(self, topic: str, positions: dict[int, int], max_messages: int) -> list[Message] | None:
        """`Store.tail_now`: `tail` without a wait, read now: None when it would reach a tiered
        range not cached (the caller awaits `tail`, which fetches it). TopicNotFound for an unknown
        topic."""
        self.catalog.topic(topic, create=False)
        try:
            return self.reader.tail(topic, positions, max_messages)
        except TieredRangeNotCached:
            return None

    def watch(self, topic: str, callback: Callable[[], object]) -> Callable[[], None]:
        """`Store.watch`: call `callback` once when `topic` next gets a record (or is deleted, or the
        store closes), for an offset reader that has caught up: no task or timer while it waits
        (LongPolling.watch: watch right after a `tail` that found nothing, with no await in
        between). Returns the function that ends the watch unfired. TopicNotFound for an unknown
        topic."""
        self.catalog.topic(topic, create=False)
        return self.polls.watch(topic, callback)
