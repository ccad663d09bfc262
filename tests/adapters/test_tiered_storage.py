"""Tiered storage with real clients (issue 28): a LOCAL gateway started with `--tier-s3-endpoint`,
`--tier-bucket` and `--tier-after` moves closed commit log segments to a local S3-compatible server
(moto's server mode) and deletes them locally; then the messages in them are read back,
transparently and exactly as before the upload, by

- a Spark batch read through the gateway data source (the same rows as before the upload),
- offset reads of the HTTP read API (the Spark source's client),
- gRPC ReceiveMessage/AckMessage (grpcio with the apache.rocketmq.v2 stubs: pop and ack),
- a 4.x consumer (ali-ons, which consumes with PULL_MESSAGE);

and with the object store unreachable (the server paused), local sends go on, a read of a tiered
range fails with UNAVAILABLE (gRPC) / 503 (HTTP), and succeeds once the server is back."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import grpc
import httpx
import pytest

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from analytics.client import GatewayError, ReadClient
from messaging_processor import ClientContext
from tests.adapters.grpc.support import MD, ack, msg, receive
from tests.adapters.remoting.support import needs_alions, received, run
from tests.analytics.support import GatewayThread, spark_session
from tests.store.s3server import s3_server

pytestmark = pytest.mark.timeout(300)

TOPIC = "cold"
N = 5000  # ~1 KiB each: 5 MiB over 2 MiB segments
BUCKET = "gateway-tier"


def body(i: int) -> bytes:
    return b"%06d:" % i + bytes([65 + i % 26]) * 1000


@pytest.fixture(scope="module")
def s3():
    with s3_server(min_part_size=64 * 1024) as srv:
        srv.create_bucket(BUCKET)
        yield srv


@pytest.fixture(scope="module")
def gw(s3, tmp_path_factory):
    g = GatewayThread(
        str(tmp_path_factory.mktemp("tier") / "data"),
        protocols=("http", "grpc", "remoting"),
        grpc_port=0,
        remoting_port=0,
        segment_size_mib=1,
        max_body_size=64 * 1024,  # (segments are at least the largest body + 1 MiB)
        amqp_max_body_size=64 * 1024,
        tier_s3_endpoint=s3.endpoint,
        tier_bucket=BUCKET,
        tier_after="1h",  # (the fixture tiers with a clock past that, once it has read everything)
    ).start()
    yield g
    g.stop()


def address(gw: GatewayThread, name: str) -> str:
    return gw._address(name)


def local_segments(gw: GatewayThread) -> list[str]:
    return sorted(os.listdir(os.path.join(gw.settings.data_dir, "commitlog")))


async def grpc_send_all(gw: GatewayThread, bodies: list[bytes]) -> None:
    async with grpc.aio.insecure_channel(address(gw, "grpc")) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        for i in range(0, len(bodies), 64):
            entries = [msg(TOPIC, b) for b in bodies[i : i + 64]]
            r = await stub.SendMessage(s.SendMessageRequest(messages=entries), metadata=MD)
            assert r.status.code == d.OK, r.status


async def grpc_receive_all(gw: GatewayThread, group: str, n: int) -> list[bytes]:
    got: list[bytes] = []
    async with grpc.aio.insecure_channel(address(gw, "grpc")) as ch:
        stub = service_pb2_grpc.MessagingServiceStub(ch)
        while len(got) < n:
            st, ms, _ = await receive(stub, group, TOPIC, batch=32, poll_ms=1000, md=MD)
            assert st.code in (d.OK, d.MESSAGE_NOT_FOUND), st
            if not ms:
                break
            got += [m.body for m in ms]
            r = await ack(stub, group, TOPIC, *(m.system_properties.receipt_handle for m in ms), md=MD)
            assert all(e.status.code == d.OK for e in r.entries)
    return got


def spark_rows(spark, gw: GatewayThread) -> list[tuple]:
    df = spark.read.format("gateway").option("url", gw.url).option("topic", TOPIC).load()
    return sorted(
        (r["queue"], r["offset"], bytes(r["body"])) for r in df.select("queue", "offset", "body").collect()
    )


def offset_reads(gw: GatewayThread) -> list[tuple]:
    rc = ReadClient(gw.url)
    out = []
    for q, (lo, hi) in sorted(rc.queues(TOPIC).items()):
        for batch in rc.read_range(TOPIC, q, lo, hi):
            for r in batch.to_pylist():
                out.append((q, r["offset"], bytes(r["body"])))
    return sorted(out)


@pytest.fixture(scope="module")
def tiered(gw):
    """The topic filled, its rows read by Spark and the read API before the upload, then its closed
    segments tiered and deleted locally: (Spark rows, read API rows) from before."""
    gw.call(gw.processor.create_topic(TOPIC, 2))
    gw.call(grpc_send_all(gw, [body(i) for i in range(N)]))
    spark = spark_session()
    try:
        before_spark = spark_rows(spark, gw)
        before_reads = offset_reads(gw)
        assert len(before_spark) == N and [r[2] for r in before_spark] == [r[2] for r in before_reads]
        local_before = local_segments(gw)
        assert len(local_before) >= 3
        tiered_n = gw.call(gw.gw.store.tier_now(now=2**62))  # every closed segment is past `tier_after`
        assert tiered_n >= 2
        stats = gw.gw.store.tier_stats()
        assert stats["tiered_segments"] >= 2, stats
        left = local_segments(gw)
        assert len([f for f in left if f in local_before]) < len(local_before)  # deleted locally
        keys = [o["Key"] for o in gw_s3_objects(gw)]
        assert len(keys) >= tiered_n
        yield spark, before_spark, before_reads
    finally:
        spark.stop()


def gw_s3_objects(gw: GatewayThread) -> list[dict]:
    import boto3

    c = boto3.client("s3", endpoint_url=gw.settings.tier_s3_endpoint, region_name="us-east-1")
    return c.list_objects_v2(Bucket=BUCKET).get("Contents", [])


def test_spark_batch_read_and_offset_reads_of_tiered_segments_match_before(gw, tiered):
    spark, before_spark, before_reads = tiered
    assert spark_rows(spark, gw) == before_spark
    assert offset_reads(gw) == before_reads


def test_grpc_pop_and_ack_of_tiered_messages(gw, tiered):
    got = gw.call(grpc_receive_all(gw, "G-TIER", N), timeout=120)
    assert sorted(got) == sorted(body(i) for i in range(N))


@needs_alions
def test_4x_pull_consumer_reads_tiered_messages(gw, tiered, tmp_path: Path):
    events = asyncio.run(
        run(
            "alions",
            "consume",
            "--namesrv",
            address(gw, "remoting"),
            "--topic",
            TOPIC,
            "--group",
            "g-tier-4x",
            "--expect",
            str(N),
            home=tmp_path / "h",
            timeout=120,
        )
    )
    assert sorted(e["body"] for e in received(events)) == sorted(body(i).decode() for i in range(N))


def test_unreachable_object_store_local_traffic_goes_on_tiered_reads_fail_then_recover(gw, tiered, s3):
    # a group that has consumed everything so far reads only local messages from here on
    p, ctx = gw.processor, ClientContext("test", client_id="tier-test")
    for q in range(2):
        _lo, hi = gw.call(p.queue_offsets(TOPIC, q))
        gw.call(p.commit_offset(ctx, "G-LIVE", TOPIC, q, hi))
    gw.gw.store.drop_tier_cache()  # the next tiered read must reach the object store
    s3.pause()
    try:
        fresh = [b"local-while-down-%d" % i for i in range(10)]
        gw.call(grpc_send_all(gw, fresh), timeout=30)
        got = gw.call(grpc_receive_all(gw, "G-LIVE", len(fresh)), timeout=30)
        assert sorted(got) == fresh
        r = httpx.get(f"{gw.url}/read/topics/{TOPIC}/queues/0/messages", params={"start": 0, "end": 5},
                      timeout=60)  # fmt: skip
        assert r.status_code == 503, r.text
        assert "tiered storage" in r.json()["detail"]
    finally:
        s3.resume()
    # back: the same rows as before the upload, once the server has worked off what queued up
    # while it was paused (the tier's uploads retry meanwhile)
    deadline = time.monotonic() + 90
    while True:
        try:
            rows = offset_reads(gw)
            break
        except GatewayError as e:
            assert e.status == 503 and time.monotonic() < deadline, e
            time.sleep(0.5)
    assert rows[:5] == tiered[2][:5]
