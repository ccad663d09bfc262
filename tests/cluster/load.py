"""Load through CLUSTER proxies that records every acknowledged send and every consumed message:
gRPC (the project's stub) and MQTT QoS 1 (aiomqtt) publishers, gRPC consumers (receive and ack,
one consumer group over every proxy) and clean-session MQTT subscribers (each sees every message),
and the official RocketMQ 5 Python client as a publisher subprocess (`Official`). Used by the
name-server loss and mixed-version tests; `Load.lost()` is what was acknowledged but never
consumed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import grpc
import httpx

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2_grpc
from tests.adapters.grpc import support as g

OFFICIAL = Path(__file__).with_name("official_publisher.py")


@dataclass
class Counters:
    """What one load task did, with the monotonic time of each success."""

    ok: list[tuple[float, bytes]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def since(self, t: float) -> int:
        return sum(1 for at, _ in self.ok if at >= t)


class Load:
    """Publishers and consumers on every proxy of `listeners`, store topic `topic` (MQTT paths
    `topic/dev<i>/...`). `start()`, then `stop_sending()`, `drain()`, `close()`."""

    def __init__(self, listeners: list[dict[str, str]], topic: str, group: str, pace_s: float = 0.01) -> None:
        self.listeners = listeners
        self.topic = topic
        self.group = group
        self.pace_s = pace_s
        self.sent: dict[str, Counters] = {}  # "grpc0", "mqtt1", ... -> acknowledged sends
        self.popped: dict[str, Counters] = {}  # "pop0", ... -> acked receives (one group)
        self.subscribed: dict[str, Counters] = {}  # "sub0", ... -> MQTT deliveries (each sees all)
        self.sending = asyncio.Event()
        self.consuming = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._subscribed: list[asyncio.Event] = []

    # ------------------------------------------------------------------ running
    async def start(self, subscribers: bool = True) -> None:
        """The topic created, consumers started (MQTT subscriptions in place), then publishers."""
        async with httpx.AsyncClient() as h:
            r = await h.post(f"http://{self.listeners[0]['http']}/admin/topics", json={"name": self.topic})
            assert r.status_code in (200, 201), r.text
        self.consuming.set()
        for i, li in enumerate(self.listeners):
            self.popped[f"pop{i}"] = c = Counters()
            self._spawn(self._pop(li, c))
            if subscribers:
                self.subscribed[f"sub{i}"] = c = Counters()
                ready = asyncio.Event()
                self._subscribed.append(ready)
                self._spawn(self._subscribe(li, i, c, ready))
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self._subscribed)), 15)
        self.sending.set()
        for i, li in enumerate(self.listeners):
            self.sent[f"grpc{i}"] = c = Counters()
            self._spawn(self._grpc_send(li, i, c))
            self.sent[f"mqtt{i}"] = c = Counters()
            self._spawn(self._mqtt_send(li, i, c))

    def _spawn(self, coro) -> None:  # noqa: ANN001
        self._tasks.append(asyncio.ensure_future(coro))

    def acked(self) -> set[bytes]:
        return {b for c in self.sent.values() for _, b in c.ok}

    def consumed(self) -> set[bytes]:
        return {b for c in self.popped.values() for _, b in c.ok}

    def lost(self, extra: set[bytes] = frozenset()) -> set[bytes]:  # type: ignore[assignment]
        """Acknowledged sends (and `extra`, e.g. another client's) that no consumer popped."""
        return (self.acked() | extra) - self.consumed()

    def failures(self) -> dict[str, list[str]]:
        every = {**self.sent, **self.popped, **self.subscribed}
        return {k: c.failures for k, c in every.items() if c.failures}

    def stop_sending(self) -> None:
        self.sending.clear()

    async def drain(self, want: set[bytes], timeout: float = 20.0) -> None:
        """Wait until the consumer group popped every body of `want` and each MQTT subscriber saw
        every MQTT-or-gRPC body of `want` (or `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            subs_done = all(want <= {b for _, b in c.ok} for c in self.subscribed.values())
            if want <= self.consumed() and subs_done:
                return
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        self.sending.clear()
        self.consuming.clear()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ the clients
    async def _grpc_send(self, li: dict[str, str], i: int, c: Counters) -> None:
        async with grpc.aio.insecure_channel(li["grpc"]) as ch:
            s = service_pb2_grpc.MessagingServiceStub(ch)
            n = 0
            while self.sending.is_set():
                body = f"g{i}-{n}".encode()
                n += 1  # a new body per attempt: a failed one is never sent again
                try:
                    r = await asyncio.wait_for(g.send(s, g.msg(self.topic, body)), 5)
                    if r.status.code == d.OK:
                        c.ok.append((time.monotonic(), body))
                    else:
                        c.failures.append(f"{body!r}: {r.status.code} {r.status.message}")
                except (grpc.aio.AioRpcError, TimeoutError) as e:
                    c.failures.append(f"{body!r}: {type(e).__name__} {e}")
                await asyncio.sleep(self.pace_s)

    async def _mqtt_send(self, li: dict[str, str], i: int, c: Counters) -> None:
        host, port = li["mqtt"].rsplit(":", 1)
        n = 0
        while self.sending.is_set():
            try:
                ident = f"pub-{self.topic}-{i}"
                async with aiomqtt.Client(host, int(port), identifier=ident, timeout=5) as m:
                    while self.sending.is_set():
                        body = f"m{i}-{n}".encode()
                        n += 1
                        await m.publish(f"{self.topic}/dev{i}/t", body, qos=1)  # returns on PUBACK
                        c.ok.append((time.monotonic(), body))
                        await asyncio.sleep(self.pace_s)
            except aiomqtt.MqttError as e:
                c.failures.append(f"mqtt: {e}")
                await asyncio.sleep(0.2)

    async def _pop(self, li: dict[str, str], c: Counters) -> None:
        async with grpc.aio.insecure_channel(li["grpc"]) as ch:
            s = service_pb2_grpc.MessagingServiceStub(ch)
            while self.consuming.is_set():
                try:
                    st, msgs, _ = await g.receive(
                        s, self.group, self.topic, batch=32, poll_ms=500, invisible_ms=5000, timeout=10
                    )
                    if st.code not in (d.OK, d.MESSAGE_NOT_FOUND):
                        c.failures.append(f"receive: {st.code} {st.message}")
                        await asyncio.sleep(0.1)
                        continue
                    if not msgs:
                        continue
                    handles = [m.system_properties.receipt_handle for m in msgs]
                    r = await g.ack(s, self.group, self.topic, *handles)
                    now = time.monotonic()
                    for m, e in zip(msgs, r.entries, strict=True):
                        if e.status.code == d.OK:
                            c.ok.append((now, m.body))
                        else:
                            c.failures.append(f"ack {m.body!r}: {e.status.code} {e.status.message}")
                except (grpc.aio.AioRpcError, TimeoutError) as e:
                    c.failures.append(f"receive: {type(e).__name__} {e}")
                    await asyncio.sleep(0.1)

    async def _subscribe(self, li: dict[str, str], i: int, c: Counters, ready: asyncio.Event) -> None:
        host, port = li["mqtt"].rsplit(":", 1)
        async with aiomqtt.Client(host, int(port), identifier=f"sub-{self.topic}-{i}", timeout=5) as m:
            await m.subscribe(f"{self.topic}/#", qos=1)
            ready.set()
            async for msg in m.messages:
                c.ok.append((time.monotonic(), bytes(msg.payload)))


class Official:
    """The official RocketMQ 5 client's publisher process (official_publisher.py): it queries
    routes, sends heartbeats and settings itself. Bodies acknowledged and refused."""

    def __init__(self) -> None:
        self.acked: list[bytes] = []
        self.failed: list[str] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None

    async def start(self, endpoint: str, topic: str = "fleet", prefix: str = "o") -> None:
        env = dict(os.environ, HOME=os.environ.get("TMPDIR", "/tmp"))  # the client logs under ~/logs
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, str(OFFICIAL), endpoint, topic, prefix,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=env,
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            word, _, rest = line.decode().strip().partition(" ")
            if word == "ok":
                self.acked.append(rest.encode())
            elif word == "failed":
                self.failed.append(rest)

    async def stop(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        finally:
            if self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
        assert self._reader is not None
        await self._reader
