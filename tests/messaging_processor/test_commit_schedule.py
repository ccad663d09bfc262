"""CommitSchedule: one commit `interval_s` after a change, one at a time, and another when changes
came while one ran or it failed; none after stop."""

from __future__ import annotations

import asyncio

import pytest

from messaging_processor import ErrorKind, ProcessorError
from messaging_processor.commit_schedule import CommitSchedule

pytestmark = pytest.mark.timeout(30)


async def test_changes_while_a_commit_runs_get_another_commit_and_a_failure_is_retried() -> None:
    calls: list[int] = []
    started = asyncio.Event()
    release = asyncio.Event()
    fail_next = True

    async def commit() -> None:
        nonlocal fail_next
        calls.append(len(calls))
        started.set()
        await release.wait()
        if fail_next:
            fail_next = False
            raise ProcessorError(ErrorKind.UNAVAILABLE, "store away")

    s = CommitSchedule(commit, 0.01, "g/t")
    s.changed()
    s.changed()  # (one timer for both)
    await asyncio.wait_for(started.wait(), 5)
    started.clear()
    s.changed()  # during the running commit, which then fails
    release.set()
    await asyncio.wait_for(started.wait(), 5)
    while s.dirty or s._running is not None:
        await asyncio.sleep(0.01)
    assert calls == [0, 1]  # the failed one, then one covering the change made meanwhile
    await s.stop()
    s.changed()
    await asyncio.sleep(0.05)
    assert calls == [0, 1]  # stopped: no more
