"""The store's background work, each job a task that runs it every so often: checkpoints, consumer
progress log flushes, compaction, the trim of emptied sealed queues, the fsync of the `async` flush
policy, tiering and the disk low-watermark's reading; and the store's own writes (delayed messages
due, transaction checks, retention), which a replica pauses (its log holds only what its primary
wrote) and a promoted replica resumes. A failed run is logged; the next one runs all the same."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from .commitlog import CommitLog, StoreFullError
from .config import StoreConfig
from .diskspace import CHECK_INTERVAL_MS
from .parts import Parts
from .tiering import TieredLog

log = logging.getLogger("store")


class BackgroundTasks:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        run_io: Callable[..., asyncio.Future],
        config: StoreConfig,
        parts: Parts,
        commitlog: CommitLog,
        tier: TieredLog | None,
        trim_sealed: Callable[[], object],
    ) -> None:
        self.loop = loop
        self.run_io = run_io
        self.config = config
        self.parts = parts
        self.commitlog = commitlog
        self.tier = tier
        self.trim_sealed = trim_sealed
        self.tasks: list[asyncio.Task] = []
        self.own_writes: list[asyncio.Task] = []  # the tasks that append by themselves

    def start(self) -> None:
        config, parts = self.config, self.parts
        checkpoints = parts.checkpoints
        self.tasks = [
            self._every(config.checkpoint_interval_ms, checkpoints.checkpoint),
            self._every(config.consumer_log_flush_ms, checkpoints.flush_progress),
            self._every(config.compaction_interval_ms, parts.compactor.run),
            self._every(config.checkpoint_interval_ms, self._trim_sealed),
        ]
        if config.flush != "sync":
            self.tasks.append(self._every(config.flush_interval_ms, self._fsync_async))
        if self.tier is not None:
            self.tasks.append(self._every(config.tier_interval_ms, self.tier.run))
        free_space = parts.appender.free_space
        if free_space.limit > 0:
            free_space.refresh(0)
            self.tasks.append(self._every(CHECK_INTERVAL_MS, free_space.poll))
        self._start_own_writes()

    def _start_own_writes(self) -> None:
        config, parts = self.config, self.parts
        self.own_writes = [
            self.loop.create_task(parts.delays.run()),
            self._every(config.transaction_check_interval_ms, parts.transactions.check),
            self._every(config.retention_check_interval_ms, parts.retention.apply),
        ]

    @property
    def writes_on_its_own(self) -> bool:
        return bool(self.own_writes)

    def pause_own_writes(self) -> None:
        for t in self.own_writes:
            t.cancel()
        self.own_writes = []

    def resume_own_writes(self) -> None:
        """Delayed and half messages are taken from the (replicated) queues again and the own
        writes start again (nothing when they run)."""
        if self.own_writes:
            return
        delays, transactions = self.parts.delays, self.parts.transactions
        delays.heap.clear()
        delays.rebuild()
        transactions.heap.clear()
        transactions.rebuild()
        self._start_own_writes()

    async def stop(self) -> None:
        """Cancel every task and wait for each to end."""
        tasks = self.tasks + self.own_writes
        self.tasks, self.own_writes = [], []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def _every(self, interval_ms: int, fn: Callable[[], Awaitable[object]]) -> asyncio.Task:
        return self.loop.create_task(self._periodic(interval_ms, fn))

    async def _periodic(self, interval_ms: int, fn: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await fn()
            except StoreFullError:
                log.warning("store is full")
            except Exception:
                log.exception("store background task failed")

    async def _trim_sealed(self) -> None:
        self.trim_sealed()

    async def _fsync_async(self) -> None:
        """The `async` flush policy: fsync the segments written since the last time."""
        segs = self.parts.writer.take_unsynced_segments()
        if segs:
            await self.run_io(self.commitlog.sync, segs)
