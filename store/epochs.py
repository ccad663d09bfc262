"""The epoch log of a replica group member: at which commit log offset each epoch (each change of
primary) started, as in RocketMQ 5's epoch file. A replica that rejoins compares its entries with
the primary's (`divergence`) to find how much of its log the two share, truncates the rest and
catches up from there.

Kept as a small JSON file (`epochs.json`), rewritten whole on each change (tmp, fsync, rename,
directory fsync): a handful of entries that change once per election need nothing more.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

FILE = "epochs.json"

Epoch = tuple[int, int]  # (epoch, start offset)


class EpochLog:
    """The (epoch, start offset) entries of one data directory, epochs and offsets increasing."""

    def __init__(self, data_dir: str) -> None:
        self.dir = data_dir
        self.path = os.path.join(data_dir, FILE)
        self._entries: list[Epoch] = []
        if os.path.exists(self.path):
            with open(self.path, "rb") as f:
                saved = json.loads(f.read())
            self._entries = [(int(e), int(o)) for e, o in saved["epochs"]]

    @property
    def entries(self) -> list[Epoch]:
        """A copy of the entries, oldest first."""
        return list(self._entries)

    @property
    def current(self) -> Epoch | None:
        """The newest entry (None when there is none)."""
        return self._entries[-1] if self._entries else None

    def start(self, epoch: int, offset: int) -> None:
        """Record that `epoch` starts at commit log offset `offset` (durable on return)."""
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        last = self.current
        if last is not None:
            if epoch <= last[0]:
                raise ValueError(f"epoch {epoch} does not follow epoch {last[0]}")
            if offset < last[1]:
                raise ValueError(
                    f"epoch {epoch} cannot start at {offset}, before epoch {last[0]} ({last[1]})"
                )
        self._save([*self._entries, (epoch, offset)])

    def end_offset_of(self, epoch: int, log_end: int) -> int:
        """Where `epoch` ends: the start of the next entry, or `log_end` for the newest.
        KeyError when the epoch is not recorded."""
        return _end_of(self._entries, epoch, log_end)

    def truncate_from(self, offset: int) -> None:
        """Drop the entries that start at or after `offset` (the log is cut there)."""
        kept = [e for e in self._entries if e[1] < offset]
        if kept != self._entries:
            self._save(kept)

    def _save(self, entries: list[Epoch]) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps({"epochs": entries}).encode())
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._entries = entries


def _end_of(entries: Sequence[Epoch], epoch: int, log_end: int) -> int:
    for i, (e, _start) in enumerate(entries):
        if e == epoch:
            return entries[i + 1][1] if i + 1 < len(entries) else log_end
    raise KeyError(f"epoch {epoch} is not recorded")


def divergence(mine: Sequence[Epoch], theirs: Sequence[Epoch], my_end: int, their_end: int) -> int:
    """The commit log offset up to which two logs hold the same records (RocketMQ's rule): the
    newest epoch both recorded (same number, same start) ends, in the shorter of the two, at the
    common point. 0 when they share no epoch."""
    their_starts = {e: s for e, s in theirs}
    for epoch, start in reversed(mine):
        if their_starts.get(epoch) == start:
            return min(_end_of(mine, epoch, my_end), _end_of(theirs, epoch, their_end))
    return 0
