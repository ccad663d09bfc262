"""Device shadows (issue 27, docs/shadows.md) through a real gateway: an MQTT device (aiomqtt, and
the raw codec client for exact PUBACK codes) and an HTTP client (httpx) on the same shadow; merge
patch, versions and conflicts over both; a restart keeps the shadow."""

from __future__ import annotations

import asyncio
import json

import aiomqtt
import httpx
import pytest

from adapters.mqtt.codec import encode_publish
from adapters.mqtt.codec.packets import Puback
from gateway.config import Settings
from gateway.server import Gateway
from messaging_processor import ClientContext
from messaging_processor.shadows import ShadowService, merge_patch
from tests.adapters.mqtt.support import Raw
from tests.support import T

CTX = ClientContext(protocol="test", client_id="t1")
PATCH = {"content-type": "application/merge-patch+json"}


def _settings(data_dir: str, **kw: object) -> Settings:
    return Settings(
        data_dir=data_dir,
        flush="async",
        protocols="http,mqtt",
        http_port=0,
        mqtt_port=0,
        segment_size_mib=1,
        max_body_size=500_000,
        amqp_max_body_size=500_000,
        **kw,
    )


class Gw:
    """A started gateway with an httpx client and its MQTT port."""

    def __init__(self, gateway: Gateway, http: httpx.AsyncClient, mqtt_port: int) -> None:
        self.gateway, self.http, self.mqtt_port = gateway, http, mqtt_port

    def device(self, name: str) -> aiomqtt.Client:
        return aiomqtt.Client(
            "127.0.0.1", self.mqtt_port, identifier=name, protocol=aiomqtt.ProtocolVersion.V5
        )


async def _start(data_dir: str) -> Gw:
    return await _start_with(_settings(data_dir))


async def _start_with(settings: Settings) -> Gw:
    gateway = Gateway(settings)
    await gateway.start()
    http = next(a for a in gateway.adapters if a.name == "http")
    mqtt = next(a for a in gateway.adapters if a.name == "mqtt")
    client = httpx.AsyncClient(base_url=f"http://{http.address}", timeout=30)
    return Gw(gateway, client, int(mqtt.address.rsplit(":", 1)[1]))


async def _stop(gw: Gw) -> None:
    await gw.http.aclose()
    await gw.gateway.stop()


@pytest.fixture
async def gw(tmp_path):
    g = await _start(str(tmp_path / "data"))
    try:
        r = await g.http.post("/admin/topics", json={"name": "devices", "queues": 2, "compacted": True})
        assert r.status_code == 201, r.text
        yield g
    finally:
        await _stop(g)


async def _next(client: aiomqtt.Client) -> aiomqtt.Message:
    async def first() -> aiomqtt.Message:
        async for m in client.messages:
            return m
        raise AssertionError("no message")

    return await asyncio.wait_for(first(), T)


async def test_an_mqtt_device_and_an_http_client_see_the_same_shadow(gw):
    async with gw.device("dev1") as dev:
        await dev.subscribe("devices/dev1/shadow/desired", qos=1)
        # the device reports; its PUBACK follows the update, so HTTP sees it at once
        await dev.publish(
            "devices/dev1/shadow/update", json.dumps({"state": {"reported": {"temp": 21}}}), qos=1
        )
        r = await gw.http.get("/shadows/devices/dev1")
        assert r.status_code == 200, r.text
        assert r.headers["etag"] == '"1"'
        assert r.json()["state"] == {"reported": {"temp": 21}} and r.json()["version"] == 1
        # the HTTP client sets desired state: the device receives it over MQTT
        r = await gw.http.put(
            "/shadows/devices/dev1", json={"state": {"desired": {"led": "on"}}}, headers=PATCH
        )
        assert r.status_code == 200, r.text
        assert r.json()["version"] == 2
        got = await _next(dev)
        assert got.topic.value == "devices/dev1/shadow/desired"
        assert json.loads(got.payload) | {"timestamp": 0} == {
            "state": {"led": "on"},
            "version": 2,
            "timestamp": 0,
        }
        # the device follows and reports; a reported-only update sends no desired message
        await dev.publish("devices/dev1/shadow/update", b'{"state": {"reported": {"led": "on"}}}', qos=1)
        r = await gw.http.get("/shadows/devices/dev1")
        assert r.json()["state"] == {"reported": {"temp": 21, "led": "on"}, "desired": {"led": "on"}}
        assert r.json()["version"] == 3
        # clearing desired (null) reaches the device too, as an empty desired state
        r = await gw.http.put("/shadows/devices/dev1", json={"state": {"desired": None}}, headers=PATCH)
        assert r.json()["state"] == {"reported": {"temp": 21, "led": "on"}}
        got = await _next(dev)
        assert json.loads(got.payload)["state"] == {} and json.loads(got.payload)["version"] == 4
    r = await gw.http.get("/shadows/devices")
    assert r.status_code == 200
    assert [(s["key"], s["version"]) for s in r.json()["shadows"]] == [("dev1", 4)]


