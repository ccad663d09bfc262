"""POST /topics/{topic}/events on a running gateway: the three content modes round-trip (checked
with the cloudevents SDK), every invalid case gets its status, idempotency."""

from __future__ import annotations

import base64
import json

import pytest
from cloudevents.core.bindings.http import (
    HTTPMessage,
    from_structured_event,
    to_binary_event,
    to_structured_event,
)
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from adapters.cloudevents.codec import BATCH, STRUCTURED
from adapters.cloudevents.ingest import request_limit
from tests.adapters.cloudevents.support import MAX_BODY, close_gateway, open_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")
BIN = {"ce-specversion": "1.0", "ce-id": "e-1", "ce-source": "/src", "ce-type": "io.example.t"}
MIN = {"specversion": "1.0", "id": "e-1", "source": "/src", "type": "io.example.t"}
PROBLEM = "application/problem+json"


def sdk_event(i: int, data=None, **attrs) -> CloudEvent:
    base = {"type": "io.example.order", "source": "/shop/eu", "id": f"ev-{i}", "subject": f"order €{i}"}
    return CloudEvent({**base, **attrs}, data)


async def pop_all(env, group: str = "reader", n: int = 16) -> list[dict]:
    r = await env.client.post(
        f"/topics/{env.topic}/subscriptions/{group}/pop", json={"max_events": n, "wait_ms": 2000}
    )
    assert r.status_code == 200 and r.headers["content-type"] == BATCH
    return r.json()


def sdk_parse(obj: dict) -> CloudEvent:
    obj = {k: v for k, v in obj.items() if k != "receipthandle"}
    return from_structured_event(HTTPMessage({"content-type": STRUCTURED}, json.dumps(obj).encode()))


def same(a: CloudEvent, b: CloudEvent) -> None:
    """`a` came back exactly as `b` was sent: an event sent without a `traceparent` gets none from
    the gateway (issue 47), one sent with it keeps it."""
    got, sent = dict(a.get_attributes()), b.get_attributes()
    assert got == sent
    assert a.get_data() == b.get_data()


