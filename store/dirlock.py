"""The data directory's lock: one store process per directory (`flock` on `<data dir>/LOCK`, held
for the process's life and released by the kernel when it ends, kill -9 included)."""

from __future__ import annotations

import fcntl
import os

from .errors import StoreError


def lock_dir(d: str) -> int:
    """Lock `d` for this process; the descriptor that holds the lock. StoreError if another has it."""
    fd = os.open(os.path.join(d, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreError(f"data directory {d} is in use by another process") from None
    return fd
