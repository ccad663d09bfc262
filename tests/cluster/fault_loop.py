"""Driver of the randomized fault test of a replica group (tests/cluster/test_fault_loop.py): the
choice of the next fault from a seeded RNG (sans-IO), publishers whose every body is sent at most
once (so the acknowledged bodies are exactly the sends answered OK), a gRPC consumer running
throughout, and a reader of a whole topic through the proxy's HTTP read API (docs/gateway.md)."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections import Counter
from dataclasses import dataclass

import aiomqtt
import grpc
import httpx

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2_grpc
from tests.adapters.grpc import support as g

TOPIC = "fleet"
MAX_KILLED = 2  # of 3: with min-insync 2 a group with one live node refuses sends (never acknowledges)


@dataclass(frozen=True)
class Fault:
    """`kill` (SIGKILL), `pause` (SIGSTOP for `pause_s`, then SIGCONT) or `restart` of `node`."""

    kind: str
    node: str
    pause_s: float = 0.0

    def __str__(self) -> str:
        return (
            f"pause {self.node} {self.pause_s:.1f} s" if self.kind == "pause" else f"{self.kind} {self.node}"
        )


def next_fault(rng: random.Random, nodes: set[str], killed: set[str], primary: str | None) -> Fault:
    """A random fault for the group's state: kill the primary or a replica (while fewer than
    MAX_KILLED are down), pause a live node, or restart a killed one (likelier, so the group heals)."""
    live = sorted(nodes - killed)
    options = [(1.5 / len(live), Fault("pause", n, round(rng.uniform(2, 5), 1))) for n in live]
    if len(killed) < MAX_KILLED:
        if primary in live:
            options.append((1.5, Fault("kill", primary)))
        options += [(1.0 / len(live), Fault("kill", n)) for n in live if n != primary]
    options += [(2.0, Fault("restart", n)) for n in sorted(killed)]
    weights, faults = zip(*options, strict=True)
    return rng.choices(faults, weights)[0]


class UniquePublishers:
    """A gRPC and an MQTT QoS 1 publisher on topic `fleet`. Every attempt sends a new body and a
    failed one is never sent again: `acked` holds exactly the bodies whose send was answered OK."""

    def __init__(self, listeners: dict[str, str]) -> None:
        self.listeners = listeners
        self.acked: list[bytes] = []
        self.attempts = 0
        self.failures = 0
        self.stop = asyncio.Event()

    async def grpc(self) -> None:
        async with grpc.aio.insecure_channel(self.listeners["grpc"]) as ch:
            s = service_pb2_grpc.MessagingServiceStub(ch)
            i = 0
            while not self.stop.is_set():
                body = f"g{i}".encode()
                i += 1
                self.attempts += 1
                try:
                    r = await asyncio.wait_for(g.send(s, g.msg(TOPIC, body)), 5)
                    ok = r.status.code == d.OK
                except (grpc.aio.AioRpcError, TimeoutError):
                    ok = False
                if ok:
                    self.acked.append(body)
                else:
                    self.failures += 1
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.01)

    async def mqtt(self) -> None:
        host, port = self.listeners["mqtt"].rsplit(":", 1)
        i = 0
        while not self.stop.is_set():
            try:
                async with aiomqtt.Client(host, int(port), identifier="fault-pub", timeout=5) as c:
                    while not self.stop.is_set():
                        body = f"m{i}".encode()
                        i += 1  # before the publish: a body whose PUBACK never came is not reused
                        self.attempts += 1
                        await c.publish(f"{TOPIC}/dev1/t{i}", body, qos=1)  # returns on PUBACK
                        self.acked.append(body)
                        await asyncio.sleep(0.01)
            except aiomqtt.MqttError:
                self.failures += 1
                await asyncio.sleep(0.2)


class AuditConsumer:
    """gRPC receive + ack of group `group` on topic `fleet` for as long as it runs; errors (a group
    without primary, a proxy between routes) are counted and retried."""

    def __init__(self, listeners: dict[str, str], group: str = "audit") -> None:
        self.listeners = listeners
        self.group = group
        self.got: list[bytes] = []
        self.errors = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        async with grpc.aio.insecure_channel(self.listeners["grpc"]) as ch:
            s = service_pb2_grpc.MessagingServiceStub(ch)
            while not self.stop.is_set():
                try:
                    st, msgs, _ = await g.receive(s, self.group, TOPIC, batch=32, poll_ms=500, timeout=8)
                    self.got += [m.body for m in msgs]
                    if msgs:
                        await g.ack(s, self.group, TOPIC, *[m.system_properties.receipt_handle for m in msgs])
                    ok = st.code in (d.OK, d.MESSAGE_NOT_FOUND)
                except (grpc.aio.AioRpcError, TimeoutError):
                    ok = False
                if not ok:
                    self.errors += 1
                    await asyncio.sleep(0.2)


async def read_topic(http: str, topic: str = TOPIC, timeout: float = 30) -> list[bytes]:
    """Every body stored on `topic`, read by offset ranges through the HTTP read API."""
    bodies: list[bytes] = []
    async with httpx.AsyncClient(base_url=f"http://{http}", timeout=timeout) as c:
        r = await c.get(f"/read/topics/{topic}/queues")
        r.raise_for_status()
        for q in r.json()["queues"]:
            start, end = q["min_offset"], q["max_offset"]
            while start < end:
                r = await c.get(
                    f"/read/topics/{topic}/queues/{q['queue_id']}/messages?start={start}&end={end}"
                )
                r.raise_for_status()
                bodies += [base64.b64decode(json.loads(line)["body"]) for line in r.text.splitlines() if line]
                start = int(r.headers["X-Next-Offset"])
    return bodies


@dataclass(frozen=True)
class Verdict:
    """The final state against the acknowledged sends."""

    acked: int
    lost: list[bytes]  # acknowledged, not stored
    duplicated: list[bytes]  # acknowledged, stored more than once
    unacked_stored: int  # stored although their send failed (allowed: the answer was lost)
    stored_twice: int  # any body stored more than once

    @property
    def ok(self) -> bool:
        return not self.lost and not self.duplicated


def judge(acked: list[bytes], stored: list[bytes]) -> Verdict:
    copies = Counter(stored)
    want = set(acked)
    return Verdict(
        acked=len(want),
        lost=sorted(b for b in want if copies[b] == 0),
        duplicated=sorted(b for b in want if copies[b] > 1),
        unacked_stored=sum(1 for b in copies if b not in want),
        stored_twice=sum(1 for n in copies.values() if n > 1),
    )
