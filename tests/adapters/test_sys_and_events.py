"""`$SYS/broker/...` and client events (docs/system-topics.md) in an in-process gateway (HTTP, MQTT,
AMQP) with `--sys-interval 1 --client-events`: mosquitto_sub reads the counters, which move when a
client publishes; `#` does not match `$SYS`; an aio-pika queue bound to `amq.rabbitmq.event` and an
aiomqtt subscriber of `$events/#` see paho clients connect, subscribe, unsubscribe and disconnect
(normally, by keep-alive timeout, by closing the socket); a CloudEvents push subscription of
`%EVENTS%` gets the events as CloudEvents; with authentication on, the ACL refuses `$SYS/#` to a
user without the right, and a refused login is an auth_failed event of its protocol."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aio_pika
import aiomqtt
import paho.mqtt.client as paho
import pytest
import pytest_asyncio
from paho.mqtt.enums import CallbackAPIVersion

from gateway.server import Gateway
from tests.adapters.cloudevents.support import Receiver
from tests.support import TEST_SEGMENT_SIZE_MIB, start_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")
T = 10.0
SYS_PATHS = {
    "$SYS/broker/version",
    "$SYS/broker/uptime",
    "$SYS/broker/clients/connected",
    "$SYS/broker/clients/disconnected",
    "$SYS/broker/clients/total",
    "$SYS/broker/clients/maximum",
    "$SYS/broker/messages/received",
    "$SYS/broker/messages/sent",
    "$SYS/broker/publish/messages/received",
    "$SYS/broker/publish/messages/sent",
    "$SYS/broker/bytes/received",
    "$SYS/broker/subscriptions/count",
    "$SYS/broker/retained messages/count",
}


async def open_gateway(root, **settings) -> Gateway:
    s = {
        "mqtt_ws": False,
        "segment_size_mib": TEST_SEGMENT_SIZE_MIB,
        "sys_interval": 1,
        "client_events": True,
    }
    s |= settings
    return await start_gateway(str(root), s.pop("protocols", ("http", "mqtt", "amqp", "grpc")), **s)


def port(gw: Gateway, name: str) -> int:
    return next(a for a in gw.adapters if a.name == name).bound_port


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(tmp_path_factory):
    gw = await open_gateway(tmp_path_factory.mktemp("sys"))
    yield gw
    await gw.stop()


# ---------------------------------------------------------------------------------------- helpers
def paho_client(client_id: str, **kw) -> paho.Client:
    return paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, **kw)


async def until(predicate, what: str) -> None:
    """Poll `predicate()` on this loop (the gateway runs on it) until true."""
    deadline = time.monotonic() + T
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def paho_connect(c: paho.Client, mqtt_port: int, keepalive: int = 60) -> int:
    """Connect `c` (its network loop in a thread) and wait for the CONNACK; its reason code."""
    done = []
    c.on_connect = lambda client, userdata, flags, rc, props=None: done.append(rc)
    c.connect("127.0.0.1", mqtt_port, keepalive=keepalive)
    c.loop_start()
    await until(lambda: done, "no CONNACK")
    return done[0].value


async def sys_messages(
    mqtt_port: int, topic: str, count: int, client_id: str = "sys-sub"
) -> list[tuple[str, str]]:
    """mosquitto_sub -t topic -C count: (topic, payload) of the messages it printed."""
    proc = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-h", "127.0.0.1", "-p", str(mqtt_port), "-i", client_id, "-t", topic,
        "-F", "%t\t%p", "-C", str(count), "-W", "10", stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), T + 2)
    assert proc.returncode == 0, out
    lines = out.decode().splitlines()
    assert len(lines) == count, lines
    return [tuple(line.split("\t", 1)) for line in lines]  # type: ignore[misc]


class Events:
    """The client events one aiomqtt subscriber of `$events/#` received: (topic, body); `$SYS`
    messages as (topic, {"value": payload})."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.got: list[tuple[str, dict]] = []
        self.task = asyncio.get_running_loop().create_task(self._read())
        self.changed = asyncio.Event()

    async def _read(self) -> None:
        async for m in self.client.messages:
            topic = str(m.topic)
            self.got.append(
                (topic, {"value": m.payload} if topic.startswith("$SYS") else json.loads(m.payload))
            )
            self.changed.set()

    async def wait(self, event_topic: str, **fields) -> dict:
        """The first event on `event_topic` whose body has `fields`."""
        deadline = time.monotonic() + T
        while True:
            for t, body in self.got:
                if t == event_topic and all(body.get(k) == v for k, v in fields.items()):
                    return body
            left = deadline - time.monotonic()
            assert left > 0, (event_topic, fields, self.got)
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    def stop(self) -> None:
        self.task.cancel()


