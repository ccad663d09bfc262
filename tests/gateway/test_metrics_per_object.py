"""Per-object metrics (issue 29, docs/observability.md) with real clients against one in-process
gateway: aiomqtt publishes at QoS 1, pika publishes to an AMQP queue and aio-pika consumes it (one ack,
one nack with requeue, the redelivery acked), a processor consumer leaves a message in flight and
dead-letters another; then /metrics is scraped over HTTP, parsed, and the per-topic, per-group,
per-protocol and store series are checked by label and value. A second gateway checks the opt-out
(--no-metrics-per-object: none in /metrics, all in /metrics/per-object) and the cap
(--metrics-max-objects 1: only the busiest topic and group)."""

from __future__ import annotations

import asyncio
import re

import aio_pika
import aiomqtt
import httpx
import pika
import pytest

from gateway.http.metrics import busiest, dead_letters
from gateway.server import Gateway
from messaging_processor import ClientContext
from store.histogram import Histogram
from tests import support
from tests.support import T, listener, wait_until

pytestmark = pytest.mark.timeout(60)

CTX = ClientContext("test", client_id="metrics-test")
MQTT_BODIES = (b"21.5", b"21.75", b"22")
AMQP_BODIES = (b"order-1", b"order-two")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Series = dict[tuple[str, frozenset], float]


def parse(text: str) -> Series:
    """Prometheus text format -> {(name, frozenset of (label, value)): value}; asserts each family is
    declared once (TYPE) and each sample line is well formed."""
    out: Series = {}
    types: list[str] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            types.append(line.split()[2])
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, line
        labels = frozenset(_LABEL.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    assert len(types) == len(set(types)), "a metric family declared twice"
    return out


def value(series: Series, name: str, **labels: str) -> float | None:
    return series.get((name, frozenset(labels.items())))


def with_label(series: Series, name: str, label: str) -> set[str]:
    """The values of `label` among the samples of `name`."""
    return {dict(lbls)[label] for (n, lbls) in series if n == name and label in dict(lbls)}


async def start_gateway(tmp_path, **kw) -> Gateway:
    return await support.start_gateway(str(tmp_path / "data"), ("mqtt", "amqp", "http"), flush="sync", **kw)


async def mqtt_publish(gw: Gateway, topic: str, bodies: tuple[bytes, ...]) -> None:
    port = int(listener(gw, "mqtt").address.rsplit(":", 1)[1])
    async with aiomqtt.Client("127.0.0.1", port, identifier="metrics-dev", timeout=T) as c:
        for body in bodies:
            await c.publish(topic, body, qos=1)  # returns on PUBACK: stored


def pika_publish(port: int, queue: str, bodies: tuple[bytes, ...]) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=T))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", queue, body, mandatory=True)  # confirmed: stored
    finally:
        conn.close()


async def scrape(gw: Gateway, path: str = "/metrics") -> Series:
    async with httpx.AsyncClient(base_url=f"http://{listener(gw, 'http').address}", timeout=T) as http:
        r = await http.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(r.text)


async def amqp_consume_ack_nack(url: str, queue: str) -> list[tuple[bytes, bool]]:
    """Consume the queue's two messages: ack the first, nack (requeue) the second, ack its redelivery."""
    seen: list[tuple[bytes, bool]] = []
    conn = await aio_pika.connect(url, timeout=T)
    try:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=1)
        q = await ch.get_queue(queue)
        async with q.iterator() as it:
            async for msg in it:
                seen.append((msg.body, msg.redelivered))
                if len(seen) == 2:
                    await msg.nack(requeue=True)
                else:
                    await msg.ack()
                if len(seen) == 3:
                    break
    finally:
        await conn.close()
    return seen


