"""The HTTP port with `auth` on, served on a real socket in this process and driven by httpx and the
cloudevents SDK: Basic and Bearer logins, one 401 whatever was wrong, 403 problem+json for a denied
topic or group, revoked tokens, the admin role, /healthz and /metrics, and the identity admin API."""

from __future__ import annotations

import base64
import logging
from types import SimpleNamespace

import httpx
import pytest
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from cloudevents.core.v1.event import CloudEvent

from gateway.config import Settings
from gateway.http import create_app
from gateway.server import Gateway

PROBLEM = "application/problem+json"
ADMIN_PW = "admin-pw-Zq8"
CHALLENGE = 'Basic realm="gateway", Bearer'


@pytest.fixture
async def gw(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("GATEWAY_ADMIN_PASSWORD", ADMIN_PW)
    settings = Settings(
        data_dir=str(tmp_path / "data"), flush="async", protocols="http", http_port=0, auth=True
    )
    gateway = Gateway(settings)
    await gateway.start()
    try:
        (http,) = gateway.adapters
        base = f"http://{http.address}"
        async with (
            httpx.AsyncClient(base_url=base, timeout=10) as anon,
            httpx.AsyncClient(base_url=base, timeout=10, auth=("admin", ADMIN_PW)) as admin,
        ):
            yield SimpleNamespace(anon=anon, admin=admin, base=base, p=gateway.processor, gateway=gateway)
    finally:
        await gateway.stop()


def client(gw, **kw) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=gw.base, timeout=10, **kw)


