"""The remoting listener in a real `gateway start` process: enabled by default, bound from
settings, serving 4.x requests, stopping cleanly on SIGTERM."""

from __future__ import annotations

import asyncio

from adapters.remoting.message_codec import decode_messages, encode_properties
from conformance.gateway_proc import GatewayProc
from gateway.config import PROTOCOLS, load
from remoting import RequestCode, ResponseCode
from remoting.client import RemotingClient


def test_remoting_is_built_and_on_by_default():
    assert "remoting" in PROTOCOLS
    assert load({"protocols": "remoting"}).protocols == ("remoting",)
    assert load().remoting_port == 8080


def test_gateway_process_serves_remoting(tmp_path):
    args = ["start", "--data-dir", str(tmp_path / "data")]
    args += [
        "--protocols",
        "remoting",
        "--remoting-port",
        "0",
        "--auto-create-topics",
        "--event-loop",
        "asyncio",
    ]
    p = GatewayProc(args)  # without the GATEWAY_* variables of the test environment
    try:
        addr = p.wait_ready(60)["remoting"]
        host, port = addr.rsplit(":", 1)

        async def talk():
            c = await RemotingClient.connect(host, int(port), version=121)
            try:
                r = await c.invoke(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "proc"})
                assert r.code == ResponseCode.SUCCESS and f'{{0:"{addr}"}}'.encode() in r.body
                ext = {"b": "proc", "e": 0, "i": encode_properties({"TAGS": "t"})}
                assert (await c.invoke(RequestCode.SEND_MESSAGE_V2, ext, b"hi")).code == ResponseCode.SUCCESS
                pull = {
                    "consumerGroup": "g",
                    "topic": "proc",
                    "queueId": 0,
                    "queueOffset": 0,
                    "maxMsgNums": 4,
                }
                r = await c.invoke(RequestCode.PULL_MESSAGE, pull)
                assert [m.body for m in decode_messages(r.body)] == [b"hi"]
            finally:
                await c.close()

        asyncio.run(talk())
        rc = p.stop(20)  # SIGTERM
        out = p.drain()
        assert rc == 0, out
        assert "gateway stopped" in out and "Traceback" not in out
    finally:
        p.kill()
