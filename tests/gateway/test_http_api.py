"""The HTTP port served on a real socket in this process: health, metrics, admin API, drain."""

from __future__ import annotations

import asyncio
import re
import socket
from types import SimpleNamespace

import httpx
import pytest
from fastapi import APIRouter

from gateway.config import Settings
from gateway.http import HttpAdapter, create_app
from gateway.http.metrics import escape_label, quantile
from gateway.server import Gateway
from messaging_processor import (
    ClientContext,
    ClientInfo,
    ClientKind,
    ErrorKind,
    Message,
    ProcessorError,
    RetryPolicy,
)

CTX = ClientContext(protocol="test", client_id="t1")
PROBLEM = "application/problem+json"

extra = APIRouter()


@extra.get("/extra/hello")
async def hello() -> dict:
    return {"hello": "world"}


@extra.get("/extra/fail/{kind}")
async def fail(kind: str) -> dict:
    raise ProcessorError(ErrorKind(kind), f"failing with {kind}")


@pytest.fixture
async def gw(tmp_path):
    # no message trace: the store counters some tests read count their own appends only (the trace
    # appends records of its own, in the background)
    settings = Settings(
        data_dir=str(tmp_path / "data"), flush="async", protocols="http", http_port=0, trace_retention="0"
    )
    gateway = Gateway(settings, extra_routers=[extra])
    await gateway.start()
    try:
        (http,) = gateway.adapters
        async with httpx.AsyncClient(base_url=f"http://{http.address}", timeout=10) as client:
            yield SimpleNamespace(client=client, p=gateway.processor, gateway=gateway, http=http)
    finally:
        await gateway.stop()


def assert_problem(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["status"] == status
    assert body["kind"] == kind
    assert body["detail"]
    return body


async def send(p, topic: str, n: int) -> None:
    await p.send(CTX, [Message(topic=topic, body=b"m%d" % i) for i in range(n)])


# ----------------------------------------------------------------------------- health
async def test_healthz_lists_listeners(gw):
    r = await gw.client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "listeners": {"http": gw.http.address}, "down": []}
    assert re.fullmatch(r"127\.0\.0\.1:\d+", gw.http.address) and not gw.http.address.endswith(":0")


class FakeListener:
    def __init__(self, name: str, listening: bool) -> None:
        self.name, self.listening, self.address = name, listening, f"127.0.0.1:{len(name)}"

    async def start(self) -> None: ...

    async def stop(self, grace: float) -> None: ...


async def test_healthz_is_503_when_a_listener_is_down(gw):
    listeners = [FakeListener("grpc", True), FakeListener("mqtt", False)]
    app = create_app(gw.p, listeners=lambda: listeners)
    http = HttpAdapter(app, "127.0.0.1", 0)
    await http.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://{http.address}") as c:
            r = await c.get("/healthz")
            assert r.status_code == 503
            assert r.json()["status"] == "unavailable"
            assert r.json()["down"] == ["mqtt"]
            assert r.json()["listeners"] == {"grpc": "127.0.0.1:4", "mqtt": "127.0.0.1:4"}
            listeners[1].listening = True
            assert (await c.get("/healthz")).status_code == 200
    finally:
        await http.stop(1)


