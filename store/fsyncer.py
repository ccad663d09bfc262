"""fdatasync in a helper process, so that waiting for the disk never holds our GIL.

A thread that fsyncs must take the GIL before and after the syscall, and an event loop busy
encoding appends keeps it for milliseconds: disk waits and CPU work then run one after the other.
A child process has its own interpreter: the loop writes records to the page cache itself, asks
the child over a pipe to fdatasync the segment files (an fsync covers the file's dirty pages
whichever process wrote them), and hears back through the same event loop. CPU and disk overlap.

Wire: request = u64 id, u16 n, then n x (u16 length, path); reply = u64 id, i32 errno (0 = ok).
"""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
from collections.abc import Callable

_REQ = struct.Struct("<QH")
_LEN = struct.Struct("<H")
_REP = struct.Struct("<Qi")


def child_main() -> None:  # pragma: no cover - runs in the helper process
    """Serve fdatasync requests on stdin, answer on stdout, until stdin closes."""
    fds: dict[bytes, int] = {}
    buf = b""

    def need(n: int) -> bytes:
        nonlocal buf
        while len(buf) < n:
            chunk = os.read(0, 65536)
            if not chunk:
                raise EOFError
            buf += chunk
        out, buf = buf[:n], buf[n:]
        return out

    try:
        while True:
            rid, n = _REQ.unpack(need(_REQ.size))
            err = 0
            for _ in range(n):
                (ln,) = _LEN.unpack(need(2))
                path = need(ln)
                try:
                    fd = fds.get(path)
                    if fd is None:
                        if len(fds) >= 4:  # keep few: deleted segments must not stay open
                            os.close(fds.pop(next(iter(fds))))
                        fd = fds[path] = os.open(path, os.O_RDONLY)
                    os.fdatasync(fd)
                except OSError as e:
                    err = e.errno or 5
            os.write(1, _REP.pack(rid, err))
    except (EOFError, BrokenPipeError):
        return


class FsyncClient:
    """Loop side: `request(paths)` returns an id; `on_done(id, errno)` is called from the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_done: Callable[[int, int], None]) -> None:
        self.loop = loop
        self.on_done = on_done
        self.proc = subprocess.Popen(
            [sys.executable, "-S", "-E", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C for the terminal's process group must not kill it
        )
        self._out = self.proc.stdin.fileno()
        self._in = self.proc.stdout.fileno()
        os.set_blocking(self._in, False)
        self._buf = b""
        self._next = 0
        loop.add_reader(self._in, self._readable)

    def request(self, paths: list[str]) -> int:
        self._next += 1
        parts = [_REQ.pack(self._next, len(paths))]
        for p in paths:
            b = os.fsencode(p)
            parts += (_LEN.pack(len(b)), b)
        data = b"".join(parts)
        while data:  # a few dozen bytes: the pipe takes them at once
            data = data[os.write(self._out, data) :]
        return self._next

    def _readable(self) -> None:
        try:
            chunk = os.read(self._in, 65536)
        except BlockingIOError:
            return
        if not chunk:
            self.loop.remove_reader(self._in)
            self.on_done(-1, 5)  # the helper died: every pending sync failed (EIO)
            return
        buf = self._buf + chunk
        n = len(buf) // _REP.size
        for i in range(n):
            rid, err = _REP.unpack_from(buf, i * _REP.size)
            self.on_done(rid, err)
        self._buf = buf[n * _REP.size :]

    def close(self) -> None:
        self.loop.remove_reader(self._in)
        self.proc.stdin.close()
        self.proc.wait(5)
        self.proc.stdout.close()


if __name__ == "__main__":
    child_main()
