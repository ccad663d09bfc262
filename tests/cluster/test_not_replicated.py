"""A write a replica group's primary stored but its in-sync replicas did not acknowledge in time
(`store.NotReplicated`) is refused with each protocol's retryable answer and never written again
by the gateway itself: the proxy's append batcher, the MQTT adapter's batched publish."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import paho.mqtt.client as paho
import pytest

from cluster.nodes import AppendBatcher
from messaging_processor import ErrorKind
from messaging_processor.errors import store_error
from store import Message, NotReplicated
from store.appending import Appender
from tests.support import running_gateway

pytestmark = pytest.mark.timeout(60)


def test_not_replicated_is_its_own_kind():
    assert store_error(NotReplicated("x")).kind is ErrorKind.NOT_REPLICATED


class WritingButNotReplicating:
    """A store node whose appends are written (counted) and answered NotReplicated."""

    name = "g1"

    def __init__(self) -> None:
        self.requests = 0

    async def call(self, op, args=None, body=b"", *, timeout=10.0, sent=None):  # noqa: ANN001, ANN201
        self.requests += 1
        await asyncio.sleep(0.02)
        raise NotReplicated("stored on the primary but not replicated to the SyncStateSet within 3 s")


async def test_the_proxy_never_sends_a_written_batch_again():
    node = WritingButNotReplicating()
    batcher = AppendBatcher(node, 5.0, max_inflight=1)  # type: ignore[arg-type]
    futs = [batcher.submit([Message("orders", f"m{i}".encode())]) for i in range(4)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert all(isinstance(r, NotReplicated) for r in results), results
    assert node.requests == 2  # the first alone, the other three together: each written once


async def test_an_mqtt_batch_written_but_not_replicated_is_refused_and_stored_once(tmp_path, monkeypatch):
    written: Counter[bytes] = Counter()

    def wrap(real):  # noqa: ANN001, ANN202
        async def append(store, msgs, *args, **kw):  # noqa: ANN001, ANN202
            await real(store, msgs, *args, **kw)
            written.update(m.body for m in (msgs if isinstance(msgs, list) else [msgs]))
            raise NotReplicated("stored on the primary but not replicated")

        return append

    # (on the class: the store client binds the appender's methods when the gateway starts)
    monkeypatch.setattr(Appender, "append_many", wrap(Appender.append_many))
    monkeypatch.setattr(Appender, "append", wrap(Appender.append))
    async with running_gateway(str(tmp_path), ("mqtt",)) as gw:
        port = next(a for a in gw.adapters if a.name == "mqtt").bound_port
        # published together (paho writes them at once): the adapter stores them with one send
        codes = await asyncio.to_thread(paho_publish, port, [f"b{i}".encode() for i in range(8)])
    assert codes == [0x80] * 8, codes  # refused (Unspecified error): the client may resend
    assert written and max(written.values()) == 1, written  # never written twice


def paho_publish(port: int, payloads: list[bytes]) -> list[int]:
    """QoS 1 publishes from a paho 5.0 client (aiomqtt hides PUBACK reason codes): each one's."""
    codes: dict[int, int] = {}
    done = threading.Event()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"nr-{time.monotonic_ns()}", protocol=5)

    def on_publish(client, userdata, mid, rc, props):  # noqa: ANN001, ANN202, ARG001
        codes[mid] = rc.value if hasattr(rc, "value") else int(rc)
        if len(codes) == len(payloads):
            done.set()

    c.on_publish = on_publish
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        mids = [c.publish(f"dev/{i}", p, qos=1).mid for i, p in enumerate(payloads)]
        assert done.wait(20), "PUBACKs missing"
    finally:
        c.disconnect()
        c.loop_stop()
    return [codes[m] for m in mids]