# ----------------------------------------------------------------------------- topics
async def test_topic_create_list_get_delete(gw):
    c = gw.client
    r = await c.post("/admin/topics", json={"name": "orders", "queues": 3, "retention_ms": 60000})
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/admin/topics/orders"
    assert r.json() == {
        "name": "orders",
        "queues": 3,
        "queues_per_store": 3,
        "retention_ms": 60000,
        "retention_bytes": None,
        "compacted": False,
        "messages": 0,
        "read_queues": 3,
    }
    r = await c.post("/admin/topics", json={"name": "plain"})
    assert r.status_code == 201 and r.json()["queues"] == 8  # default_queues

    await send(gw.p, "orders", 5)
    r = await c.get("/admin/topics")
    assert r.status_code == 200
    by_name = {t["name"]: t for t in r.json()}
    assert set(by_name) == {"orders", "plain"}
    assert by_name["orders"]["messages"] == 5

    r = await c.get("/admin/topics/orders")
    assert r.status_code == 200
    detail = r.json()
    assert detail["messages"] == 5 and detail["queues"] == 3
    assert [q["queue_id"] for q in detail["queue_offsets"]] == [0, 1, 2]
    assert sum(q["max_offset"] - q["min_offset"] for q in detail["queue_offsets"]) == 5
    assert detail["groups"] == {}

    # A group that consumed the topic shows its backlog and in-flight count.
    popped = await gw.p.pop(CTX, "billing", "orders", max_messages=2)
    assert len(popped) == 2
    await gw.p.ack(CTX, popped[0].receipt_handle)
    detail = (await c.get("/admin/topics/orders")).json()
    assert detail["groups"] == {"billing": {"backlog": 4, "inflight": 1}}

    r = await c.delete("/admin/topics/orders")
    assert r.status_code == 204 and r.content == b""
    assert_problem(await c.get("/admin/topics/orders"), 404, "topic_not_found")
    assert_problem(await c.delete("/admin/topics/orders"), 404, "topic_not_found")
    assert [t["name"] for t in (await c.get("/admin/topics")).json()] == ["plain"]


async def test_topic_create_is_an_upsert_that_never_removes_queues(gw):
    c = gw.client
    assert (await c.post("/admin/topics", json={"name": "t", "queues": 2})).status_code == 201
    r = await c.post("/admin/topics", json={"name": "t", "queues": 4, "retention_bytes": 1 << 20})
    assert r.status_code == 200
    assert (r.json()["queues"], r.json()["retention_bytes"]) == (4, 1 << 20)
    r = await c.post("/admin/topics", json={"name": "t"})  # fields left out keep their value
    assert r.status_code == 200
    assert (r.json()["queues"], r.json()["retention_bytes"]) == (4, 1 << 20)
    body = assert_problem(await c.post("/admin/topics", json={"name": "t", "queues": 1}), 409, "conflict")
    assert "does not remove queues" in body["detail"]
    assert (await c.get("/admin/topics/t")).json()["queues"] == 4


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"name": "has space"}, "illegal_topic"),
        ({"name": "%SYSTEM"}, "illegal_topic"),
        ({"name": "x" * 128}, "illegal_topic"),
        ({"name": ""}, "bad_request"),
        ({"queues": 2}, "bad_request"),
        ({"name": "t", "queues": 0}, "bad_request"),
        ({"name": "t", "queues": 2000}, "bad_request"),
        ({"name": "t", "retention_ms": -1}, "bad_request"),
    ],
)
async def test_topic_create_rejects_bad_requests_with_400(gw, body, kind):
    assert_problem(await gw.client.post("/admin/topics", json=body), 400, kind)
    assert (await gw.client.get("/admin/topics")).json() == []


