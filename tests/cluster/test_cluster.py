"""CLUSTER mode as real processes: `gateway namesrv`, two `gateway store` nodes and `gateway start
--mode cluster` proxies, driven by real clients (gRPC stubs of tests/adapters/grpc, aiomqtt, aio-pika,
the RocketMQ 4.x clients ali-ons and the C++ client of tests/adapters/remoting).

- clients connected to either proxy see every message, whichever store holds it; proxies are
  registered with the name server;
- `kill -9` of a proxy loses nothing acknowledged; gRPC clients continue on the other proxy
  (receipt handles included), an MQTT persistent session on a proxy started in its place;
- a stopped store node is dropped from routes within its lease and sends continue on the other;
  once restarted, its messages are consumable again;
- a store node exits 0 on SIGTERM and unregisters at once."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aio_pika
import aiomqtt
import grpc
import httpx
import pika
import pytest

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2, service_pb2_grpc
from conformance.gateway_proc import GATEWAY
from namesrv.client import NameServerClient
from tests.adapters.grpc import support as g
from tests.adapters.mqtt.support import drain_messages
from tests.adapters.remoting.support import needs_alions, needs_cpp, received, run
from tests.cluster.support import Cluster, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start_namesrv()
        c.start_stores("store-a", "store-b")
        c.start_proxies(2)
        yield c
    finally:
        c.close()


@asynccontextmanager
async def stub(listeners: dict[str, str]) -> AsyncIterator[service_pb2_grpc.MessagingServiceStub]:
    async with grpc.aio.insecure_channel(listeners["grpc"]) as ch:
        yield service_pb2_grpc.MessagingServiceStub(ch)


def mqtt(listeners: dict[str, str], **kw) -> aiomqtt.Client:
    host, port = listeners["mqtt"].rsplit(":", 1)
    return aiomqtt.Client(host, int(port), **kw)


async def send_all(s, topic: str, bodies: list[bytes]) -> None:
    for b in bodies:
        r = await g.send(s, g.msg(topic, b))
        assert r.status.code == d.OK, r.status


async def receive_until(
    s, group: str, topic: str, n: int, timeout: float = 15.0, until=None, **kw
) -> list[d.Message]:
    """Receive (without acking) until `n` messages arrived (or `until(messages)` holds) or
    `timeout` passed."""
    out: list[d.Message] = []
    deadline = time.monotonic() + timeout
    done = until or (lambda got: len(got) >= n)
    while not done(out) and time.monotonic() < deadline:
        st, msgs, _ = await g.receive(s, group, topic, batch=32, poll_ms=500, **kw)
        assert st.code in (d.OK, d.MESSAGE_NOT_FOUND), st
        out += msgs
    return out


def store_of(m: d.Message) -> str:
    return m.system_properties.receipt_handle.split("@", 1)[0]


async def test_clients_on_either_proxy_see_all_messages(cluster):
    (_, l0), (_, l1) = cluster.proxies[:2]
    assert not (cluster.root / "proxy-data").exists()  # stateless proxies: no local store
    bodies = [f"m{i}".encode() for i in range(20)]
    async with stub(l0) as s0, stub(l1) as s1:
        await send_all(s0, "orders", bodies[:10])
        await send_all(s1, "orders", bodies[10:])
        for group, consumer, acker in (("via-1", s1, s0), ("via-0", s0, s1)):
            got = await receive_until(consumer, group, "orders", 20)
            assert sorted(m.body for m in got) == sorted(bodies), group
            assert {store_of(m) for m in got} == {"store-a", "store-b"}  # spread over both stores
            # Receipt handles are good on any proxy.
            r = await g.ack(acker, group, "orders", *[m.system_properties.receipt_handle for m in got])
            assert r.status.code == d.OK and all(e.status.code == d.OK for e in r.entries), r
            st, rest, _ = await g.receive(consumer, group, "orders", poll_ms=0)
            assert rest == [], group
    # MQTT: a subscriber on one proxy gets what is published through the other.
    async with mqtt(l0, identifier="sub-0") as sub:
        await sub.subscribe("sensors/#", qos=1)
        async with mqtt(l1, identifier="pub-1") as pub:
            for i in range(10):
                await pub.publish(f"sensors/{i}", f"s{i}".encode(), qos=1)
        got = await drain_messages(sub, 10)
    assert sorted(m.payload for m in got) == sorted(f"s{i}".encode() for i in range(10))


async def test_amqp_publish_on_one_proxy_and_consume_on_the_other(cluster):
    (_, l0), (_, l1) = cluster.proxies[:2]

    async def declare(listeners: dict[str, str]):
        host, port = listeners["amqp"].rsplit(":", 1)
        conn = await aio_pika.connect(host=host, port=int(port))
        ch = await conn.channel()  # publisher confirms: a publish returns once stored
        q = await ch.declare_queue("work", durable=True)
        ex = await ch.declare_exchange("jobs", aio_pika.ExchangeType.DIRECT, durable=True)
        await q.bind(ex, "j")
        return conn, q, ex

    pub, _, ex = await declare(l0)
    sub, q, _ = await declare(l1)  # each proxy learns the declarations from its own clients
    try:
        for i in range(10):
            await ex.publish(aio_pika.Message(f"a{i}".encode(), delivery_mode=2), routing_key="j")
        got: list[bytes] = []
        async with q.iterator() as it:
            async for m in it:
                got.append(m.body)
                await m.ack()
                if len(got) == 10:
                    break
        assert sorted(got) == sorted(f"a{i}".encode() for i in range(10))
    finally:
        await pub.close()
        await sub.close()


def pika_channel(listeners: dict[str, str]) -> tuple[pika.BlockingConnection, object]:
    host, port = listeners["amqp"].rsplit(":", 1)
    conn = pika.BlockingConnection(pika.ConnectionParameters(host, int(port), connection_attempts=1))
    return conn, conn.channel()


def test_amqp_durable_queue_declared_again_on_a_second_proxy_keeps_its_messages(cluster):
    """Regression: a second proxy declaring an existing durable queue treated it as new and moved
    its group to the end of the topic, so 200 confirmed messages became unreachable."""
    (_, l0), (_, l1) = cluster.proxies[:2]
    c1, ch1 = pika_channel(l0)
    c2, ch2 = pika_channel(l1)
    try:
        ch1.queue_declare("orders-q", durable=True)
        ch1.confirm_delivery()
        for i in range(200):  # each returns once confirmed (stored)
            ch1.basic_publish("", "orders-q", f"o{i}".encode(), pika.BasicProperties(delivery_mode=2))
        assert ch1.queue_declare("orders-q", passive=True).method.message_count == 200
        # Proxy 2 knows the queue without declaring it, and declaring it again changes nothing.
        assert ch2.queue_declare("orders-q", passive=True).method.message_count == 200
        assert ch2.queue_declare("orders-q", durable=True).method.message_count == 200
        assert ch1.queue_declare("orders-q", passive=True).method.message_count == 200
        # An inequivalent declaration on proxy 2 is refused as RabbitMQ refuses it (406).
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch2.queue_declare("orders-q", durable=False)
        assert e.value.reply_code == 406
        ch2 = c2.channel()
        # Consumers on either proxy get every message, each once.
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        for ch in itertools.cycle((ch1, ch2)):
            if len(got) >= 200 or time.monotonic() > deadline:
                break
            method, _, body = ch.basic_get("orders-q")
            if method is not None:
                got.append(body)
                ch.basic_ack(method.delivery_tag)
        assert sorted(got) == sorted(f"o{i}".encode() for i in range(200))
        # basic.ack has no reply: the last acks (on either proxy) reach the store a moment later
        wait_for(lambda: ch1.queue_declare("orders-q", passive=True).method.message_count == 0, what="empty")
    finally:
        c1.close()
        c2.close()


def test_amqp_exclusive_queue_of_another_proxy_is_locked(cluster):
    (_, l0), (_, l1) = cluster.proxies[:2]
    c1, ch1 = pika_channel(l0)
    c2, ch2 = pika_channel(l1)
    try:
        ch1.queue_declare("mine-only", exclusive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch2.queue_declare("mine-only", exclusive=True)
        assert e.value.reply_code == 405  # RESOURCE_LOCKED, as for another connection of one proxy
    finally:
        c1.close()
        c2.close()


def test_amqp_non_durable_exchange_is_shared_by_the_proxies(cluster):
    """As RabbitMQ's non-durable metadata is cluster-wide: an exchange declared non-durable through
    one proxy is found through the other (it was 404 there, seen in aio-pika's own suite under
    `--workers 2`), with its flags: publishing to it internal is 403 there too."""
    (_, l0), (_, l1) = cluster.proxies[:2]
    c1, ch1 = pika_channel(l0)
    c2, ch2 = pika_channel(l1)
    try:
        ch1.exchange_declare("shared-transient", "fanout", durable=False, internal=True)
        ch2.exchange_declare("shared-transient", passive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch2.exchange_declare("shared-transient", "fanout", durable=True, internal=True)
        assert e.value.reply_code == 406  # its durable flag came with it
        ch2 = c2.channel()
        ch2.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            ch2.basic_publish("shared-transient", "", b"x")
        assert e.value.reply_code == 403  # internal, as on the proxy that declared it
    finally:
        c1.close()
        c2.close()


def publish_until(ch, exchange: str, rk: str, body: bytes, routed: bool, timeout: float = 10.0) -> int:
    """Publish (mandatory, confirmed) until the publish is routed (`routed`) or returned as
    unroutable (not `routed`); the number of publishes it took. A binding made or removed through
    another proxy reaches this one within a poll of the shared records (0.25 s)."""
    deadline = time.monotonic() + timeout
    n = 0
    while True:
        n += 1
        try:
            ch.basic_publish(exchange, rk, body, mandatory=True)
            if routed:
                return n
        except pika.exceptions.UnroutableError:
            if not routed:
                return n
        assert time.monotonic() < deadline, f"still {'un' if routed else ''}routable after {timeout} s"


def test_amqp_bindings_made_through_one_proxy_route_publishes_through_the_other(cluster):
    """RabbitMQ's pub/sub tutorial across proxies: a subscriber's exclusive queue bound through one
    proxy receives what a publisher publishes through the other. Before, the publisher's proxy knew
    only its own bindings and the publishes were lost (unroutable)."""
    (_, l0), (_, l1) = cluster.proxies[:2]
    c1, ch1 = pika_channel(l0)
    c2, ch2 = pika_channel(l1)
    conns = [c1, c2]
    try:
        # The publisher's proxy knows the exchange before the bindings exist: they reach it by poll.
        ch2.exchange_declare("news", "direct", durable=False)
        ch2.confirm_delivery()
        q = ch1.queue_declare("", exclusive=True).method.queue
        ch1.exchange_declare("news", "direct", durable=False)
        ch1.queue_bind(q, "news", "eu")
        tries = publish_until(ch2, "news", "eu", b"first", routed=True)
        # A publisher that declares the exchange gets the bindings made up to then at once.
        q2 = ch1.queue_declare("", exclusive=True).method.queue
        ch1.queue_bind(q2, "news", "eu")
        c3, ch3 = pika_channel(l1)
        conns.append(c3)
        ch3.exchange_declare("news", "direct", durable=False)
        ch3.confirm_delivery()
        ch3.basic_publish("news", "eu", b"second", mandatory=True)  # routed: would raise UnroutableError
        # Everything routed reached the queues, each message once.
        got = {q: [], q2: []}
        deadline = time.monotonic() + 10
        while (len(got[q]) < 2 or not got[q2]) and time.monotonic() < deadline:
            for name, bodies in got.items():
                method, _, body = ch1.basic_get(name, auto_ack=True)
                if method is not None:
                    bodies.append(body)
        # (sorted: in CLUSTER mode a queue's topic has a queue on each store, so no order between them)
        assert {k: sorted(v) for k, v in got.items()} == {q: [b"first", b"second"], q2: [b"second"]}, tries
        # Unbinding through one proxy stops the routing through the other.
        ch1.queue_unbind(q, "news", "eu")
        ch1.queue_unbind(q2, "news", "eu")
        publish_until(ch2, "news", "eu", b"late", routed=False)
    finally:
        for c in conns:
            c.close()


def test_amqp_closing_an_exclusive_queue_owner_unbinds_it_on_the_other_proxy(cluster):
    """The owner's connection closes: its exclusive queue, bound to a durable fanout exchange, is
    deleted with its bindings, and the other proxy stops routing to it (its publishes are unroutable,
    not failed)."""
    (_, l0), (_, l1) = cluster.proxies[:2]
    c1, ch1 = pika_channel(l0)
    c2, ch2 = pika_channel(l1)
    try:
        ch1.exchange_declare("alerts", "fanout", durable=True)
        q = ch1.queue_declare("", exclusive=True).method.queue
        ch1.queue_bind(q, "alerts")
        ch2.exchange_declare("alerts", "fanout", durable=True)
        ch2.confirm_delivery()
        ch2.basic_publish("alerts", "", b"one", mandatory=True)
        deadline = time.monotonic() + 10
        while (got := ch1.basic_get(q, auto_ack=True))[0] is None and time.monotonic() < deadline:
            pass
        assert got[2] == b"one"
        c1.close()
        publish_until(ch2, "alerts", "", b"two", routed=False)
        assert ch2.is_open
    finally:
        if c1.is_open:
            c1.close()
        c2.close()


def admin_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return subprocess.run(GATEWAY + list(args), capture_output=True, text=True, env=env, timeout=60)


def test_topic_create_with_queues_is_repeatable_and_counts_queues_per_store(cluster):
    """Regression: the second `topic create T --queues 4` answered 409 (the topic's 8 queues over
    two stores were compared with the 4 asked per store)."""
    url = f"http://{cluster.proxies[0][1]['http']}"
    for _ in range(2):
        r = admin_cli("topic", "create", "repeat", "--queues", "4", "--url", url, "--json")
        assert r.returncode == 0, r.stderr
        t = json.loads(r.stdout)
        assert (t["queues"], t["queues_per_store"]) == (8, 4)  # 4 on each of the two stores
    r = admin_cli("topic", "create", "repeat", "--url", url, "--json")  # no count: keeps it
    assert r.returncode == 0 and json.loads(r.stdout)["queues_per_store"] == 4, r.stderr
    r = admin_cli("topic", "create", "repeat", "--queues", "2", "--url", url)
    assert r.returncode == 1 and "4 queues per store" in r.stderr and "does not remove queues" in r.stderr
    r = admin_cli("topic", "create", "repeat", "--queues", "6", "--url", url, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["queues"] == 12, r.stderr
    r = admin_cli("topic", "get", "repeat", "--url", f"http://{cluster.proxies[1][1]['http']}", "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)["queue_offsets"]) == 12, r.stderr


async def test_topic_update_resizes_the_queues_of_every_store(cluster):
    """Logic queues in CLUSTER mode: `gateway topic update` on one proxy changes every store's
    queues; global queue ids interleave the stores, so a queue keeps its id and its offsets across
    the change, and the other proxy routes and reads the same queues."""
    (_, l0), (_, l1) = cluster.proxies[:2]
    r = admin_cli("topic", "create", "grows", "--queues", "2", "--url", f"http://{l0['http']}", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["queues"] == 4, r.stderr
    async with stub(l0) as s0, stub(l1) as s1:
        await send_all(s0, "grows", [b"a%d" % i for i in range(12)])
        r = admin_cli("topic", "update", "grows", "--queues", "6", "--url", f"http://{l1['http']}", "--json")
        assert r.returncode == 0, r.stderr
        assert (json.loads(r.stdout)["queues"], json.loads(r.stdout)["queues_per_store"]) == (12, 6)
        await send_all(s1, "grows", [b"b%d" % i for i in range(36)])
        r = admin_cli("topic", "update", "grows", "--queues", "1", "--url", f"http://{l0['http']}", "--json")
        assert r.returncode == 0, r.stderr
        t = json.loads(r.stdout)
        assert (t["queues"], t["read_queues"]) == (2, 12)  # the other 10 are sealed, readable
        route = await s1.QueryRoute(
            service_pb2.QueryRouteRequest(topic=d.Resource(name="grows"), endpoints=d.Endpoints()),
            metadata=g.MD,
        )
        perms = {q.id: q.permission for q in route.message_queues}
        assert perms == {q: d.READ_WRITE if q < 2 else d.READ for q in range(12)}
        await send_all(s0, "grows", [b"c%d" % i for i in range(6)])
        got = await receive_until(s1, "G-GROWS", "grows", 54)
        assert sorted(m.body for m in got) == sorted(
            [b"a%d" % i for i in range(12)] + [b"b%d" % i for i in range(36)] + [b"c%d" % i for i in range(6)]
        )
        per_queue: dict[int, list[int]] = {}
        for m in got:
            per_queue.setdefault(m.system_properties.queue_id, []).append(m.system_properties.queue_offset)
        assert sorted(per_queue) == list(range(12))  # every queue of the grown topic was used
        for offs in per_queue.values():  # each queue's offsets dense from 0: none moved or restarted
            assert sorted(offs) == list(range(len(offs)))


async def test_message_trace_and_key_lookup_across_proxies_and_stores(cluster):
    """The message trace in CLUSTER mode: messages sent through one proxy land on both stores and are
    consumed through the other; either proxy's admin API answers each message's trace (received and
    stored by the first proxy, delivered and acked by the second: both write `%TRACE%`, and a query
    reads every store's key index) and finds the messages by key."""
    (_, l0), (_, l1) = cluster.proxies[:2]
    bodies = [b"traced-%d" % i for i in range(6)]
    async with stub(l0) as s0, stub(l1) as s1:
        for i, b in enumerate(bodies):
            r = await g.send(s0, g.msg("traced", b, keys=[f"order-{i}"]))
            assert r.status.code == d.OK, r.status
        got = await receive_until(s1, "G-TRACED", "traced", len(bodies))
        assert sorted(m.body for m in got) == bodies
        assert len({store_of(m) for m in got}) == 2  # both store nodes hold some
        r = await g.ack(s1, "G-TRACED", "traced", *(m.system_properties.receipt_handle for m in got))
        assert r.status.code == d.OK, r.status
    ids = {m.body: m.system_properties.message_id for m in got}

    def trace(listeners: dict[str, str], mid: str) -> list[tuple]:
        resp = httpx.get(f"http://{listeners['http']}/admin/messages/{mid}/trace", timeout=10)
        if resp.status_code != 200:
            return []
        return [(e["event"], e["protocol"], e["group"]) for e in resp.json()["events"]]

    want = [("received", "grpc", None), ("stored", "grpc", None), ("delivered", "grpc", "G-TRACED"),
            ("acked", "grpc", "G-TRACED")]  # fmt: skip
    for at, mid in itertools.product((l0, l1), ids.values()):  # (each proxy writes within 200 ms)
        wait_for(lambda at=at, mid=mid: trace(at, mid) == want, what=f"the trace of {mid}: {trace(at, mid)}")
    found = httpx.get(f"http://{l1['http']}/admin/messages/trace", params={"key": "order-3"}, timeout=10)
    assert [t["message_id"] for t in found.json()] == [ids[b"traced-3"]]
    r = admin_cli("message", "find", "--key", "order-5", "--url", f"http://{l0['http']}", "--json")
    assert r.returncode == 0, r.stderr
    assert [(m["id"], m["body"]) for m in json.loads(r.stdout)] == [(ids[b"traced-5"], "traced-5")]


async def test_proxies_register_their_endpoints_with_the_name_server(cluster):
    ns = NameServerClient(cluster.namesrv)
    try:
        proxies = await ns.proxies(protocol="grpc")
    finally:
        await ns.close()
    endpoints = [p["endpoints"] for p in proxies if p["cluster"] == "DefaultCluster"]
    for _, listeners in cluster.proxies[:2]:
        assert listeners in endpoints  # every listener, at the address it is bound to


@needs_alions
@needs_cpp
async def test_4x_clients_produce_on_one_proxy_and_consume_on_the_other(cluster, tmp_path):
    (_, l0), (_, l1) = cluster.proxies[:2]
    home = tmp_path / "home"
    sent = await run("alions", "produce", "--namesrv", l0["remoting"], "--topic", "old", "--count", "6",
                     "--prefix", "js", home=home)  # fmt: skip
    assert [e["status"] for e in sent] == ["SEND_OK"] * 6
    got = await run("cpp", "consume", "--namesrv", l1["remoting"], "--topic", "old", "--group", "g-old",
                    "--expect", "6", home=home)  # fmt: skip
    assert sorted(e["body"] for e in received(got)) == sorted(e["body"] for e in sent)
    # The same group through the first proxy resumes from the committed offsets: nothing again.
    async with stub(l0) as s0:
        await send_all(s0, "old", [b"new"])
    again = await run("alions", "consume", "--namesrv", l0["remoting"], "--topic", "old", "--group", "g-old",
                      "--expect", "1", home=home)  # fmt: skip
    assert [e["body"] for e in received(again)] == ["new"], (got, again)


async def test_kill9_of_a_proxy_loses_nothing_acknowledged(cluster):
    victim = cluster.start_proxies(1)[0]  # a third proxy, to be killed
    victim_proc = cluster.proxies[-1][0]
    survivor = cluster.proxies[1][1]
    bodies = [f"k{i}".encode() for i in range(30)]
    async with mqtt(victim, identifier="dev-1", clean_session=False) as dev:
        await dev.subscribe("cmd/#", qos=1)
    async with stub(victim) as sv:
        await send_all(sv, "jobs", bodies)  # every send acknowledged by the victim
        got = await receive_until(sv, "workers", "jobs", 10, invisible_ms=2000)
        got = got[:10]
        acked = [m.body for m in got[:5]]
        r = await g.ack(sv, "workers", "jobs", *[m.system_properties.receipt_handle for m in got[:5]])
        assert all(e.status.code == d.OK for e in r.entries)
    async with mqtt(survivor, identifier="pub-2") as pub:
        for i in range(3):
            await pub.publish(f"cmd/{i}", f"c{i}".encode(), qos=1)  # dev-1 is offline
    victim_proc.p.send_signal(signal.SIGKILL)
    victim_proc.p.wait(10)
    # The other proxy has everything not yet acknowledged: the 20 never received and the 5
    # received but unacked (visible again after their invisible time), and none of the acked.
    async with stub(survivor) as ss:
        rest = await receive_until(ss, "workers", "jobs", 25, timeout=20)
        assert sorted(m.body for m in rest) == sorted(set(bodies) - set(acked))
        r = await g.ack(ss, "workers", "jobs", *[m.system_properties.receipt_handle for m in rest])
        assert all(e.status.code == d.OK for e in r.entries)
        await send_all(ss, "jobs", [b"after"])  # and sending continues
        (late,) = await receive_until(ss, "workers", "jobs", 1)
        assert late.body == b"after"
    # The MQTT persistent session (saved in the store) continues on the surviving proxy, with what
    # arrived while it was offline.
    async with mqtt(survivor, identifier="dev-1", clean_session=False) as dev:
        got_cmd = await drain_messages(dev, 3)
    assert sorted(m.payload for m in got_cmd) == [b"c0", b"c1", b"c2"]


async def test_stopped_store_is_dropped_and_its_messages_return_with_it(cluster):
    (_, l0), (_, l1) = cluster.proxies[:2]
    ns = NameServerClient(cluster.namesrv)
    before = [f"b{i}".encode() for i in range(20)]
    after = [f"a{i}".encode() for i in range(20)]
    proc_b, _ = cluster.stores["store-b"]
    try:
        async with stub(l0) as s0, stub(l1) as s1:
            await send_all(s0, "fo", before)
            # Freeze store-b: no heartbeats, connections stay open; the lease (2 s) must expire.
            t0 = time.monotonic()
            os.kill(proc_b.p.pid, signal.SIGSTOP)

            async def listed() -> set[str]:
                info = await ns.cluster_info()
                return set(info["brokerAddrTable"])

            while "store-b" in await listed():
                assert time.monotonic() - t0 < 5.0, "store-b still listed after its lease"
                await asyncio.sleep(0.05)
            dropped_after = time.monotonic() - t0
            assert dropped_after >= 1.0  # dropped by lease expiry, not by anything quicker
            t1 = time.monotonic()
            await send_all(s1, "fo", after)  # sends continue on store-a
            assert time.monotonic() - t1 < 10
            got = await receive_until(
                s0, "fo-group", "fo", 0, timeout=10, until=lambda ms: set(after) <= {m.body for m in ms}
            )
            st, more, _ = await g.receive(s0, "fo-group", "fo", poll_ms=300)
            got += more
            assert {store_of(m) for m in got} == {"store-a"}
            assert set(after) <= {m.body for m in got}
            missing = set(before) - {m.body for m in got}
            assert missing  # what store-b holds is not available while it is down
            r = await g.ack(s1, "fo-group", "fo", *[m.system_properties.receipt_handle for m in got])
            assert all(e.status.code == d.OK for e in r.entries)
            # Restart store-b on its data (new process, new port): its messages come back.
            proc_b.kill()
            cluster.start_stores("store-b")
            back = await receive_until(s1, "fo-group", "fo", len(missing), timeout=15)
            assert {m.body for m in back} == missing
            assert {store_of(m) for m in back} == {"store-b"}
    finally:
        await ns.close()
        if proc_b.p.poll() is None:
            os.kill(proc_b.p.pid, signal.SIGCONT)


async def test_store_node_exits_cleanly_on_sigterm_and_unregisters(cluster):
    # Another cluster name: the proxies of the fixture do not use it.
    cluster.start_stores("store-z", extra=("--cluster-name", "other"))
    proc, addr = cluster.stores["store-z"]
    ns = NameServerClient(cluster.namesrv)
    try:
        info = await ns.cluster_info()
        assert info["clusterAddrTable"]["other"] == ["store-z"]
        assert proc.stop() == 0
        assert "store closed" in proc.output()
        info = await ns.cluster_info()
        assert "store-z" not in info["brokerAddrTable"]
    finally:
        await ns.close()
    assert wait_for(lambda: proc.p.poll() is not None, 5)
