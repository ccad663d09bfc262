"""Message browser and dead-letter admin (issue 29): `GET /admin/topics/{t}/messages`,
`/admin/messages/{id}`, `/admin/messages?key=`, `/admin/dlq/{group}` and its redrive, through the
`gateway message|dlq ...` CLI run as a subprocess against an in-process gateway, with real AMQP
clients (pika publishes, aio-pika consumes).

An AMQP `nack(requeue=False)` follows RabbitMQ (the message goes to the queue's dead-letter
exchange, or is dropped), so the consumer here nacks with requeue=True: each is a new delivery
attempt, and past the queue group's `max_attempts` the store moves the message to `%DLQ%<group>`."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path

import aio_pika
import httpx
import pika
import pytest

from gateway import admin_client as ac
from gateway.server import Gateway
from messaging_processor import ClientContext, Message
from tests.support import T, running_gateway

pytestmark = pytest.mark.timeout(60)

GATEWAY_CLI = str(Path(sys.executable).parent / "gateway")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CTX = ClientContext("test", client_id="messages-admin-test")


@pytest.fixture
async def gw(tmp_path):
    async with running_gateway(str(tmp_path / "data"), ("amqp", "http")) as g:
        yield g


def address(gw: Gateway, name: str) -> str:
    return next(a for a in gw.adapters if a.name == name).address


def http_url(gw: Gateway) -> str:
    return f"http://{address(gw, 'http')}"


async def cli(gw: Gateway, *args: str) -> tuple[int, str, str]:
    """Run `gateway ARGS --url <the gateway>` as a subprocess: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        GATEWAY_CLI,
        *args,
        "--url",
        http_url(gw),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), T)
    return proc.returncode or 0, out.decode(), err.decode()


async def cli_json(gw: Gateway, *args: str):
    rc, out, err = await cli(gw, *args, "--json")
    assert rc == 0, err
    return json.loads(out)


def pika_publish(port: int, queue: str, body: bytes, headers: dict[str, str]) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, socket_timeout=T))
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", queue, body, pika.BasicProperties(headers=headers), mandatory=True)
    finally:
        conn.close()


async def dead_letters(http: httpx.AsyncClient, group: str) -> list[dict]:
    r = await http.get(f"/admin/dlq/{group}")
    assert r.status_code == 200, r.text
    return r.json()


async def test_amqp_dead_letter_listed_redriven_once_and_received_again(gw):
    amqp_port = int(address(gw, "amqp").rsplit(":", 1)[1])
    queue = "orders-dlq-test"
    await asyncio.to_thread(pika_publish, amqp_port, queue, b"order 1", {"traceparent": TRACEPARENT})
    async with httpx.AsyncClient(base_url=http_url(gw), timeout=T) as http:
        r = await http.post("/admin/groups", json={"name": queue, "max_attempts": 2})  # the queue's group
        assert r.status_code == 200 and r.json()["max_attempts"] == 2

        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/", timeout=T)
        try:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=1)
            q = await ch.get_queue(queue)
            deliveries = 0

            async def nack_max_attempts() -> None:
                nonlocal deliveries
                async with q.iterator() as it:
                    async for msg in it:
                        deliveries += 1
                        await msg.nack(requeue=True)
                        if deliveries == 2:  # max_attempts: the store moves it on its next pop
                            return

            await asyncio.wait_for(nack_max_attempts(), T)
            deadline = asyncio.get_running_loop().time() + T
            while not await dead_letters(http, queue):  # (the move happens in the store's pop loop)
                assert asyncio.get_running_loop().time() < deadline, "not dead-lettered in time"
                await asyncio.sleep(0.05)
        finally:
            await conn.close()
        assert deliveries == 2  # max_attempts deliveries, then the store moved it

        rc, out, err = await cli(gw, "dlq", "list", queue)
        assert rc == 0, err
        assert "order 1" not in out and queue in out and "max attempts reached" in out
        [dead] = await cli_json(gw, "dlq", "list", queue)
        assert dead["original_topic"] == queue and dead["redriven"] is False and dead["attempts"] == 2
        assert dead["body"] == "order 1" and dead["properties"]["traceparent"] == TRACEPARENT

        out = await cli_json(gw, "dlq", "redrive", queue)
        assert out["redriven"] == 1 and out["ids"] == [dead["id"]]
        again = await cli_json(gw, "dlq", "redrive", queue, "--ids", dead["id"])
        assert again["redriven"] == 0  # marked: a second redrive does not send it twice
        [listed] = await cli_json(gw, "dlq", "list", queue)
        assert listed["redriven"] is True and listed["redriven_id"] == out["new_ids"][0]
        assert await cli_json(gw, "dlq", "list", queue, "--pending") == []

        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port}/", timeout=T)
        try:
            ch = await conn.channel()
            q = await ch.get_queue(queue)
            msg = await q.get(timeout=T, fail=False)
            for _ in range(100):  # the redriven copy is stored: poll until the queue hands it out
                if msg is not None:
                    break
                await asyncio.sleep(0.05)
                msg = await q.get(timeout=T, fail=False)
            assert msg is not None, "the redriven message never arrived"
            assert msg.body == b"order 1" and msg.headers.get("traceparent") == TRACEPARENT
            await msg.ack()
            assert await q.get(timeout=T, fail=False) is None  # sent once
        finally:
            await conn.close()

        [stored] = (await http.get(f"/admin/messages/{out['new_ids'][0]}")).json()
        assert stored["topic"] == queue
        assert not {"ORIGIN_TOPIC", "DLQ_REASON", "RECONSUME_TIMES"} & set(stored["properties"])

    # the trace (helper T's endpoint) rendered by `gateway message trace`: every hop, as a timeline
    rc, out, err = await cli(gw, "message", "trace", dead["id"])
    assert rc == 0, err
    events = [ln.split()[2] for ln in out.split("\n\n", 1)[1].splitlines()[1:]]
    assert events[:2] == ["received", "stored"] and events.count("delivered") == 2
    assert events[-1] == "redriven", out
    assert TRACEPARENT in out.splitlines()[0]


