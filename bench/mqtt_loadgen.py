"""MQTT 3.1.1 load generator processes for bench/mqtt_bench.py.

Raw asyncio sockets (uvloop when importable) with hand-encoded packets: the few packets a load
generator needs (CONNECT, SUBSCRIBE, PUBLISH, PUBACK, PINGREQ, DISCONNECT) are encoded once up front,
and one incremental reader per connection walks the received bytes with integer indexing, counting
CONNACK / SUBACK / PUBACK / PINGRESP and PUBLISH packets. No MQTT library and no code of the server
under test is used, so the same generator measures every broker.

Roles of a connection (`Spec.role`):

- `pub0`: QoS 0 publisher. Writes batches of `qos0_batch` publishes each followed by a PINGREQ and
  keeps at most `qos0_batches` batches unanswered; a PINGRESP confirms its batch (servers answer
  packets of one connection in order), so the counted rate is what the server took in, not what fit
  in socket buffers.
- `pub1`: QoS 1 publisher with at most `window` unacknowledged publishes; counts PUBACKs.
- `fanpub`: a `pub1` that also keeps at most `fan_window` messages between what it published and
  what the slowest subscriber received (shared counters across processes), so a broker never
  builds an unbounded backlog and the counted deliveries are sustainable.
- `sub`: QoS 1 subscriber to `Spec.topic`; PUBACKs and counts every delivery.
- `latpub` / `latsub`: QoS 1 publisher paced at `rate` msg/s (1 ms ticks) stamping
  `time.monotonic_ns()` (CLOCK_MONOTONIC, system-wide) into the first 8 payload bytes at write time,
  and its subscriber, which records receive time minus stamp for stamps inside the measured window.
- `idle`: CONNECT (keep-alive `keep_alive` s), CONNACK, then nothing.

A worker process (`worker_main`) pins itself to the generator CPUs, raises RLIMIT_NOFILE, opens its
connections (at most `connect_concurrency` handshakes at once), reports ready on its pipe and then
serves commands: `("run", t_start, t0, t1)` (monotonic seconds: load from t_start, counter
snapshots at t0 and t1, load stops at t1, then a drain of outstanding acks/deliveries) answered by a
result dict, and `("stop",)` which DISCONNECTs and exits.

With `Job.tls_ca` every connection is TLS (the event loop's own TLS transport, certificate checked
against that file); the packets and their counting are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import ssl
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

PINGREQ = b"\xc0\x00"
DISCONNECT = b"\xe0\x00"
PUBACK_HEAD = b"\x40\x02"
PIDS = [i.to_bytes(2, "big") for i in range(65536)]
PUB_ROLES = ("pub0", "pub1", "fanpub", "latpub")
SUB_ROLES = ("sub", "latsub")


# ---------------------------------------------------------------------------- packet encoding


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def mqtt_str(s: str) -> bytes:
    b = s.encode()
    return len(b).to_bytes(2, "big") + b


def encode_connect(
    client_id: str,
    keep_alive: int,
    username: str | None = None,
    password: str | None = None,
    clean: bool = True,
) -> bytes:
    """MQTT 3.1.1 CONNECT, no will; clean session unless `clean` is False; a user name and password
    when given."""
    flags = 0x02 if clean else 0
    flags |= (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    body = mqtt_str("MQTT") + bytes([4, flags]) + keep_alive.to_bytes(2, "big") + mqtt_str(client_id)
    if username is not None:
        body += mqtt_str(username)
    if password is not None:
        body += mqtt_str(password)
    return b"\x10" + varint(len(body)) + body


def encode_subscribe(pid: int, topic_filter: str, qos: int) -> bytes:
    body = PIDS[pid] + mqtt_str(topic_filter) + bytes([qos])
    return b"\x82" + varint(len(body)) + body


def publish_head(topic: str, qos: int, payload_len: int) -> bytes:
    """Fixed header + topic of a PUBLISH; a QoS > 0 packet continues with its packet id, then the payload."""
    t = mqtt_str(topic)
    return bytes([0x30 | (qos << 1)]) + varint(len(t) + (2 if qos else 0) + payload_len) + t


def encode_publish(topic: str, payload: bytes, qos: int, pid: int = 0) -> bytes:
    return publish_head(topic, qos, len(payload)) + (PIDS[pid] if qos else b"") + payload


# ---------------------------------------------------------------------------- job description


@dataclass(slots=True)
class Spec:
    role: str  # see the module docstring
    index: int  # global index within its role (client ids, shared fan-out counters)
    topic: str = ""
    persistent: bool = False  # CONNECT with clean session 0 (a persistent session)


@dataclass(slots=True)
class Job:
    host: str
    port: int
    specs: list[Spec]
    tag: str = "mb"  # client id prefix
    payload: int = 100
    window: int = 100
    qos0_batch: int = 100
    qos0_batches: int = 2
    fan_window: int = 1000
    fan_subscribers: int = 0  # length of the shared counter array
    rate: float = 5000.0
    keep_alive: int = 120
    connect_concurrency: int = 64
    connect_timeout: float = 30.0
    drain_timeout: float = 5.0
    cpus: list[int] | None = None
    loop: str = "uvloop"
    username: str | None = None  # CONNECT credentials (a gateway started with --auth)
    password: str | None = None
    tls_ca: str | None = None  # connect over TLS, verifying the server against this PEM (its certificate)


@dataclass(slots=True)
class _Window:
    t0: float = 0.0
    t1: float = 0.0
    lat_lo: int = 0  # latency stamps recorded in [lat_lo, lat_hi) ns
    lat_hi: int = 0


# ---------------------------------------------------------------------------- connections


class Client(asyncio.Protocol):
    """One MQTT connection: an incremental reader plus the behaviour of its role."""

    def __init__(self, w: Worker, spec: Spec) -> None:
        self.w = w
        self.spec = spec
        self.role = spec.role
        self.transport: asyncio.Transport | None = None
        self.rest = b""
        loop = w.loop
        self.connack: asyncio.Future[int] = loop.create_future()
        self.suback: asyncio.Future[int] = loop.create_future()
        self.closed = False
        self.count = 0  # acked (pub1/fanpub/latpub), confirmed (pub0) or delivered (sub/latsub)
        self.sent = 0
        self.lat: list[int] | None = [] if spec.role == "latsub" else None
        self.is_sub = spec.role in SUB_ROLES

    # -- transport callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        err = ConnectionError(f"connection closed by the server ({exc})")
        for f in (self.connack, self.suback):
            if not f.done():
                f.set_exception(err)
        if self.w.running and not self.w.stopping:
            self.w.errors.append(f"{self.role}{self.spec.index}: connection lost")

    def data_received(self, data: bytes) -> None:
        if self.rest:
            data = self.rest + data
        n = len(data)
        pos = 0
        acks = pings = delivered = 0
        out: list[bytes] | None = None
        lat = self.lat
        now = time.monotonic_ns() if lat is not None else 0
        win = self.w.win
        while n - pos >= 2:
            b0 = data[pos]
            rl = data[pos + 1]
            h = pos + 2
            if rl & 0x80:  # multi-byte remaining length
                rl &= 0x7F
                shift = 7
                while True:
                    if h >= n:
                        rl = -1
                        break
                    b = data[h]
                    h += 1
                    rl |= (b & 0x7F) << shift
                    shift += 7
                    if not b & 0x80:
                        break
                if rl < 0:
                    break
            end = h + rl
            if end > n:
                break
            t = b0 >> 4
            if t == 4:  # PUBACK
                acks += 1
            elif t == 3:  # PUBLISH
                delivered += 1
                p = h + 2 + ((data[h] << 8) | data[h + 1])
                if b0 & 0x06:
                    if out is None:
                        out = []
                    out.append(PUBACK_HEAD + data[p : p + 2])
                    p += 2
                if lat is not None:
                    ts = int.from_bytes(data[p : p + 8], "big")
                    if win.lat_lo <= ts < win.lat_hi:
                        lat.append(now - ts)
            elif t == 13:  # PINGRESP
                pings += 1
            elif t == 2:  # CONNACK
                if not self.connack.done():
                    self.connack.set_result(data[h + 1])
            elif t == 9 and not self.suback.done():  # SUBACK
                self.suback.set_result(data[h + 2])
            pos = end
        self.rest = data[pos:] if pos < n else b""
        if out is not None and self.transport is not None:
            self.transport.write(b"".join(out))
        if delivered:
            self.count += delivered
            if self.role == "sub":
                self.w.on_fan_delivery(self)
        if acks:
            self.count += acks
            self.fill()
        if pings:
            self.count += pings * self.w.job.qos0_batch
            self.fill()

    # -- publishing
    def fill(self) -> None:  # overridden by publishers
        pass

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)


class Qos0Publisher(Client):
    def __init__(self, w: Worker, spec: Spec) -> None:
        super().__init__(w, spec)
        j = w.job
        one = encode_publish(spec.topic, b"x" * j.payload, 0)
        self.batch = one * j.qos0_batch + PINGREQ
        self.batch_n = j.qos0_batch
        self.max_out = j.qos0_batches * j.qos0_batch

    def fill(self) -> None:
        if not self.w.sending:
            return
        while self.sent - self.count < self.max_out:
            self.write(self.batch)
            self.sent += self.batch_n


class Qos1Publisher(Client):
    def __init__(self, w: Worker, spec: Spec) -> None:
        super().__init__(w, spec)
        j = w.job
        self.head = publish_head(spec.topic, 1, j.payload)
        self.payload = b"x" * j.payload
        self.window = j.window
        self.pid = 0

    def room(self) -> int:
        return self.window - (self.sent - self.count)

    def fill(self) -> None:
        if not self.w.sending:
            return
        k = self.room()
        if k <= 0:
            return
        head, payload, pids = self.head, self.payload, PIDS
        pid = self.pid
        parts: list[bytes] = []
        ap = parts.append
        for _ in range(k):
            pid = pid + 1 if pid < 65535 else 1
            ap(head)
            ap(pids[pid])
            ap(payload)
        self.pid = pid
        self.sent += k
        self.write(b"".join(parts))


class FanPublisher(Qos1Publisher):
    """QoS 1 publisher limited by the slowest fan-out subscriber (shared counters)."""

    def __init__(self, w: Worker, spec: Spec) -> None:
        super().__init__(w, spec)
        self.fan_window = w.job.fan_window
        self.adjust = 0  # messages written off as lost (a stalled window is resynchronised)
        self.stalls = 0
        self._last_min = -1
        self._last_progress = time.monotonic()
        self._poll: asyncio.TimerHandle | None = None

    def room(self) -> int:
        counts = self.w.fan_counts
        lo = min(counts) if counts is not None and len(counts) else self.sent
        now = time.monotonic()
        if lo != self._last_min:
            self._last_min = lo
            self._last_progress = now
        fan_room = self.fan_window - (self.sent - lo - self.adjust)
        if fan_room <= 0 and now - self._last_progress > 2.0:
            # A subscriber missed messages (a broker that drops): do not stall the run forever.
            self.stalls += 1
            self.adjust = self.sent - lo - self.fan_window // 2
            fan_room = self.fan_window // 2
            self._last_progress = now
        room = min(super().room(), fan_room)
        if room <= 0 and self.w.sending and self._poll is None:
            self._poll = self.w.loop.call_later(0.001, self._repoll)
        return room

    def _repoll(self) -> None:
        self._poll = None
        self.fill()


class LatencyPublisher(Qos1Publisher):
    """QoS 1 publisher paced at `rate` msg/s, payload starting with the monotonic write time in ns."""

    def __init__(self, w: Worker, spec: Spec) -> None:
        super().__init__(w, spec)
        self.window = max(self.window, 1000)
        self.pad = b"x" * max(w.job.payload - 8, 0)
        self.rate = w.job.rate
        self.t_start = 0.0
        self.sent_base = 0
        self.behind = 0  # ticks where the window stopped us from keeping the pace
        self._tick: asyncio.TimerHandle | None = None

    def start(self, t_start: float) -> None:
        self.t_start = t_start
        self.sent_base = self.sent
        self._tick = self.w.loop.call_later(max(0.0, t_start - time.monotonic()), self.tick)

    def tick(self) -> None:
        self._tick = None
        if not self.w.sending:
            return
        self.fill()
        self._tick = self.w.loop.call_later(0.001, self.tick)

    def fill(self) -> None:
        if not self.w.sending or self.t_start == 0.0:
            return
        due = int((time.monotonic() - self.t_start) * self.rate) - (self.sent - self.sent_base)
        if due <= 0:
            return
        k = min(due, self.room())
        if k < due:
            self.behind += 1
        if k <= 0:
            return
        head, pad, pids = self.head, self.pad, PIDS
        stamp = time.monotonic_ns().to_bytes(8, "big")
        pid = self.pid
        parts: list[bytes] = []
        for _ in range(k):
            pid = pid + 1 if pid < 65535 else 1
            parts.append(head + pids[pid] + stamp + pad)
        self.pid = pid
        self.sent += k
        self.write(b"".join(parts))


_CLASSES: dict[str, type[Client]] = {
    "pub0": Qos0Publisher,
    "pub1": Qos1Publisher,
    "fanpub": FanPublisher,
    "latpub": LatencyPublisher,
    "sub": Client,
    "latsub": Client,
    "idle": Client,
}


# ---------------------------------------------------------------------------- worker


class Worker:
    def __init__(self, job: Job, fan_counts: Any) -> None:
        self.job = job
        self.loop = asyncio.get_running_loop()
        self.fan_counts = fan_counts  # multiprocessing RawArray('q') or None
        self.clients: list[Client] = []
        self.fanpubs: list[FanPublisher] = []
        self.win = _Window()
        self.sending = False
        self.running = False
        self.stopping = False
        self.errors: list[str] = []

    def on_fan_delivery(self, c: Client) -> None:
        if self.fan_counts is not None:
            self.fan_counts[c.spec.index] = c.count
        for p in self.fanpubs:
            p.fill()

    async def connect(self) -> None:
        j = self.job
        sem = asyncio.Semaphore(j.connect_concurrency)
        pid = os.getpid()
        tls = client_tls(j.tls_ca) if j.tls_ca else None

        async def one(spec: Spec) -> Client:
            async with sem:
                _, c = await self.loop.create_connection(
                    lambda: _CLASSES[spec.role](self, spec), j.host, j.port, ssl=tls
                )
                assert isinstance(c, Client)
                c.write(
                    encode_connect(
                        f"{j.tag}{pid}-{spec.role}{spec.index}",
                        j.keep_alive,
                        j.username,
                        j.password,
                        clean=not spec.persistent,
                    )
                )
                rc = await asyncio.wait_for(c.connack, j.connect_timeout)
                if rc != 0:
                    raise ConnectionError(f"CONNACK return code {rc}")
                if c.is_sub:
                    c.write(encode_subscribe(1, spec.topic, 1))
                    granted = await asyncio.wait_for(c.suback, j.connect_timeout)
                    if granted >= 0x80:
                        raise ConnectionError(f"SUBACK failure 0x{granted:02x} for {spec.topic}")
                return c

        self.clients = list(await asyncio.gather(*(one(s) for s in j.specs)))
        self.fanpubs = [c for c in self.clients if isinstance(c, FanPublisher)]

    def _snapshot(self) -> tuple[float, float, list[int]]:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return time.monotonic(), ru.ru_utime + ru.ru_stime, [c.count for c in self.clients]

    async def run(self, t_start: float, t0: float, t1: float) -> dict[str, Any]:
        loop = self.loop
        self.errors = []
        self.win = _Window(t0, t1, int(t0 * 1e9), int(t1 * 1e9))
        for c in self.clients:
            if c.lat is not None:
                c.lat.clear()
        snaps: dict[str, tuple[float, float, list[int]]] = {}
        done = loop.create_future()
        self.running = True

        def start() -> None:
            self.sending = True
            for c in self.clients:
                if isinstance(c, LatencyPublisher):
                    c.start(t_start)
                else:
                    c.fill()

        def snap0() -> None:
            snaps["t0"] = self._snapshot()

        def snap1() -> None:
            snaps["t1"] = self._snapshot()
            self.sending = False
            done.set_result(None)

        now = time.monotonic()
        loop.call_later(max(0.0, t_start - now), start)
        loop.call_later(max(0.0, t0 - now), snap0)
        loop.call_later(max(0.0, t1 - now), snap1)
        await done
        drain_ok = await self._drain()
        self.running = False
        _, cpu0, c0 = snaps["t0"]
        _, cpu1, c1 = snaps["t1"]
        res: dict[str, Any] = {
            "t0": snaps["t0"][0],
            "t1": snaps["t1"][0],
            "gen_cpu_s": cpu1 - cpu0,
            "drained": drain_ok,
            "errors": list(self.errors),
            "roles": {},
            "lat_ns": [],
            "sent_in_window": 0,
            "stalls": sum(p.stalls for p in self.fanpubs),
            "behind_ticks": sum(c.behind for c in self.clients if isinstance(c, LatencyPublisher)),
        }
        roles: dict[str, dict[str, int]] = res["roles"]
        for c, a, b in zip(self.clients, c0, c1, strict=True):
            r = roles.setdefault(c.role, {"clients": 0, "at_t0": 0, "window": 0, "final": 0, "sent": 0})
            r["clients"] += 1
            r["at_t0"] += a
            r["window"] += b - a
            r["final"] += c.count
            r["sent"] += c.sent
            if c.lat is not None:
                res["lat_ns"].extend(c.lat)
        return res

    async def _drain(self) -> bool:
        """After the load stops: wait for outstanding acks and for deliveries to settle."""
        deadline = time.monotonic() + self.job.drain_timeout
        last = None
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            pubs_done = all(
                c.count >= c.sent or c.closed for c in self.clients if c.role in ("pub1", "fanpub", "latpub")
            ) and all(c.count >= c.sent or c.closed for c in self.clients if c.role == "pub0")
            state = [c.count for c in self.clients if c.is_sub]
            if state != last:
                last = state
                quiet_since = time.monotonic()
            subs_quiet = time.monotonic() - quiet_since >= 0.2 or not state
            if pubs_done and subs_quiet:
                return True
            await asyncio.sleep(0.02)
        return False

    async def close(self) -> None:
        self.stopping = True
        for c in self.clients:
            if c.transport is not None and not c.closed:
                c.transport.write(DISCONNECT)
                c.transport.close()
        await asyncio.sleep(0.05)


async def _serve(job: Job, conn: Connection, fan_counts: Any) -> None:
    w = Worker(job, fan_counts)
    loop = asyncio.get_running_loop()
    try:
        t = time.monotonic()
        await w.connect()
        conn.send(("ready", {"connect_s": time.monotonic() - t, "clients": len(w.clients)}))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"connect: {type(e).__name__}: {e}"))
        await w.close()
        return
    while True:
        cmd = await loop.run_in_executor(None, conn.recv)
        if cmd[0] == "run":
            try:
                conn.send(("result", await w.run(*cmd[1:])))
            except BaseException as e:  # noqa: BLE001
                conn.send(("error", f"run: {type(e).__name__}: {e}"))
        else:
            await w.close()
            conn.send(("closed", None))
            return


def client_tls(cafile: str) -> ssl.SSLContext:
    """The generator's TLS client context: the library defaults (TLS 1.2+, the server's certificate
    and host name checked) with `cafile` as the only trusted root."""
    return ssl.create_default_context(cafile=cafile)


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def worker_main(job: Job, conn: Connection, fan_counts: Any = None) -> None:
    """Process entry point (multiprocessing target)."""
    if job.cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, job.cpus)
    raise_nofile()
    runner_factory = None
    if job.loop == "uvloop":
        try:
            import uvloop

            runner_factory = uvloop.new_event_loop
        except ImportError:
            runner_factory = None
    try:
        with asyncio.Runner(loop_factory=runner_factory) as runner:
            runner.run(_serve(job, conn, fan_counts))
    except BaseException as e:  # noqa: BLE001
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


__all__ = ["Job", "Spec", "encode_connect", "encode_publish", "encode_subscribe", "worker_main"]
