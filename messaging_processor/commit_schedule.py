"""When an offset reader commits its progress (OffsetDeliveryLoop, LocalFeed): `interval_s` after
the first change since the last commit, one commit at a time, and once more when changes came
while one ran or it failed (the next commit covers them)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from runtime.tasks import cancel_and_wait

from .errors import ProcessorError

log = logging.getLogger("messaging_processor.commit_schedule")


class CommitSchedule:
    __slots__ = ("_commit", "interval_s", "name", "dirty", "stopped", "_timer", "_running")

    def __init__(self, commit: Callable[[], Awaitable[None]], interval_s: float, name: str) -> None:
        self._commit = commit
        self.interval_s = interval_s
        self.name = name  # for the log (the group: an existing string, no copy per reader)
        self.dirty = False  # changes not committed yet
        self.stopped = False
        self._timer: asyncio.TimerHandle | None = None
        self._running: asyncio.Task | None = None

    def changed(self) -> None:
        """Progress changed: commit within `interval_s`."""
        self.dirty = True
        if self._timer is None and self._running is None and not self.stopped:
            self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._start)

    def _start(self) -> None:
        self._timer = None
        self._running = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        self.dirty = False
        try:
            await self._commit()
        except ProcessorError as e:
            log.info("commit of %s failed: %s", self.name, e)
            self.dirty = True
        finally:
            self._running = None
        if self.dirty:
            self.changed()

    async def stop(self) -> None:
        """No more commits from here (one running is cancelled: the owner commits last itself)."""
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await cancel_and_wait(self._running, errors=True)
        self._running = None
