"""HTTP/1.1 load generator and webhook receiver processes for bench/http_bench.py.

Raw asyncio sockets (uvloop when importable), no HTTP library and no code of the server under test,
so the same generator measures our gateway and the bare FastAPI endpoint.

Generator (`gen_main`): `conns` keep-alive connections, each with one request in flight at a time
(closed loop: the next request is written when the previous response is complete). Requests are
built once up front (`requests[i]` for connection i, a ring of pre-encoded requests with distinct
event ids, reused round-robin). The response reader finds the end of the header block, reads
`content-length` (a `transfer-encoding: chunked` response is an error) and skips the body; 2xx
answers are counted as ok, others as errors (first few kept with their status line and body). Each
connection records the latency (write to last response byte, CLOCK_MONOTONIC ns) of requests that
completed inside the measured window [t0, t1].

Commands on the pipe: `("run", t_start, t0, t1)` (monotonic seconds: load from t_start, counters
snapshot at t0 and t1, no new request after t1, then the outstanding ones complete) answered by a
result dict, and `("stop",)`.

Receiver (`receiver_main`): a minimal HTTP/1.1 server for push delivery. Answers
`OPTIONS` with `WebHook-Allowed-Origin: *` (the CloudEvents webhook handshake), every other request
with `200` and an empty body, counts requests that carry `ce-id`, remembers the distinct ids and the
monotonic times of the first and the last one. Commands: `("stats",)` -> dict, `("reset",)`,
`("stop",)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked", re.IGNORECASE)
_CE_ID = re.compile(rb"\r\nce-id:[ \t]*([^\r]*)", re.IGNORECASE)


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _loop_factory(loop: str):
    if loop == "uvloop":
        try:
            import uvloop

            return uvloop.new_event_loop
        except ImportError:
            return None
    return None


def _pin(cpus: list[int] | None) -> None:
    if cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)
    raise_nofile()


# ---------------------------------------------------------------------------- requests


def http_request(method: str, path: str, host: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """One pre-encoded HTTP/1.1 request (keep-alive is the default)."""
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers]
    lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# ---------------------------------------------------------------------------- generator


@dataclass
class GenJob:
    host: str
    port: int
    requests: list[list[bytes]]  # per connection: a ring of pre-encoded requests
    events_per_request: int = 1
    cpus: list[int] | None = None
    loop: str = "uvloop"
    max_errors_kept: int = 5
    drain_timeout: float = 30.0


class Conn(asyncio.Protocol):
    def __init__(self, worker: Worker, ring: list[bytes]) -> None:
        self.w = worker
        self.ring = ring
        self.i = 0
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.need = -1  # body bytes still to skip; -1: reading the header block
        self.status = 0
        self.head = b""
        self.errbody: bytearray | None = None
        self.sent_at = 0
        self.busy = False
        self.ok = 0
        self.errors = 0
        self.lat: list[int] = []
        self.closed = False
        self.connected: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.connected.done():
            self.connected.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.w.stopping:
            self.w.error(f"connection closed by the server: {exc!r}")
        if not self.connected.done():
            self.connected.set_exception(ConnectionError("connection lost"))

    def send(self) -> None:
        if self.closed or self.transport is None:
            return
        self.busy = True
        req = self.ring[self.i]
        self.i = (self.i + 1) % len(self.ring)
        self.sent_at = time.monotonic_ns()
        self.transport.write(req)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        while buf:
            if self.need < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                head = buf[: end + 2]
                buf = buf[end + 4 :]
                try:
                    self.status = int(head[9:12])
                except ValueError:
                    self.w.error(f"bad status line {head[:60]!r}")
                    self.status = 0
                if _CHUNKED.search(head):
                    self.w.error("chunked responses are not supported by the generator")
                    self.transport.close()  # type: ignore[union-attr]
                    return
                m = _CONTENT_LENGTH.search(head)
                self.need = int(m.group(1)) if m else 0
                self.head = head
                self.errbody = None if 200 <= self.status < 300 else bytearray()
            take = min(self.need, len(buf))
            if take and self.errbody is not None and len(self.errbody) < 300:
                self.errbody += buf[:take]
            buf = buf[take:]
            self.need -= take
            if self.need == 0:
                self.need = -1
                self._complete()
        self.buf = buf

    def _complete(self) -> None:
        now = time.monotonic_ns()
        self.busy = False
        w = self.w
        if 200 <= self.status < 300:
            self.ok += 1
            if w.t0_ns <= now <= w.t1_ns:
                self.lat.append(now - self.sent_at)
        else:
            self.errors += 1
            if w.keep_error():
                line = self.head.split(b"\r\n", 1)[0].decode(errors="replace")
                w.error(f"{line}: {bytes(self.errbody or b'')[:300].decode(errors='replace')}")
        if w.sending:
            self.send()


class Worker:
    def __init__(self, job: GenJob) -> None:
        self.job = job
        self.conns: list[Conn] = []
        self.sending = False
        self.stopping = False
        self.errors: list[str] = []
        self.error_count = 0
        self.t0_ns = 1 << 62
        self.t1_ns = 0

    def keep_error(self) -> bool:
        return len(self.errors) < self.job.max_errors_kept

    def error(self, msg: str) -> None:
        self.error_count += 1
        if len(self.errors) < self.job.max_errors_kept:
            self.errors.append(msg)

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        for ring in self.job.requests:
            c = Conn(self, ring)
            await loop.create_connection(lambda c=c: c, self.job.host, self.job.port)
            await c.connected
            self.conns.append(c)

    def _snapshot(self) -> tuple[int, int]:
        return sum(c.ok for c in self.conns), sum(c.errors for c in self.conns)

    async def run(self, t_start: float, t0: float, t1: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        for c in self.conns:
            c.lat.clear()
        snaps: dict[str, Any] = {}
        done = loop.create_future()
        off = time.monotonic_ns() - int(time.monotonic() * 1e9)
        self.t0_ns = int(t0 * 1e9) + off
        self.t1_ns = int(t1 * 1e9) + off

        def start() -> None:
            self.sending = True
            for c in self.conns:
                if not c.busy:
                    c.send()

        def snap(name: str) -> None:
            snaps[name] = (self._snapshot(), time.process_time())
            if name == "t1":
                self.sending = False
                done.set_result(None)

        now = time.monotonic()
        loop.call_later(max(0.0, t_start - now), start)
        loop.call_later(max(0.0, t0 - now), snap, "t0")
        loop.call_later(max(0.0, t1 - now), snap, "t1")
        await done
        deadline = time.monotonic() + self.job.drain_timeout
        while any(c.busy and not c.closed for c in self.conns) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        (ok0, err0), cpu0 = snaps["t0"]
        (ok1, err1), cpu1 = snaps["t1"]
        lat: list[int] = []
        for c in self.conns:
            lat.extend(c.lat)
        return {
            "ok": ok1 - ok0,
            "errors": err1 - err0,
            "gen_cpu_s": cpu1 - cpu0,
            "lat_ns": lat,
            "error_samples": list(self.errors),
            "error_count": self.error_count,
            "drained": not any(c.busy and not c.closed for c in self.conns),
            "closed": sum(c.closed for c in self.conns),
        }

    async def close(self) -> None:
        self.stopping = True
        for c in self.conns:
            if c.transport is not None and not c.closed:
                c.transport.close()
        await asyncio.sleep(0.02)


async def _serve_gen(job: GenJob, pipe: Connection) -> None:
    w = Worker(job)
    loop = asyncio.get_running_loop()
    try:
        await w.connect()
        pipe.send(("ready", {"conns": len(w.conns)}))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        pipe.send(("error", f"connect to {job.host}:{job.port}: {type(e).__name__}: {e}"))
        await w.close()
        return
    while True:
        cmd = await loop.run_in_executor(None, pipe.recv)
        if cmd[0] == "run":
            try:
                pipe.send(("result", await w.run(*cmd[1:])))
            except BaseException as e:  # noqa: BLE001
                pipe.send(("error", f"run: {type(e).__name__}: {e}"))
        else:
            await w.close()
            pipe.send(("closed", None))
            return


def gen_main(job: GenJob, pipe: Connection) -> None:
    """Generator process entry point (multiprocessing target)."""
    _pin(job.cpus)
    try:
        with asyncio.Runner(loop_factory=_loop_factory(job.loop)) as runner:
            runner.run(_serve_gen(job, pipe))
    except BaseException as e:  # noqa: BLE001
        with contextlib.suppress(Exception):
            pipe.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        pipe.close()


# ---------------------------------------------------------------------------- webhook receiver

OK_RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
OPTIONS_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nwebhook-allowed-origin: *\r\nwebhook-allowed-rate: *\r\n"
    b"allow: POST, OPTIONS\r\ncontent-length: 0\r\n\r\n"
)


@dataclass
class RecvStats:
    count: int = 0
    first: float = 0.0
    last: float = 0.0
    handshakes: int = 0
    ids: set[bytes] = field(default_factory=set)
    connections: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "distinct": len(self.ids),
            "first": self.first,
            "last": self.last,
            "handshakes": self.handshakes,
            "connections": self.connections,
        }


class Receiving(asyncio.Protocol):
    def __init__(self, stats: RecvStats) -> None:
        self.stats = stats
        self.buf = b""
        self.need = -1
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.stats.connections += 1

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        out: list[bytes] = []
        while buf:
            if self.need < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                head = buf[: end + 2]
                buf = buf[end + 4 :]
                m = _CONTENT_LENGTH.search(head)
                self.need = int(m.group(1)) if m else 0
                if head.startswith(b"OPTIONS "):
                    self.stats.handshakes += 1
                    out.append(OPTIONS_RESPONSE)
                else:
                    m = _CE_ID.search(head)
                    if m:
                        s = self.stats
                        now = time.monotonic()
                        if not s.count:
                            s.first = now
                        s.last = now
                        s.count += 1
                        s.ids.add(m.group(1))
                    out.append(OK_RESPONSE)
            take = min(self.need, len(buf))
            buf = buf[take:]
            self.need -= take
            if self.need == 0:
                self.need = -1
        self.buf = buf
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def _serve_receiver(host: str, port: int, pipe: Connection) -> None:
    stats = RecvStats()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Receiving(stats), host, port, backlog=1024)
    pipe.send(("ready", {"port": server.sockets[0].getsockname()[1]}))
    try:
        while True:
            cmd = await loop.run_in_executor(None, pipe.recv)
            if cmd[0] == "stats":
                pipe.send(("stats", stats.as_dict()))
            elif cmd[0] == "reset":
                conns = stats.connections
                stats.__init__()  # type: ignore[misc]
                stats.connections = conns
                pipe.send(("reset", None))
            else:
                pipe.send(("closed", None))
                return
    finally:
        server.close()


def receiver_main(host: str, port: int, cpus: list[int] | None, loop: str, pipe: Connection) -> None:
    """Webhook receiver process entry point (multiprocessing target)."""
    _pin(cpus)
    try:
        with asyncio.Runner(loop_factory=_loop_factory(loop)) as runner:
            runner.run(_serve_receiver(host, port, pipe))
    except BaseException as e:  # noqa: BLE001
        with contextlib.suppress(Exception):
            pipe.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        pipe.close()


__all__ = ["GenJob", "gen_main", "http_request", "raise_nofile", "receiver_main"]
