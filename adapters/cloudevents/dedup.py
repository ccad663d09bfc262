"""Optional idempotent ingest on `source` + `id` (setting cloudevents_dedup_window_s > 0).

An event whose (topic, source, id) was stored within the window is accepted (202) but not stored
again. Records live in the processor's kv table (`ce.dedup/<topic> <sha256(source, id)>` -> expiry
epoch s), written in one transaction per request after the send returned, and mirrored in memory
(loaded at start, pruned every minute) so that lookups cost no I/O. Concurrent requests carrying the
same event wait for each other. A crash between the store write and the record write can store a
retried event twice (at-least-once, as without the option)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Sequence

from messaging_processor import MessagingProcessor
from runtime.tasks import cancel_and_wait

from .event import Event

log = logging.getLogger("adapters.cloudevents")
NS = "ce.dedup"


def dedup_key(topic: str, ev: Event) -> str:
    h = hashlib.sha256(ev.source.encode() + b"\x00" + ev.id.encode()).hexdigest()[:40]
    return f"{topic} {h}"


class Deduplicator:
    def __init__(self, processor: MessagingProcessor, window_s: float) -> None:
        self.processor = processor
        self.window_s = window_s
        self._seen: dict[str, float] = {}  # key -> expiry (epoch s)
        self._pending: dict[str, asyncio.Future[bool]] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        now = time.time()
        expired: list[str] = []
        for k, v in await self.processor.kv_scan(NS):
            try:
                expiry = float(v)
            except ValueError:
                expiry = 0.0
            if expiry > now:
                self._seen[k] = expiry
            else:
                expired.append(k)
        if expired:
            await self.processor.kv_put_many(NS, dict.fromkeys(expired))
        self._task = asyncio.get_running_loop().create_task(self._prune_loop(), name="ce dedup prune")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def claim(self, topic: str, events: Sequence[Event]) -> tuple[list[int], list[str]]:
        """Indices of the events to store (first of each key, not seen within the window) and their
        keys, now pending: call `commit` after storing them or `release` when that failed."""
        keep: list[int] = []
        keys: list[str] = []
        in_request: set[str] = set()
        for i, ev in enumerate(events):
            k = dedup_key(topic, ev)
            if k in in_request:
                continue
            in_request.add(k)
            while (fut := self._pending.get(k)) is not None:
                await asyncio.shield(fut)
            if self._seen.get(k, 0.0) > time.time():
                continue
            self._pending[k] = asyncio.get_running_loop().create_future()
            keep.append(i)
            keys.append(k)
        return keep, keys

    async def commit(self, keys: Sequence[str]) -> None:
        expiry = time.time() + self.window_s
        try:
            if keys:
                value = repr(expiry).encode()
                await self.processor.kv_put_many(NS, dict.fromkeys(keys, value))
            for k in keys:
                self._seen[k] = expiry
        finally:
            self.release(keys)

    def release(self, keys: Sequence[str]) -> None:
        for k in keys:
            fut = self._pending.pop(k, None)
            if fut is not None and not fut.done():
                fut.set_result(True)

    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(min(60.0, max(self.window_s, 1.0)))
            now = time.time()
            old = [k for k, exp in self._seen.items() if exp <= now]
            for k in old:
                del self._seen[k]
            if old:
                try:
                    await self.processor.kv_put_many(NS, dict.fromkeys(old))
                except Exception as e:  # noqa: BLE001 - pruning is retried next round
                    log.warning("pruning %d dedup records failed: %s", len(old), e)
