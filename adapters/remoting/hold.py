"""Long polling for PULL_MESSAGE (the broker's PullRequestHoldService).

A pull that finds nothing waits here until its queue grows past the requested offset or its
suspend time ends. Sends through this listener wake the waiters of their queue at once; messages
that arrive through other protocols (or another proxy) are noticed by a check of the held queues'
max offsets every `interval` seconds, one check per queue however many pulls wait on it."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from messaging_processor import MessagingProcessor, ProcessorError
from runtime.tasks import cancel_and_wait

log = logging.getLogger("adapters.remoting")

Key = tuple[str, int]  # (topic, queue id)


class PullHold:
    def __init__(self, processor: MessagingProcessor, interval: float = 0.1) -> None:
        self.processor = processor
        self.interval = interval
        self._waiters: dict[Key, list[tuple[int, asyncio.Future[None]]]] = {}
        self._task: asyncio.Task | None = None
        self.closed = False

    @property
    def waiting(self) -> int:
        return sum(len(v) for v in self._waiters.values())

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="remoting pull hold")

    async def stop(self) -> None:
        """Answer every held pull now; later waits return at once."""
        self.closed = True
        await cancel_and_wait(self._task)
        self._task = None
        for ws in self._waiters.values():
            for _o, f in ws:
                if not f.done():
                    f.set_result(None)
        self._waiters.clear()

    async def wait(self, topic: str, queue_id: int, offset: int, timeout: float) -> None:
        """Return when (topic, queue_id) may hold a message at `offset` or later, or after `timeout` s."""
        if timeout <= 0 or self.closed:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = (topic, queue_id)
        entry = (offset, fut)
        self._waiters.setdefault(key, []).append(entry)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, timeout)
        finally:
            ws = self._waiters.get(key)
            if ws is not None:
                with contextlib.suppress(ValueError):
                    ws.remove(entry)
                if not ws:
                    del self._waiters[key]

    def notify(self, topic: str, queue_id: int, max_offset: int | None = None) -> None:
        """A message was stored in (topic, queue_id): wake the pulls it satisfies (all if unknown)."""
        ws = self._waiters.get((topic, queue_id))
        if not ws:
            return
        for offset, f in ws:
            if not f.done() and (max_offset is None or max_offset > offset):
                f.set_result(None)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            for key in list(self._waiters):
                try:
                    _lo, hi = await self.processor.queue_offsets(*key)
                except ProcessorError:
                    hi = None  # topic deleted: let the pulls find out
                except Exception:  # noqa: BLE001 - keep polling
                    log.exception("pull hold check of %s failed", key)
                    continue
                self.notify(key[0], key[1], hi)