def assert_problem(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body = r.json()
    assert body["status"] == status
    return body


async def add_user(gw, name: str, password: str, role: str = "user") -> None:
    r = await gw.admin.post("/admin/users", json={"name": name, "password": password, "role": role})
    assert r.status_code == 201, r.text
    assert "password_hash" not in r.text and password not in r.text


async def allow(gw, subject: str, pattern: str, *actions: str, kind: str = "topic", effect: str = "allow"):
    body = {"subject": subject, "kind": kind, "pattern": pattern, "actions": list(actions), "effect": effect}
    r = await gw.admin.post("/admin/acl", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def event(i: int = 1) -> CloudEvent:
    return CloudEvent({"type": "io.example.t", "source": "/dev", "id": f"e-{i}"}, {"n": i})


async def test_refusals_are_one_401_with_a_challenge(gw, caplog):
    await add_user(gw, "dev1", "pw-dev1")
    refused = []
    for kw in (
        {},  # no credentials
        {"auth": ("dev1", "wrong")},  # wrong password
        {"auth": ("nobody", "pw-dev1")},  # unknown user
        {"headers": {"Authorization": "Bearer gwt_0000_nope"}},  # unknown token
        {"headers": {"Authorization": "Basic !!!"}},  # malformed
        {"headers": {"Authorization": "Digest x"}},  # unsupported scheme
    ):
        async with client(gw, **kw) as c:
            r = await c.get("/admin/topics")
        assert_problem(r, 401)
        assert r.headers["www-authenticate"] == CHALLENGE
        refused.append(r.content)
    assert len(set(refused)) == 1  # the client learns nothing about which part was wrong
    async with client(gw, auth=("dev1", "pw-dev1")) as c:
        assert (await c.get("/read/topics/x/queues")).status_code != 401
    text = (await gw.admin.get("/metrics")).text
    assert 'gateway_auth_failures_total{protocol="http",reason="bad_password"} 1' in text
    assert 'gateway_auth_failures_total{protocol="http",reason="unknown_user"} 1' in text
    logged = server_log(caplog)
    assert "wrong" not in logged and "pw-dev1" not in logged and ADMIN_PW not in logged


async def test_cloudevents_publish_needs_publish_on_the_topic(gw):
    await add_user(gw, "dev1", "pw-dev1")
    for t in ("orders", "secret"):
        assert (await gw.admin.post("/admin/topics", json={"name": t})).status_code == 201
    await allow(gw, "user:dev1", "orders/#", "publish")
    async with client(gw, auth=("dev1", "pw-dev1")) as c:
        msg = to_binary_event(event(1))
        r = await c.post("/topics/orders/events", headers=msg.headers, content=msg.body)
        assert r.status_code == 202, r.text
        msg = to_structured_event(event(2))
        r = await c.post("/topics/secret/events", headers=msg.headers, content=msg.body)
        assert assert_problem(r, 403)["kind"] == "forbidden"
    topic = (await gw.admin.get("/admin/topics/orders")).json()
    assert topic["messages"] == 1
    assert (await gw.admin.get("/admin/topics/secret")).json()["messages"] == 0
    text = (await gw.admin.get("/metrics")).text
    assert 'gateway_acl_denials_total{protocol="http",action="publish"} 1' in text


def server_log(caplog) -> str:
    """What the gateway logged (the test's own httpx client logs its request URLs)."""
    return "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("httpx"))


async def test_bearer_token_works_until_revoked(gw, caplog):
    await add_user(gw, "svc", "pw-svc")
    await allow(gw, "user:svc", "orders", "subscribe")
    await gw.admin.post("/admin/topics", json={"name": "orders", "queues": 2})
    r = await gw.admin.post("/admin/tokens", json={"name": "ci", "user": "svc"})
    assert r.status_code == 201
    tok = r.json()
    assert tok["user"] == "svc" and tok["token"].startswith("gwt_")
    listed = (await gw.admin.get("/admin/tokens")).json()
    assert [t["id"] for t in listed] == [tok["id"]] and "token" not in listed[0]
    bearer = {"Authorization": f"Bearer {tok['token']}"}
    async with client(gw, headers=bearer) as c:
        r = await c.get("/read/topics/orders/queues")
        assert r.status_code == 200 and len(r.json()["queues"]) == 2
        assert (await c.get(f"/read/topics/orders/queues?access_token={tok['token']}")).status_code == 200
        assert (await gw.admin.delete(f"/admin/tokens/{tok['id']}")).status_code == 204
        r = await c.get("/read/topics/orders/queues")
        assert_problem(r, 401)
    assert (await gw.admin.delete(f"/admin/tokens/{tok['id']}")).status_code == 404
    assert tok["token"] not in server_log(caplog)


async def test_read_api_and_pull_need_subscribe(gw):
    await add_user(gw, "reader", "pw-r")
    for t in ("orders", "hr"):
        await gw.admin.post("/admin/topics", json={"name": t})
    await allow(gw, "user:reader", "orders", "subscribe")
    await allow(gw, "user:reader", "analytics", "subscribe", kind="group")
    async with client(gw, auth=("reader", "pw-r")) as c:
        assert (await c.get("/read/topics/orders/queues")).status_code == 200
        assert_problem(await c.get("/read/topics/hr/queues"), 403)
        assert (await c.get("/read/groups/analytics/topics/orders/offsets")).status_code == 200
        assert_problem(await c.get("/read/groups/other/topics/orders/offsets"), 403)
        r = await c.post("/topics/orders/subscriptions/analytics/pop", json={"wait_ms": 0})
        assert r.status_code == 200, r.text
        assert_problem(await c.post("/topics/hr/subscriptions/analytics/pop", json={"wait_ms": 0}), 403)
        # push subscriptions: SUBSCRIBE on the topic and on a named group
        sink = "http://127.0.0.1:9/sink"
        body = {"topic": "orders", "sink": sink, "group": "other", "delivery": {"handshake": False}}
        assert_problem(await c.post("/subscriptions", json=body), 403)
        assert_problem(await c.post("/subscriptions", json={**body, "topic": "hr", "group": None}), 403)
        r = await c.post("/subscriptions", json={**body, "group": "analytics"})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert [s["id"] for s in (await c.get("/subscriptions")).json()] == [sid]
        assert (await c.delete(f"/subscriptions/{sid}")).status_code == 204


async def test_deny_wins_and_a_user_role_cannot_use_the_admin_api(gw):
    await add_user(gw, "dev7", "pw7")
    await gw.admin.post("/admin/topics", json={"name": "devices"})
    await allow(gw, "role:user", "devices/#", "subscribe")
    rule = await allow(gw, "user:dev7", "devices", "subscribe", effect="deny")
    async with client(gw, auth=("dev7", "pw7")) as c:
        assert_problem(await c.get("/read/topics/devices/queues"), 403)
        for method, path in (("GET", "/admin/topics"), ("GET", "/admin/users"), ("POST", "/admin/acl")):
            r = await c.request(method, path, json={})
            assert assert_problem(r, 403)["kind"] == "forbidden"
        assert (await gw.admin.delete(f"/admin/acl/{rule['id']}")).status_code == 204
        assert (await c.get("/read/topics/devices/queues")).status_code == 200


async def test_healthz_open_metrics_and_docs_open_on_loopback_only(gw):
    assert (await gw.anon.get("/healthz")).status_code == 200
    assert (await gw.anon.get("/metrics")).status_code == 200  # loopback client
    assert (await gw.anon.get("/openapi.json")).status_code == 200
    app = create_app(gw.p)
    remote = httpx.ASGITransport(app=app, client=("192.0.2.10", 40000))
    async with httpx.AsyncClient(transport=remote, base_url="http://gw") as c:
        assert (await c.get("/healthz")).status_code == 200
        for path in ("/metrics", "/openapi.json", "/docs"):
            r = await c.get(path)
            assert_problem(r, 401)
            assert r.headers["www-authenticate"] == CHALLENGE
        r = await c.get("/metrics", auth=("admin", ADMIN_PW))
        assert r.status_code == 200 and "gateway_auth_failures_total" in r.text


async def test_user_admin_api(gw):
    r = await gw.admin.post(
        "/admin/users",
        json={
            "name": "rmq",
            "password": "p1",
            "access_key": "AK1",
            "secret_key": "SK-secret",
            "vhosts": ["/", "v"],
        },
    )
    assert r.status_code == 201 and "SK-secret" not in r.text
    assert r.json()["access_key"] == "AK1" and r.json()["vhosts"] == ["/", "v"]
    assert assert_problem(await gw.admin.post("/admin/users", json={"name": "rmq"}), 409)
    assert_problem(await gw.admin.post("/admin/users", json={"name": "a/b", "password": "x"}), 400)
    users = (await gw.admin.get("/admin/users")).json()
    assert [u["name"] for u in users] == ["admin", "rmq"]
    assert "SK-secret" not in (await gw.admin.get("/admin/users")).text
    r = await gw.admin.put("/admin/users/rmq/password", json={"password": "p2"})
    assert r.status_code == 204
    async with client(gw, auth=("rmq", "p1")) as c:
        assert_problem(await c.get("/read/topics/x/queues"), 401)
    async with client(gw, auth=("rmq", "p2")) as c:
        assert (await c.get("/read/topics/x/queues")).status_code != 401
    assert_problem(await gw.admin.put("/admin/users/ghost/password", json={"password": "x"}), 404)
    assert_problem(await gw.admin.delete("/admin/users/admin"), 409)  # the last admin stays
    assert (await gw.admin.delete("/admin/users/rmq")).status_code == 204
    assert_problem(await gw.admin.delete("/admin/users/rmq"), 404)
    bad = {"subject": "group:x", "kind": "topic", "pattern": "a", "actions": ["publish"]}
    assert_problem(await gw.admin.post("/admin/acl", json=bad), 400)
    bad = {"subject": "anyone", "kind": "topic", "pattern": "a/#/b", "actions": ["publish"]}
    assert_problem(await gw.admin.post("/admin/acl", json=bad), 400)


async def test_policy_export_import_round_trip(gw):
    await add_user(gw, "dev1", "pw-dev1")
    odd = 'odd "pattern" \\ with\ttab'
    r1 = await allow(gw, "role:user", "devices/%u/#", "publish", "subscribe")
    r2 = await allow(gw, "anyone", odd, "subscribe", effect="deny")
    text = (await gw.admin.get("/admin/acl/export")).text
    assert "pw-dev1" not in text and "argon2" not in text
    for rid in (r1["id"], r2["id"]):
        assert (await gw.admin.delete(f"/admin/acl/{rid}")).status_code == 204
    assert (await gw.admin.get("/admin/acl")).json() == []
    r = await gw.admin.post("/admin/acl/import", content=text, headers={"Content-Type": "application/toml"})
    assert r.status_code == 200, r.text
    assert r.json() == {"users": 2, "rules": 2, "removed": 0}
    rules = {x["id"]: x for x in (await gw.admin.get("/admin/acl")).json()}
    assert rules == {r1["id"]: r1, r2["id"]: r2}
    async with client(gw, auth=("dev1", "pw-dev1")) as c:  # imported users keep their password
        assert (await c.get("/read/topics/x/queues")).status_code != 401
    bad = "[[rules]]\nsubject = 'anyone'\npattern = 'a'\nactions = ['fly']\n"
    assert_problem(await gw.admin.post("/admin/acl/import", content=bad), 400)
    assert_problem(
        await gw.admin.post("/admin/acl/import", content="[[users]]\nname='x'\nsecret_key='s'\n"), 400
    )
    demote = "[[users]]\nname = 'admin'\nrole = 'user'\n"
    assert_problem(await gw.admin.post("/admin/acl/import", content=demote), 409)


async def test_security_api_with_auth_off_says_so(tmp_path):
    settings = Settings(data_dir=str(tmp_path / "data"), flush="async", protocols="http", http_port=0)
    gateway = Gateway(settings)
    await gateway.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://{gateway.adapters[0].address}", timeout=10) as c:
            assert (await c.get("/admin/topics")).status_code == 200  # no credentials needed
            r = await c.get("/admin/users")
            body = assert_problem(r, 409)
            assert "authentication is off" in body["detail"]
            basic = "Basic " + base64.b64encode(b"x:y").decode()
            assert (await c.get("/admin/topics", headers={"Authorization": basic})).status_code == 200
    finally:
        await gateway.stop()


def test_policy_file_strings_round_trip():
    import tomllib

    from messaging_processor.security.policy_file import parse_policy, toml_string

    for text in ('a"b', "back\\slash", "tab\tnew\nline\r", "\x00\x1f\x7f", "ünï/cødé/#", "'single'", ""):
        assert tomllib.loads(f"v = {toml_string(text)}")["v"] == text
    users, rules = parse_policy(
        "[[users]]\nname = 'dev1'\naccess_key = 'AK1'\n\n"
        "[[rules]]\nsubject = 'user:dev1'\npattern = 'a/%u/#'\nactions = ['publish', 'publish']\n"
    )
    assert [(u.name, u.role, u.access_key, u.vhosts, u.password_hash) for u in users] == [
        ("dev1", "user", "AK1", ("/",), None)
    ]
    (r,) = rules
    assert (r.subject, r.kind, r.pattern, r.actions, r.deny) == (
        "user:dev1",
        "topic",
        "a/%u/#",
        ("publish",),
        False,
    )
    for bad, why in (
        ("x = 1", "unknown key"),
        ("[[users]]\nname = 'a'\npassword = 'p'", "unknown key"),
        ("[[users]]\nname = 'a b'", "user name"),
        (
            "[[rules]]\nid = 'x'\nsubject = 'anyone'\npattern = 'a'\nactions = ['publish']\n" * 2,
            "repeated id",
        ),
        ("[[rules]]\nsubject = 'anyone'\npattern = 'a'\nactions = ['publish']\neffect = 'maybe'", "effect"),
        ("[[rules", "invalid TOML"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_policy(bad)
