"""AmqpAdapter with pika's BlockingConnection (run in a thread, the server in the test's loop):
the RabbitMQ tutorials' patterns and error reporting as pika applications see them."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pika
import pytest

from tests.adapters.amqp.support import T


def run(env, fn):
    """Run a blocking pika scenario in a thread while the gateway serves in this loop."""
    return asyncio.to_thread(fn, env)


async def test_pika_work_queue_prefetch_1_is_fair_across_two_consumers(env):
    def scenario(env):
        with env.blocking() as pub:
            ch = pub.channel()
            ch.queue_declare("tasks", durable=True)
            ch.confirm_delivery()
            for i in range(20):
                ch.basic_publish(
                    "",
                    "tasks",
                    str(i).encode(),
                    pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent),
                )
        counts: dict[str, list[int]] = {}
        lock = threading.Lock()
        total = threading.Event()

        def worker(name: str) -> None:
            with env.blocking() as conn:
                ch = conn.channel()
                ch.basic_qos(prefetch_count=1)
                got = counts.setdefault(name, [])

                def on_message(ch, method, props, body):
                    got.append(int(body))
                    conn.sleep(0.01)  # slow worker: the other one takes the next message meanwhile
                    ch.basic_ack(method.delivery_tag)
                    with lock:
                        if sum(len(v) for v in counts.values()) == 20:
                            total.set()

                ch.basic_consume("tasks", on_message)
                while not total.is_set():
                    conn.process_data_events(time_limit=0.05)

        threads = [threading.Thread(target=worker, args=(n,)) for n in ("w1", "w2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(T * 2)
        return counts

    counts = await run(env, scenario)
    assert sorted(counts["w1"] + counts["w2"]) == list(range(20))
    assert 7 <= len(counts["w1"]) <= 13, counts


async def test_pika_confirms_mandatory_returns_and_get(env):
    def scenario(env):
        with env.blocking() as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("pq", durable=True)
            ch.basic_publish(
                "", "pq", b"one", pika.BasicProperties(headers={"n": 1}, content_type="text/plain")
            )
            with pytest.raises(pika.exceptions.UnroutableError):
                ch.basic_publish("", "nowhere", b"lost", mandatory=True)
            method, props, body = ch.basic_get("pq")
            assert body == b"one" and props.headers == {"n": 1} and props.content_type == "text/plain"
            assert method.message_count == 0 and not method.redelivered
            ch.basic_nack(method.delivery_tag, requeue=True)
            method, props, body = ch.basic_get("pq", auto_ack=True)
            assert body == b"one" and method.redelivered
            assert ch.basic_get("pq") == (None, None, None)

    await run(env, scenario)


async def test_pika_rpc_with_reply_to_and_correlation_id(env):
    ready = threading.Event()
    stop = threading.Event()

    def server(env):
        with env.blocking() as conn:
            ch = conn.channel()
            ch.queue_declare("rpc_queue")

            def on_request(ch, method, props, body):
                n = int(body)
                ch.basic_publish(
                    "",
                    props.reply_to,
                    str(n + 1).encode(),
                    pika.BasicProperties(correlation_id=props.correlation_id),
                )
                ch.basic_ack(method.delivery_tag)

            ch.basic_qos(prefetch_count=1)
            ch.basic_consume("rpc_queue", on_request)
            ready.set()
            while not stop.is_set():
                conn.process_data_events(time_limit=0.05)

    def client(env):
        ready.wait(T)
        with env.blocking() as conn:
            ch = conn.channel()
            callback = ch.queue_declare("", exclusive=True).method.queue
            replies: dict[str, bytes] = {}
            ch.basic_consume(
                callback, lambda c, m, p, b: replies.__setitem__(p.correlation_id, b), auto_ack=True
            )
            out = []
            for n in (1, 41):
                cid = str(uuid.uuid4())
                ch.basic_publish(
                    "",
                    "rpc_queue",
                    str(n).encode(),
                    pika.BasicProperties(reply_to=callback, correlation_id=cid),
                )
                while cid not in replies:
                    conn.process_data_events(time_limit=0.05)
                out.append(int(replies[cid]))
            return out

    srv = asyncio.ensure_future(run(env, server))
    try:
        assert await run(env, client) == [2, 42]
    finally:
        stop.set()
        await srv


async def test_pika_channel_error_keeps_the_connection(env):
    def scenario(env):
        with env.blocking() as conn:
            ch = conn.channel()
            ch.queue_declare("pika-conf", arguments={"x-max-length": 10})
            bad = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                bad.queue_declare("pika-conf", arguments={"x-max-length": 20})
            assert e.value.reply_code == 406
            assert conn.is_open and ch.is_open and bad.is_closed
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                conn.channel().queue_declare("pika-missing", passive=True)
            assert e.value.reply_code == 404
            ch.queue_declare("pika-conf", passive=True)

    await run(env, scenario)


async def test_pika_topic_routing_and_fanout(env):
    def scenario(env):
        with env.blocking() as conn:
            ch = conn.channel()
            ch.exchange_declare("topic_logs", "topic")
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.queue_bind(q, "topic_logs", "kern.*")
            ch.queue_bind(q, "topic_logs", "*.critical")
            for rk in ("kern.info", "app.critical", "app.info", "kern.disk.full"):
                ch.basic_publish("topic_logs", rk, rk.encode())
            ch.exchange_declare("logs", "fanout")
            qs = [ch.queue_declare("", exclusive=True).method.queue for _ in range(3)]
            for name in qs:
                ch.queue_bind(name, "logs")
            ch.basic_publish("logs", "", b"broadcast")
            got = []
            while (r := ch.basic_get(q, auto_ack=True)) != (None, None, None):
                got.append((r[0].routing_key, r[0].exchange))
            assert got == [("kern.info", "topic_logs"), ("app.critical", "topic_logs")]
            for name in qs:
                assert ch.basic_get(name, auto_ack=True)[2] == b"broadcast"

    await run(env, scenario)


async def test_pika_rpc_with_direct_reply_to(env):
    ready = threading.Event()
    stop = threading.Event()

    def server(env):
        with env.blocking() as conn:
            ch = conn.channel()
            ch.queue_declare("direct_rpc")

            def on_request(ch, method, props, body):
                assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
                ch.basic_publish("", props.reply_to, body.upper(), pika.BasicProperties(correlation_id="x"))
                ch.basic_ack(method.delivery_tag)

            ch.basic_consume("direct_rpc", on_request)
            ready.set()
            while not stop.is_set():
                conn.process_data_events(time_limit=0.05)

    def client(env):
        ready.wait(T)
        with env.blocking() as conn:
            ch = conn.channel()
            replies: list[bytes] = []
            ch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append(b), auto_ack=True)
            ch.basic_publish(
                "", "direct_rpc", b"ping", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
            )
            while not replies:
                conn.process_data_events(time_limit=0.05)
            other = conn.channel()  # a channel without a reply consumer may not ask for replies
            other.basic_publish(
                "", "direct_rpc", b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
            )
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                other.queue_declare("direct_rpc", passive=True)
            assert e.value.reply_code == 406
            return replies

    srv = asyncio.ensure_future(run(env, server))
    try:
        assert await run(env, client) == [b"PING"]
    finally:
        stop.set()
        await srv


async def test_pika_connection_blocked_when_the_store_is_full(env, monkeypatch):
    from messaging_processor import ErrorKind, ProcessorError

    real_send = env.processor.send
    failures = [1]

    async def send(ctx, msgs, **kw):
        if failures:
            failures.pop()
            raise ProcessorError(ErrorKind.STORE_FULL, "disk full")
        return await real_send(ctx, msgs, **kw)

    monkeypatch.setattr(env.processor, "send", send)

    def scenario(env):
        events: list[str] = []
        with env.blocking() as conn:
            conn.add_on_connection_blocked_callback(lambda c, f: events.append("blocked"))
            conn.add_on_connection_unblocked_callback(lambda c, f: events.append("unblocked"))
            ch = conn.channel()
            ch.queue_declare("full")
            ch.confirm_delivery()
            with pytest.raises(pika.exceptions.NackError):
                ch.basic_publish("", "full", b"refused")
            while "unblocked" not in events:
                conn.process_data_events(time_limit=0.05)
            ch.basic_publish("", "full", b"accepted")
            return events, ch.queue_declare("full", passive=True).method.message_count

    events, count = await run(env, scenario)
    assert events == ["blocked", "unblocked"] and count == 1


async def test_channel_max_counts_open_channels_not_channel_numbers(env):
    def scenario(env):
        params = pika.ConnectionParameters("127.0.0.1", env.port, channel_max=2)
        with pika.BlockingConnection(params) as conn:
            conn.channel(channel_number=60000)  # any number: only the count is limited
            conn.channel(channel_number=7)
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
                conn.channel(channel_number=8)
                conn.process_data_events(time_limit=1)
            return exc.value.reply_code

    assert await run(env, scenario) == 530


async def test_owner_may_redeclare_its_exclusive_queue_without_exclusive(env):
    def scenario(env):
        with env.blocking() as conn:
            a, b = conn.channel(), conn.channel()
            name = "excl-" + uuid.uuid4().hex[:6]
            a.queue_declare(name, exclusive=True)
            ok = b.queue_declare(name, exclusive=False)  # same connection: accepted, as RabbitMQ does
            return ok.method.queue == name and b.is_open

    assert await run(env, scenario)


async def test_pika_multiple_ack_settles_every_delivery_with_one_store_call(env):
    """basic.ack multiple=True of 40 consumed deliveries, and of 5 basic.get ones, each reaches the
    store as one ack_many with every handle (issue 30: acks in batches), and nothing stays in flight."""
    calls: list[int] = []
    real = env.processor.ack_many

    async def ack_many(ctx, handles):
        calls.append(len(handles))
        return await real(ctx, handles)

    env.processor.ack_many = ack_many

    def scenario(env):
        with env.blocking() as conn:
            ch = conn.channel()
            ch.queue_declare("batched", durable=True)
            ch.confirm_delivery()
            for i in range(40):
                ch.basic_publish("", "batched", str(i).encode(), pika.BasicProperties(delivery_mode=2))
            ch.basic_qos(prefetch_count=40)
            tags: list[int] = []
            ctag = ch.basic_consume("batched", lambda c, m, p, b: tags.append(m.delivery_tag))
            while len(tags) < 40:
                conn.process_data_events(time_limit=0.05)
            ch.basic_ack(tags[-1], multiple=True)
            ch.basic_cancel(ctag)
            for i in range(5):
                ch.basic_publish("", "batched", b"g%d" % i, pika.BasicProperties(delivery_mode=2))
            got = []
            while len(got) < 5:
                method, _, body = ch.basic_get("batched")
                if method is not None:
                    got.append(method.delivery_tag)
            ch.basic_ack(got[-1], multiple=True)
            conn.process_data_events(time_limit=0.1)

    await run(env, scenario)
    deadline = asyncio.get_running_loop().time() + T
    while await env.processor.backlog("batched", "batched") != (0, 0):
        assert asyncio.get_running_loop().time() < deadline, await env.processor.backlog("batched", "batched")
        await asyncio.sleep(0.02)
    assert 40 in calls and 5 in calls and sum(calls) == 45