async def test_message_get_and_find_through_the_cli(gw):
    p = gw.processor
    await p.create_topic("browse", queues=2)
    bodies = [b"plain text", json.dumps({"n": 1}).encode(), bytes([0xFF, 0x00, 0x80])]
    for i, body in enumerate(bodies):
        await p.send(CTX, [Message("browse", body, tag="t", keys=(f"k{i}",), queue_id=i % 2)])

    listed = await cli_json(gw, "message", "get", "browse")
    assert sorted(base64.b64decode(m["body_base64"]) for m in listed) == sorted(bodies)
    assert {m["body"] for m in listed} == {"plain text", '{"n": 1}', None}  # not UTF-8: null
    q0 = await cli_json(gw, "message", "get", "browse", "--queue", "0", "--offset", "1")
    assert [m["keys"] for m in q0] == [["k2"]] and q0[0]["queue"] == 0 and q0[0]["offset"] == 1
    assert len(await cli_json(gw, "message", "get", "browse", "--count", "1")) == 1

    rc, out, _ = await cli(gw, "message", "get", "browse", "--queue", "0", "--offset", "1", "--format", "hex")
    assert rc == 0 and "ff 00 80" in out and "k2" in out
    rc, out, _ = await cli(gw, "message", "get", "browse", "--queue", "1", "--format", "json")
    assert rc == 0 and '"n": 1' in out

    [found] = await cli_json(gw, "message", "find", "--key", "k0")
    assert found["body"] == "plain text" and found["tag"] == "t"
    rc, out, _ = await cli(gw, "message", "find", "--key", "k0")
    assert rc == 0 and "plain text" in out and found["id"] in out
    assert await cli_json(gw, "message", "find", "--key", "nothing") == []
    [by_id] = await cli_json(gw, "message", "find", "--id", found["id"])
    assert by_id == found

    rc, _, err = await cli(gw, "message", "find", "--id", "0" * 32)
    assert rc == 1 and "404" in err
    rc, _, err = await cli(gw, "message", "get", "no-such-topic")
    assert rc == 1 and "404" in err


async def test_long_redrive_goes_in_chunks_with_a_progress_bar(gw):
    p = gw.processor
    n = 250
    await p.create_topic("bulk", queues=1)
    await p.create_group("bulk-workers", max_attempts=16)
    await p.send(CTX, [Message("bulk", f"m{i}".encode()) for i in range(n)])
    moved = 0
    while moved < n:
        for d in await p.pop(CTX, "bulk-workers", "bulk", max_messages=32):
            await p.forward_to_dlq(CTX, d.receipt_handle, "test")
            moved += 1
    async with httpx.AsyncClient(base_url=http_url(gw), timeout=T) as http:
        assert len((await http.get("/admin/dlq/bulk-workers", params={"count": 1000})).json()) == n

    rc, out, err = await cli(gw, "dlq", "redrive", "bulk-workers")
    assert rc == 0, err
    assert out.strip() == f"redrove {n} dead letter(s) of bulk-workers"
    bars = [b for b in err.split("\r") if b.strip()]
    assert bars[0].startswith("[....") and bars[0].endswith(f"] 0/{n}")
    assert "] 100/250" in err and "] 200/250" in err
    assert bars[-1].strip() == ac.progress_bar(n, n)
    assert (await p.get_topic("bulk")).messages == 2 * n  # each dead letter sent back once
    rc, out, _ = await cli(gw, "dlq", "redrive", "bulk-workers", "--json")
    assert rc == 0 and json.loads(out)["redriven"] == 0
    assert (await p.get_topic("bulk")).messages == 2 * n


