"""Compacted topics through the gateway: created with the admin API (`"compacted": true`; it cannot
be changed later), compacted on demand (`POST /admin/compaction`), read from the start by a new
group of the official RocketMQ 5 client (current state: the latest value per key)."""

from __future__ import annotations

import importlib.util

import httpx
import pytest

from gateway.config import Settings
from gateway.server import Gateway
from messaging_processor import ClientContext, Message
from tests.adapters.grpc.test_official_client import run_client

CTX = ClientContext(protocol="test", client_id="t1")


@pytest.fixture
async def gw(tmp_path):
    settings = Settings(
        data_dir=str(tmp_path / "data"),
        flush="async",
        protocols="http,grpc",
        http_port=0,
        grpc_port=0,
        grpc_plain=True,
        segment_size_mib=1,
        max_body_size=500_000,
        amqp_max_body_size=500_000,  # (segments are at least the largest body + 1 MiB)
    )
    gateway = Gateway(settings)
    await gateway.start()
    try:
        http = next(a for a in gateway.adapters if a.name == "http")
        grpc = next(a for a in gateway.adapters if a.name == "grpc")
        async with httpx.AsyncClient(base_url=f"http://{http.address}", timeout=30) as client:
            yield gateway, client, grpc.address
    finally:
        await gateway.stop()


async def _fill_segment(p) -> None:
    """Close the commit log segment written so far (compaction covers closed segments only)."""
    for _ in range(8):  # segments are 2 MiB here
        await p.send(CTX, [Message(topic="filler", body=b"f" * 400_000)], auto_create=True)


async def test_admin_api_creates_compacts_and_a_new_consumer_gets_the_current_state(gw):
    gateway, client, grpc_address = gw
    p = gateway.processor
    r = await client.post("/admin/topics", json={"name": "devices", "queues": 2, "compacted": True})
    assert r.status_code == 201, r.text
    assert r.json()["compacted"] is True
    # compaction is fixed at creation
    r = await client.post("/admin/topics", json={"name": "devices", "compacted": False})
    assert r.status_code == 409
    assert (await client.get("/admin/topics/devices")).json()["compacted"] is True
    for version in range(5):
        await p.send(
            CTX,
            [
                Message(topic="devices", body=b"hello-%d" % k + b"@%d" % version, keys=(f"dev-{k}",))
                for k in range(3)
            ],
        )
    await _fill_segment(p)
    r = await client.post("/admin/compaction")
    assert r.status_code == 200, r.text
    stats = r.json()
    assert stats["records_in"] == 15 and stats["records_kept"] == 3
    assert (await p.latest("devices", "dev-1")).body == b"hello-1@4"
    assert [m.keys[0] for m in await p.latest_items("devices")] == ["dev-0", "dev-1", "dev-2"]
    if importlib.util.find_spec("rocketmq") is None:
        pytest.skip("rocketmq-python-client is not installed")
    res = await run_client("receive", grpc_address, "devices", "new-reader")
    assert sorted(m["body"] for m in res["got"]) == ["hello-0@4", "hello-1@4", "hello-2@4"]


async def test_the_read_api_returns_the_kept_records_of_a_compacted_queue(gw, caplog):
    """The read API (the Spark source's) over a compacted range: removed records are gaps, not errors."""
    import json

    gateway, client, _grpc = gw
    p = gateway.processor
    await p.create_topic("table", 1, None, None, compacted=True)
    for version in range(4):
        await p.send(
            CTX, [Message(topic="table", body=b"%d@%d" % (k, version), keys=(f"k{k}",)) for k in range(5)]
        )
    await _fill_segment(p)
    await p.compact()
    await p.send(CTX, [Message(topic="table", body=b"0@new", keys=("k0",))])  # not compacted yet
    for fmt in ("jsonl", "arrow"):
        r = await client.get("/read/topics/table/queues/0/messages", params={"start": 0, "format": fmt})
        assert r.status_code == 200, r.text
        if fmt == "jsonl":
            rows = [json.loads(line) for line in r.text.splitlines()]
            import base64

            got = [(row["offset"], base64.b64decode(row["body"])) for row in rows]
            assert got == [(15 + k, b"%d@3" % k) for k in range(5)] + [(20, b"0@new")]
    assert "unreadable" not in caplog.text
