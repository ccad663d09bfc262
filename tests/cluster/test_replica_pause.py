"""A replica paused under load (docs/cluster.md, "Replica groups"): a real etcd, a name server,
three `gateway store --group g1` nodes (sync replication, `--min-insync 2`) and a proxy. One
replica is paused with SIGSTOP while the official RocketMQ Python client (its own retries and 3 s
request timeout), the project's raw gRPC stub and MQTT 3.1.1 (aiomqtt) and 5.0 (paho) publishers send: no
send is refused, no MQTT connection is closed, no message is stored twice and none acknowledged
is lost; after SIGCONT the replica rejoins the SyncStateSet."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import paho.mqtt.client as paho
import pytest

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2_grpc
from store import Store, StoreConfig
from tests.adapters.grpc import support as g
from tests.cluster.etcd_support import EtcdProcess, etcd_missing
from tests.cluster.load import Official
from tests.cluster.support import Cluster
from tests.cluster.test_replica_group import NODES, Publishers, _in_sync, _set_is, start_member, until

pytestmark = [
    pytest.mark.skipif(etcd_missing(), reason="etcd is not installed (deps/debian-packages.txt)"),
    # found, not imported: its generated protobuf modules must stay out of this process
    pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None, reason="no rocketmq-python-client"),
    pytest.mark.timeout(120),
]


def paho5(pubs: Publishers, stop: threading.Event, failures: list[str]) -> None:
    """An MQTT 5 QoS 1 publisher (paho: aiomqtt hides PUBACK reason codes), one PUBLISH at a time:
    a negative PUBACK or a lost connection is a failure. Runs in a thread until `stop`."""
    host, port = pubs.listeners["mqtt"].rsplit(":", 1)
    acked: dict[int, int] = {}
    answered = threading.Condition()

    def on_publish(client, userdata, mid, rc, props):  # noqa: ANN001, ANN202, ARG001
        with answered:
            acked[mid] = rc.value if hasattr(rc, "value") else int(rc)
            answered.notify_all()

    def on_disconnect(client, userdata, flags, rc, props):  # noqa: ANN001, ANN202, ARG001
        if not stop.is_set():
            failures.append(f"disconnected: {rc}")

    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="dev-5", protocol=5)
    c.on_publish, c.on_disconnect = on_publish, on_disconnect
    c.connect(host, int(port))
    c.loop_start()
    try:
        i = 0
        while not stop.is_set():
            body = f"v{i}".encode()
            i += 1  # a new body per attempt: a refused one is never sent again
            mid = c.publish(f"fleet/dev5/t{i}", body, qos=1).mid
            with answered:
                if not answered.wait_for(lambda: mid in acked, 10):  # noqa: B023
                    failures.append(f"{body!r}: no PUBACK")
                    continue
            rc = acked.pop(mid)
            if rc:
                failures.append(f"{body!r}: PUBACK {rc:#x}")
            else:
                pubs.acked.append(body)
            stop.wait(0.005)
    finally:
        c.disconnect()
        c.loop_stop()


async def timed_grpc(pubs: Publishers, latencies: list[float], failures: list[str]) -> None:
    """A raw gRPC publisher (the project's stub) recording how long each send took."""
    async with grpc.aio.insecure_channel(pubs.listeners["grpc"]) as ch:
        s = service_pb2_grpc.MessagingServiceStub(ch)
        i = 0
        while not pubs.stop.is_set():
            body = f"t{i}".encode()
            i += 1
            t0 = time.monotonic()
            try:
                r = await asyncio.wait_for(g.send(s, g.msg("fleet", body)), 10)
            except (grpc.aio.AioRpcError, TimeoutError) as e:
                failures.append(f"{body!r}: {e}")
                continue
            if r.status.code != d.OK:
                failures.append(f"{body!r}: {r.status.code} {r.status.message}")
                continue
            latencies.append(time.monotonic() - t0)
            pubs.acked.append(body)
            await asyncio.sleep(0.02)


async def stored_bodies(data_dir: Path) -> Counter[bytes]:
    """Every body of topic `fleet` in a stopped node's store, with its number of copies."""
    store = await Store.open(StoreConfig(data_dir=str(data_dir)))
    try:
        out: Counter[bytes] = Counter()
        for q in range(store.queue_count("fleet")):
            offset = 0
            while batch := store.read("fleet", q, offset, max_messages=1000):
                out.update(m.body for m in batch)
                offset = batch[-1].queue_offset + 1
        return out
    finally:
        await store.close()


async def test_a_paused_replica_refuses_no_send_and_stores_none_twice(tmp_path):
    (tmp_path / "etcd").mkdir()
    etcd = EtcdProcess(tmp_path / "etcd")
    etcd.start()
    c = Cluster(tmp_path)
    tasks: list[asyncio.Task] = []
    try:
        c.start_namesrv()
        for name in sorted(NODES):
            start_member(c, name, etcd.endpoint)
        (listeners,) = c.start_proxies(1, "grpc,mqtt")
        state = await until(lambda: _in_sync(etcd.endpoint, NODES), 30, "every node in the SyncStateSet")
        pubs = Publishers(listeners)
        official, mqtt5_failures, timed_failures, latencies = Official(), [], [], []
        paho_stop = threading.Event()
        await official.start(listeners["grpc"])
        tasks = [
            asyncio.create_task(pubs.grpc()),
            asyncio.create_task(pubs.mqtt()),
            asyncio.create_task(asyncio.to_thread(paho5, pubs, paho_stop, mqtt5_failures)),
            asyncio.create_task(timed_grpc(pubs, latencies, timed_failures)),
        ]

        def acked() -> int:
            return len(pubs.acked) + len(official.acked)

        async def more(n: int, what: str, timeout: float = 20) -> None:
            want = acked() + n

            async def enough() -> bool:
                return acked() >= want and len(official.acked) > 0

            await until(enough, timeout, what)

        await more(100, "100 acknowledged sends", 30)
        paused = sorted(NODES - {state.primary})[0]
        p = c.stores[paused][0].p
        p.send_signal(signal.SIGSTOP)
        try:
            await until(lambda: _set_is(etcd.endpoint, NODES - {paused}), 15, "the paused replica out")
            await more(100, "sends acknowledged with a replica paused")
        finally:
            p.send_signal(signal.SIGCONT)
        await until(lambda: _in_sync(etcd.endpoint, NODES), 30, "the paused replica back in")
        await more(50, "sends acknowledged with the three again")
        pubs.stop.set()
        paho_stop.set()
        await asyncio.gather(*tasks)
        await official.stop()
        assert pubs.failures == 0, f"{pubs.failures} raw gRPC or MQTT 3.1.1 sends failed"
        assert not mqtt5_failures, mqtt5_failures[:5]
        assert not timed_failures, timed_failures[:5]
        # the sends in flight at the pause waited for the shrink (about 1 s), not the 3 s timeout
        # (nor the official client's 3 s request timeout, after which it would resend)
        assert max(latencies) < 2.5, max(latencies)
        assert {b[:1] for b in pubs.acked} == {b"g", b"m", b"v", b"t"}  # every publisher got through
        assert not official.failed, official.failed[:5]
        for name in NODES:
            assert c.stores[name][0].stop() == 0
        want = set(pubs.acked) | set(official.acked)
        for name in sorted(NODES):
            copies = await stored_bodies(tmp_path / name)
            lost = want - set(copies)
            assert not lost, f"{name}: {len(lost)} acknowledged sends lost: {sorted(lost)[:10]}"
            twice = [b for b, n in copies.items() if n > 1]
            assert not twice, f"{name}: {len(twice)} stored twice: {sorted(twice)[:10]}"
        print(
            f"paused {paused}: {len(pubs.acked)} raw gRPC/MQTT and {len(official.acked)} official sends; "
            f"longest raw gRPC send {max(latencies):.2f} s"
        )
    finally:
        if tasks:
            paho_stop.set()
        for t in tasks:
            t.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        c.close()
        etcd.stop()
