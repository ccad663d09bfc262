"""Load generator of bench/amqp_bench.py: raw asyncio sockets speaking AMQP 0-9-1 as a client.

Frames are pre-encoded with our codec's client-side encoders (adapters/amqp/codec: `encode_method`,
`encode_publish`, `encode_basic_ack`) and server frames are parsed by a minimal hand-written frame
reader that only looks at what the roles need (method class/id, basic.ack/nack tags, basic.deliver
tags and the first 8 body bytes), so the client costs a few µs per message and the server, not the
generator, is what is measured.

Roles (one AMQP connection and one channel each):

- `pub`: `confirm.select`, then persistent (delivery_mode 2) publishes of `payload` bytes to the
  default exchange with routing key = its durable queue, keeping `window` unconfirmed; counts
  confirms (`basic.ack`, `multiple` honoured; `basic.nack` counted apart).
- `cons`: declares its durable queue (the declare-ok's message count is the backlog), `basic.qos`
  prefetch `prefetch`, `basic.consume` (manual ack) and acks every delivery (one `basic.ack` per
  delivery, written once per socket read); stops when it has the backlog (`target`) or at t1.
- `latpub` / `latsub`: a confirmed publisher paced at `rate` msg/s stamping CLOCK_MONOTONIC ns in the
  body, and a consumer (prefetch 100) recording receive - stamp for messages stamped in [t0, t1].
- `fixpub`: a `latpub` that also keeps at most `window` messages unconfirmed (it falls behind the pace
  rather than exceed it: `behind` counts the writes the window held back), for the fixed-rate phase.

With `exclusive` (a Job field), the consumer roles declare their queue exclusive (transient) and the
publishers declare nothing: pub/sub into a queue only the consumer's connection reads.

Each worker process runs its specs in one event loop and talks to the bench over a Pipe:
("ready", info) after setup, then ("run", t_start, t0, t1) -> ("result", {...}).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from adapters.amqp.codec import (
    BasicConsume,
    BasicQos,
    ChannelOpen,
    ConfirmSelect,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTuneOk,
    QueueDeclare,
    encode_basic_ack,
    encode_method,
    encode_publish,
)
from adapters.amqp.codec.properties import BasicProperties

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_HEAD = struct.Struct(">BHI")
_CM = struct.Struct(">HH")
_Q = struct.Struct(">Q")
FRAME_MAX = 131072


@dataclass
class Spec:
    role: str  # pub | cons | latpub | latsub | fixpub
    index: int
    queue: str


@dataclass
class Job:
    host: str
    port: int
    specs: list[Spec] = field(default_factory=list)
    payload: int = 100
    window: int = 200
    prefetch: int = 100
    rate: float = 2000
    cpus: list[int] | None = None
    user: str = "guest"
    password: str = "guest"
    exclusive: bool = False  # the consumer declares its queue exclusive; publishers declare none


class Conn:
    """One AMQP connection with channel 1 open; `on_frame(type, payload)` gets every frame after setup."""

    def __init__(self) -> None:
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter
        self.buf = bytearray()
        self.pending: list[tuple[int, bytes]] = []  # frames read after the one `expect` wanted

    async def open(self, job: Job) -> None:
        self.reader, self.writer = await asyncio.open_connection(job.host, job.port, limit=1 << 20)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.writer.write(PROTOCOL_HEADER)
        await self.expect(10, 10)
        resp = b"\x00" + job.user.encode() + b"\x00" + job.password.encode()
        self.writer.write(
            encode_method(
                0,
                ConnectionStartOk(
                    client_properties={"product": "amqp_loadgen"}, mechanism="PLAIN", response=resp
                ),
            )
        )
        await self.expect(10, 30)
        self.writer.write(
            encode_method(0, ConnectionTuneOk(channel_max=2047, frame_max=FRAME_MAX, heartbeat=0))
        )
        self.writer.write(encode_method(0, ConnectionOpen(virtual_host="/")))
        await self.expect(10, 41)
        self.writer.write(encode_method(1, ChannelOpen()))
        await self.expect(20, 11)

    async def frames(self) -> list[tuple[int, bytes]]:
        """The complete frames of the next read (at least one)."""
        if self.pending:
            out, self.pending = self.pending, []
            return out
        out = []
        while not out:
            data = await self.reader.read(1 << 18)
            if not data:
                raise ConnectionError("server closed the connection")
            self.buf += data
            buf = self.buf
            pos = 0
            n = len(buf)
            while n - pos >= 7:
                ftype, _ch, size = _HEAD.unpack_from(buf, pos)
                end = pos + 7 + size
                if end + 1 > n:
                    break
                out.append((ftype, bytes(buf[pos + 7 : end])))
                pos = end + 1
            del buf[:pos]
        return out

    async def expect(self, cls: int, mid: int) -> bytes:
        while True:
            frames = await self.frames()
            for i, (ftype, payload) in enumerate(frames):
                if ftype != 1:
                    continue
                c, m = _CM.unpack_from(payload)
                if (c, m) == (cls, mid):
                    self.pending = frames[i + 1 :] + self.pending
                    return payload
                if (c, m) in ((10, 50), (20, 40)):
                    code = struct.unpack_from(">H", payload, 4)[0]
                    text = payload[7 : 7 + payload[6]].decode(errors="replace")
                    raise RuntimeError(f"server closed: {code} {text}")

    async def call(self, method: Any, cls: int, mid: int) -> bytes:
        self.writer.write(encode_method(1, method))
        return await self.expect(cls, mid)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


async def declare(conn: Conn, queue: str, exclusive: bool = False) -> int:
    """Durable queue.declare (or an exclusive, transient one); the message count of the declare-ok."""
    p = await conn.call(QueueDeclare(queue=queue, durable=not exclusive, exclusive=exclusive), 50, 11)
    qlen = p[4]
    return struct.unpack_from(">I", p, 5 + qlen)[0]


class Role:
    def __init__(self, spec: Spec, job: Job) -> None:
        self.spec = spec
        self.job = job
        self.conn = Conn()
        self.sent = 0
        self.final = 0  # confirms / deliveries
        self.at_t0 = 0
        self.at_t1 = 0
        self.nacks = 0
        self.backlog = 0
        self.done_at: float | None = None
        self.lat_ns: list[int] = []
        self.error: str | None = None
        self.t0 = self.t1 = 0.0
        self.behind = 0  # fixpub: writes held back by the window
        self.confirmed = asyncio.Event()  # fixpub: set by the confirm loop on every confirm

    async def setup(self) -> None:
        await self.conn.open(self.job)
        role = self.spec.role
        publishes = role in ("pub", "latpub", "fixpub")
        if not self.job.exclusive:
            self.backlog = await declare(self.conn, self.spec.queue)
        elif not publishes:  # (the queue is the consumer's connection's alone)
            self.backlog = await declare(self.conn, self.spec.queue, exclusive=True)
        if publishes:
            await self.conn.call(ConfirmSelect(), 85, 11)
        else:
            await self.conn.call(
                BasicQos(prefetch_count=self.job.prefetch if role == "cons" else 100), 60, 11
            )

    async def run(self, t_start: float, t0: float, t1: float) -> None:
        self.t0, self.t1 = t0, t1
        await asyncio.sleep(max(0.0, t_start - time.monotonic()))
        ticker = asyncio.ensure_future(self._marks(t0, t1))
        try:
            role = self.spec.role
            if role == "pub":
                await self._pub(t1)
            elif role == "cons":
                await self._cons(t1)
            elif role == "latpub":
                await self._latpub(t1)
            elif role == "fixpub":
                await self._latpub(t1, self.job.window)
            else:
                await self._latsub(t1)
        except Exception as e:  # noqa: BLE001
            self.error = f"{self.spec.role}{self.spec.index}: {type(e).__name__}: {e}"
        finally:
            if not ticker.done():
                await ticker

    async def _marks(self, t0: float, t1: float) -> None:
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        self.at_t0 = self.final
        await asyncio.sleep(max(0.0, t1 - time.monotonic()))
        self.at_t1 = self.final

    def _publish_frame(self, body: bytes) -> bytes:
        return encode_publish(
            1, b"", self.spec.queue.encode(), BasicProperties(delivery_mode=2), body, FRAME_MAX
        )

    async def _read_confirms(self) -> int:
        """Process one read of frames; return how many messages got confirmed."""
        got = 0
        for ftype, p in await self.conn.frames():
            if ftype != 1:
                continue
            c, m = _CM.unpack_from(p)
            if c == 60 and m in (80, 120):
                tag = _Q.unpack_from(p, 4)[0]
                multiple = p[12] & 1
                k = tag - self.final if multiple else 1
                if m == 120:
                    self.nacks += k
                self.final += k
                got += k
            elif (c, m) in ((10, 50), (20, 40)):
                raise RuntimeError(f"closed by server: {p[4:60]!r}")
        return got

    async def _pub(self, t1: float) -> None:
        frame = self._publish_frame(b"x" * self.job.payload)
        w = self.conn.writer
        window = self.job.window
        w.write(frame * window)
        self.sent = window
        while time.monotonic() < t1:
            got = await self._read_confirms()
            if got:
                w.write(frame * got)
                self.sent += got
        # drain what is in flight (counted: the server did that work)
        deadline = time.monotonic() + 30
        while self.final < self.sent and time.monotonic() < deadline:
            await self._read_confirms()

    async def _deliveries(self, on_body: Any = None) -> int:
        """Process one read; ack every delivery in it with one write; return deliveries seen."""
        acks: list[bytes] = []
        frames = await self.conn.frames()
        for ftype, p in frames:
            if ftype == 1:
                c, m = _CM.unpack_from(p)
                if c == 60 and m == 60:
                    ctlen = p[4]
                    tag = _Q.unpack_from(p, 5 + ctlen)[0]
                    acks.append(encode_basic_ack(1, tag))
                elif (c, m) in ((10, 50), (20, 40)):
                    raise RuntimeError(f"closed by server: {p[4:60]!r}")
            elif ftype == 3 and on_body is not None:
                on_body(p)
        if acks:
            self.conn.writer.write(b"".join(acks))
            self.final += len(acks)
        return len(acks)

    async def _cons(self, t1: float) -> None:
        await self.conn.call(BasicConsume(queue=self.spec.queue, consumer_tag="c"), 60, 21)
        target = self.backlog
        while self.final < target and time.monotonic() < t1:
            try:
                await asyncio.wait_for(self._deliveries(), max(0.01, t1 - time.monotonic()))
            except TimeoutError:
                break
        self.done_at = time.monotonic()
        if self.final < target:
            self.error = f"cons{self.spec.index}: {self.final} of {target} messages by the deadline"

    async def _latpub(self, t1: float, window: int | None = None) -> None:
        """Publish at `rate` msg/s until t1; with `window`, at most that many unconfirmed."""
        pad = b"x" * max(0, self.job.payload - 8)
        interval = 1.0 / self.job.rate
        reader = asyncio.ensure_future(self._confirm_loop())
        try:
            nxt = time.monotonic()
            while True:
                now = time.monotonic()
                if now >= t1:
                    break
                if now < nxt:
                    await asyncio.sleep(nxt - now)
                    continue
                # catch up in small bursts when the loop was late
                k = min(50, int((now - nxt) / interval) + 1)
                if window is not None:
                    room = window - (self.sent - self.final)
                    if room < k:
                        self.behind += 1
                    if room <= 0:
                        self.confirmed.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self.confirmed.wait(), max(0.001, t1 - now))
                        continue
                    k = room if room < k else k
                self.conn.writer.write(
                    b"".join(
                        self._publish_frame(struct.pack(">Q", time.monotonic_ns()) + pad) for _ in range(k)
                    )
                )
                self.sent += k
                nxt += k * interval
            deadline = time.monotonic() + 10
            while self.final < self.sent and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _confirm_loop(self) -> None:
        while True:
            if await self._read_confirms():
                self.confirmed.set()

    async def _latsub(self, t1: float) -> None:
        await self.conn.call(BasicConsume(queue=self.spec.queue, consumer_tag="l"), 60, 21)
        t0ns = int(self.t0 * 1e9)
        t1ns = int(t1 * 1e9)

        def on_body(p: bytes) -> None:
            if len(p) >= 8:
                stamp = _Q.unpack_from(p)[0]
                if t0ns <= stamp <= t1ns:
                    self.lat_ns.append(time.monotonic_ns() - stamp)

        # after t1: until 0.3 s pass without a delivery (the publisher has stopped), at most 2 s
        end = t1 + 2.0
        while (now := time.monotonic()) < end:
            wait = end - now if now < t1 else min(0.3, end - now)
            try:
                await asyncio.wait_for(self._deliveries(on_body), max(0.01, wait))
            except TimeoutError:
                if time.monotonic() >= t1:
                    break

    def result(self) -> dict[str, Any]:
        return {
            "role": self.spec.role,
            "sent": self.sent,
            "final": self.final,
            "at_t0": self.at_t0,
            "at_t1": self.at_t1,
            "window": self.at_t1 - self.at_t0,
            "nacks": self.nacks,
            "backlog": self.backlog,
            "done_at": self.done_at,
            "behind": self.behind,
        }


async def _worker(job: Job, pipe: Any) -> None:
    roles = [Role(s, job) for s in job.specs]
    await asyncio.gather(*(r.setup() for r in roles))
    pipe.send(("ready", {"backlog": sum(r.backlog for r in roles)}))
    loop = asyncio.get_running_loop()
    msg = await loop.run_in_executor(None, pipe.recv)
    if msg[0] != "run":
        return
    c0 = time.process_time()
    _, t_start, t0, t1 = msg
    await asyncio.gather(*(r.run(t_start, t0, t1) for r in roles))
    res: dict[str, Any] = {
        "roles": {},
        "lat_ns": [],
        "errors": [],
        "gen_cpu_s": time.process_time() - c0,
        "done_at": [],
    }
    for r in roles:
        acc = res["roles"].setdefault(r.spec.role, {})
        for k, v in r.result().items():
            if isinstance(v, int) and not isinstance(v, bool):
                acc[k] = acc.get(k, 0) + v
        if r.done_at is not None:
            res["done_at"].append(r.done_at)
        res["lat_ns"].extend(r.lat_ns)
        if r.error:
            res["errors"].append(r.error)
        r.conn.close()
    pipe.send(("result", res))


def worker_main(job: Job, pipe: Any) -> None:
    if job.cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, set(job.cpus))
    try:
        asyncio.run(_worker(job, pipe))
    except Exception as e:  # noqa: BLE001
        with contextlib.suppress(Exception):
            pipe.send(("error", f"{type(e).__name__}: {e}"))
