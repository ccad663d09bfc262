"""What a publisher sees when the store refuses writes, on the protocols whose answer is a code
(docs/limits.md "What each protocol answers"): a gateway started with `--disk-free-limit` above the
free space of its volume refuses every publish at once, without filling a disk. gRPC (our generated
stubs) gets Status TOO_MANY_REQUESTS (42900), a 4.x remoting SEND_MESSAGE_V2 response code
SERVICE_NOT_AVAILABLE (14) with a remark naming the disk, as a RocketMQ broker with a full disk;
/metrics shows the disk alarm, and a store under its limit reports no alarm."""

from __future__ import annotations

import os
import re

import grpc
import httpx
import pytest

from adapters.grpc.codes import Code
from adapters.grpc.generated import service_pb2_grpc
from gateway.http.metrics import render
from remoting import RequestCode, ResponseCode
from remoting.client import RemotingClient
from tests.adapters.grpc.support import msg, send
from tests.adapters.remoting.support import send as remoting_send
from tests.support import Core
from tests.tls.support import start_gateway

GIB = 1 << 30


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    data = tmp_path_factory.mktemp("full")
    st = os.statvfs(data)
    limit = st.f_bavail * st.f_frsize + GIB  # more than the volume has free: every publish is refused
    proc = start_gateway(
        data,
        *("--disk-free-limit", str(limit), "--auto-create-topics"),
        protocols="grpc,remoting,http",
    )
    yield proc, limit
    assert proc.stop() == 0


async def test_grpc_send_gets_too_many_requests(full) -> None:
    proc, _ = full
    async with grpc.aio.insecure_channel(proc.listeners["grpc"]) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        r = await send(stub, msg("FullDisk", b"refused"))
    assert r.status.code == Code.TOO_MANY_REQUESTS, r.status
    assert "disk free space" in r.status.message
    assert [e.status.code for e in r.entries] in ([], [Code.TOO_MANY_REQUESTS])


async def test_remoting_send_gets_service_not_available(full) -> None:
    proc, _ = full
    host, port = proc.listeners["remoting"].rsplit(":", 1)
    client = await RemotingClient.connect(host, int(port), version=121)
    try:
        route = await client.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "FullDisk4x"})
        assert route.code == ResponseCode.SUCCESS  # reads still work
        r = await remoting_send(client, "FullDisk4x", b"refused", {"TAGS": "t"})
    finally:
        await client.close()
    assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE == 14
    assert "disk" in (r.remark or "")


async def test_metrics_show_the_disk_alarm(full) -> None:
    proc, limit = full
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://{proc.listeners['http']}/metrics")).text
    assert re.search(r"^gateway_disk_alarm 1$", text, re.M), text
    assert re.search(rf"^gateway_disk_free_limit_bytes {limit}$", text, re.M)
    free = int(re.search(r"^gateway_disk_free_bytes (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert 0 < free < limit
    assert re.search(
        r'^gateway_errors_total\{protocol="grpc",operation="send",kind="store_full"\} \d+$', text, re.M
    )


async def test_no_alarm_under_the_limit(tmp_path) -> None:
    core = await Core.open(str(tmp_path), disk_free_limit_bytes=0)
    try:
        text = render(core.processor)
    finally:
        await core.close()
    assert re.search(r"^gateway_disk_alarm 0$", text, re.M)
    assert re.search(r"^gateway_disk_free_limit_bytes 0$", text, re.M)
    assert int(re.search(r"^gateway_disk_free_bytes (\d+)$", text, re.M).group(1)) > 0  # type: ignore[union-attr]
