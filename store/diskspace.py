"""The disk low-watermark: client appends are refused with `StoreFullError` while the free space of
the commit log's volume is below a limit, and accepted again by themselves once there is room.

The free space is read with `statvfs` when the store opens and then every `CHECK_INTERVAL_MS` by a
background task of the store (`poll`), so the append path reads one attribute (`low`), never a
syscall or a call per message. The store's own appends (delayed and transactional deliveries,
dead letters) and consumer progress (acks) are not refused: acks are what lets retention free space
again.
"""

from __future__ import annotations

import os
import time

from .commitlog import StoreFullError

CHECK_INTERVAL_MS = 250


def watermark_bytes(directory: str, min_free_bytes: int, min_free_ratio: float) -> int:
    """The effective limit: `min_free_bytes` or `min_free_ratio` of the volume's size, the smaller
    of the two when both are set (the default "1GiB,5%": 1 GiB, or 5 % of a volume under 20 GiB)."""
    if min_free_ratio <= 0:
        return max(min_free_bytes, 0)
    st = os.statvfs(directory)
    by_ratio = int(st.f_blocks * st.f_frsize * min_free_ratio)
    return min(min_free_bytes, by_ratio) if min_free_bytes > 0 else by_ratio


class FreeSpaceWatermark:
    """`check(now_ms)` raises StoreFullError while the volume of `directory` has less than `limit`
    bytes free (re-read every CHECK_INTERVAL_MS); a limit of 0 never refuses."""

    __slots__ = ("directory", "limit", "due", "low", "free")

    def __init__(self, directory: str, limit: int) -> None:
        self.directory = directory
        self.limit = limit
        self.due = 0 if limit > 0 else 1 << 62  # next statvfs (epoch ms)
        self.low = False  # below the limit at the last reading
        self.free = -1  # free bytes at the last reading (-1: not read yet)

    def refresh(self, now_ms: int) -> None:
        st = os.statvfs(self.directory)
        self.free = st.f_bavail * st.f_frsize
        self.low = self.free < self.limit
        self.due = now_ms + CHECK_INTERVAL_MS

    def check(self, now_ms: int) -> None:
        if now_ms >= self.due:
            self.refresh(now_ms)
        if self.low:
            self.refuse()

    def refuse(self) -> None:
        """Raise the refusal of an append while the free space is below the limit."""
        raise StoreFullError(
            f"disk free space {self.free} bytes is below the limit of {self.limit} bytes "
            "(publishing resumes once space is freed)"
        )

    async def poll(self) -> None:
        """The periodic reading (the store runs it every CHECK_INTERVAL_MS while a limit is set)."""
        self.refresh(time.time_ns() // 1_000_000)
