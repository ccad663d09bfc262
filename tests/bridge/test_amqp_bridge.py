"""AMQP 0-9-1 links with a real RabbitMQ (one per module) and an in-process gateway: a RabbitMQ
queue into the gateway, the gateway into a RabbitMQ exchange with a routing key, publisher
confirms both ways (an unroutable message stays at its source until a queue is bound), TLS with a
client certificate, and a `kill -9` of RabbitMQ mid-stream with nothing it confirmed lost."""

from __future__ import annotations

import asyncio
import itertools

import aio_pika
import aiomqtt

from tests.bridge.conftest import link, needs_mosquitto, needs_rabbitmq, running
from tests.support import T

pytestmark = needs_rabbitmq
_names = itertools.count()


def rabbit_url(r) -> str:
    return f"amqp://guest:guest@127.0.0.1:{r.port}/"


async def rabbit_channel(r):
    conn = await aio_pika.connect(rabbit_url(r), timeout=T)
    return conn, await conn.channel()


async def drain(
    queue: aio_pika.abc.AbstractQueue, n: int, timeout: float = T
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    out = []

    async def run() -> None:
        async with queue.iterator() as it:
            async for m in it:
                await m.ack()
                out.append(m)
                if len(out) >= n:
                    return

    await asyncio.wait_for(run(), timeout)
    return out


async def test_rabbit_queue_into_gateway_topic(rabbit, gateway):
    """RabbitMQ queue -> gateway's `amq.topic`: an MQTT subscriber of the gateway gets the routing
    key as its topic (prefix remapped); the far queue is empty afterwards (acked after confirm)."""
    qname = f"legacy{next(_names)}"
    conn, ch = await rabbit_channel(rabbit)
    q = await ch.declare_queue(qname, durable=True)
    await q.bind("amq.topic", f"{qname}.#")
    amq_topic = await ch.get_exchange("amq.topic")
    for i in range(30):
        msg = aio_pika.Message(str(i).encode(), delivery_mode=2, headers={"n": i})
        await amq_topic.publish(msg, f"{qname}.orders.{i % 2}")
    cfg = link(
        "rabbit-in",
        {"url": rabbit_url(rabbit), "queue": qname},
        {"url": f"amqp://127.0.0.1:{gateway.ports['amqp']}", "exchange": "amq.topic"},
        [{"filter": "#", "from_prefix": f"{qname}/", "to_prefix": "shop/"}],
    )
    async with aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-sub") as sub:
        await sub.subscribe("shop/#", qos=1)
        async with running(cfg) as b:
            got = []

            async def take() -> None:
                async for m in sub.messages:
                    got.append(m)
                    if len(got) == 30:
                        return

            await asyncio.wait_for(take(), T)
            assert sorted(int(m.payload) for m in got) == list(range(30))
            assert {str(m.topic) for m in got} == {"shop/orders/0", "shop/orders/1"}
            await asyncio.wait_for(_until(lambda: b.snapshot()[0]["forwarded"] == 30), T)
    q2 = await ch.declare_queue(qname, passive=True)
    assert q2.declaration_result.message_count == 0
    await conn.close()


async def test_gateway_queue_to_rabbit_exchange_with_routing_key(rabbit, gateway):
    """A gateway queue (topic `orders`, filled over MQTT) -> RabbitMQ exchange with a fixed
    routing key; persistent messages, properties kept."""
    n = next(_names)
    conn, ch = await rabbit_channel(rabbit)
    ex = await ch.declare_exchange(f"ex{n}", aio_pika.ExchangeType.DIRECT, durable=True)
    q = await ch.declare_queue(f"in{n}", durable=True)
    await q.bind(ex, "from-gateway")
    cfg = link(
        "gw-out",
        {"url": f"amqp://127.0.0.1:{gateway.ports['amqp']}", "queue": "orders", "declare": True},
        {"url": rabbit_url(rabbit), "exchange": f"ex{n}", "routing_key": "from-gateway"},
    )
    async with running(cfg) as b:
        async with aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-pub") as pub:
            for i in range(25):
                await pub.publish(f"orders/eu/{i}", str(i).encode(), qos=1)
        got = await drain(q, 25)
        assert sorted(int(m.body) for m in got) == list(range(25))
        assert all(m.delivery_mode == aio_pika.DeliveryMode.PERSISTENT for m in got)
        assert all(m.routing_key == "from-gateway" for m in got)
        await asyncio.wait_for(_until(lambda: b.snapshot()[0]["forwarded"] == 25), T)
        await asyncio.wait_for(_until(lambda: b.snapshot()[0]["lag_messages"] == 0), T)  # (depth: polled)
    await conn.close()


async def test_unroutable_stays_at_the_source_until_routable(rabbit, gateway):
    """mandatory + confirms: RabbitMQ returns a message no queue takes; the link does not ack it
    at the source, reconnects with backoff and delivers it once a queue is bound."""
    n = next(_names)
    conn, ch = await rabbit_channel(rabbit)
    ex = await ch.declare_exchange(f"late{n}", aio_pika.ExchangeType.TOPIC, durable=True)
    cfg = link(
        "late",
        {"url": f"mqtt://127.0.0.1:{gateway.ports['mqtt']}"},
        {"url": rabbit_url(rabbit), "exchange": f"late{n}"},
        [{"filter": "late/#"}],
        reconnect_min_s=0.05,
        reconnect_max_s=0.2,
    )
    async with running(cfg) as b:
        async with aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-pub") as pub:
            await pub.publish("late/a", b"keep me", qos=1)
        st = b.links[0].state
        await asyncio.wait_for(_until(lambda: st.connect_failures >= 2), T)
        assert st.forwarded == 0 and "NO_ROUTE" in st.last_error
        q = await ch.declare_queue(f"late{n}", durable=True)
        await q.bind(ex, "late.#")
        (m,) = await drain(q, 1)
        assert (m.body, m.routing_key) == (b"keep me", "late.a")
        await asyncio.wait_for(_until(lambda: st.forwarded == 1), T)
    await conn.close()


async def test_tls_to_rabbitmq_with_client_certificate_and_password_file(rabbit, gateway, tmp_path):
    n = next(_names)
    conn, ch = await rabbit_channel(rabbit)
    q = await ch.declare_queue(f"tls{n}", durable=True)
    pw = tmp_path / "guest.pw"
    pw.write_text("guest\n")
    cfg = link(
        "tls-out",
        {"url": f"mqtt://127.0.0.1:{gateway.ports['mqtt']}"},
        {
            "url": f"amqps://127.0.0.1:{rabbit.tls_port}",
            "username": "guest",
            "password_file": str(pw),
            "ca_file": rabbit.ca.cert,
            "cert_file": rabbit.client.cert,
            "key_file": rabbit.client.key,
            "routing_key": f"tls{n}",
        },
        [{"filter": f"tls{n}/#"}],
    )
    async with running(cfg):
        async with aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-pub") as pub:
            await pub.publish(f"tls{n}/a", b"over tls", qos=1)
        (m,) = await drain(q, 1)
    assert m.body == b"over tls"
    await conn.close()


@needs_mosquitto
async def test_kill9_of_rabbitmq_loses_nothing_it_confirmed(rabbit, gateway):
    """gateway (MQTT persistent session) -> RabbitMQ durable queue; RabbitMQ is killed with
    SIGKILL mid-stream and restarted on the same ports and mnesia: every message is in the queue
    afterwards, the duplicates at most the link's window."""
    n, total, inflight = next(_names), 400, 50
    conn, ch = await rabbit_channel(rabbit)
    q = await ch.declare_queue(f"k{n}", durable=True)
    await conn.close()
    cfg = link(
        "k9",
        {"url": f"mqtt://127.0.0.1:{gateway.ports['mqtt']}"},
        {"url": rabbit_url(rabbit), "routing_key": f"k{n}"},
        [{"filter": f"k{n}/#"}],
        inflight=inflight,
        reconnect_min_s=0.1,
        reconnect_max_s=0.5,
    )
    async with running(cfg) as b:
        st = b.links[0].state
        async with aiomqtt.Client("127.0.0.1", gateway.ports["mqtt"], identifier="gw-pub") as pub:
            for i in range(total):
                await pub.publish(f"k{n}/x", str(i).encode(), qos=1)
                if i == total // 3:
                    await asyncio.wait_for(_until(lambda: st.forwarded > 0), T)
                    await asyncio.to_thread(rabbit.kill9)
                    await asyncio.to_thread(rabbit.start)
        await asyncio.wait_for(_until(lambda: st.forwarded >= total), 60)
        assert st.connect_failures >= 1
    conn, ch = await rabbit_channel(rabbit)
    q = await ch.declare_queue(f"k{n}", durable=True)
    bodies = [int(m.body) for m in await drain(q, q.declaration_result.message_count)]
    assert set(bodies) == set(range(total))
    dups = len(bodies) - total
    assert 0 <= dups <= inflight
    await conn.close()


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.01)
