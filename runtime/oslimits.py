"""Operating limits that say so (docs/limits.md, "Process limits"): the descriptor limit raised to
its hard limit at start, and the moments the process meets it or its memory limit logged (at most
once a minute per reason) and counted for /metrics.

asyncio's accept loop, out of descriptors, reports each failed accept to the loop's exception
handler and pauses that listener for a second (ours counts them: `accept_errors`); uvloop (libuv)
accepts and closes such connections itself, silently. So a watch also tries, once a second, to
open a descriptor: failing, the process is at its limit (`fd_limit_reached`), whichever the loop."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gateway.limits")

ACCEPT_OUT_OF_RESOURCE = "socket.accept() out of system resource"  # asyncio's message
LOG_EVERY_S = 60.0
MEMORY_WARN_RATIO = 0.9


def raise_fd_limit() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to the hard one where allowed; (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("file descriptor limit stays %d (raising it to %d failed: %s)", soft, target, e)
    return soft, hard


def memory_limit() -> int | None:
    """The smallest of RLIMIT_AS, RLIMIT_DATA and the cgroup's memory.max, in bytes (None: none)."""
    limits = [
        lim
        for lim in (resource.getrlimit(resource.RLIMIT_AS)[0], resource.getrlimit(resource.RLIMIT_DATA)[0])
        if lim != resource.RLIM_INFINITY
    ]
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            text = f.read().strip()
        if text.isdigit():
            limits.append(int(text))
    except OSError:
        pass
    return min(limits) if limits else None


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
    except OSError:
        return -1


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class ProcessLimits:
    """The limits of this process and what hitting them cost, for /metrics."""

    def __init__(self) -> None:
        self.fd_limit, self.fd_hard = raise_fd_limit()
        self.memory_limit = memory_limit()
        self.accept_errors: Counter[str] = Counter()  # reason (emfile, enfile, ...) -> failed accepts
        self.fd_limit_reached = 0  # watch ticks that found no descriptor free
        self.memory_limit_near = 0  # watch ticks with RSS over 90 % of the memory limit
        self._logged: dict[str, float] = {}
        self._task: asyncio.Task | None = None
        self._restore: Callable[[], None] = lambda: None
        mem = f"{self.memory_limit} bytes" if self.memory_limit else "none"
        log.info("file descriptor limit %d (hard %d); memory limit %s", self.fd_limit, self.fd_hard, mem)

    def install(self, loop: asyncio.AbstractEventLoop, interval_s: float = 1.0) -> None:
        """Count failed accepts (asyncio loops) and watch the limits every `interval_s`."""
        previous = loop.get_exception_handler()

        def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            if context.get("message") == ACCEPT_OUT_OF_RESOURCE and isinstance(exc, OSError):
                self.accept_error(exc.errno)
            elif previous is not None:
                previous(lp, context)
            else:
                lp.default_exception_handler(context)

        loop.set_exception_handler(handler)
        self._restore = lambda: loop.set_exception_handler(previous)
        self._task = loop.create_task(self._watch(interval_s))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            self._restore()

    def accept_error(self, err: int | None) -> None:
        reason = errno.errorcode.get(err or 0, "other").lower()
        self.accept_errors[reason] += 1
        self._say(
            f"accept:{reason}",
            "connections refused: accept() failed with %s (%d so far; file descriptor limit %d); "
            "existing connections stay open, the listener retries every second",
            reason.upper(),
            self.accept_errors[reason],
            self.fd_limit,
        )

    def check(self) -> None:
        """One watch tick: is a descriptor left, is memory near its limit?"""
        try:
            os.close(os.open("/dev/null", os.O_RDONLY))
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                self.fd_limit_reached += 1
                self._say(
                    "fd",
                    "file descriptor limit reached (%d, %s): new connections are refused until some close",
                    self.fd_limit,
                    errno.errorcode[e.errno],
                )
        if self.memory_limit:
            rss = rss_bytes()
            if rss > MEMORY_WARN_RATIO * self.memory_limit:
                self.memory_limit_near += 1
                self._say("memory", "memory near its limit: %d of %d bytes resident", rss, self.memory_limit)

    async def _watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.check()

    def _say(self, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._logged.get(key, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged[key] = now
            log.warning(msg, *args)
