"""An asyncio.Event that costs nothing until awaited: the per-connection flags ("closed",
"writable") of many idle connections would otherwise each hold an empty deque of waiters."""

from __future__ import annotations

import asyncio
from typing import Any, Literal


class LazyEvent(asyncio.Event):
    """asyncio.Event whose list of waiters exists only while someone waits."""

    def __init__(self) -> None:  # not super().__init__: that allocates the deque
        self._waiters: Any = ()
        self._value = False

    async def wait(self) -> Literal[True]:
        if self._value:
            return True
        if not self._waiters:
            self._waiters = []
        try:
            return await super().wait()
        finally:
            if not self._waiters:
                self._waiters = ()
