"""The lines a subprocess writes to a pipe, read on a thread so a test can wait for one with a
timeout (used by tests/gatewayproc.py and the mosquitto client tests)."""

from __future__ import annotations

import queue
import re
import threading
import time
from typing import IO


class StreamLines:
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
        """The next line; None at the end of the stream; queue.Empty when none came in time
        (`timeout` None: do not wait)."""
        line = self._q.get(timeout=timeout) if timeout else self._q.get_nowait()
        if line is None:
            self._q.put(None)
        else:
            self.lines.append(line)
        return line

    def wait_line(self, pattern: str, timeout: float) -> re.Match | None:
        """The first new line matching `pattern`, or None if the stream ended or time ran out."""
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
        waiting), until the stream ends or none comes in time."""
        while True:
            try:
                if self._next(wait) is None:
                    return
            except queue.Empty:
                return