async def test_the_device_gets_its_shadow_and_sees_rejections_over_mqtt(gw):
    await gw.http.put(
        "/shadows/devices/dev2", json={"state": {"desired": {"rate": 5}}}, headers=PATCH
    )  # version 1
    async with gw.device("dev2") as dev:
        await dev.subscribe("devices/dev2/shadow/#", qos=1)
        await dev.publish("devices/dev2/shadow/get", b"", qos=1)
        got = await _next(dev)
        assert got.topic.value == "devices/dev2/shadow/get/accepted"
        assert json.loads(got.payload)["state"] == {"desired": {"rate": 5}}
        # a stale version: refused, with the current version on .../update/rejected
        await dev.publish("devices/dev2/shadow/update", b'{"state": {"reported": {}}, "version": 7}', qos=1)
        got = await _next(dev)
        assert got.topic.value == "devices/dev2/shadow/update/rejected"
        assert json.loads(got.payload) | {"message": ""} == {
            "code": 409,
            "kind": "version_conflict",
            "message": "",
            "version": 1,
        }
        # the right version: accepted; the new document is published on .../shadow
        await dev.publish(
            "devices/dev2/shadow/update", b'{"state": {"reported": {"rate": 5}}, "version": 1}', qos=1
        )
        got = await _next(dev)
        assert got.topic.value == "devices/dev2/shadow"
        assert json.loads(got.payload)["version"] == 2
    # exact PUBACK reason codes (MQTT 5.0): bad JSON, a version conflict, and a plain publish
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.mqtt_port)
    raw = Raw(reader, writer, 5)
    from adapters.mqtt.codec import Connect, encode_connect

    raw.send(encode_connect(Connect("raw-dev2", 5)))
    await raw.recv()
    for pid, payload in ((1, b"not json"), (2, b'{"state": {"reported": {"a": 1}}, "version": 1}')):
        raw.send(encode_publish("devices/dev2/shadow/update", payload, 1, pid, version=5))
        ack = await raw.recv()
        assert isinstance(ack, Puback) and ack.packet_id == pid
        assert ack.reason_code == (0x99 if pid == 1 else 0x83)
    raw.send(
        encode_publish("devices/dev2/shadow/update", b'{"state": {"reported": {"a": 1}}}', 1, 3, version=5)
    )
    ack = await raw.recv()
    assert ack.reason_code == 0
    await raw.close()
    assert (await gw.http.get("/shadows/devices/dev2")).json()["version"] == 3


async def test_a_shadow_path_of_a_topic_that_is_not_compacted_is_an_ordinary_publish(gw):
    async with gw.device("dev3") as dev:
        await dev.subscribe("plain/dev3/shadow/update", qos=1)
        await dev.publish("plain/dev3/shadow/update", b"not a shadow request", qos=1)
        got = await _next(dev)
        assert got.payload == b"not a shadow request"
    r = await gw.http.get("/shadows/plain/dev3")
    assert r.status_code == 409 and r.json()["kind"] == "not_a_shadow_topic"