async def test_errors_and_openapi(gw):
    async with httpx.AsyncClient(base_url=http_url(gw), timeout=T) as http:
        r = await http.get("/admin/dlq/no-such-group")
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
        r = await http.post("/admin/dlq/no-such-group/redrive", json={})
        assert r.status_code == 404
        r = await http.get("/admin/messages")
        assert r.status_code == 400  # key is required
        await gw.processor.create_group("quiet", max_attempts=3)
        assert (await http.get("/admin/dlq/quiet")).json() == []  # a group without dead letters
        r = await http.post("/admin/dlq/quiet/redrive", json={"ids": ["0" * 32]})
        assert r.json() == {"redriven": 0, "ids": [], "new_ids": []}
        p = gw.processor
        await p.create_topic("quiet-topic", queues=1)
        await p.send(CTX, [Message("quiet-topic", b"a"), Message("quiet-topic", b"b")])
        for d in await p.pop(CTX, "quiet", "quiet-topic", max_messages=2):
            await p.forward_to_dlq(CTX, d.receipt_handle, "test")
        r = await http.post("/admin/dlq/quiet/redrive", json={})  # no ids: every pending one
        assert r.status_code == 200 and r.json()["redriven"] == 2
        assert (await http.post("/admin/dlq/quiet/redrive")).json()["redriven"] == 0
        assert [d["reason"] for d in await dead_letters(http, "quiet")] == ["test", "test"]
        paths = (await http.get("/openapi.json")).json()["paths"]
    for path in (
        "/admin/topics/{topic}/messages",
        "/admin/messages",
        "/admin/messages/{message_id}",
        "/admin/dlq/{group}",
        "/admin/dlq/{group}/redrive",
    ):
        assert path in paths, path
    assert "200" in paths["/admin/dlq/{group}/redrive"]["post"]["responses"]


# A trace as GET /admin/messages/{id}/trace answers it (recorded; the events out of order on purpose).
TRACE_SAMPLE = {
    "message_id": "7F0000010001ABCD",
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    "traceparent": TRACEPARENT,
    "topic": "orders",
    "events": [
        {"event": "delivered", "time": 1_700_000_000_250, "protocol": "amqp", "client_id": "c-amqp",
         "user": None, "group": "billing", "queue_id": 0, "offset": 7, "attempt": 1, "detail": None},
        {"event": "received", "time": 1_700_000_000_100, "protocol": "mqtt", "client_id": "dev-1",
         "user": "alice", "group": None, "queue_id": None, "offset": None, "attempt": None, "detail": None},
        {"event": "stored", "time": 1_700_000_000_120, "protocol": "mqtt", "client_id": "dev-1",
         "user": "alice", "group": None, "queue_id": 0, "offset": 7, "attempt": None, "detail": None},
        {"event": "acked", "time": 1_700_000_000_300, "protocol": "amqp", "client_id": "c-amqp",
         "user": None, "group": "billing", "queue_id": 0, "offset": 7, "attempt": None, "detail": "ok"},
    ],
}  # fmt: skip


def test_trace_renders_as_a_timeline():
    text = ac.render_trace(TRACE_SAMPLE)
    head, _, timeline = text.partition("\n\n")
    assert TRACE_SAMPLE["trace_id"] in head and "orders" in head
    lines = timeline.splitlines()
    assert lines[0].split() == ["TIME", "EVENT", "PROTOCOL", "CLIENT", "GROUP", "ATTEMPT", "DETAIL"]
    assert [ln.split()[2] for ln in lines[1:]] == ["received", "stored", "delivered", "acked"]  # by time
    assert lines[1].split()[3:] == ["mqtt", "dev-1", "-", "-", "-"]
    assert lines[3].split()[3:] == ["amqp", "c-amqp", "billing", "1", "-"]
    assert lines[1].split()[1] == "22:13:20.100"  # UTC, with milliseconds


def test_body_formats_and_progress_bar():
    def m(raw: bytes) -> dict:
        try:
            text: str | None = raw.decode()
        except UnicodeDecodeError:
            text = None
        return {"body": text, "body_base64": base64.b64encode(raw).decode()}

    assert ac.render_body(m(b'{"a":[1,2]}'), "json") == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert ac.render_body(m(b"not json"), "json") == "not json"
    assert ac.render_body(m(b"AB"), "hex") == "41 42"
    assert ac.render_body(m(b"\xff\x01"), "text") == "ff 01"  # not text: hex
    assert ac.progress_bar(300, 1000, width=10) == "[###.......] 300/1000"
    assert ac.progress_bar(0, 0, width=4) == "[####] 0/0"
