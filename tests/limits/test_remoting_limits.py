"""The 4.x remoting listener's limits (adapters/remoting/limits.py) against a real gateway process:
a connection over `--max-connections` is closed at once while the others keep working, and sends
over the publish rate are answered SYSTEM_BUSY (2) `[TOO_MANY_REQUESTS]` and not stored."""

from __future__ import annotations

import asyncio

import pytest

from remoting import RequestCode, ResponseCode
from remoting.client import RemotingClient, RemotingClientError
from tests.adapters.remoting.support import send as remoting_send
from tests.cluster.support import wait_for
from tests.tls.support import start_gateway

pytestmark = pytest.mark.timeout(60)


def _address(proc) -> tuple[str, int]:
    host, port = proc.listeners["remoting"].rsplit(":", 1)
    return host, int(port)


async def test_a_connection_over_the_limit_is_closed_and_the_others_keep_working(tmp_path) -> None:
    proc = start_gateway(tmp_path, "--max-connections", "1", protocols="remoting")
    try:
        host, port = _address(proc)
        first = await RemotingClient.connect(host, port, version=121)
        try:
            second = await RemotingClient.connect(host, port, version=121)
            with pytest.raises((RemotingClientError, OSError, TimeoutError)):
                await second.invoke(RequestCode.GET_BROKER_CLUSTER_INFO, timeout=5)
            await second.close()
            r = await first.invoke(RequestCode.GET_BROKER_CLUSTER_INFO, timeout=5)
            assert r.code == ResponseCode.SUCCESS
        finally:
            await first.close()
        third = await RemotingClient.connect(host, port, version=121)  # the place is free again
        try:
            assert (await third.invoke(RequestCode.GET_BROKER_CLUSTER_INFO, timeout=5)).code == 0
        finally:
            await third.close()
        # (the log line travels through the process's pipe: it may come after the refusal is seen)
        wait_for(
            lambda: "remoting connection" in (o := proc.output()) and "max_connections limit reached" in o,
            what="the refusal in the log",
        )
    finally:
        assert proc.stop() == 0


async def test_sends_over_the_publish_rate_are_answered_system_busy(tmp_path) -> None:
    proc = start_gateway(
        tmp_path,
        *("--publish-rate-msgs", "5", "--publish-burst", "1", "--auto-create-topics"),
        protocols="remoting",
    )
    try:
        host, port = _address(proc)
        client = await RemotingClient.connect(host, port, version=121)
        try:
            answers = [await remoting_send(client, "Rated4x", f"m{i}".encode(), {}) for i in range(20)]
            codes = [r.code for r in answers]
            assert codes.count(ResponseCode.SUCCESS) <= 7, codes  # the burst (5) and what refilled
            busy = [r for r in answers if r.code == ResponseCode.SYSTEM_BUSY]
            assert len(busy) >= 13 and all("[TOO_MANY_REQUESTS]" in (r.remark or "") for r in busy)
            await asyncio.sleep(1.0)  # the bucket refills at 5/s: a send fits again
            assert (await remoting_send(client, "Rated4x", b"later", {})).code == ResponseCode.SUCCESS
            stored = 0  # only the accepted sends were stored
            for q in range(8):
                r = await client.invoke(RequestCode.GET_MAX_OFFSET, {"topic": "Rated4x", "queueId": str(q)})
                assert r.code == ResponseCode.SUCCESS
                stored += int(r.ext_fields["offset"])
            assert stored == codes.count(ResponseCode.SUCCESS) + 1
        finally:
            await client.close()
    finally:
        assert proc.stop() == 0