async def test_http_merge_patch_versions_and_conflicts(gw):
    h = gw.http
    r = await h.put("/shadows/devices/d", json={"state": {"reported": {"a": 1, "b": {"c": 2, "d": 3}}}})
    assert r.status_code == 201 and r.headers["etag"] == '"1"'
    r = await h.put(
        "/shadows/devices/d",
        json={"state": {"reported": {"a": None, "b": {"c": None, "e": [1]}}}},
        headers={**PATCH, "If-Match": '"1"'},
    )
    assert r.status_code == 200, r.text
    assert r.json()["state"] == {"reported": {"b": {"d": 3, "e": [1]}}} and r.json()["version"] == 2
    # stale If-Match: 412; stale body version: 409; both with the current version
    r = await h.put("/shadows/devices/d", json={"state": {"reported": {"x": 1}}}, headers={"If-Match": '"1"'})
    assert r.status_code == 412 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["kind"] == "version_conflict" and r.headers["etag"] == '"2"'
    r = await h.put("/shadows/devices/d", json={"state": {"reported": {"x": 1}}, "version": 5})
    assert r.status_code == 409 and r.json()["kind"] == "version_conflict"
    # version 0: create only
    r = await h.put("/shadows/devices/d", json={"state": {"reported": {"x": 1}}, "version": 0})
    assert r.status_code == 409
    # bad requests
    r = await h.put("/shadows/devices/d", content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    for body in ({"state": {"other": {}}}, {"state": {"reported": 3}}, {"reported": {}}, [1]):
        r = await h.put("/shadows/devices/d", json=body)
        assert r.status_code == 400 and r.json()["kind"] == "invalid_shadow_request", body
    r = await h.put("/shadows/devices/a+b", json={"state": {"reported": {}}})
    assert r.status_code == 400
    assert (await h.get("/shadows/devices/nobody")).status_code == 404
    assert (await h.get("/shadows/nosuchtopic/d")).status_code == 404
    # delete: stale If-Match refused, then gone; a new shadow starts at version 1
    assert (await h.delete("/shadows/devices/d", headers={"If-Match": '"1"'})).status_code == 412
    assert (await h.delete("/shadows/devices/d")).status_code == 204
    assert (await h.get("/shadows/devices/d")).status_code == 404
    assert (await h.delete("/shadows/devices/d")).status_code == 404
    assert (await h.get("/shadows/devices")).json()["shadows"] == []
    r = await h.put("/shadows/devices/d", json={"state": {"desired": {"z": 1}}})
    assert r.status_code == 201 and r.json()["version"] == 1


async def test_concurrent_updates_of_one_key_are_serialized(gw):
    svc = ShadowService.for_processor(gw.gateway.processor)
    await asyncio.gather(
        *(svc.update(CTX, "devices", "busy", {"state": {"reported": {f"f{i}": i}}}) for i in range(20))
    )
    shadow = await svc.get(CTX, "devices", "busy")
    assert shadow.version == 20
    assert shadow.state["reported"] == {f"f{i}": i for i in range(20)}
    assert svc._locks == {}  # per-key locks are dropped when unused


async def test_a_shadow_survives_a_restart(tmp_path):
    data = str(tmp_path / "data")
    g = await _start(data)
    try:
        await g.http.post("/admin/topics", json={"name": "devices", "compacted": True})
        await g.http.put("/shadows/devices/k", json={"state": {"reported": {"on": True}}})
        await g.http.put("/shadows/devices/k", json={"state": {"desired": {"on": False}}})
    finally:
        await _stop(g)
    g = await _start(data)
    try:
        r = await g.http.get("/shadows/devices/k")
        assert r.json()["state"] == {"reported": {"on": True}, "desired": {"on": False}}
        r = await g.http.put("/shadows/devices/k", json={"state": {"reported": {"on": False}}, "version": 2})
        assert r.status_code == 200 and r.json()["version"] == 3
    finally:
        await _stop(g)


def test_merge_patch_follows_rfc_7396_examples():
    cases = [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
        (["a", "b"], {"a": "b"}, {"a": "b"}),
    ]
    for target, patch, want in cases:
        assert merge_patch(target, patch) == want


async def test_shadows_follow_the_acl_of_their_mqtt_paths(tmp_path, monkeypatch):
    """With auth on, a user may read `T/K/shadow` and update `T/K/shadow/update` as its rules allow
    those paths: `devices/%u/#` lets each device user at its own shadow only."""
    monkeypatch.setenv("GATEWAY_ADMIN_PASSWORD", "admin-pw-Zq8")
    g = await _start_with(_settings(str(tmp_path / "data"), auth=True))
    base = g.http.base_url
    try:
        async with (
            httpx.AsyncClient(base_url=base, timeout=10, auth=("admin", "admin-pw-Zq8")) as admin,
            httpx.AsyncClient(base_url=base, timeout=10, auth=("alice", "alice-pw")) as alice,
        ):
            assert (await admin.post("/admin/topics", json={"name": "devices", "compacted": True})).is_success
            r = await admin.post(
                "/admin/users", json={"name": "alice", "password": "alice-pw", "role": "user"}
            )
            assert r.status_code == 201, r.text
            rule = {"subject": "role:user", "kind": "topic", "pattern": "devices/%u/#"}
            r = await admin.post(
                "/admin/acl", json=rule | {"actions": ["publish", "subscribe"], "effect": "allow"}
            )
            assert r.status_code == 201, r.text
            assert (await g.http.get("/shadows/devices/alice")).status_code == 401
            r = await alice.put("/shadows/devices/alice", json={"state": {"reported": {"up": 1}}})
            assert r.status_code == 201, r.text
            r = await alice.put("/shadows/devices/bob", json={"state": {"reported": {"up": 1}}})
            assert r.status_code == 403 and r.json()["kind"] == "forbidden"
            assert (await admin.put("/shadows/devices/bob", json={"state": {"desired": {"x": 1}}})).is_success
            assert (await alice.get("/shadows/devices/bob")).status_code == 403
            r = await alice.get("/shadows/devices")
            assert [s["key"] for s in r.json()["shadows"]] == ["alice"]
            r = await admin.get("/shadows/devices")
            assert [s["key"] for s in r.json()["shadows"]] == ["alice", "bob"]
    finally:
        await _stop(g)