async def amqp_events(amqp_port: int, *keys: str):
    """An aio-pika connection with an exclusive queue bound to amq.rabbitmq.event by `keys`, and an
    asyncio.Queue of (routing key, headers, body) delivered from it."""
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/", timeout=T)
    ch = await conn.channel()
    q = await ch.declare_queue(exclusive=True)
    for k in keys:
        await q.bind("amq.rabbitmq.event", k)
    got: asyncio.Queue = asyncio.Queue()

    async def on(m: aio_pika.abc.AbstractIncomingMessage) -> None:
        got.put_nowait((m.routing_key, dict(m.headers), json.loads(m.body)))

    await q.consume(on, no_ack=True)
    return conn, got


async def amqp_wait(got: asyncio.Queue, rk: str, **fields) -> tuple[dict, dict]:
    deadline = time.monotonic() + T
    while True:
        key, headers, body = await asyncio.wait_for(got.get(), max(0.01, deadline - time.monotonic()))
        if key == rk and all(body.get(k) == v for k, v in fields.items()):
            return headers, body


async def ignore(m: aio_pika.abc.AbstractIncomingMessage) -> None:
    pass


async def raw_connect(mqtt_port: int, client_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A 3.1.1 CONNECT over a plain socket; the socket's streams once the CONNACK came."""
    cid = client_id.encode()
    var = b"\x00\x04MQTT\x04\x02\x00\x3c"  # clean session, keep-alive 60
    payload = len(cid).to_bytes(2, "big") + cid
    r, w = await asyncio.open_connection("127.0.0.1", mqtt_port)
    w.write(bytes([0x10, len(var) + len(payload)]) + var + payload)
    assert await asyncio.wait_for(r.readexactly(4), T) == b"\x20\x02\x00\x00"
    return r, w


async def raw_connect_and_close(mqtt_port: int, client_id: str) -> None:
    """A 3.1.1 CONNECT over a plain socket, then, once the CONNACK came, the socket closed."""
    _, w = await raw_connect(mqtt_port, client_id)
    w.close()


# ------------------------------------------------------------------------------------------ $SYS
async def test_mosquitto_sub_gets_the_counters_and_they_move_when_clients_publish(gw) -> None:
    mqtt_port = port(gw, "mqtt")
    sys_topics = next(a for a in gw.adapters if a.name == "mqtt").broker.sys
    n = len(sys_topics.values())
    # the retained values come first, at once: every path of the layout
    first = dict(await sys_messages(mqtt_port, "$SYS/#", n))
    assert set(first) >= SYS_PATHS, SYS_PATHS - set(first)
    assert first["$SYS/broker/version"].startswith("msg-gateway")
    assert first["$SYS/broker/uptime"].endswith(" seconds")
    assert int(first["$SYS/broker/clients/connected"]) >= 1  # mosquitto_sub itself

    before = int(first["$SYS/broker/publish/messages/received"])
    async with aiomqtt.Client("127.0.0.1", mqtt_port, identifier="sys-pub") as pub:
        await pub.subscribe("$events/session_subscribed", qos=1)
        ev = Events(pub)
        try:
            sub = asyncio.get_running_loop().create_task(
                sys_messages(mqtt_port, "$SYS/broker/publish/messages/received", 2, "sys-watch")
            )
            # (publish once mosquitto_sub has subscribed: its first message is the value before)
            await ev.wait("$events/session_subscribed", client_id="sys-watch")
            for i in range(3):
                await pub.publish(f"sysdemo/{i}", b"x", qos=1)
            (_, v1), (_, v2) = await sub
        finally:
            ev.stop()
    assert int(v1) == before and int(v2) >= before + 3  # the next tick's changed value


async def test_a_root_wildcard_does_not_get_sys_topics(gw) -> None:
    mqtt_port = port(gw, "mqtt")
    async with (
        aiomqtt.Client("127.0.0.1", mqtt_port, identifier="wild") as wild,
        aiomqtt.Client("127.0.0.1", mqtt_port, identifier="ticks") as ticks,
    ):
        await wild.subscribe("#", qos=1)
        await ticks.subscribe("$SYS/broker/uptime")
        seen = 0
        async for _m in ticks.messages:  # the retained value, then a tick published while `#` is on
            seen += 1
            if seen == 2:
                break
        await ticks.publish("marker/x", b"m", qos=1)
        m = await asyncio.wait_for(anext(aiter(wild.messages)), T)
        assert str(m.topic) == "marker/x"  # the first thing `#` got (no $SYS before it)


async def test_clients_cannot_publish_to_sys(gw) -> None:
    mqtt_port = port(gw, "mqtt")
    c = paho_client("sys-faker", protocol=paho.MQTTv5)
    acks: list = []
    c.on_publish = lambda client, userdata, mid, rc, props=None: acks.append(rc)
    assert await paho_connect(c, mqtt_port) == 0
    try:
        c.publish("$SYS/broker/clients/connected", b"999", qos=1)
        await until(lambda: acks, "no PUBACK")
        assert acks[0].value == 0x90  # Topic Name invalid: the gateway's own topic
    finally:
        c.disconnect()
        c.loop_stop()


# ---------------------------------------------------------------------------------- client events
async def test_mqtt_and_amqp_consumers_see_connect_subscribe_and_disconnect_reasons(gw) -> None:
    mqtt_port, amqp_port = port(gw, "mqtt"), port(gw, "amqp")
    conn, got = await amqp_events(amqp_port, "connection.*", "consumer.*")
    watcher = aiomqtt.Client("127.0.0.1", mqtt_port, identifier="watcher")
    async with watcher:
        await watcher.subscribe("$events/#", qos=1)
        ev = Events(watcher)
        try:
            # a paho client: connect, subscribe, unsubscribe, DISCONNECT
            c = paho_client("dev-normal")
            assert await paho_connect(c, mqtt_port) == 0
            done: list = []
            c.on_subscribe = lambda *a: done.append(1)
            c.on_unsubscribe = lambda *a: done.append(2)
            c.subscribe("plant/+/temp", qos=1)
            await until(lambda: done, "no SUBACK")
            c.unsubscribe("plant/+/temp")
            await until(lambda: len(done) == 2, "no UNSUBACK")
            c.disconnect()
            c.loop_stop()
            body = await ev.wait("$events/client_connected", client_id="dev-normal")
            assert body["protocol"] == "mqtt" and body["peer"].startswith("127.0.0.1:")
            assert body["keep_alive"] == 60 and body["clean_start"] is True
            sub = await ev.wait("$events/session_subscribed", client_id="dev-normal")
            assert (sub["topic"], sub["qos"]) == ("plant/+/temp", 1)
            await ev.wait("$events/session_unsubscribed", client_id="dev-normal", topic="plant/+/temp")
            await ev.wait("$events/client_disconnected", client_id="dev-normal", reason="normal")

            # keep-alive timeout: a paho client whose network loop stops (no more PINGREQ)
            k = paho_client("dev-silent")
            assert await paho_connect(k, mqtt_port, keepalive=1) == 0
            k.loop_stop()
            await ev.wait("$events/client_disconnected", client_id="dev-silent", reason="keepalive_timeout")
            k.socket().close()

            # the socket closed without DISCONNECT
            await raw_connect_and_close(mqtt_port, "dev-abrupt")
            await ev.wait("$events/client_disconnected", client_id="dev-abrupt", reason="closed")

            # taken over by a second connection with the same client id
            r1, w1 = await raw_connect(mqtt_port, "dev-twin")
            _, w2 = await raw_connect(mqtt_port, "dev-twin")
            assert await asyncio.wait_for(r1.read(), T) == b""  # the first one was closed
            await ev.wait("$events/client_disconnected", client_id="dev-twin", reason="takenover")
            w1.close()
            w2.close()

            # the same events through the AMQP event exchange, RabbitMQ's routing keys and headers
            h, b = await amqp_wait(got, "connection.created", client_id="dev-normal")
            assert h["name"] == "dev-normal" and h["protocol"] == "mqtt" and h["peer_host"] == "127.0.0.1"
            h, b = await amqp_wait(got, "consumer.created", client_id="dev-normal")
            assert b["topic"] == "plant/+/temp"
            await amqp_wait(got, "consumer.deleted", client_id="dev-normal")
            h, b = await amqp_wait(got, "connection.closed", client_id="dev-normal")
            assert h["reason"] == "normal" and b["reason"] == "normal"
            h, b = await amqp_wait(got, "connection.closed", client_id="dev-silent")
            assert b["reason"] == "keepalive_timeout"

            # an AMQP client's own connection and consumer, seen over MQTT
            other = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/", timeout=T)
            ch = await other.channel()
            q = await ch.declare_queue("ev-work", auto_delete=True)
            tag = await q.consume(ignore)
            body = await ev.wait("$events/client_connected", protocol="amqp", vhost="/")
            cid = body["client_id"]
            c2 = await ev.wait("$events/session_subscribed", client_id=cid, queue="ev-work")
            assert c2["consumer_tag"] == tag and c2["ack_required"] is True
            await other.close()
            await ev.wait("$events/session_unsubscribed", client_id=cid, queue="ev-work")
            await ev.wait("$events/client_disconnected", client_id=cid, reason="normal")
        finally:
            ev.stop()
    await conn.close()


async def test_a_persistent_session_gets_events_and_sys_while_offline(gw) -> None:
    mqtt_port = port(gw, "mqtt")

    def persistent() -> aiomqtt.Client:
        return aiomqtt.Client("127.0.0.1", mqtt_port, identifier="ops-offline", clean_session=False)

    async with persistent() as c:
        await c.subscribe("$events/client_disconnected", qos=1)
        await c.subscribe("$SYS/broker/uptime", qos=1)
    # while it is offline: a client comes and goes, and $SYS ticks (a clean watcher sees both)
    async with aiomqtt.Client("127.0.0.1", mqtt_port, identifier="offline-watch") as w:
        await w.subscribe("$events/client_disconnected", qos=1)
        await w.subscribe("$SYS/broker/uptime")
        ev = Events(w)
        try:
            await raw_connect_and_close(mqtt_port, "while-away")
            await ev.wait("$events/client_disconnected", client_id="while-away")
            ticks = sum(1 for t, _ in ev.got if t == "$SYS/broker/uptime")
            await until(lambda: sum(1 for t, _ in ev.got if t == "$SYS/broker/uptime") > ticks, "no tick")
        finally:
            ev.stop()
    async with persistent() as c:  # its queue kept both (after its own disconnect event)
        gone: list[str] = []
        uptime: list[bytes] = []
        async with asyncio.timeout(T):
            async for m in c.messages:
                if str(m.topic) == "$SYS/broker/uptime":
                    uptime.append(m.payload)
                else:
                    gone.append(json.loads(m.payload)["client_id"])
                if "while-away" in gone and uptime:
                    break
        assert gone[0] == "ops-offline" and uptime[0].endswith(b" seconds")


async def test_a_cloudevents_push_subscription_gets_client_events(gw) -> None:
    import httpx

    http = next(a for a in gw.adapters if a.name == "http")
    receiver = await Receiver().start()
    try:
        async with httpx.AsyncClient(base_url=f"http://{http.address}", timeout=T) as client:
            r = await client.post(
                "/subscriptions",
                json={"topic": "%EVENTS%", "sink": receiver.url(), "delivery": {"handshake": False}},
            )
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            deadline = time.monotonic() + T
            while (await client.get(f"/subscriptions/{sid}")).json()["status"]["state"] != "active":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await raw_connect_and_close(port(gw, "mqtt"), "ce-dev")
            deadline = time.monotonic() + T
            while True:
                events = [p.event() for p in receiver.posts()]
                mine = [e for e in events if e.get_subject() == "ce-dev"]
                if len(mine) >= 2:
                    break
                assert time.monotonic() < deadline, events
                await asyncio.sleep(0.02)
            by_type = {e.get_type(): e for e in mine}  # (pushes run concurrently: in any order)
            assert set(by_type) == {"io.gateway.client.connected", "io.gateway.client.disconnected"}
            gone = by_type["io.gateway.client.disconnected"]
            data = gone.get_data()
            assert data["client_id"] == "ce-dev" and data["reason"] == "closed"
            assert gone.get_source().startswith("/gateway/") and gone.get_subject() == "ce-dev"
            assert (await client.delete(f"/subscriptions/{sid}")).status_code == 204
    finally:
        await receiver.stop()


async def test_a_grpc_client_connects_and_goes(gw) -> None:
    import grpc

    from adapters.grpc.generated import service_pb2_grpc
    from tests.adapters.grpc.support import Telemetry, producer_settings

    async with aiomqtt.Client("127.0.0.1", port(gw, "mqtt"), identifier="grpc-watch") as watcher:
        await watcher.subscribe("$events/#", qos=1)
        ev = Events(watcher)
        try:
            grpc_address = next(a for a in gw.adapters if a.name == "grpc").address
            async with grpc.aio.insecure_channel(grpc_address) as channel:
                md = (("x-mq-client-id", "grpc-host@1@0@ev"), ("x-mq-language", "PYTHON"))
                tel = Telemetry(service_pb2_grpc.MessagingServiceStub(channel), md)
                await tel.settings(producer_settings())
                body = await ev.wait("$events/client_connected", client_id="grpc-host@1@0@ev")
                assert (body["protocol"], body["kind"]) == ("grpc", "producer")
                await tel.close()
                body = await ev.wait("$events/client_disconnected", client_id="grpc-host@1@0@ev")
                assert body["reason"] == "unregistered"
        finally:
            ev.stop()


# ------------------------------------------------------------------------------ with the ACL on
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secured(tmp_path_factory):
    gw = await open_gateway(tmp_path_factory.mktemp("sys-auth"), auth=True, protocols=("mqtt", "amqp"))
    sec = gw.processor.security
    await sec.add_user("ops", password="ops-pw")
    await sec.add_user("dev", password="dev-pw")
    await sec.directory.add_rule("user:ops", "topic", "$SYS/#", ("subscribe",), False)
    await sec.directory.add_rule("user:ops", "topic", "$events/#", ("subscribe",), False)
    await sec.directory.add_rule("user:dev", "topic", "sensors/#", ("subscribe", "publish"), False)
    yield gw
    await gw.stop()


async def test_the_acl_refuses_sys_without_the_right_and_refused_logins_are_events(secured) -> None:
    mqtt_port, amqp_port = port(secured, "mqtt"), port(secured, "amqp")
    ops = aiomqtt.Client("127.0.0.1", mqtt_port, identifier="ops", username="ops", password="ops-pw")
    async with ops:
        await ops.subscribe("$events/#", qos=1)
        ev = Events(ops)
        try:
            async with aiomqtt.Client(
                "127.0.0.1", mqtt_port, identifier="dev", username="dev", password="dev-pw"
            ) as dev:
                refused = await dev.subscribe("$SYS/#")
                assert [int(getattr(x, "value", x)) for x in refused] == [0x80]  # 3.1.1 Failure
            body = await ev.wait("$events/client_connected", client_id="dev")
            assert body["user"] == "dev"
            # the user allowed `$SYS/#` reads the counters
            async with aiomqtt.Client(
                "127.0.0.1", mqtt_port, identifier="ops-2", username="ops", password="ops-pw"
            ) as ops2:
                granted = await ops2.subscribe("$SYS/broker/clients/connected")
                assert [int(getattr(x, "value", x)) for x in granted] == [0]
                m = await asyncio.wait_for(anext(aiter(ops2.messages)), T)
                assert int(m.payload) >= 2
            # refused logins: MQTT (bad password) and AMQP
            bad = paho_client("intruder")
            bad.username_pw_set("dev", "wrong")
            assert await paho_connect(bad, mqtt_port) == 0x86  # (paho's name of 3.1.1's 4) bad password
            bad.loop_stop()
            body = await ev.wait("$events/client_auth_failed", client_id="intruder")
            assert body["reason"] == "bad_username_or_password" and body["user"] == "dev"
            with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
                await aio_pika.connect(f"amqp://dev:nope@127.0.0.1:{amqp_port}/", timeout=T)
            body = await ev.wait("$events/client_auth_failed", protocol="amqp")
            assert body["user"] == "dev" and body["mechanism"] == "PLAIN"
        finally:
            ev.stop()
