"""Task helpers for the packages above the store and the remoting wire (those two import no
project package, so they keep their own copies)."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(task: asyncio.Future | None, *, errors: bool = False) -> None:
    """Cancel `task` (None: nothing to do) and return once it has ended. Its CancelledError is
    swallowed; with `errors`, so is any exception it ended with (a failed background loop must not
    stop its owner's shutdown)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, *((Exception,) if errors else ())):
        await task
