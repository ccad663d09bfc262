"""The remoting listener in a real `gateway start` process: enabled by default, bound from
settings, serving 4.x requests, stopping cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys

from adapters.remoting.client import RemotingClient
from adapters.remoting.codec import RequestCode, ResponseCode, decode_messages, encode_properties
from gateway.config import DEFAULT_PROTOCOLS, IMPLEMENTED_PROTOCOLS, load


def test_remoting_is_built_and_on_by_default():
    assert "remoting" in IMPLEMENTED_PROTOCOLS and "remoting" in DEFAULT_PROTOCOLS
    assert load({"protocols": "remoting"}).protocols == ("remoting",)
    assert load().remoting_port == 8080


def test_gateway_process_serves_remoting(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    cmd = [sys.executable, "-m", "gateway.cli", "start", "--data-dir", str(tmp_path / "data")]
    cmd += [
        "--protocols",
        "remoting",
        "--remoting-port",
        "0",
        "--auto-create-topics",
        "--event-loop",
        "asyncio",
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    try:
        addr = None
        for line in p.stdout:  # type: ignore[union-attr]
            lines.append(line)
            m = re.search(r"remoting listening on (\S+)", line)
            if m:
                addr = m.group(1)
            if "gateway ready" in line or "ERROR" in line:
                break
        assert addr, "".join(lines)
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
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=20)
        lines.append(out)
        assert p.returncode == 0, "".join(lines)
        assert "gateway stopped" in out and "Traceback" not in out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
