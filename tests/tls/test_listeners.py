"""TLS on the gRPC port, HTTPS, and permissive TLS on the remoting port, against one `gateway start`
subprocess with --tls-cert (a certificate of a test CA the clients trust)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from pathlib import Path

import grpc
import httpx
import pytest

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2_grpc
from remoting.codes import ResponseCode
from tests.adapters.grpc.support import msg, receive, send
from tests.tls.certs import TestCa
from tests.tls.support import client_context, remoting_call, start_gateway

CLIENT = Path(__file__).with_name("official_tls_client.py")


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> TestCa:
    return TestCa(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def gw(tmp_path_factory, ca):
    server = ca.server("server", 1)
    proc = start_gateway(
        tmp_path_factory.mktemp("gw"),
        "--tls-cert",
        server.cert,
        "--tls-key",
        server.key,
        "--auto-create-topics",
    )
    yield proc
    assert proc.stop() == 0


async def test_grpc_port_serves_tls_send_and_receive(gw, ca):
    creds = grpc.ssl_channel_credentials(root_certificates=Path(ca.cert).read_bytes())
    async with grpc.aio.secure_channel(gw.listeners["grpc"], creds) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        sent = await send(stub, msg("TlsGrpc", b"secret"))
        assert sent.status.code == d.OK, sent.status
        status, got, _ = await receive(stub, "TlsGroup", "TlsGrpc", poll_ms=2000)
        assert [m.body for m in got] == [b"secret"]


async def test_grpc_port_refuses_a_plain_channel(gw):
    async with grpc.aio.insecure_channel(gw.listeners["grpc"]) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await send(stub, msg("TlsGrpc", b"clear"))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.skipif(importlib.util.find_spec("rocketmq") is None, reason="rocketmq-python-client missing")
async def test_official_client_with_tls_enabled(gw, ca):
    env = dict(os.environ, HOME=os.environ.get("TMPDIR", "/tmp"), GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=ca.cert)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CLIENT), gw.listeners["grpc"], "TlsOfficial", "TlsOfficialGroup",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()[-3000:]
    res = json.loads(out.decode().strip().splitlines()[-1])
    assert res["got"] == [{"id": res["sent"], "body": "over tls"}]


async def test_https_serves_cloudevents_and_admin(gw, ca):
    base = f"https://{gw.listeners['https']}"
    async with httpx.AsyncClient(base_url=base, verify=client_context(ca.cert)) as http:
        r = await http.post("/admin/topics", json={"name": "TlsEvents", "queues": 1})
        assert r.status_code == 201, r.text
        ce = {"ce-specversion": "1.0", "ce-id": "e1", "ce-source": "/tls", "ce-type": "t"}
        r = await http.post("/topics/TlsEvents/events", content=b"hello", headers=ce)
        assert r.status_code == 202, r.text
        r = await http.get("/admin/topics/TlsEvents")
        assert r.status_code == 200 and r.json()["messages"] == 1, r.text
    with pytest.raises(httpx.ConnectError):  # the test CA is not trusted by default
        async with httpx.AsyncClient() as plain:
            await plain.get(f"{base}/healthz")


def test_remoting_port_serves_tls_and_plain_clients(gw, ca):
    over_tls = remoting_call(gw.listeners["remoting"], client_context(ca.cert))
    plain = remoting_call(gw.listeners["remoting"])
    for reply in (over_tls, plain):
        assert reply.is_response and reply.opaque == 7
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        assert json.loads(reply.body)["brokerDatas"]
