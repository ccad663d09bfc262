"""connection.blocked / connection.unblocked: when the store refuses writes (store full) every open
connection is told it is blocked (if its client supports it), and unblocked a second after the last
refusal (the next refusal blocks again)."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Blockable(Protocol):
    def set_blocked(self, reason: str | None) -> None: ...


class Blocking:
    __slots__ = ("connections", "reason", "_unblock")

    def __init__(self) -> None:
        self.connections: set[Blockable] = set()  # the open connections
        self.reason: str | None = None  # blocked, and why
        self._unblock: asyncio.TimerHandle | None = None

    def join(self, conn: Blockable) -> None:
        """A connection is open: it is told at once if the store refuses writes."""
        self.connections.add(conn)
        if self.reason is not None:
            conn.set_blocked(self.reason)

    def leave(self, conn: Blockable) -> None:
        self.connections.discard(conn)

    def block(self, reason: str) -> None:
        loop = asyncio.get_running_loop()
        if self._unblock is not None:
            self._unblock.cancel()
        self._unblock = loop.call_later(1.0, self._unblock_all)
        if self.reason is None:
            self.reason = reason
            for c in list(self.connections):
                c.set_blocked(reason)

    def _unblock_all(self) -> None:
        self._unblock = None
        self.reason = None
        for c in list(self.connections):
            c.set_blocked(None)

    def close(self) -> None:
        if self._unblock is not None:
            self._unblock.cancel()
