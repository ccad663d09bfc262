"""The lines a subprocess writes, for waiting on one with a timeout: `StreamLines` reads a pipe on
a daemon thread, `FileLines` reads a log file the process writes to, only when asked (no thread, so
nothing runs beside a benchmarked process). Both keep every line taken so far in `lines`.

Used by conformance/gateway_proc.py and the mosquitto client tests (tests/adapters/mqtt)."""

from __future__ import annotations

import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO


class _Lines:
    """What both readers share: `next_line`, `wait_line`, `collect` over `_next`."""

    lines: list[str]

    def _next(self, timeout: float | None) -> str | None:
        """The next line; None at the end of the output; raises queue.Empty when none came in time
        (`timeout` None or 0: do not wait)."""
        raise NotImplementedError

    def next_line(self, timeout: float | None) -> str | None:
        """The next line (also appended to `lines`); None at the end of the output; raises
        TimeoutError when none came within `timeout` s (None: do not wait)."""
        try:
            return self._next(timeout)
        except queue.Empty:
            raise TimeoutError from None

    def wait_line(self, pattern: str, timeout: float) -> re.Match | None:
        """The first new line matching `pattern`, or None if the output ended or time ran out."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._next(left)
            except queue.Empty:
                return None
            if line is None:
                return None
            if m := rx.search(line):
                return m
        return None

    def collect(self, wait: float | None) -> None:
        """Take the lines already written, waiting up to `wait` s for each further one (None: no
        waiting), until the output ends or none comes in time."""
        while True:
            try:
                if self._next(wait) is None:
                    return
            except queue.Empty:
                return


class StreamLines(_Lines):
    """Read `stream` line by line on a daemon thread; `lines` holds every line taken so far."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)  # end of stream (kept in the queue once seen)

    def _next(self, timeout: float | None) -> str | None:
        line = self._q.get(timeout=timeout) if timeout else self._q.get_nowait()
        if line is None:
            self._q.put(None)
        else:
            self.lines.append(line)
        return line


class FileLines(_Lines):
    """The lines appended to the file `path` from byte `offset` on, read when asked; the output
    ends once `ended()` is true (the writing process exited) and everything it wrote is read."""

    POLL = 0.05  # seconds between looks at the file while waiting

    def __init__(self, path: str | Path, offset: int, ended: Callable[[], bool]) -> None:
        self.lines: list[str] = []
        self.path = Path(path)
        self._offset = offset
        self._ended = ended
        self._partial = b""
        self._pending: deque[str] = deque()
        self._done = False

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        self._pending.extend(line.decode(errors="replace").rstrip("\r") for line in complete)

    def _next(self, timeout: float | None) -> str | None:
        deadline = time.monotonic() + (timeout or 0)
        while not self._pending and not self._done:
            ended = self._ended()  # before reading: what it wrote before exiting is read below
            self._read()
            if self._pending:
                break
            if ended:
                if self._partial:  # a last line without its newline
                    self._pending.append(self._partial.decode(errors="replace"))
                    self._partial = b""
                    break
                self._done = True
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise queue.Empty
            time.sleep(min(self.POLL, left))
        if not self._pending:
            return None
        line = self._pending.popleft()
        self.lines.append(line)
        return line
