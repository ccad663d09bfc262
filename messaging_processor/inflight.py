"""What a delivery loop has handed out and not yet settled (`InflightBound`), shared by the pop loop
(delivery.py) and the offset loop (offset_delivery.py): a count bounded by `max_count` and, with
`max_bytes`, the body bytes too (one message is always allowed). A read then asks for about the
bytes left by the mean body size seen so far (the first for one), so it does not overshoot by a
whole batch of large messages (docs/limits.md "Memory per connection")."""

from __future__ import annotations

import asyncio


class InflightBound:
    """`room` is set while more may be read, `idle` while nothing is out; `ask()` is how many to read
    next (0: full)."""

    __slots__ = ("max_bytes", "count", "held", "mean_size", "room", "idle", "_max_count")

    def __init__(self, max_count: int, max_bytes: int = 0) -> None:
        if max_count < 1:
            raise ValueError("max_inflight must be at least 1")
        self._max_count = max_count
        self.max_bytes = max_bytes  # 0: bytes not counted
        self.count = 0
        self.held = 0  # body bytes out (counted with max_bytes only)
        self.mean_size = 0  # of the bodies read (idem)
        self.room = asyncio.Event()
        self.room.set()
        self.idle = asyncio.Event()
        self.idle.set()

    @property
    def max_count(self) -> int:
        return self._max_count

    @max_count.setter
    def max_count(self, n: int) -> None:
        if n < 1:
            raise ValueError("max_inflight must be at least 1")
        self._max_count = n
        self.update()

    def ask(self) -> int:
        """How many to read now (0, with `room` cleared, when full)."""
        n = self._max_count - self.count
        mb = self.max_bytes
        if mb:
            if self.held >= mb:
                n = 0
            elif self.mean_size:
                n = min(n, max(1, (mb - self.held) // self.mean_size))
            else:
                n = min(n, 1)
        if n <= 0:
            self.room.clear()
            return 0
        return n

    def read(self, sizes: list[int]) -> None:
        """The body sizes of what a read returned (the mean follows them)."""
        if self.max_bytes and sizes:
            size = max(1, sum(sizes) // len(sizes))
            self.mean_size = (self.mean_size + size) // 2 if self.mean_size else size

    def out(self, size: int) -> None:
        """One message handed out (call `update()` after a batch)."""
        self.count += 1
        if self.max_bytes:
            self.held += size

    def settled(self, size: int) -> None:
        """One message settled."""
        self.count -= 1
        if self.max_bytes:
            self.held -= size
        self.update()

    def update(self) -> None:
        if self.count < self._max_count and (not self.max_bytes or self.held < self.max_bytes):
            self.room.set()
        else:
            self.room.clear()
        if self.count == 0:
            self.idle.set()
        else:
            self.idle.clear()