async def test_non_json_body_is_400(gw):
    r = await gw.client.post(
        "/admin/topics", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_problem(r, 400, "bad_request")


# ----------------------------------------------------------------------------- groups
async def test_group_create_get_list_delete(gw):
    c = gw.client
    r = await c.post("/admin/groups", json={"name": "g1", "max_attempts": 2, "retry_initial_ms": 10})
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/admin/groups/g1"
    assert r.json() == {
        "name": "g1",
        "max_attempts": 2,
        "retry_initial_ms": 10,
        "retry_multiplier": 2.0,
        "retry_max_ms": 60000,
        "topics": {},
    }
    assert (await gw.p.get_group("g1")).max_attempts == 2  # really stored

    # Upsert: only the given fields change.
    r = await c.post("/admin/groups", json={"name": "g1", "max_attempts": 5})
    assert r.status_code == 200
    assert (r.json()["max_attempts"], r.json()["retry_initial_ms"]) == (5, 10)

    await gw.p.create_topic("t")
    await send(gw.p, "t", 3)
    assert len(await gw.p.pop(CTX, "g1", "t", max_messages=1)) == 1
    r = await c.get("/admin/groups/g1")
    assert r.status_code == 200
    assert r.json()["topics"] == {"t": {"backlog": 3, "inflight": 1}}
    r = await c.get("/admin/groups")
    assert [(g["name"], g["topics"]) for g in r.json()] == [("g1", {"t": {"backlog": 3, "inflight": 1}})]

    assert (await c.delete("/admin/groups/g1")).status_code == 204
    assert_problem(await c.get("/admin/groups/g1"), 404, "group_not_found")
    assert_problem(await c.delete("/admin/groups/g1"), 404, "group_not_found")


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"name": "bad name"}, "illegal_group"),
        ({"name": "g", "max_attempts": 0}, "bad_request"),
        ({"name": "g", "retry_multiplier": 0.5}, "bad_request"),
        ({"name": "g", "retry_initial_ms": -1}, "bad_request"),
        ({}, "bad_request"),
    ],
)
async def test_group_create_rejects_bad_requests_with_400(gw, body, kind):
    assert_problem(await gw.client.post("/admin/groups", json=body), 400, kind)
    assert (await gw.client.get("/admin/groups")).json() == []


async def test_small_max_attempts_sends_to_dlq(gw):
    # What other suites rely on: a group created through the API with max_attempts=1 dead-letters
    # a message after one failed delivery.
    r = await gw.client.post("/admin/groups", json={"name": "g", "max_attempts": 1, "retry_initial_ms": 0})
    assert r.status_code == 201
    await gw.p.create_topic("t", queues=1)
    await send(gw.p, "t", 1)
    (d,) = await gw.p.pop(CTX, "g", "t", max_messages=1)
    await gw.p.nack(CTX, d.receipt_handle)
    for _ in range(200):
        # The store moves an exhausted message to the DLQ when a pop finds it visible again.
        assert await gw.p.pop(CTX, "g", "t", max_messages=1) == []
        topics = {t["name"]: t for t in (await gw.client.get("/admin/topics")).json()}
        if topics.get("%DLQ%g", {}).get("messages") == 1:
            break
        await asyncio.sleep(0.02)
    assert topics["%DLQ%g"]["messages"] == 1


# ----------------------------------------------------------------------------- clients, errors, docs
async def test_clients_lists_the_registry(gw):
    assert (await gw.client.get("/admin/clients")).json() == []
    gw.p.clients.register(
        ClientInfo("c-1", "grpc", ClientKind.PRODUCER, topics=frozenset({"b", "a"}), remote="1.2.3.4:5")
    )
    gw.p.clients.register(ClientInfo("c-2", "mqtt", ClientKind.PUSH_CONSUMER, group="g"))
    r = await gw.client.get("/admin/clients")
    assert r.status_code == 200
    rows = {c["client_id"]: c for c in r.json()}
    assert set(rows) == {"c-1", "c-2"}
    assert (rows["c-1"]["protocol"], rows["c-1"]["kind"], rows["c-1"]["topics"]) == (
        "grpc",
        "producer",
        ["a", "b"],
    )
    assert rows["c-1"]["remote"] == "1.2.3.4:5"
    assert rows["c-2"]["group"] == "g"
    only = (await gw.client.get("/admin/clients", params={"protocol": "mqtt"})).json()
    assert [c["client_id"] for c in only] == ["c-2"]


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        ("store_full", 503),
        ("unavailable", 503),
        ("forbidden", 403),
        ("body_too_large", 413),
        ("too_many_requests", 429),
        ("internal", 500),
    ],
)
async def test_extra_routers_are_mounted_and_errors_map_to_status(gw, kind, status):
    assert (await gw.client.get("/extra/hello")).json() == {"hello": "world"}
    r = await gw.client.get(f"/extra/fail/{kind}")
    body = assert_problem(r, status, kind)
    assert body["detail"] == f"failing with {kind}"
    assert ("retry-after" in r.headers) == (status in (429, 503))


