"""Logic queues with real clients (issue 28): a topic grows from 4 to 16 queues and back to 4 while
gRPC producers (grpcio with the apache.rocketmq.v2 stubs, FIFO message groups) and MQTT publishers
(aiomqtt, QoS 1) send, and a gRPC FIFO consumer and an MQTT subscriber consume. Nothing is lost or
delivered twice, no message group and no MQTT path is reordered, two messages of one group are never
in flight together, and every queue's offsets stay dense and increasing. Routes follow the change:
gRPC QueryRoute (READ for sealed queues), the 4.x route (readQueueNums / writeQueueNums), the read
API's queue listing (the Spark source's): sealed queues stay readable until retention empties them."""

from __future__ import annotations

import asyncio
import collections
import json

import aiomqtt
import grpc
import httpx
import pytest

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from analytics.client import ReadClient
from gateway.server import Gateway
from messaging_processor import ClientContext
from remoting import RequestCode, ResponseCode
from remoting.client import RemotingClient
from tests.adapters.grpc.support import MD, ack, msg, receive
from tests.support import running_gateway, wait_until

pytestmark = pytest.mark.timeout(180)

TOPIC = "lq"
GROUPS = 3  # gRPC FIFO message groups, one producer each
PATHS = 2  # MQTT publishers, one path each
PER_PRODUCER = 150
CTX = ClientContext("test", client_id="logic-queues-test")


@pytest.fixture
async def gw(tmp_path):
    async with running_gateway(
        str(tmp_path / "data"), ("grpc", "mqtt", "remoting", "http"), default_queues=4
    ) as g:
        yield g


def address(gw: Gateway, name: str) -> str:
    return next(a for a in gw.adapters if a.name == name).address


async def grpc_route(stub) -> list[tuple[int, int]]:
    r = await stub.QueryRoute(
        s.QueryRouteRequest(topic=d.Resource(name=TOPIC), endpoints=d.Endpoints()), metadata=MD
    )
    assert r.status.code == d.OK, r.status
    return sorted((q.id, q.permission) for q in r.message_queues)


async def remoting_route(gw: Gateway) -> tuple[int, int]:
    host, port = address(gw, "remoting").rsplit(":", 1)
    c = await RemotingClient.connect(host, int(port))
    try:
        r = await c.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
        assert r.code == ResponseCode.SUCCESS, r.remark
        (qd,) = json.loads(r.body)["queueDatas"]
        return qd["readQueueNums"], qd["writeQueueNums"]
    finally:
        await c.close()


