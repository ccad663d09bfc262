"""Authentication and ACL on the gRPC adapter (issue 23): the official RocketMQ 5 Python and Node
clients with `Credentials`, against a core with security on."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import shutil
import sys
from pathlib import Path

import grpc
import pytest

from adapters.grpc import GrpcAdapter
from adapters.grpc.codes import Code
from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from messaging_processor.security import grpc_signature
from tests.adapters.grpc.support import CLIENT_ID, msg, producer_settings
from tests.support import Core

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "official_client.py"
NODE_SCRIPT = HERE / "node_client.js"
NODE_MODULES = HERE.parents[2] / "conformance" / "clients" / "node" / "node_modules"
SECRET = "s3cr3t-device-key"


class AuthGateway:
    def __init__(self, core: Core, adapter: GrpcAdapter, stub: service_pb2_grpc.MessagingServiceStub) -> None:
        self.core = core
        self.processor = core.processor
        self.security = core.security
        self.adapter = adapter
        self.stub = stub


@pytest.fixture
async def agw(tmp_path):
    core = await Core.open(str(tmp_path / "data"), auth=True, default_queues=2)
    try:
        adapter = await core.add(GrpcAdapter(core.processor, host="127.0.0.1", port=0))
        channel = grpc.aio.insecure_channel(adapter.address)
        core.on_close(channel.close)
        sec = core.security
        await sec.add_user("alice", access_key="AK_ALICE", secret_key=SECRET)
        await sec.add_user("pubonly", access_key="AK_PUB", secret_key=SECRET)
        await sec.directory.add_rule("user:alice", "topic", "AT/#", ("publish", "subscribe"), False)
        await sec.directory.add_rule("user:alice", "group", "AG", ("subscribe",), False)
        await sec.directory.add_rule("user:pubonly", "topic", "AT/#", ("publish",), False)
        await sec.directory.add_rule("user:pubonly", "group", "AG", ("subscribe",), False)
        await core.processor.create_topic("AT", queues=2)
        yield AuthGateway(core, adapter, service_pb2_grpc.MessagingServiceStub(channel))
    finally:
        await core.close()


def md(ak: str = "AK_ALICE", secret: str = SECRET, dt: str = "20250101T000000Z") -> tuple:
    sig = grpc_signature(secret, dt)
    auth = f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={sig}"
    return (("x-mq-client-id", CLIENT_ID), ("x-mq-date-time", dt), ("authorization", auth))


# ---------------------------------------------------------------------------- our stubs


async def test_signed_requests_pass_and_bad_ones_get_unauthorized(agw):
    ok = await agw.stub.SendMessage(s.SendMessageRequest(messages=[msg("AT", tag="x")]), metadata=md())
    assert ok.status.code == Code.OK
    for bad in (md(secret="wrong"), md(ak="AK_NOBODY"), (("x-mq-client-id", CLIENT_ID),)):
        r = await agw.stub.SendMessage(s.SendMessageRequest(messages=[msg("AT")]), metadata=bad)
        assert r.status.code == Code.UNAUTHORIZED
        assert r.status.message == "authentication failed"  # the same whatever was wrong
        q = await agw.stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="AT")), metadata=bad)
        assert q.status.code == Code.UNAUTHORIZED
    fails = agw.processor.metrics.auth_failures
    assert fails[("grpc", "bad_signature")] >= 1 and fails[("grpc", "unknown_access_key")] >= 1
    assert fails[("grpc", "missing_credentials")] >= 1


async def test_verified_identity_is_cached_per_signature(agw):
    calls = 0
    real = agw.processor.authenticate

    async def counting(ctx, content=b""):
        nonlocal calls
        calls += 1
        await real(ctx, content)

    agw.processor.authenticate = counting
    for _ in range(5):
        r = await agw.stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="AT")), metadata=md())
        assert r.status.code == Code.OK
    assert calls == 1
    r = await agw.stub.QueryRoute(
        s.QueryRouteRequest(topic=d.Resource(name="AT")), metadata=md(dt="20250101T000001Z")
    )
    assert r.status.code == Code.OK and calls == 2  # a new date-time is a new signature to check
    assert len(agw.adapter.service._principals) == 1  # one principal (and ACL cache) for the client


async def test_acl_on_route_assignment_ack_and_settings(agw):
    route = await agw.stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="OTHER")), metadata=md())
    assert route.status.code == Code.FORBIDDEN
    pub_route = await agw.stub.QueryRoute(
        s.QueryRouteRequest(topic=d.Resource(name="AT")), metadata=md("AK_PUB")
    )
    assert pub_route.status.code == Code.OK  # publish alone is enough for a route
    assign = await agw.stub.QueryAssignment(
        s.QueryAssignmentRequest(topic=d.Resource(name="AT"), group=d.Resource(name="AG")),
        metadata=md("AK_PUB"),
    )
    assert assign.status.code == Code.FORBIDDEN  # needs subscribe on the topic
    ack = await agw.stub.AckMessage(
        s.AckMessageRequest(
            group=d.Resource(name="NOTMINE"),
            topic=d.Resource(name="AT"),
            entries=[s.AckMessageEntry(message_id="m", receipt_handle="h")],
        ),
        metadata=md(),
    )
    assert ack.status.code == Code.FORBIDDEN
    end = await agw.stub.EndTransaction(
        s.EndTransactionRequest(topic=d.Resource(name="OTHER"), transaction_id="1", resolution=d.COMMIT),
        metadata=md(),
    )
    assert end.status.code == Code.FORBIDDEN
    call = agw.stub.Telemetry(metadata=md())
    await call.write(s.TelemetryCommand(settings=producer_settings("OTHER")))
    denied = await asyncio.wait_for(call.read(), 10)
    assert denied.status.code == Code.FORBIDDEN and not denied.HasField("settings")
    await call.write(s.TelemetryCommand(settings=producer_settings("AT")))
    granted = await asyncio.wait_for(call.read(), 10)
    assert granted.status.code == Code.OK and granted.HasField("settings")
    call.cancel()


async def test_unauthenticated_telemetry_is_answered_with_a_status(agw):
    call = agw.stub.Telemetry(metadata=md(secret="nope"))
    for _ in range(2):  # the stream stays open (no reconnect loop); nothing is registered
        await call.write(s.TelemetryCommand(settings=producer_settings("AT")))
        reply = await asyncio.wait_for(call.read(), 10)
        assert reply.status.code == Code.UNAUTHORIZED and not reply.HasField("settings")
    assert CLIENT_ID not in agw.adapter.service.sessions
    call.cancel()
    # the server is fine: a good client still works
    ok = await agw.stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name="AT")), metadata=md())
    assert ok.status.code == Code.OK


async def test_refused_login_never_logs_the_secret(agw, caplog):
    caplog.set_level(logging.DEBUG)
    r = await agw.stub.SendMessage(
        s.SendMessageRequest(messages=[msg("AT")]), metadata=md(secret="wrong-" + SECRET)
    )
    assert r.status.code == Code.UNAUTHORIZED
    assert "login refused" in caplog.text and "AK_ALICE" in caplog.text
    assert SECRET not in caplog.text
    assert grpc_signature("wrong-" + SECRET, "20250101T000000Z") not in caplog.text


# ---------------------------------------------------------------------------- official clients


def _python_missing() -> str | None:
    # found, not imported: the 5.x client must stay out of this process
    return None if importlib.util.find_spec("rocketmq") else "rocketmq-python-client is not installed"


def _node_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not (NODE_MODULES / "rocketmq-client-nodejs").is_dir():
        return "rocketmq-client-nodejs is not installed (run `make install-conformance`)"
    return None


async def run_probe(client: str, endpoint: str, topic: str, group: str, ak: str, sk: str) -> dict:
    """One client's probe (send one message, then receive): each step's outcome."""
    if client == "python":
        if (why := _python_missing()) is not None:
            pytest.skip(why)
        cmd = [sys.executable, str(SCRIPT), "probe", endpoint, topic, group, ak, sk]
    else:
        if (why := _node_missing()) is not None:
            pytest.skip(why)
        cmd = ["node", str(NODE_SCRIPT), endpoint, topic, group, ak, sk]
    env = dict(os.environ, HOME=os.environ.get("TMPDIR", "/tmp"), NODE_PATH=str(NODE_MODULES))
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


CLIENTS = pytest.mark.parametrize("client", ["python", "node"])


@CLIENTS
async def test_official_client_with_right_credentials_sends_and_receives(agw, client):
    res = await run_probe(client, agw.adapter.address, "AT", "AG", "AK_ALICE", SECRET)
    assert "id" in res["send"], res
    assert [m["id"] for m in res["receive"]["got"]] == [res["send"]["id"]], res


@CLIENTS
@pytest.mark.parametrize(
    "ak,sk,reason",
    [("AK_ALICE", "wrong-secret", "bad_signature"), ("AK_NOBODY", SECRET, "unknown_access_key")],
)
async def test_official_client_with_bad_credentials_is_refused(agw, client, ak, sk, reason):
    res = await run_probe(client, agw.adapter.address, "AT", "AG", ak, sk)
    # The clients fail their startup or send (their route queries got UNAUTHORIZED): nothing stored.
    assert "error" in res["send"] and "error" in res["receive"], res
    assert agw.core.store.backlog("AG", "AT") == 0
    assert agw.processor.metrics.auth_failures[("grpc", reason)] >= 1
    assert not agw.adapter.service.sessions  # no Settings accepted


@CLIENTS
async def test_official_client_allowed_publish_only_cannot_receive(agw, client):
    res = await run_probe(client, agw.adapter.address, "AT", "AG", "AK_PUB", SECRET)
    assert "id" in res["send"], res
    assert res["receive"].get("code") == Code.FORBIDDEN, res
    assert agw.core.store.backlog("AG", "AT") == 1  # sent, still there


@CLIENTS
async def test_official_client_deny_wins_over_allow(agw, client):
    await agw.security.directory.add_rule("user:alice", "topic", "AT/#", ("publish",), True)
    res = await run_probe(client, agw.adapter.address, "AT", "AG", "AK_ALICE", SECRET)
    assert res["send"].get("code") == Code.FORBIDDEN, res
    assert agw.core.store.backlog("AG", "AT") == 0
    assert agw.processor.metrics.acl_denials[("grpc", "publish")] >= 1