async def test_per_object_series_from_real_clients(tmp_path):
    gw = await start_gateway(tmp_path)
    try:
        amqp_port = int(listener(gw, "amqp").address.rsplit(":", 1)[1])
        url = f"amqp://guest:guest@127.0.0.1:{amqp_port}/"
        conn = await aio_pika.connect(url, timeout=T)
        await (await conn.channel()).declare_queue("orders", durable=True)  # topic + group "orders"
        await mqtt_publish(gw, "sensors/dev1/temp", MQTT_BODIES)  # store topic "sensors"
        await asyncio.to_thread(pika_publish, amqp_port, "orders", AMQP_BODIES)
        seen = await asyncio.wait_for(amqp_consume_ack_nack(url, "orders"), T)
        assert seen == [(b"order-1", False), (b"order-two", False), (b"order-two", True)]

        p = gw.processor  # a consumer group on "sensors": one in flight, one dead-lettered, one left
        popped = await p.pop(CTX, "sensor-readers", "sensors", max_messages=2, invisible_time_ms=60_000)
        assert len(popped) == 2
        await p.forward_to_dlq(CTX, popped[1].receipt_handle)

        m = await scrape(gw)  # the AMQP connection above is still open
        assert value(m, "gateway_topic_messages_in_total", topic="sensors", protocol="mqtt") == 3
        assert value(m, "gateway_topic_bytes_in_total", topic="sensors", protocol="mqtt") == sum(
            map(len, MQTT_BODIES)
        )
        assert value(m, "gateway_topic_messages_in_total", topic="orders", protocol="amqp") == 2
        assert value(m, "gateway_topic_bytes_in_total", topic="orders", protocol="amqp") == 16
        assert value(m, "gateway_topic_messages_out_total", topic="orders", protocol="amqp") == 3
        assert value(m, "gateway_topic_messages_out_total", topic="sensors", protocol="test") == 2
        group_orders = {"group": "orders", "topic": "orders"}
        assert value(m, "gateway_group_deliveries_total", **group_orders, protocol="amqp") == 3
        assert value(m, "gateway_group_redeliveries_total", **group_orders, protocol="amqp") == 1
        readers = {"group": "sensor-readers", "topic": "sensors"}
        assert value(m, "gateway_group_deliveries_total", **readers, protocol="test") == 2
        assert value(m, "gateway_group_messages_in_flight", **readers) == 1
        assert value(m, "gateway_group_messages_ready", **readers) == 1  # 3 - 1 in flight - 1 dead
        assert value(m, "gateway_group_dead_letters_total", **readers) == 1
        # internal % topics and groups (the DLQ, MQTT's retained topic) stay out of per-object series
        for name in ("gateway_topic_messages_in_total", "gateway_group_messages_ready"):
            assert not any(t.startswith("%") for t in with_label(m, name, "topic")), name
        assert not any(g.startswith("%") for g in with_label(m, "gateway_group_deliveries_total", "group"))

        # per protocol: connections open now, opens and closes so far
        assert value(m, "gateway_connections", protocol="amqp") == 1
        assert value(m, "gateway_connection_opens_total", protocol="amqp") == 3  # 2 aio-pika, 1 pika
        assert value(m, "gateway_connection_opens_total", protocol="mqtt") == 1
        assert value(m, "gateway_connection_opens_total", protocol="http") >= 1
        # store: fsync histogram (cumulative buckets ending in +Inf == count), commit log bytes
        count = value(m, "gateway_store_fsync_duration_seconds_count")
        assert count is not None and count >= 1
        buckets = sorted(
            (float(dict(lbls)["le"]), v)
            for (n, lbls), v in m.items()
            if n == "gateway_store_fsync_duration_seconds_bucket"
        )
        assert buckets[-1] == (float("inf"), count)
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:], strict=False))
        assert value(m, "gateway_store_fsync_duration_seconds_sum") > 0
        assert value(m, "gateway_store_commitlog_bytes") > sum(map(len, MQTT_BODIES + AMQP_BODIES))
        # existing names are kept
        assert value(m, "gateway_messages_in_total", protocol="mqtt", topic="sensors") == 3
        assert value(m, "gateway_store_appends_total") is not None

        await conn.close()
        await p.ack(CTX, popped[0].receipt_handle)
        await wait_until(lambda: gw.limiter.connections["amqp"] == 0)
        m = await scrape(gw)
        assert value(m, "gateway_connections", protocol="amqp") == 0
        assert value(m, "gateway_connection_closes_total", protocol="amqp") == 3
        assert value(m, "gateway_group_messages_in_flight", **readers) == 0
        assert value(m, "gateway_group_messages_ready", **readers) == 1
        assert value(m, "gateway_group_messages_ready", **group_orders) == 0
    finally:
        await gw.stop()


async def test_opt_out_and_cap(tmp_path):
    gw = await start_gateway(tmp_path, metrics_per_object=False, metrics_max_objects=1)
    try:
        await mqtt_publish(gw, "busy/a", (b"1", b"2", b"3"))
        await mqtt_publish(gw, "quiet/a", (b"1",))
        p = gw.processor
        assert len(await p.pop(CTX, "g-busy", "busy", max_messages=2)) == 2
        assert len(await p.pop(CTX, "g-quiet", "quiet", max_messages=1)) == 1

        m = await scrape(gw)
        assert not any(n.startswith(("gateway_topic_", "gateway_group_")) for n, _ in m)
        assert value(m, "gateway_messages_in_total", protocol="mqtt", topic="quiet") == 1  # global: kept

        per = await scrape(gw, "/metrics/per-object")
        assert with_label(per, "gateway_topic_messages_in_total", "topic") == {"busy"}  # the busiest only
        assert with_label(per, "gateway_group_deliveries_total", "group") == {"g-busy"}
        assert with_label(per, "gateway_group_messages_ready", "topic") == {"busy"}
        assert value(per, "gateway_group_messages_in_flight", group="g-busy", topic="busy") == 2
        assert not any(n.startswith(("gateway_store_", "gateway_connections")) for n, _ in per)
    finally:
        await gw.stop()


def test_busiest_ranks_by_activity_then_name_and_drops_internal_topics():
    activity = {"b": 5, "a": 5, "c": 9, "%DLQ%x": 100}
    assert busiest(activity, [*activity, "d", "a"], 3) == ["c", "a", "b"]
    assert busiest(activity, ["d", "e"], 5) == ["d", "e"]
    assert busiest(activity, activity, 0) == []


def test_histogram_flat_is_cumulative():
    h = Histogram((0.001, 0.01))
    for s in (0.0005, 0.001, 0.005, 2.0):
        h.observe(s)
    flat = h.flat("x")
    assert [flat["x_bucket:0.001"], flat["x_bucket:0.01"], flat["x_bucket:+Inf"]] == [2, 3, 4]
    assert flat["x_count"] == 4
    assert flat["x_sum"] == pytest.approx(2.0065)


def test_dead_letters_read_from_flat_store_stats():
    stats = {"dead_letters:g1\tt1": 2, "dead_letters:g2\tt\u00e9": 1.0, "dlq": 7, "dead_letters:bad": "x"}
    assert dead_letters(stats) == {("g1", "t1"): 2, ("g2", "t\u00e9"): 1}