async def test_unknown_path_is_a_404_problem(gw):
    assert_problem(await gw.client.get("/nope"), 404, "not_found")


async def test_openapi_and_docs(gw):
    r = await gw.client.get("/openapi.json")
    assert r.status_code == 200
    paths = r.json()["paths"]
    for path in ("/healthz", "/metrics", "/admin/topics", "/admin/topics/{name}", "/admin/groups",
                 "/admin/groups/{name}", "/admin/clients"):  # fmt: skip
        assert path in paths, path
    assert set(paths["/admin/topics"]) == {"get", "post"}
    assert set(paths["/admin/topics/{name}"]) == {"get", "patch", "delete"}
    r = await gw.client.get("/docs")
    assert r.status_code == 200 and "swagger" in r.text.lower()


# ----------------------------------------------------------------------------- metrics
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    """Strict enough for the text format: every sample belongs to a family declared by a TYPE line
    before it (summaries and histograms: _count/_sum/_bucket), label sets well formed, values floats."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "summary", "histogram", "untyped")
            assert name not in types, f"family {name} declared twice"
            types[name] = kind
            continue
        m = SAMPLE.match(line)
        assert m, f"malformed sample line {line!r}"
        name, labels, value = m.groups()
        family = name if name in types else re.sub(r"_(count|sum|bucket)$", "", name)
        assert family in types, f"sample {name} has no TYPE"
        if family != name:
            assert types[family] in ("summary", "histogram")
        pairs = frozenset(LABEL.findall(labels or ""))
        if labels:
            assert labels == "{" + ",".join(f'{k}="{v}"' for k, v in LABEL.findall(labels)) + "}"
        key = (name, pairs)
        assert key not in samples, f"duplicate sample {line!r}"
        samples[key] = float(value)
    return samples


def val(samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


async def test_metrics_reflect_traffic(gw):
    p = gw.p
    await p.create_topic("t", queues=2)
    await p.create_group("g", max_attempts=5, retry=RetryPolicy(initial_ms=0, max_ms=0))
    p.clients.register(ClientInfo("prod-1", "test", ClientKind.PRODUCER))
    p.clients.register(ClientInfo("prod-2", "test", ClientKind.PRODUCER))

    r = await gw.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    before = parse_metrics(r.text)
    assert val(before, "gateway_store_appends_total") == 0
    assert not any(k[0] == "gateway_messages_in_total" for k in before)

    await send(p, "t", 3)
    got = await p.pop(CTX, "g", "t", max_messages=3)
    assert len(got) == 3
    await p.ack(CTX, got[0].receipt_handle)
    await p.ack(CTX, got[1].receipt_handle)
    await p.nack(CTX, got[2].receipt_handle)
    again = []
    for _ in range(200):  # the nacked message comes back (back-off 0) as attempt 2
        again = await p.pop(CTX, "g", "t", max_messages=1)
        if again:
            break
        await asyncio.sleep(0.01)
    assert again and again[0].delivery_attempt == 2
    await p.forward_to_dlq(CTX, again[0].receipt_handle)
    with pytest.raises(ProcessorError):
        await p.ack(CTX, "not-a-handle")

    s = parse_metrics((await gw.client.get("/metrics")).text)
    assert val(s, "gateway_messages_in_total", protocol="test", topic="t") == 3
    assert val(s, "gateway_messages_out_total", protocol="test", topic="t") == 4
    assert val(s, "gateway_pops_total", protocol="test") == 2
    assert val(s, "gateway_acks_total", protocol="test") == 2
    assert val(s, "gateway_nacks_total", protocol="test") == 1
    assert val(s, "gateway_redeliveries_total", protocol="test", topic="t") == 1
    assert val(s, "gateway_dlq_total", protocol="test", topic="%DLQ%g") == 1
    assert (
        val(s, "gateway_errors_total", protocol="test", operation="ack", kind="invalid_receipt_handle") == 1
    )
    assert val(s, "gateway_clients", protocol="test", kind="producer") == 2
    assert val(s, "gateway_listener_up", protocol="http") == 1
    assert val(s, "gateway_store_appends_total") == 4  # 3 sends + the DLQ copy
    assert val(s, "gateway_store_pops_total") == 4
    assert val(s, "gateway_store_acks_total") >= 2
    assert val(s, "gateway_store_dlq_total") == 1
    flushes = val(s, "gateway_store_flushes_total")
    assert flushes >= 1
    assert val(s, "gateway_store_flush_latency_seconds_count") == flushes
    qs = [val(s, "gateway_store_flush_latency_seconds", quantile=q) for q in ("0.5", "0.9", "0.99", "1.0")]
    assert all(x >= 0 for x in qs) and qs == sorted(qs)
    assert qs[-1] < 60


def test_metric_helpers():
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0
    assert quantile([5.0], 0.1) == 5.0


# ----------------------------------------------------------------------------- listener lifecycle
slow = APIRouter()


@slow.get("/slow")
async def slow_endpoint(seconds: float) -> dict:
    await asyncio.sleep(seconds)
    return {"slept": seconds}


async def serve_slow_app(gw) -> HttpAdapter:
    http = HttpAdapter(create_app(gw.p, [slow]), "127.0.0.1", 0)
    await http.start()
    return http


def connect_refused(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


async def test_stop_drains_in_flight_requests(gw):
    http = await serve_slow_app(gw)
    async with httpx.AsyncClient(base_url=f"http://{http.address}", timeout=10) as c:
        request = asyncio.create_task(c.get("/slow", params={"seconds": 0.5}))
        while not http._server.server_state.tasks:  # the request reached the app
            await asyncio.sleep(0.01)
        stopping = asyncio.create_task(http.stop(5))
        while http.listening:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.15)  # uvicorn closes the listener on its next tick (0.1 s)
        assert connect_refused(http.address)  # no new connections while draining
        r = await request
        assert r.status_code == 200 and r.json() == {"slept": 0.5}
        await asyncio.wait_for(stopping, 5)


async def test_stop_gives_up_on_requests_after_grace(gw):
    http = await serve_slow_app(gw)
    async with httpx.AsyncClient(base_url=f"http://{http.address}", timeout=10) as c:
        request = asyncio.create_task(c.get("/slow", params={"seconds": 30}))
        while not http._server.server_state.tasks:
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await http.stop(0.3)
        assert loop.time() - t0 < 2.5
        # uvicorn cancels the handler: the client gets a 500 (or a closed connection), not a hang.
        try:
            r = await asyncio.wait_for(request, 2)
        except httpx.HTTPError:
            pass
        else:
            assert r.status_code == 500


async def test_busy_port_raises_oserror(gw):
    host, port = gw.http.address.rsplit(":", 1)
    other = HttpAdapter(create_app(gw.p), host, int(port))
    with pytest.raises(OSError):
        await other.start()
    assert not other.listening


async def test_a_fresh_gateway_prepares_its_first_commit_log_segment_at_start(gw):
    """The zero-filled first segment is written in the background at start, not by the first
    publish (which would otherwise wait for the whole segment)."""
    import asyncio
    import os

    store = gw.gateway.store
    t = store.commitlog._prealloc_thread
    assert t is not None
    await asyncio.to_thread(t.join, 30)
    first = os.path.join(store.commitlog.dir, f"{0:020d}")
    assert os.path.getsize(first) == store.config.segment_size
