"""AmqpAdapter end to end with aio-pika: exchanges and routing, work queues, confirms, requeue and
dead-lettering, TTL, limits, transactions, consumers, against an in-process Store + processor."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import aiormq
import pytest
from aio_pika import ExchangeType, Message

from tests.adapters.amqp.support import T, close_env, collect, drain, get_message, open_env
from tests.support import wait_until

# ------------------------------------------------------------------ routing


async def test_default_exchange_round_trip_keeps_properties_and_headers(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("props", durable=True)
        sent = Message(
            b"body",
            headers={"h1": "v", "n": 7, "nested": {"x": [1, "two"]}, "flag": True},
            content_type="application/json",
            content_encoding="gzip",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            priority=3,
            correlation_id="corr",
            reply_to="replies",
            expiration=60,
            message_id="mid-1",
            timestamp=1_700_000_000,
            type="kind",
            user_id="guest",
            app_id="app",
        )
        await ch.default_exchange.publish(sent, routing_key="props")
        m = await get_message(q)
        assert m.body == b"body"
        # the headers exactly as sent: no trace context added (issue 47)
        assert m.headers == {"h1": "v", "n": 7, "nested": {"x": [1, "two"]}, "flag": True}
        assert (m.content_type, m.content_encoding, m.priority) == ("application/json", "gzip", 3)
        assert (m.correlation_id, m.reply_to, m.message_id) == ("corr", "replies", "mid-1")
        assert (m.type, m.user_id, m.app_id, m.expiration) == ("kind", "guest", "app", 60)
        assert m.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert m.timestamp.timestamp() == 1_700_000_000
        assert (m.exchange, m.routing_key, m.redelivered) == ("", "props", False)
        await m.ack()


async def test_topic_exchange_star_and_hash(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        ex = await ch.declare_exchange("logs.topic", ExchangeType.TOPIC)
        qs = {}
        for name, key in (("star", "*.error"), ("hash", "app.#"), ("all", "#"), ("mid", "a.*.c")):
            qs[name] = await ch.declare_queue(f"t-{name}", auto_delete=True)
            await qs[name].bind(ex, key)
        for rk in ("db.error", "app.error", "app", "app.x.y", "a.b.c", "a.b.b.c", "x.y.error"):
            await ex.publish(Message(rk.encode()), routing_key=rk)
        expect = {
            "star": ["db.error", "app.error"],
            "hash": ["app.error", "app", "app.x.y"],
            "all": ["db.error", "app.error", "app", "app.x.y", "a.b.c", "a.b.b.c", "x.y.error"],
            "mid": ["a.b.c"],
        }
        for name, keys in expect.items():
            got = [m.body.decode() for m in await drain(qs[name], len(keys))]
            assert got == keys, name
            assert (await qs[name].declare()).message_count == 0, name


async def test_fanout_to_three_queues(env):
    async with await env.connect() as conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.declare_exchange("fan", ExchangeType.FANOUT, durable=True)
        queues = [await ch.declare_queue(f"fan-{i}") for i in range(3)]
        for q in queues:
            await q.bind(ex)
        for i in range(5):
            await ex.publish(Message(f"m{i}".encode()), routing_key="ignored")
        for q in queues:
            assert (await q.declare()).message_count == 5
            got = await drain(q, 5)
            assert [m.body for m in got] == [f"m{i}".encode() for i in range(5)]
            assert all(m.exchange == "fan" and m.routing_key == "ignored" for m in got)


async def test_headers_exchange_any_and_all(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        ex = await ch.declare_exchange("hdr", ExchangeType.HEADERS)
        q_all = await ch.declare_queue("h-all", exclusive=True)
        q_any = await ch.declare_queue("h-any", exclusive=True)
        await q_all.bind(ex, arguments={"x-match": "all", "format": "pdf", "type": "report"})
        await q_any.bind(ex, arguments={"x-match": "any", "format": "pdf", "type": "log"})
        cases = [
            ({"format": "pdf", "type": "report"}, True, True),
            ({"format": "pdf"}, False, True),
            ({"type": "log"}, False, True),
            ({"format": "zip", "type": "report"}, False, False),
            ({}, False, False),
        ]
        for i, (headers, _, _) in enumerate(cases):
            await ex.publish(Message(str(i).encode(), headers=headers), routing_key="")
        want_all = [str(i) for i, c in enumerate(cases) if c[1]]
        want_any = [str(i) for i, c in enumerate(cases) if c[2]]
        assert [m.body.decode() for m in await drain(q_all, len(want_all))] == want_all
        assert [m.body.decode() for m in await drain(q_any, len(want_any))] == want_any
        assert (await q_all.declare()).message_count == 0


async def test_direct_exchange_and_exchange_to_exchange_binding_and_unbind(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        src = await ch.declare_exchange("e2e-src", ExchangeType.DIRECT)
        dst = await ch.declare_exchange("e2e-dst", ExchangeType.FANOUT)
        await dst.bind(src, "route")
        q = await ch.declare_queue("e2e-q", exclusive=True)
        await q.bind(dst)
        d = await ch.declare_queue("direct-q", exclusive=True)
        await d.bind(src, "other")
        await src.publish(Message(b"via-e2e"), routing_key="route")
        await src.publish(Message(b"direct"), routing_key="other")
        assert (await get_message(q)).body == b"via-e2e"
        assert (await get_message(d)).body == b"direct"
        await d.unbind(src, "other")
        await dst.unbind(src, "route")
        await src.publish(Message(b"nowhere"), routing_key="route")
        await src.publish(Message(b"nowhere"), routing_key="other")
        await asyncio.sleep(0)
        assert (await q.declare()).message_count == 0 and (await d.declare()).message_count == 0


async def test_mandatory_unroutable_publish_is_returned_before_its_confirm(env):
    async with await env.connect() as conn:
        ch = await conn.channel(publisher_confirms=True, on_return_raises=False)
        returned: asyncio.Future = asyncio.get_running_loop().create_future()
        ch.return_callbacks.add(lambda _ch, msg: returned.done() or returned.set_result(msg))
        ex = await ch.declare_exchange("nobody", ExchangeType.DIRECT)
        await ex.publish(Message(b"lost", correlation_id="c9"), routing_key="nokey", mandatory=True)
        msg = await asyncio.wait_for(returned, T)
        assert (msg.body, msg.correlation_id, msg.routing_key) == (b"lost", "c9", "nokey")
        # without mandatory it is dropped silently and still confirmed
        await ex.publish(Message(b"dropped"), routing_key="nokey")


async def test_mandatory_return_raises_in_aio_pika_by_default(env):
    async with await env.connect() as conn:
        ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
        with pytest.raises(aio_pika.exceptions.DeliveryError) as e:
            await ch.default_exchange.publish(Message(b"x"), routing_key="no-such-queue", mandatory=True)
        assert e.value.frame.reply_code == 312


async def test_alternate_exchange_gets_unroutable_messages(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        alt = await ch.declare_exchange("alt", ExchangeType.FANOUT)
        catch = await ch.declare_queue("alt-catch", exclusive=True)
        await catch.bind(alt)
        main = await ch.declare_exchange(
            "main-ae", ExchangeType.DIRECT, arguments={"alternate-exchange": "alt"}
        )
        await main.publish(Message(b"stray"), routing_key="none")
        assert (await get_message(catch)).body == b"stray"


# ------------------------------------------------------------------ work queues and consumers


async def test_work_queue_prefetch_1_splits_fairly_across_two_consumers(env):
    async with await env.connect() as conn:
        pub = await conn.channel(publisher_confirms=True)
        await pub.declare_queue("work", durable=True)
        got: dict[str, list[int]] = {"a": [], "b": []}
        done = asyncio.Event()
        chans = []
        for name in ("a", "b"):
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=1)
            q = await ch.declare_queue("work", durable=True)

            async def on_msg(m, name=name):
                got[name].append(int(m.body))
                await asyncio.sleep(0.01)  # a slow worker: the other one must get the next message
                await m.ack()
                if len(got["a"]) + len(got["b"]) == 20:
                    done.set()

            await q.consume(on_msg)
            chans.append(ch)
        for i in range(20):
            await pub.default_exchange.publish(Message(str(i).encode()), routing_key="work")
        await asyncio.wait_for(done.wait(), T)
        assert sorted(got["a"] + got["b"]) == list(range(20))
        assert 8 <= len(got["a"]) <= 12, got
        assert got["a"] == sorted(got["a"]) and got["b"] == sorted(got["b"])


async def test_prefetch_limits_unacked_deliveries_per_consumer(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=3)
        q = await ch.declare_queue("pf", exclusive=True)
        for i in range(10):
            await ch.default_exchange.publish(Message(str(i).encode()), routing_key="pf")
        held: list = []
        await q.consume(collect(held))
        await wait_until(lambda: len(held) >= 3)
        await asyncio.sleep(0.2)
        assert len(held) == 3
        await held[0].ack()
        await wait_until(lambda: len(held) == 4)
        await asyncio.sleep(0.1)
        assert len(held) == 4


async def test_global_qos_limits_the_channel(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=2, global_=True)
        q1 = await ch.declare_queue("g1", exclusive=True)
        q2 = await ch.declare_queue("g2", exclusive=True)
        for _ in range(4):
            await ch.default_exchange.publish(Message(b"1"), routing_key="g1")
            await ch.default_exchange.publish(Message(b"2"), routing_key="g2")
        held: list = []
        await q1.consume(collect(held))
        await q2.consume(collect(held))
        await wait_until(lambda: len(held) == 2)
        await asyncio.sleep(0.2)
        assert len(held) == 2
        await held[0].ack(multiple=False)
        await wait_until(lambda: len(held) == 3)


async def test_nack_and_reject_requeue_redeliver_with_redelivered_flag(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("rq", exclusive=True)
        await ch.default_exchange.publish(Message(b"again"), routing_key="rq")
        m = await get_message(q)
        assert not m.redelivered
        await m.nack(requeue=True)
        m = await get_message(q)
        assert (m.body, m.redelivered) == (b"again", True)
        await m.reject(requeue=True)
        m = await get_message(q)
        assert m.redelivered
        await m.reject(requeue=False)  # no dead-letter exchange: dropped
        assert (await q.declare()).message_count == 0
        assert await q.get(fail=False) is None


async def test_ack_multiple_and_nack_multiple(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=10)
        q = await ch.declare_queue("multi", exclusive=True)
        for i in range(6):
            await ch.default_exchange.publish(Message(str(i).encode()), routing_key="multi")
        got: list = []
        tag = await q.consume(collect(got))
        await wait_until(lambda: len(got) == 6)
        await got[2].ack(multiple=True)  # 0, 1, 2
        await got[5].nack(multiple=True, requeue=True)  # 3, 4, 5 back
        await wait_until(lambda: len(got) == 9)
        assert [int(m.body) for m in got[6:]] == [3, 4, 5] and all(m.redelivered for m in got[6:])
        await got[8].ack(multiple=True)
        await q.cancel(tag)
        assert (await q.declare()).message_count == 0


async def test_unacked_messages_are_requeued_when_the_channel_closes(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("ch-close", durable=True)
        await ch.default_exchange.publish(Message(b"keep"), routing_key="ch-close")
        m = await get_message(q)
        assert not m.redelivered
        await ch.close()
        ch2 = await conn.channel()
        q2 = await ch2.declare_queue("ch-close", durable=True)
        m = await get_message(q2)
        assert (m.body, m.redelivered) == (b"keep", True)
        await m.ack()


async def test_basic_recover_requeues_unacked(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("recover", exclusive=True)
        await ch.default_exchange.publish(Message(b"r"), routing_key="recover")
        m = await get_message(q)
        await (await ch.get_underlay_channel()).basic_recover(requeue=True)
        m2 = await get_message(q)
        assert (m2.body, m2.redelivered) == (b"r", True)
        await m2.ack()
        await m.ack()  # its tag was given up by the recover: 406 closes the channel
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await ch.declare_queue("recover", passive=True)


async def test_basic_get_counts_and_no_ack(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("getq", exclusive=True)
        for i in range(3):
            await ch.default_exchange.publish(Message(str(i).encode()), routing_key="getq")
        m = await q.get(no_ack=True)
        assert m.body == b"0" and m.message_count == 2
        m = await q.get()
        assert m.body == b"1" and m.message_count == 1
        await m.ack()
        assert (await q.declare()).message_count == 1
        assert await q.purge() is not None
        assert (await q.declare()).message_count == 0
        assert await q.get(fail=False) is None


async def test_rpc_reply_to_and_correlation_id(env):
    async with await env.connect() as conn:
        server_ch = await conn.channel()
        rpc_q = await server_ch.declare_queue("rpc", exclusive=True)

        async def serve(m):
            async with m.process():
                n = int(m.body)
                await server_ch.default_exchange.publish(
                    Message(str(n * n).encode(), correlation_id=m.correlation_id), routing_key=m.reply_to
                )

        await rpc_q.consume(serve)
        client_ch = await conn.channel()
        callback = await client_ch.declare_queue("", exclusive=True)
        assert callback.name.startswith("amq.gen-")
        futures: dict[str, asyncio.Future] = {}

        async def on_reply(m):
            await m.ack()
            futures.pop(m.correlation_id).set_result(int(m.body))

        await callback.consume(on_reply)
        for n in (3, 4, 12):
            cid = str(uuid.uuid4())
            futures[cid] = fut = asyncio.get_running_loop().create_future()
            await client_ch.default_exchange.publish(
                Message(str(n).encode(), correlation_id=cid, reply_to=callback.name), routing_key="rpc"
            )
            assert await asyncio.wait_for(fut, T) == n * n


async def test_consumer_cancel_and_server_cancel_when_queue_deleted(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("doomed")
        got: list = []
        tag = await q.consume(collect(got), no_ack=True)
        await ch.default_exchange.publish(Message(b"1"), routing_key="doomed")
        await wait_until(lambda: len(got) == 1)
        await q.cancel(tag)
        await ch.default_exchange.publish(Message(b"2"), routing_key="doomed")
        await asyncio.sleep(0.1)
        assert len(got) == 1
        # a consumer on another connection gets basic.cancel when the queue is deleted
        async with await env.connect() as other:
            och = await other.channel()
            oq = await och.declare_queue("doomed", passive=True)
            otag = await oq.consume(collect(got), no_ack=True)
            underlay = await och.get_underlay_channel()
            await wait_until(lambda: len(got) == 2)
            deleted = await (await ch.get_underlay_channel()).queue_delete("doomed")
            assert deleted.message_count == 0
            await wait_until(lambda: otag not in underlay.consumers, T)
        await ch.default_exchange.publish(Message(b"3"), routing_key="doomed")
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await ch.declare_queue("doomed", passive=True)


async def test_exclusive_consumer_refuses_others(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("excl-consumer", auto_delete=False)
        await q.consume(collect([]), exclusive=True)
        ch2 = await conn.channel()
        q2 = await ch2.declare_queue("excl-consumer", passive=True)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await q2.consume(collect([]))


async def test_single_active_consumer_fails_over(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("sac", arguments={"x-single-active-consumer": True})
        a: list = []
        b: list = []
        ta = await q.consume(collect(a), no_ack=True)
        await q.consume(collect(b), no_ack=True)
        for i in range(3):
            await ch.default_exchange.publish(Message(str(i).encode()), routing_key="sac")
        await wait_until(lambda: len(a) == 3)
        assert b == []
        await q.cancel(ta)
        await ch.default_exchange.publish(Message(b"next"), routing_key="sac")
        await wait_until(lambda: len(b) == 1)


# ------------------------------------------------------------------ confirms and transactions


async def test_publisher_confirms_ack_after_store_and_in_order(env):
    async with await env.connect() as conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("confirmed", durable=True)
        results = await asyncio.gather(
            *(
                ch.default_exchange.publish(Message(str(i).encode()), routing_key="confirmed")
                for i in range(200)
            )
        )
        assert all(isinstance(r, aiormq.spec.Basic.Ack) for r in results)
        info = await env.processor.get_topic("confirmed")
        assert info.messages == 200


async def test_tx_commit_and_rollback(env):
    async with await env.connect() as conn:
        ch = await conn.channel(publisher_confirms=False)
        q = await ch.declare_queue("txq", exclusive=True)
        tx = ch.transaction()
        await tx.select()
        await ch.default_exchange.publish(Message(b"rolled back"), routing_key="txq")
        await tx.rollback()
        assert (await q.declare()).message_count == 0
        await ch.default_exchange.publish(Message(b"committed"), routing_key="txq")
        assert (await q.declare()).message_count == 0  # not before the commit
        await tx.commit()
        assert (await q.declare()).message_count == 1
        m = await q.get()
        await m.ack()  # acks inside a transaction wait for the commit too
        await tx.rollback()
        assert (await q.declare()).message_count == 0  # the ack was rolled back: still unacked
        await ch.close()
        ch2 = await conn.channel()
        q2 = await ch2.declare_queue("txq", passive=True)
        m = await get_message(q2)
        assert (m.body, m.redelivered) == (b"committed", True)


# ------------------------------------------------------------------ dead-lettering, TTL, limits


async def _dlx_setup(ch, name: str, **args):
    dlx = await ch.declare_exchange(f"{name}-dlx", ExchangeType.FANOUT)
    dead = await ch.declare_queue(f"{name}-dead", exclusive=True)
    await dead.bind(dlx)
    q = await ch.declare_queue(
        name, exclusive=True, arguments={"x-dead-letter-exchange": f"{name}-dlx", **args}
    )
    return q, dead


async def test_reject_without_requeue_dead_letters_with_x_death(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q, dead = await _dlx_setup(ch, "dl1")
        await ch.default_exchange.publish(
            Message(b"bad", headers={"k": "v"}, correlation_id="c"), routing_key="dl1"
        )
        m = await get_message(q)
        await m.reject(requeue=False)
        d = await get_message(dead)
        assert (d.body, d.correlation_id, d.routing_key) == (b"bad", "c", "dl1")
        assert d.headers["k"] == "v"
        death = d.headers["x-death"][0]
        assert (death["reason"], death["queue"], death["count"], death["routing-keys"]) == (
            "rejected",
            "dl1",
            1,
            ["dl1"],
        )
        assert d.headers["x-first-death-reason"] == "rejected"
        assert (await q.declare()).message_count == 0


async def test_nack_dead_letters_to_routing_key_override(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        dlx = await ch.declare_exchange("dl2-dlx", ExchangeType.DIRECT)
        dead = await ch.declare_queue("dl2-dead", exclusive=True)
        await dead.bind(dlx, "parking")
        q = await ch.declare_queue(
            "dl2",
            exclusive=True,
            arguments={"x-dead-letter-exchange": "dl2-dlx", "x-dead-letter-routing-key": "parking"},
        )
        await ch.default_exchange.publish(Message(b"x"), routing_key="dl2")
        await (await get_message(q)).nack(requeue=False)
        d = await get_message(dead)
        assert (d.body, d.routing_key, d.exchange) == (b"x", "parking", "dl2-dlx")


async def test_message_ttl_expires_to_dead_letter_without_consumers(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q, dead = await _dlx_setup(ch, "ttlq", **{"x-message-ttl": 100})
        await ch.default_exchange.publish(Message(b"late"), routing_key="ttlq")
        d = await get_message(dead)
        assert d.body == b"late" and d.headers["x-death"][0]["reason"] == "expired"
        assert (await q.declare()).message_count == 0
        # per-message expiration (no queue TTL): expired at the head, the fresh one stays
        q2, dead2 = await _dlx_setup(ch, "ttlm")
        await ch.default_exchange.publish(Message(b"short", expiration=0.05), routing_key="ttlm")
        await ch.default_exchange.publish(Message(b"fresh", expiration=30), routing_key="ttlm")
        d = await get_message(dead2)
        assert d.body == b"short" and d.headers["x-death"][0]["original-expiration"] == "50"
        assert d.expiration is None
        m = await get_message(q2)
        assert (m.body, m.expiration) == (b"fresh", 30)


async def test_expired_message_is_not_delivered_to_a_consumer(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q, dead = await _dlx_setup(ch, "ttlc")
        await ch.default_exchange.publish(Message(b"old", expiration=0.01), routing_key="ttlc")
        await ch.default_exchange.publish(Message(b"new"), routing_key="ttlc")
        await asyncio.sleep(0.05)
        got: list = []
        await q.consume(collect(got), no_ack=True)
        await wait_until(lambda: len(got) == 1)
        assert got[0].body == b"new"
        assert (await get_message(dead)).body == b"old"


async def test_max_length_drop_head_dead_letters_the_oldest(env):
    async with await env.connect() as conn:
        ch = await conn.channel(publisher_confirms=True)
        q, dead = await _dlx_setup(ch, "maxq", **{"x-max-length": 2})
        for i in range(5):
            await ch.default_exchange.publish(Message(str(i).encode()), routing_key="maxq")
        got = [m.body for m in await drain(dead, 3)]
        assert got == [b"0", b"1", b"2"]
        assert [m.body for m in await drain(q, 2)] == [b"3", b"4"]


async def test_max_length_reject_publish_nacks(env):
    async with await env.connect() as conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue(
            "rejq", exclusive=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        r = await ch.default_exchange.publish(Message(b"1"), routing_key="rejq")
        assert isinstance(r, aiormq.spec.Basic.Ack)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await ch.default_exchange.publish(Message(b"2"), routing_key="rejq")


async def test_queue_expires_when_unused(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        await ch.declare_queue("short-lived", arguments={"x-expires": 100})
        assert "short-lived" in env.adapter.broker.vhosts["/"].queues
        await wait_until(lambda: "short-lived" not in env.adapter.broker.vhosts["/"].queues)
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await ch.declare_queue("short-lived", passive=True)


async def test_x_queue_type_and_delivery_limit(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        dlx = await ch.declare_exchange("ql-dlx", ExchangeType.FANOUT)
        dead = await ch.declare_queue("ql-dead", exclusive=True)
        await dead.bind(dlx)
        q = await ch.declare_queue(
            "quorum-q",
            durable=True,
            arguments={"x-queue-type": "quorum", "x-delivery-limit": 1, "x-dead-letter-exchange": "ql-dlx"},
        )
        await ch.default_exchange.publish(Message(b"poison"), routing_key="quorum-q")
        await (await get_message(q)).nack(requeue=True)
        await (await get_message(q)).nack(requeue=True)
        d = await get_message(dead)
        assert d.body == b"poison" and d.headers["x-death"][0]["reason"] == "delivery_limit"
        ch2 = await conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await ch2.declare_queue("bad-quorum", exclusive=True, arguments={"x-queue-type": "quorum"})


# ------------------------------------------------------------------ vhosts and exchange flags


async def test_vhosts_are_separate_namespaces(env):
    async with await aio_pika.connect(env.url + "tenant-a", timeout=T) as a:
        cha = await a.channel()
        qa = await cha.declare_queue("shared-name", durable=True)
        await cha.default_exchange.publish(Message(b"from a"), routing_key="shared-name")
        async with await env.connect() as root:
            chr_ = await root.channel()
            qr = await chr_.declare_queue("shared-name", durable=True)
            assert (await qr.declare()).message_count == 0
            assert (await get_message(qa)).body == b"from a"
    topics = {t.name for t in await env.processor.list_topics()}
    assert "shared-name" in topics
    assert any(t.startswith("amqp|tenant-a.shared-name|") for t in topics)


async def test_auto_delete_exchange_goes_with_its_last_binding(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        ex = await ch.declare_exchange("ad-ex", ExchangeType.FANOUT, auto_delete=True)
        q = await ch.declare_queue("ad-ex-q", exclusive=True)
        await q.bind(ex)
        await q.unbind(ex)
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await ch.declare_exchange("ad-ex", passive=True)


async def test_publish_checks_internal_exchange_user_id_and_expiration(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        await ch.declare_exchange("inner", ExchangeType.FANOUT, internal=True)
        for exchange, msg, exc in (
            ("inner", Message(b"x"), aiormq.exceptions.ChannelAccessRefused),
            ("", Message(b"x", user_id="mallory"), aiormq.exceptions.ChannelPreconditionFailed),
        ):
            ch = await conn.channel(publisher_confirms=False)
            underlay = await ch.get_underlay_channel()
            await underlay.basic_publish(
                msg.body, exchange=exchange, routing_key="k", properties=msg.properties
            )
            with pytest.raises(exc):
                await ch.declare_queue("probe", exclusive=True)
        ch = await conn.channel(publisher_confirms=False)
        underlay = await ch.get_underlay_channel()
        await underlay.basic_publish(
            b"x", routing_key="k", properties=aiormq.spec.Basic.Properties(expiration="soon")
        )
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await ch.declare_queue("probe", exclusive=True)


# ------------------------------------------------------------------ held deliveries


async def test_held_deliveries_stay_invisible_and_the_consumer_timeout_closes_the_channel(tmp_path):
    env = await open_env(str(tmp_path / "data"), invisible_time_ms=300, consumer_timeout_ms=1500)
    try:
        async with await env.connect() as a, await env.connect() as b:
            cha = await a.channel()
            q = await cha.declare_queue("held", durable=True)
            await cha.default_exchange.publish(Message(b"mine"), routing_key="held")
            m = await get_message(q)
            chb = await b.channel()
            qb = await chb.declare_queue("held", passive=True)
            await asyncio.sleep(0.8)  # well past the 300 ms invisible time: renewed meanwhile
            assert await qb.get(fail=False) is None
            closed = asyncio.get_running_loop().create_future()
            cha.close_callbacks.add(lambda _ch, exc: closed.done() or closed.set_result(exc))
            exc = await asyncio.wait_for(closed, T)  # held past the consumer timeout
            assert isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed)
            assert "timed out" in str(exc)
            again = await get_message(qb)  # requeued with the channel's end
            assert (again.body, again.redelivered) == (m.body, True)
            await again.ack()
    finally:
        await close_env(env)