async def test_binary_mode_round_trips(env):
    sent = [
        sdk_event(1, {"total": 12.5, "items": ["a", "b"]}, datacontenttype="application/json"),
        sdk_event(2, b"\x00\x01binary\xff", datacontenttype="application/octet-stream", tenant="acme"),
        sdk_event(3, "plain text", datacontenttype="text/plain; charset=utf-8"),
        sdk_event(4, b"traced", traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        sdk_event(5, b"odd", traceparent="not-a-trace-context"),  # (kept as sent, too)
    ]
    for ev in sent:
        msg = to_binary_event(ev)
        r = await env.client.post(env.url, headers=msg.headers, content=msg.body)
        assert r.status_code == 202, r.text
        assert r.content == b""
    got = {e["id"]: sdk_parse(e) for e in await pop_all(env)}
    for ev in sent:
        same(got[ev.get_id()], ev)
    assert got["ev-2"].get_extension("tenant") == "acme"


async def test_structured_mode_round_trips_with_typed_extensions(env):
    ev = sdk_event(
        1, {"k": [1, 2]}, datacontenttype="application/json", count=42, flag=True, dataschema="https://s/x"
    )
    msg = to_structured_event(ev)
    r = await env.client.post(
        env.url, headers={**msg.headers, "ce-id": "ignored-in-structured-mode"}, content=msg.body
    )
    assert r.status_code == 202, r.text
    (out,) = await pop_all(env)
    assert out["count"] == 42 and out["flag"] is True  # JSON types survive the store
    same(sdk_parse(out), ev)


async def test_batched_mode_round_trips(env):
    sent = [sdk_event(i, {"n": i}) for i in range(5)] + [sdk_event(9, b"\x01\x02")]
    body = json.dumps([json.loads(JSONFormat().write(e)) for e in sent])
    r = await env.client.post(env.url, headers={"content-type": BATCH}, content=body)
    assert r.status_code == 202, r.text
    got = {e["id"]: sdk_parse(e) for e in await pop_all(env)}
    assert set(got) == {e.get_id() for e in sent}
    for ev in sent:
        same(got[ev.get_id()], ev)
    r = await env.client.post(env.url, headers={"content-type": BATCH}, content=b"[]")
    assert r.status_code == 202


async def test_charset_and_percent_encoding_are_kept(env):
    hdrs = {**BIN, "ce-subject": "Euro%20%E2%82%AC", "content-type": "application/json; charset=utf-8"}
    assert (await env.client.post(env.url, headers=hdrs, content=b"{}")).status_code == 202
    (out,) = await pop_all(env)
    assert out["subject"] == "Euro €"
    assert out["datacontenttype"] == "application/json; charset=utf-8"


def binary(**override):
    h = {**BIN, "content-type": "application/json"}
    for k, v in override.items():
        name = "ce-" + k if k != "content_type" else "content-type"
        if v is None:
            h.pop(name, None)
        else:
            h[name] = v
    return h


INVALID_BINARY = {
    "missing specversion": binary(specversion=None),
    "missing id": binary(id=None),
    "empty id": binary(id=""),
    "missing source": binary(source=None),
    "empty type": binary(type=""),
    "specversion 0.9": binary(specversion="0.9"),
    "specversion 2.0": binary(specversion="2.0"),
    "time lunchtime": binary(time="lunchtime"),
    "time to the minute": binary(time="2018-04-05T18:31Z"),
    "time offset +25:00": binary(time="2018-04-05T18:31:00%2B25:00"),
    "time offset +05": binary(time="2018-04-05T18:31:00+05"),
    "extension my-ext": binary(**{"my-ext": "x"}),
    "invalid percent-encoding": binary(subject="100%"),
    "overlong UTF-8": binary(subject="%C0%A0"),
    "ce-datacontenttype": binary(datacontenttype="application/json"),
}


@pytest.mark.parametrize("headers", INVALID_BINARY.values(), ids=INVALID_BINARY.keys())
async def test_invalid_binary_events_get_400(env, headers):
    r = await env.client.post(env.url, headers=headers, content=b"{}")
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["status"] == 400 and body["kind"] == "invalid_event" and body["errors"]


INVALID_JSON = {
    "malformed JSON": (STRUCTURED, b'{"specversion": "1.0",'),
    "not an object": (STRUCTURED, b'"text"'),
    "extension MyExtension": (STRUCTURED, json.dumps({**MIN, "MyExtension": "x"}).encode()),
    "extension my.extension": (STRUCTURED, json.dumps({**MIN, "my.extension": "x"}).encode()),
    "data and data_base64": (STRUCTURED, json.dumps({**MIN, "data": "a", "data_base64": "YQ=="}).encode()),
    "bad time": (STRUCTURED, json.dumps({**MIN, "time": "2018-04-05T18:31:00X"}).encode()),
    "bad datacontenttype": (STRUCTURED, json.dumps({**MIN, "datacontenttype": "xyz"}).encode()),
    "batch not an array": (BATCH, json.dumps(MIN).encode()),
    "batch mixed specversions": (BATCH, json.dumps([MIN, {**MIN, "specversion": "0.3"}]).encode()),
    "batch invalid member": (BATCH, json.dumps([MIN, {**MIN, "id": ""}]).encode()),
    "batch non-object member": (BATCH, json.dumps([MIN, 1]).encode()),
}


@pytest.mark.parametrize(("ct", "body"), INVALID_JSON.values(), ids=INVALID_JSON.keys())
async def test_invalid_json_events_get_400(env, ct, body):
    r = await env.client.post(env.url, headers={"content-type": ct}, content=body)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith(PROBLEM)


async def test_nothing_of_an_invalid_batch_is_stored(env):
    r = await env.client.post(
        env.url, headers={"content-type": BATCH}, content=json.dumps([MIN, {**MIN, "type": ""}])
    )
    assert r.status_code == 400
    assert [p["index"] for p in r.json()["errors"]] == [1]
    assert (await env.p.get_topic(env.topic)).messages == 0


@pytest.mark.parametrize("ct", ["application/cloudevents+avro", "application/cloudevents+xml; charset=utf-8"])
async def test_unknown_event_format_gets_415(env, ct):
    r = await env.client.post(env.url, headers={"content-type": ct}, content=b"<event/>")
    assert r.status_code == 415
    assert r.json()["kind"] == "unsupported_format"


async def test_size_limits(env):
    r = await env.client.post(
        env.url, headers=binary(content_type="application/octet-stream"), content=b"x" * MAX_BODY
    )
    assert r.status_code == 202, r.text  # a 64 KiB event is accepted
    b64 = json.dumps({**MIN, "data_base64": base64.b64encode(b"y" * MAX_BODY).decode()})
    r = await env.client.post(env.url, headers={"content-type": STRUCTURED}, content=b64)
    assert r.status_code == 202, r.text  # ... in structured mode too
    r = await env.client.post(env.url, headers=binary(), content=b"x" * (MAX_BODY + 1))
    assert r.status_code == 413 and r.json()["kind"] == "body_too_large"  # data over max_body_size
    r = await env.client.post(env.url, headers=binary(), content=b"x" * (request_limit(MAX_BODY) + 1))
    assert r.status_code == 413  # request over the limit, refused before reading

    async def chunked():
        for _ in range(3):
            yield b"x" * MAX_BODY

    r = await env.client.post(env.url, headers=binary(), content=chunked())
    assert r.status_code == 413  # no Content-Length: counted while streaming
    many = json.dumps([{**MIN, "id": str(i)} for i in range(1025)])
    r = await env.client.post(env.url, headers={"content-type": BATCH}, content=many)
    assert r.status_code == 413  # more events than one processor send takes
    assert (await env.p.get_topic(env.topic)).messages == 2


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
async def test_other_methods_get_405_with_allow(env, method):
    r = await env.client.request(method, env.url)
    assert r.status_code == 405
    assert r.headers["allow"] == "POST, OPTIONS"


async def test_webhook_handshake_is_answered(env):
    r = await env.client.options(env.url, headers={"WebHook-Request-Origin": "sender.example.com"})
    assert r.status_code == 200
    assert r.headers["webhook-allowed-origin"] == "sender.example.com"
    assert r.headers["webhook-allowed-rate"] == "*"
    assert "POST" in r.headers["allow"]
    r = await env.client.options(env.url)
    assert r.status_code == 405 and r.headers["allow"] == "POST, OPTIONS"


async def test_unknown_topic_gets_404_unless_auto_create(env):
    url = f"/topics/{env.topic}x/events"
    r = await env.client.post(url, headers=binary(), content=b"{}")
    assert r.status_code == 404 and r.json()["kind"] == "topic_not_found"
    r = await env.client.post(url, headers={"content-type": BATCH}, content=b"[]")
    assert r.status_code == 404
    env.p.auto_create_topics = True
    r = await env.client.post(url, headers=binary(), content=b"{}")
    assert r.status_code == 202
    assert (await env.p.get_topic(env.topic + "x")).messages == 1


async def test_illegal_topic_names_get_400(env):
    r = await env.client.post("/topics/%25DLQ%25x/events", headers=binary(), content=b"{}")
    assert r.status_code == 400


async def test_idempotency_on_source_and_id(tmp_path):
    env = await open_gateway(str(tmp_path / "d"), protocols=("http",), cloudevents_dedup_window_s=60)
    env.topic, env.url = "orders", "/topics/orders/events"
    try:
        await env.p.create_topic("orders")
        ev = json.dumps({**MIN, "data": 1})
        for _ in range(2):
            r = await env.client.post(env.url, headers={"content-type": STRUCTURED}, content=ev)
            assert r.status_code == 202
        batch = [MIN, {**MIN, "id": "e-2"}, {**MIN, "id": "e-2"}, {**MIN, "source": "/other"}]
        r = await env.client.post(env.url, headers={"content-type": BATCH}, content=json.dumps(batch))
        assert r.status_code == 202
        got = sorted((e["source"], e["id"]) for e in await pop_all(env))
        assert got == [("/other", "e-1"), ("/src", "e-1"), ("/src", "e-2")]
    finally:
        await close_gateway(env)
    env = await open_gateway(str(tmp_path / "d"), protocols=("http",), cloudevents_dedup_window_s=60)
    env.topic, env.url = "orders", "/topics/orders/events"
    try:  # the records survive a restart
        r = await env.client.post(env.url, headers=binary(id="e-2"), content=b"{}")
        assert r.status_code == 202
        assert (await env.p.get_topic(env.topic)).messages == 3
    finally:
        await close_gateway(env)


async def test_openapi_documents_the_cloudevents_api(env):
    spec = (await env.client.get("/openapi.json")).json()
    paths = spec["paths"]
    ingest = paths["/topics/{topic}/events"]
    assert set(ingest) >= {"post", "options"}
    assert set(ingest["post"]["requestBody"]["content"]) == {STRUCTURED, BATCH, "*/*"}
    assert {"202", "400", "404", "405", "413", "415"} <= set(ingest["post"]["responses"])
    for p in ("pop", "ack", "nack"):
        assert "post" in paths[f"/topics/{{topic}}/subscriptions/{{group}}/{p}"]
    assert set(paths["/subscriptions"]) == {"get", "post"}
    assert set(paths["/subscriptions/{sid}"]) == {"get", "delete"}
    schemas = set(spec["components"]["schemas"])
    refs = set()

    def collect(node):
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.add(node["$ref"])
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    collect(spec)
    assert refs and all(r.startswith("#/components/schemas/") and r.split("/")[-1] in schemas for r in refs)
    assert {"SubscriptionIn", "DeliverySpec"} <= schemas and any(s.startswith("FilterSpec") for s in schemas)


async def test_credentials_reach_the_processor_authorizer(env):
    seen = []

    def authorizer(identity, action, resource):
        seen.append((identity.mechanism, identity.username, identity.secret, action.value))
        return identity.secret == "s3cret"

    env.p.authorizer = authorizer
    try:
        r = await env.client.post(env.url, headers=binary(), content=b"{}")
        assert r.status_code == 403 and r.json()["kind"] == "forbidden"
        bearer = {**binary(), "Authorization": "Bearer s3cret"}
        r = await env.client.post(env.url, headers=bearer, content=b"{}")
        assert r.status_code == 202
        r = await env.client.post(env.url + "?access_token=s3cret", headers=binary(), content=b"{}")
        assert r.status_code == 202
        r = await env.client.post(env.url, headers=binary(), content=b"{}", auth=("alice", "s3cret"))
        assert r.status_code == 202
        sub = {"topic": env.topic, "sink": "http://127.0.0.1:9/x"}
        assert (await env.client.post("/subscriptions", json=sub)).status_code == 403
    finally:
        env.p.authorizer = None
    assert seen[:4] == [
        ("none", None, None, "publish"),
        ("bearer", None, "s3cret", "publish"),
        ("bearer", None, "s3cret", "publish"),
        ("plain", "alice", "s3cret", "publish"),
    ]
