"""A bound on the consume queue files a store holds open: files are opened on first use and the
least recently used unpinned one is closed once more than `limit` are open (docs/store.md, "Open
files"). A file is pinned while one call uses its descriptor, so that neither the event loop nor
the IO thread closes a descriptor the other is reading or writing (a closed number may be reused
by the next open: a write through it would land in another file)."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Protocol

FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


class LazyFile(Protocol):
    """What the pool keeps: a path, the descriptor while open (-1 when closed) and a pin count."""

    path: str
    _fd: int
    _pins: int


class OpenFiles:
    """The open descriptors of many lazily opened files, at most `limit` of them unpinned."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the open file limit must be at least 1")
        self.limit = limit
        self._lock = threading.Lock()
        self._open: OrderedDict[LazyFile, None] = OrderedDict()
        self.opens = 0  # files opened since start (a reopen after a close counts again)
        self.closes = 0  # files closed by the bound

    def __len__(self) -> int:
        return len(self._open)

    def acquire(self, f: LazyFile) -> int:
        """`f`'s descriptor, opened if needed, pinned until `release(f)`."""
        with self._lock:
            fd = f._fd
            if fd >= 0:
                self._open.move_to_end(f)
            else:
                fd = f._fd = os.open(f.path, FLAGS, 0o644)
                self._open[f] = None
                self.opens += 1
                if len(self._open) > self.limit:
                    self._shrink()
            f._pins += 1
            return fd

    def release(self, f: LazyFile) -> None:
        with self._lock:
            f._pins -= 1

    def close(self, f: LazyFile) -> None:
        """Close `f`'s descriptor now if it is open (its file is renamed, replaced or done)."""
        with self._lock:
            if f._fd >= 0:
                del self._open[f]
                os.close(f._fd)
                f._fd = -1

    def _shrink(self) -> None:
        """Close the least recently used unpinned files until `limit` are open (pinned ones stay)."""
        over = len(self._open) - self.limit
        victims = []
        for g in self._open:  # oldest first: usually the first is unpinned
            if g._pins == 0:
                victims.append(g)
                if len(victims) == over:
                    break
        for g in victims:
            del self._open[g]
            os.close(g._fd)
            g._fd = -1
        self.closes += len(victims)
