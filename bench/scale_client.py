"""Raw asyncio MQTT 3.1.1 clients for bench/scale_bench.py: the same generator for every server.

Packets are hand-encoded (bench/mqtt_loadgen.py's encoders: CONNECT, SUBSCRIBE, PUBLISH heads
built once per topic) and one incremental reader per connection (`Conn.data_received`) walks the
received bytes: CONNACK (session-present flag and return code), SUBACK, PUBACK (counted, and the
connection's `on_ack` hook), PUBLISH (a QoS 1 one is PUBACKed at once; the connection's `sink` gets
topic, payload, retain flag and the receive time) and PINGRESP. No MQTT library and no code of the
server under test is used.

Connections are spread over loopback source addresses (`SOURCES`: 127.0.0.2 ... 127.0.0.9, each
socket bound to one of them before it connects), so a fleet is not bounded by one address's
ephemeral ports. `open_conn` opens one connection and waits for its CONNACK; `open_many` opens
many with at most `concurrency` handshakes in flight.

A stamped payload (`stamp`/`unstamp`) carries `time.monotonic_ns()` at write time and a 64-bit
sequence number in its first 16 bytes, so a receiver measures publish-to-delivery latency and
finds losses and duplicates.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any

from mqtt_loadgen import PIDS, encode_connect, encode_subscribe, mqtt_str, varint

SOURCES = [f"127.0.0.{i}" for i in range(2, 10)]
DISCONNECT = b"\xe0\x00"
STAMP = struct.Struct(">QQ")  # monotonic ns at write time, sequence number

Sink = Callable[["Conn", bytes, bytes, bool, int], None]


def stamp(seq: int, size: int) -> bytes:
    """A payload of `size` bytes (at least 16): the write time and `seq`, then padding."""
    return STAMP.pack(time.monotonic_ns(), seq) + b"x" * max(0, size - STAMP.size)


def unstamp(payload: bytes) -> tuple[int, int]:
    """(write time ns, sequence number) of a stamped payload."""
    return STAMP.unpack_from(payload)


class Publisher:
    """Pre-encoded QoS 1 PUBLISH packets to one topic: `packet(pid, payload)` joins the fixed
    header and topic (encoded once, for one payload size) with the packet id and the payload."""

    __slots__ = ("head", "size")

    def __init__(self, topic: str, size: int, retain: bool = False) -> None:
        t = mqtt_str(topic)
        self.size = size
        self.head = bytes([0x32 | (1 if retain else 0)]) + varint(len(t) + 2 + size) + t

    def packet(self, pid: int, payload: bytes) -> bytes:
        return self.head + PIDS[pid] + payload


class Conn(asyncio.Protocol):
    """One MQTT connection of the bench (see the module docstring)."""

    __slots__ = (
        "transport",
        "rest",
        "connack",
        "suback",
        "closed",
        "lost",
        "acks",
        "received",
        "sink",
        "on_ack",
        "next_pid",
        "index",
        "session_present",
        "persistent",
    )

    def __init__(self, index: int = 0, persistent: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.rest = b""
        self.connack: asyncio.Future[tuple[int, int]] = loop.create_future()
        self.suback: asyncio.Future[int] = loop.create_future()
        self.closed = False
        self.lost: asyncio.Future[None] = loop.create_future()
        self.acks = 0
        self.received = 0
        self.sink: Sink | None = None
        self.on_ack: Callable[[Conn, int], None] | None = None
        self.next_pid = 0
        self.index = index
        self.session_present = 0
        self.persistent = persistent

    def pid(self) -> int:
        """The next packet id (1 ... 65535)."""
        self.next_pid = self.next_pid % 65535 + 1
        return self.next_pid

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        err = ConnectionError(f"connection {self.index} closed ({exc})")
        for f in (self.connack, self.suback):
            if not f.done():
                f.set_exception(err)
                f.exception()  # retrieved: nobody may be waiting for it any more
        if not self.lost.done():
            self.lost.set_result(None)

    def data_received(self, data: bytes) -> None:  # noqa: C901 - one flat packet walk
        if self.rest:
            data = self.rest + data
        n = len(data)
        pos = 0
        acks: list[bytes] = []  # PUBACKs of this read, written at once
        while n - pos >= 2:
            b0 = data[pos]
            rl = shift = 0
            h = pos + 1
            more = True  # the remaining length goes on
            while more and h < n:
                b = data[h]
                h += 1
                rl |= (b & 0x7F) << shift
                shift += 7
                more = bool(b & 0x80)
            end = h + rl
            if more or end > n:  # the remaining length or the packet is not all here yet
                break
            kind = b0 >> 4
            if kind == 3:  # PUBLISH
                qos = (b0 >> 1) & 3
                tl = (data[h] << 8) | data[h + 1]
                topic = data[h + 2 : h + 2 + tl]
                p = h + 2 + tl
                if qos:
                    acks.append(b"\x40\x02" + data[p : p + 2])
                    p += 2
                self.received += 1
                if self.sink is not None:
                    self.sink(self, topic, data[p:end], bool(b0 & 1), time.monotonic_ns())
            elif kind == 4:  # PUBACK
                self.acks += 1
                if self.on_ack is not None:
                    self.on_ack(self, (data[h] << 8) | data[h + 1])
            elif kind == 2:  # CONNACK
                self.session_present = data[h] & 1
                if not self.connack.done():
                    self.connack.set_result((data[h] & 1, data[h + 1]))
            elif kind == 9 and not self.suback.done():  # SUBACK
                self.suback.set_result(data[end - 1])
            pos = end
        self.rest = data[pos:] if pos < n else b""
        if acks:
            self.write(b"".join(acks))

    # -- requests
    def subscribe(self, topic_filter: str, qos: int = 1) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        if self.suback.done():
            self.suback = loop.create_future()
        self.write(encode_subscribe(self.pid(), topic_filter, qos))
        return self.suback

    def disconnect(self) -> None:
        """DISCONNECT and close (the socket is closed once the packet is written)."""
        if self.transport is not None and not self.closed:
            self.transport.write(DISCONNECT)
            self.transport.close()


async def open_conn(
    host: str,
    port: int,
    client_id: str,
    *,
    clean: bool = True,
    index: int = 0,
    source: str | None = None,
    keep_alive: int = 600,
    timeout: float = 30.0,
) -> Conn:
    """One connection from `source` (a loopback address; None: the default), CONNACK received
    with return code 0 (ConnectionError otherwise); `conn.session_present` is its flag."""
    loop = asyncio.get_running_loop()
    local = (source, 0) if source else None
    _, conn = await asyncio.wait_for(
        loop.create_connection(lambda: Conn(index, not clean), host, port, local_addr=local), timeout
    )
    conn.write(encode_connect(client_id, keep_alive, clean=clean))
    _, rc = await asyncio.wait_for(asyncio.shield(conn.connack), timeout)
    if rc != 0:
        conn.disconnect()
        raise ConnectionError(f"{client_id}: CONNACK return code {rc}")
    return conn


async def open_many(
    host: str,
    port: int,
    items: Iterable[tuple[int, str, bool]],
    concurrency: int = 64,
    timeout: float = 60.0,
    sources: list[str] | None = None,
) -> list[Conn]:
    """Connections for (index, client id, clean) items, source addresses (`sources`, default
    `SOURCES`) in turn, at most `concurrency` handshakes at once; in the items' order. Fails on
    the first error."""
    srcs = sources or SOURCES
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, cid: str, clean: bool) -> Conn:
        async with sem:
            return await open_conn(
                host, port, cid, clean=clean, index=i, source=srcs[i % len(srcs)], timeout=timeout
            )

    return list(await asyncio.gather(*(one(i, c, cl) for i, c, cl in items)))


async def subscribe_all(conns: list[Conn], topic_of: Callable[[Conn], str], timeout: float = 60.0) -> None:
    """Each connection subscribes (QoS 1) to its own filter; all SUBACKs awaited (granted QoS 1)."""
    futs = [c.subscribe(topic_of(c), 1) for c in conns]
    granted = await asyncio.wait_for(asyncio.gather(*futs), timeout)
    bad = [g for g in granted if g not in (0, 1)]
    if bad:
        raise ConnectionError(f"{len(bad)} subscriptions refused (SUBACK {bad[0]:#x})")


async def wait_for(cond: Callable[[], bool], timeout: float, step: float = 0.005) -> bool:
    """Poll `cond` until true or `timeout` s pass; whether it became true."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= end:
            return False
        await asyncio.sleep(step)
    return True


def close_all(conns: Iterable[Any]) -> None:
    for c in conns:
        c.disconnect()
