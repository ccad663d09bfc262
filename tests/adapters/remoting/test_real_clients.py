"""The real RocketMQ 4.x clients against the gateway's remoting port (issue 7 acceptance): ali-ons
(npm) and PyPI rocketmq 0.4.4 (the Apache C++ client), each a subprocess in its own environment.

Produce and push-consume with both (across clients), a consumer's retry redelivered through the
retry topic after send-back, offsets resumed after a consumer restart, batch send, and messages
from 4.x producers received by an MQTT subscriber, an AMQP consumer (aio-pika), a processor pop
consumer and the official RocketMQ 5 gRPC client (same message ids)."""

from __future__ import annotations

import asyncio

import pytest

from messaging_processor import RetryPolicy
from tests.adapters.remoting.support import (
    CTX,
    close_env,
    grpc_available,
    needs_alions,
    needs_cpp,
    open_env,
    received,
    run,
    run_grpc_receive,
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
async def gw(tmp_path):
    e = await open_env(str(tmp_path / "data"), queues=2, mqtt=True, amqp=True)
    yield e
    await close_env(e)


@pytest.fixture
async def gw_grpc(tmp_path):
    e = await open_env(str(tmp_path / "data"), queues=2, grpc=True)
    yield e
    await close_env(e)


def ns(gw) -> list[str]:
    return ["--namesrv", gw.addr]


@needs_alions
@needs_cpp
async def test_produce_and_consume_across_both_clients(gw, tmp_path):
    home = tmp_path / "home"
    a_sent, c_sent = await asyncio.gather(
        run("alions", "produce", *ns(gw), "--topic", "both", "--count", "3", "--prefix", "js", home=home),
        run("cpp", "produce", *ns(gw), "--topic", "both", "--count", "3", "--prefix", "cpp", home=home),
    )
    assert [e["status"] for e in a_sent] == ["SEND_OK"] * 3 and [e["status"] for e in c_sent] == [0] * 3
    bodies = {e["body"] for e in a_sent + c_sent}
    a_got, c_got = await asyncio.gather(
        run("alions", "consume", *ns(gw), "--topic", "both", "--group", "g-js", "--expect", "6", home=home),
        run("cpp", "consume", *ns(gw), "--topic", "both", "--group", "g-cpp", "--expect", "6", home=home),
    )
    for got in (received(a_got), received(c_got)):
        assert {e["body"] for e in got} == bodies
        for e in got:
            assert e["tags"] == "TagA" and e["keys"].startswith("key-") and e["topic"] == "both"
            assert e["origin"] == ("ali-ons" if e["body"].startswith("js") else "cpp")
    # ali-ons ids are offset message ids both ways; the C++ client's are its UNIQ_KEYs.
    assert {e["msgId"] for e in received(a_got) if e["body"].startswith("js")} == {e["msgId"] for e in a_sent}
    assert {e["msgId"] for e in received(c_got) if e["body"].startswith("cpp")} == {
        e["msgId"] for e in c_sent
    }
    cpp_ids = {e["msgId"] for e in c_sent}
    assert {e["uniqKey"] for e in received(a_got) if e["body"].startswith("cpp")} == cpp_ids


@needs_alions
@needs_cpp
@pytest.mark.parametrize("client", ["alions", "cpp"])
async def test_retry_via_send_back_is_redelivered(gw, tmp_path, client):
    group = f"g-retry-{client}"
    await gw.processor.create_group(group, 16, RetryPolicy(300, 2.0, 2000))
    home = tmp_path / "home"
    await run(
        client, "produce", *ns(gw), "--topic", f"r-{client}", "--count", "2", "--prefix", "r", home=home
    )
    args = ["--topic", f"r-{client}", "--group", group, "--expect", "2", "--retry-first"]
    events = await run(client, "consume", *ns(gw), *args, home=home)
    got = received(events)
    for body in ("r-0", "r-1"):
        tries = [e for e in got if e["body"] == body]
        assert tries[0]["retry"] and tries[0]["reconsumeTimes"] == 0
        ok = [e for e in tries if not e["retry"]]
        assert ok and ok[0]["reconsumeTimes"] >= 1 and ok[0]["topic"] == f"r-{client}"  # retry topic reset
    assert events[-1]["event"] == "done"
    assert await gw.processor.get_topic(f"%RETRY%{group}")


@needs_alions
@needs_cpp
@pytest.mark.parametrize("client", ["alions", "cpp"])
async def test_offsets_resume_after_a_consumer_restart(gw, tmp_path, client):
    home, topic, group = tmp_path / "home", f"o-{client}", f"g-off-{client}"
    await run(client, "produce", *ns(gw), "--topic", topic, "--count", "3", "--prefix", "first", home=home)
    first = await run(
        client, "consume", *ns(gw), "--topic", topic, "--group", group, "--expect", "3", home=home
    )
    assert {e["body"] for e in received(first)} == {"first-0", "first-1", "first-2"}
    committed = [await gw.processor.committed_offset(group, topic, q) for q in range(2)]
    assert sum(committed) == 3, committed  # both queues' offsets reached the store
    await run(client, "produce", *ns(gw), "--topic", topic, "--count", "2", "--prefix", "second", home=home)
    again = await run(
        client, "consume", *ns(gw), "--topic", topic, "--group", group, "--expect", "2", home=home
    )
    assert {e["body"] for e in received(again)} == {"second-0", "second-1"}  # nothing of the first round


@needs_cpp
@needs_alions
async def test_batch_send(gw, tmp_path):
    home = tmp_path / "home"
    ev = await run("cpp", "batch", *ns(gw), "--topic", "batch", "--count", "4", "--prefix", "b", home=home)
    assert ev[0]["event"] == "batch_sent" and ev[0]["status"] == 0
    stored = [m for q in range(2) for m in await gw.processor.read(CTX, "batch", q, 0)]
    assert sorted(m.body for m in stored) == [b"b-0", b"b-1", b"b-2", b"b-3"]
    assert len({m.queue_id for m in stored}) == 1 and len({m.message_id for m in stored}) == 4  # one queue
    got = await run(
        "alions", "consume", *ns(gw), "--topic", "batch", "--group", "g-b", "--expect", "4", home=home
    )
    assert sorted(e["body"] for e in received(got)) == ["b-0", "b-1", "b-2", "b-3"]
    assert {e["uniqKey"] for e in received(got)} == {m.message_id for m in stored}


@needs_alions
@needs_cpp
async def test_4x_messages_reach_mqtt_amqp_and_pop_consumers(gw, tmp_path):
    import aio_pika
    import aiomqtt

    home = tmp_path / "home"
    await gw.processor.create_topic("iot", 2)
    mqtt_port, amqp_port = gw.extra[0].bound_port, gw.extra[1].bound_port
    amqp = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/")
    channel = await amqp.channel()
    queue = await channel.declare_queue("iot", durable=True)  # AMQP queue iot is store topic iot
    temps = await channel.declare_queue("iot-temps", durable=True)  # RabbitMQ style: bound by pattern
    await temps.bind("amq.topic", "iot.temp")
    async with aiomqtt.Client("127.0.0.1", mqtt_port, identifier="sub-4x") as sub:
        await sub.subscribe("iot/#", qos=1)
        await asyncio.sleep(0.2)
        common = ["--topic", "iot", "--count", "2"]
        await asyncio.gather(
            run("alions", "produce", *ns(gw), *common, "--prefix", "js", "--tag", "temp", home=home),
            run("cpp", "produce", *ns(gw), *common, "--prefix", "cpp", "--tag", "hum", home=home),
        )

        async def four():
            out = []
            async for m in sub.messages:
                out.append((str(m.topic), m.payload.decode()))
                if len(out) == 4:
                    return out

        got = await asyncio.wait_for(four(), 20)
    assert sorted(got) == [
        ("iot/hum", "cpp-0"),
        ("iot/hum", "cpp-1"),
        ("iot/temp", "js-0"),
        ("iot/temp", "js-1"),
    ]
    popped = []
    while len(popped) < 4:
        ds = await gw.processor.pop(CTX, "pop-group", "iot", max_messages=8, long_poll_ms=2000)
        assert ds
        for d in ds:
            popped.append(
                (d.message.body.decode(), d.message.tag, d.message.keys, d.message.properties.get("origin"))
            )
            await gw.processor.ack(CTX, d.receipt_handle)
    assert sorted(popped) == [
        ("cpp-0", "hum", ("key-0",), "cpp"),
        ("cpp-1", "hum", ("key-1",), "cpp"),
        ("js-0", "temp", ("key-0",), "ali-ons"),
        ("js-1", "temp", ("key-1",), "ali-ons"),
    ]
    amqp_got = []
    async with queue.iterator() as it:
        async for m in it:
            amqp_got.append((m.body.decode(), m.routing_key, m.headers.get("origin")))
            await m.ack()
            if len(amqp_got) == 4:
                break
    bound = []
    async with temps.iterator() as it:
        async for m in it:  # routing key <topic>.<tag>: only ali-ons' `temp` messages match
            bound.append((m.body.decode(), m.exchange, m.routing_key, m.headers.get("origin")))
            await m.ack()
            if len(bound) == 2:
                break
    assert sorted(bound) == [
        ("js-0", "amq.topic", "iot.temp", "ali-ons"),
        ("js-1", "amq.topic", "iot.temp", "ali-ons"),
    ]
    await amqp.close()
    assert sorted(amqp_got) == [
        ("cpp-0", "hum", "cpp"),
        ("cpp-1", "hum", "cpp"),
        ("js-0", "temp", "ali-ons"),
        ("js-1", "temp", "ali-ons"),
    ]


@needs_alions
@needs_cpp
@pytest.mark.skipif(
    not grpc_available(), reason="the official RocketMQ 5 Python client is not installed in .venv"
)
async def test_4x_messages_reach_the_official_grpc_client_with_the_same_ids(gw_grpc, tmp_path):
    gw = gw_grpc
    home = tmp_path / "home"
    await gw.processor.create_topic("xg", 2)
    common = ["--topic", "xg", "--count", "2"]
    a_sent, c_sent = await asyncio.gather(
        run("alions", "produce", *ns(gw), *common, "--prefix", "js", home=home),
        run("cpp", "produce", *ns(gw), *common, "--prefix", "cpp", home=home),
    )
    got = await run_grpc_receive(gw.extra[0].address, "xg", "g-grpc", 4, home=home)
    by_body = {g["body"]: g for g in got}
    assert sorted(by_body) == ["cpp-0", "cpp-1", "js-0", "js-1"]
    for e in c_sent:  # the C++ client's UNIQ_KEY is the message id everywhere
        assert by_body[e["body"]]["id"] == e["msgId"]
    for body, g in by_body.items():
        assert g["tag"] == "TagA" and g["keys"] == [f"key-{body[-1]}"]
        assert g["props"]["origin"] == ("ali-ons" if body.startswith("js") else "cpp")
    # ali-ons consumers see the store-assigned id of ali-ons messages as UNIQ_KEY.
    seen = await run(
        "alions", "consume", *ns(gw), "--topic", "xg", "--group", "g-js2", "--expect", "4", home=home
    )
    assert {e["uniqKey"] for e in received(seen)} == {g["id"] for g in got}
    assert len(a_sent) == 2


@needs_alions
async def test_a_new_4x_consumer_reads_a_compacted_topic_from_its_current_state(tmp_path):
    """A compacted topic through a real 4.x push consumer (ali-ons): a new group gets the latest
    value of each key (what compaction kept), then the changes made after."""
    from messaging_processor import Message

    e = await open_env(str(tmp_path / "data"), queues=2, store_kw={"segment_size": 1 << 20})
    try:
        p = e.processor
        await p.create_topic("states", 2, None, None, compacted=True)
        for version in range(5):
            await p.send(
                CTX, [Message("states", b"k%d@%d" % (k, version), keys=(f"k{k}",)) for k in range(3)]
            )
        for _ in range(4):  # close the segment: compaction covers closed segments
            await p.send(CTX, [Message("filler", b"f" * 300_000)], auto_create=True)
        stats = await p.compact()
        assert (stats.records_in, stats.records_kept) == (15, 3)
        got = await run(
            "alions",
            "consume",
            *ns(e),
            "--topic",
            "states",
            "--group",
            "g-new",
            "--expect",
            "3",
            home=tmp_path / "h",
        )
        assert sorted(ev["body"] for ev in received(got)) == ["k0@4", "k1@4", "k2@4"]
    finally:
        await close_env(e)


@needs_alions
async def test_a_4x_pull_consumer_is_traced(tmp_path):
    """ali-ons consumes with PULL_MESSAGE (reads by offset) and commits offsets: each message's
    trace shows its delivery to the group over remoting, and its ack once the committed offset
    passed it."""
    env = await open_env(str(tmp_path / "data"), queues=2, traced=True)
    try:
        home = tmp_path / "home"
        sent = await run("alions", "produce", *ns(env), "--topic", "pulled", "--count", "3", home=home)
        got = await run(
            "alions",
            "consume",
            *ns(env),
            "--topic",
            "pulled",
            "--group",
            "g-pull",
            "--expect",
            "3",
            home=home,
        )
        assert {e["body"] for e in received(got)} == {e["body"] for e in sent}
        tracer = env.core.processor.tracer
        await tracer.flush()
        for m in await env.core.processor.read(CTX, "pulled", 0, 0, None, 10) + await env.core.processor.read(
            CTX, "pulled", 1, 0, None, 10
        ):
            t = await tracer.trace(m.message_id)
            events = [(e["event"], e["protocol"], e["group"]) for e in t["events"]]
            assert events[:3] == [
                ("received", "remoting", None),
                ("stored", "remoting", None),
                ("delivered", "remoting", "g-pull"),
            ]
            acked = [e for e in t["events"] if e["event"] == "acked"]
            assert [(e["group"], e["detail"]) for e in acked] == [("g-pull", "offset committed")]
    finally:
        await close_env(env)