async def test_topic_grows_and_shrinks_under_grpc_and_mqtt_load(gw):
    await gw.processor.create_topic(TOPIC, 4)
    http_url = f"http://{address(gw, 'http')}"
    mqtt_host, mqtt_port = address(gw, "mqtt").rsplit(":", 1)
    sent = 0
    grown, shrunk = asyncio.Event(), asyncio.Event()
    total = (GROUPS + 1) * PER_PRODUCER + PATHS * PER_PRODUCER  # (+1: a producer without groups)

    async def resizer() -> None:
        async with httpx.AsyncClient(base_url=http_url) as h:
            await wait_until(lambda: sent >= total // 3, timeout=60)
            r = await h.patch(f"/admin/topics/{TOPIC}", json={"queues": 16})
            assert r.status_code == 200, r.text
            assert (r.json()["queues"], r.json()["read_queues"]) == (16, 16)
            grown.set()
            await wait_until(lambda: sent >= 2 * total // 3, timeout=60)
            r = await h.patch(f"/admin/topics/{TOPIC}", json={"queues": 4})
            assert r.status_code == 200, r.text
            assert (r.json()["queues"], r.json()["read_queues"]) == (4, 16)
            shrunk.set()

    async def grpc_producer(stub, k: int) -> None:
        nonlocal sent
        for i in range(PER_PRODUCER):
            if k == GROUPS:  # normal messages: round robin over the writable queues
                m = msg(TOPIC, f"n:{i}".encode())
            else:
                m = msg(TOPIC, f"g{k}:{i}".encode(), message_group=f"grp-{k}", message_type=d.FIFO)
            r = await stub.SendMessage(s.SendMessageRequest(messages=[m]), metadata=MD)
            assert r.status.code == d.OK, r.status
            sent += 1

    async def mqtt_producer(k: int) -> None:
        nonlocal sent
        async with aiomqtt.Client(mqtt_host, int(mqtt_port), identifier=f"lq-pub-{k}") as c:
            for i in range(PER_PRODUCER):
                await c.publish(f"{TOPIC}/dev{k}", f"m{k}:{i}".encode(), qos=1)
                sent += 1

    grpc_got: list[str] = []
    mqtt_got: list[str] = []

    async def grpc_consumer(stub) -> None:
        while len(grpc_got) < total:
            st, got, _ = await receive(stub, "G-LQ", TOPIC, batch=16, poll_ms=1000, md=MD)
            assert st.code in (d.OK, d.MESSAGE_NOT_FOUND), st
            groups = [m.system_properties.message_group for m in got if m.system_properties.message_group]
            assert len(groups) == len(set(groups))  # never two of one group in flight
            grpc_got.extend(m.body.decode() for m in got)
            if got:
                r = await ack(stub, "G-LQ", TOPIC, *(m.system_properties.receipt_handle for m in got), md=MD)
                assert all(e.status.code == d.OK for e in r.entries)

    async with aiomqtt.Client(mqtt_host, int(mqtt_port), identifier="lq-sub", clean_session=True) as sub:
        await sub.subscribe(f"{TOPIC}/#", qos=1)

        async def mqtt_consumer() -> None:
            async for m in sub.messages:
                body = bytes(m.payload).decode()
                if body.startswith("m"):
                    mqtt_got.append(body)
                    if len(mqtt_got) == PATHS * PER_PRODUCER:
                        return

        async with grpc.aio.insecure_channel(address(gw, "grpc")) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            consumers = [asyncio.create_task(grpc_consumer(stub)), asyncio.create_task(mqtt_consumer())]
            await asyncio.gather(
                resizer(),
                *(grpc_producer(stub, k) for k in range(GROUPS + 1)),
                *(mqtt_producer(k) for k in range(PATHS)),
            )
            assert grown.is_set() and shrunk.is_set()
            # after the shrink: queues 4..15 are readable only while not yet drained (the fast
            # consumers may have drained the last ones already: they leave from the top)
            route = await grpc_route(stub)
            assert 4 <= len(route) <= 16 and [q for q, _ in route] == list(range(len(route)))
            assert {p for q, p in route if q < 4} == {d.READ_WRITE}
            assert {p for q, p in route if q >= 4} in ({d.READ}, set())
            await asyncio.wait_for(asyncio.gather(*consumers), 90)

            # nothing lost, nothing twice, no group and no path reordered
            assert len(grpc_got) == total and len(set(grpc_got)) == total
            per_key: dict[str, list[int]] = collections.defaultdict(list)
            for b in grpc_got:
                key, i = b.split(":")
                per_key[key].append(int(i))
            assert sorted(per_key.pop("n")) == list(range(PER_PRODUCER))  # no order across queues
            assert all(v == list(range(PER_PRODUCER)) for v in per_key.values()), per_key
            per_path: dict[str, list[int]] = collections.defaultdict(list)
            for b in mqtt_got:
                key, i = b.split(":")
                per_path[key].append(int(i))
            assert sorted(per_path) == [f"m{k}" for k in range(PATHS)]
            assert all(v == list(range(PER_PRODUCER)) for v in per_path.values())

            # every queue's offsets are dense and increasing; messages sat in all 16 queues
            used = 0
            for q in range(16):
                ms = await gw.processor.read(CTX, TOPIC, q, 0, max_messages=10_000)
                assert [m.queue_offset for m in ms] == list(range(len(ms)))
                used += bool(ms)
            assert used >= 8

            # consumed, the sealed queues stay listed for reading until retention empties them:
            # the read API (the Spark source) replays all of it
            assert (await remoting_route(gw))[1] == 4
            rc = ReadClient(http_url)
            listed = await asyncio.to_thread(rc.queues, TOPIC)
            assert sorted(listed) == list(range(16))
            assert sum(hi - lo for lo, hi in listed.values()) == total


async def test_sealed_queues_are_routed_read_only_until_drained(gw):
    """After a shrink: the 4.x route reads 8 and writes 2, gRPC lists
    the sealed queues READ, the read API (Spark) lists all 8; a 4.x send to a sealed queue id lands
    in a writable one."""
    await gw.processor.create_topic(TOPIC, 8)
    async with grpc.aio.insecure_channel(address(gw, "grpc")) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for i in range(32):
            r = await stub.SendMessage(s.SendMessageRequest(messages=[msg(TOPIC, b"x%d" % i)]), metadata=MD)
            assert r.status.code == d.OK
        async with httpx.AsyncClient(base_url=f"http://{address(gw, 'http')}") as h:
            r = await h.patch(f"/admin/topics/{TOPIC}", json={"queues": 2})
            assert r.status_code == 200, r.text
            r = await h.patch("/admin/topics/nope", json={"queues": 2})
            assert r.status_code == 404
        route = await grpc_route(stub)
        assert route == [(q, d.READ_WRITE if q < 2 else d.READ) for q in range(8)]
        assert await remoting_route(gw) == (8, 2)
        rc = ReadClient(f"http://{address(gw, 'http')}")
        listed = await asyncio.to_thread(rc.queues, TOPIC)  # (a blocking client)
        assert sorted(listed) == list(range(8)) and sum(hi for _lo, hi in listed.values()) == 32
        host, port = address(gw, "remoting").rsplit(":", 1)
        c = await RemotingClient.connect(host, int(port))
        try:
            r = await c.invoke(
                RequestCode.SEND_MESSAGE,
                {
                    "producerGroup": "PG",
                    "topic": TOPIC,
                    "queueId": "6",
                    "sysFlag": "0",
                    "bornTimestamp": "0",
                    "flag": "0",
                    "properties": "",
                    "reconsumeTimes": "0",
                },  # fmt: skip
                b"to-a-sealed-queue",
            )
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert int(r.ext_fields["queueId"]) in (0, 1)
        finally:
            await c.close()
