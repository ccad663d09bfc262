"""The official RocketMQ Python client (in a subprocess) against the adapter served in this process."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "official_client.py")


async def run_client(mode: str, endpoint: str, topic: str, group: str, timeout: float = 90) -> dict:
    env = dict(os.environ, HOME=os.environ.get("TMPDIR", "/tmp"))  # the client logs under ~/logs
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        SCRIPT,
        mode,
        endpoint,
        topic,
        group,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _needs_client():
    if importlib.util.find_spec("rocketmq") is None:  # found, not imported: it must stay out of this process
        pytest.skip("rocketmq-python-client is not installed")


async def test_official_producer_and_simple_consumer(gw):
    await gw.processor.create_topic("OT", queues=4)
    res = await run_client("simple", gw.adapter.address, "OT", "OG")
    assert len(res["sent"]) == 3
    got = sorted(res["got"], key=lambda m: m["body"])
    assert [m["body"] for m in got] == ["hello-0", "hello-1", "hello-2"]
    assert sorted(m["id"] for m in got) == sorted(res["sent"])  # the client's message ids are kept
    for i, m in enumerate(got):
        assert m["tag"] == "TagA" and m["keys"] == [f"key-{i}"] and m["props"] == {"seq": str(i)}
        assert m["attempt"] == 1
    assert res["empty_after"] == 0
    assert gw.store.backlog("OG", "OT") == 0


async def test_official_transaction_commit(gw):
    # The producer commits by itself here. The fixture's 300 ms transaction timeout (for the check
    # tests) lets the store's check commit first when the machine is slow, and the producer's own
    # commit then meets an already resolved transaction: give it the production default instead.
    gw.store.config.transaction_timeout_ms = 6000
    await gw.processor.create_topic("OTX")
    res = await run_client("transaction", gw.adapter.address, "OTX", "OTG")
    assert [m["body"] for m in res["got"]] == ["hello-0"]
    assert res["got"][0]["id"] == res["sent"][0]


async def test_official_push_consumer_retries_failed_message(gw):
    await gw.processor.create_topic("OP")
    res = await run_client("push", gw.adapter.address, "OP", "OPG")
    assert res["done"], res
    assert set(res["attempts"]) == set(res["sent"])
    for attempts in res["attempts"].values():
        assert attempts[:2] == [1, 2]  # FAILURE -> ChangeInvisibleDuration -> redelivered as attempt 2
