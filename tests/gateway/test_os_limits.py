"""Operating limits that say so (runtime/oslimits.py): `gateway start` raises its descriptor limit
to the hard limit, and a gateway out of descriptors refuses new connections, logs it (once a
minute) and counts it in /metrics; its connections stay open and work again once descriptors are
free. (While none is free the store cannot open a file either: a publish then fails; see
docs/limits.md, "Process limits".)"""

from __future__ import annotations

import asyncio
import re
import resource
import socket
import time

import aio_pika
import aiomqtt
import httpx
import pytest

from tests.gateway.support import Proc
from tests.support import wait_until


def limited(soft: int, hard: int):
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return preexec


def open_files_limit(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no 'Max open files' line")


def start(tmp_path, soft: int, hard: int, *extra: str) -> tuple[Proc, dict[str, str]]:
    args = ["start", "--data-dir", str(tmp_path / "data"), "--protocols", "mqtt,http"]
    args += ["--mqtt-port", "0", "--http-port", "0", *extra]
    proc = Proc(args, preexec_fn=limited(soft, hard), log_path=tmp_path / "gateway.log")
    return proc, proc.wait_ready(60)


def test_soft_limit_raised_to_hard_at_start(tmp_path):
    proc, _ = start(tmp_path, 256, 4096)
    try:
        assert open_files_limit(proc.p.pid) == (4096, 4096)
        assert "file descriptor limit 4096 (hard 4096)" in (tmp_path / "gateway.log").read_text()
    finally:
        proc.stop()


async def test_out_of_descriptors_serves_existing_refuses_new_and_says_so(tmp_path):
    limit = 160
    # without the reserve (below) the connections take every descriptor
    proc, listeners = start(tmp_path, limit, limit, "--event-loop", "asyncio", "--fd-reserve", "0")
    mqtt_port = int(listeners["mqtt"].rsplit(":", 1)[1])
    http = f"http://{listeners['http']}"
    flood: list[socket.socket] = []
    try:
        async with aiomqtt.Client("127.0.0.1", mqtt_port, identifier="old", timeout=10) as c:
            await c.subscribe("fd/test", qos=1)
            for _ in range(limit + 40):  # more connections than the gateway has descriptors left
                flood.append(socket.create_connection(("127.0.0.1", mqtt_port), timeout=5))
            log_path = tmp_path / "gateway.log"
            await wait_until(lambda: "accept() failed with EMFILE" in log_path.read_text(), timeout=20)
            for s in flood:
                s.close()
            flood.clear()
            r = await wait_for_metrics(http)
            await c.publish("fd/test", b"still served", qos=1)  # the connection held through it
            msg = await asyncio.wait_for(anext(aiter(c.messages)), 10)
            assert msg.payload == b"still served"
        text = r.text
        m = re.search(r'^gateway_accept_errors_total\{reason="emfile"\} (\d+)', text, re.M)
        assert m and int(m.group(1)) > 0, text
        assert re.search(rf"^gateway_fd_limit {limit}$", text, re.M)
        assert re.search(r"^gateway_open_fds \d+$", text, re.M)
        log = log_path.read_text()
        assert log.count("accept() failed with EMFILE") == 1, "the message is not rate-limited"
        # and new connections are accepted again once descriptors are free
        async with aiomqtt.Client("127.0.0.1", mqtt_port, identifier="new", timeout=10) as c2:
            await c2.publish("fd/test", b"new", qos=1)
    finally:
        for s in flood:
            s.close()
        proc.stop()


def mqtt_connect(client_id: str) -> bytes:
    """An MQTT 3.1.1 CONNECT (clean session, keep-alive 60 s)."""
    cid = client_id.encode()
    rest = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(cid).to_bytes(2, "big") + cid
    return bytes([0x10, len(rest)]) + rest


def connect_raw(port: int, client_id: str) -> socket.socket | None:
    """A device that connects and stays: its socket once CONNACK came, None when the gateway
    closed the connection instead."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(mqtt_connect(client_id))
    try:
        answer = s.recv(4)
    except ConnectionResetError:
        answer = b""
    if answer[:1] == b"\x20":
        return s
    s.close()
    return None


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_connections_leave_the_descriptor_reserve_to_the_store(tmp_path, event_loop):
    """With `--fd-reserve`, device connections stop below the top of the descriptor limit: the one
    that would take a descriptor of the reserve is closed at once, counted and logged, the store
    keeps opening files (new commit log segments) for the connections already open, and the HTTP
    port (health, metrics) still answers."""
    limit, reserve = 300, 60
    args = ("--event-loop", event_loop, "--fd-reserve", str(reserve), "--segment-size-mib", "1")
    args += ("--max-body-size", "65536", "--amqp-max-body-size", "65536")  # 2 MiB segments
    args += ("--protocols", "mqtt,amqp,remoting,http", "--amqp-port", "0", "--remoting-port", "0")
    proc, listeners = start(tmp_path, limit, limit, *args)
    mqtt_port = int(listeners["mqtt"].rsplit(":", 1)[1])
    log_path = tmp_path / "gateway.log"
    devices: list[socket.socket] = []
    try:
        async with aiomqtt.Client("127.0.0.1", mqtt_port, identifier="old", timeout=10) as c:
            await c.subscribe("fd/#", qos=1)
            for i in range(limit):
                s = await asyncio.to_thread(connect_raw, mqtt_port, f"device-{i}")
                if s is None:
                    break
                devices.append(s)
            else:
                raise AssertionError(f"{limit} connections taken with a limit of {limit} descriptors")
            assert len(devices) < limit - reserve
            with pytest.raises(aiomqtt.MqttError):  # a real client is refused too
                async with aiomqtt.Client("127.0.0.1", mqtt_port, identifier="late", timeout=2):
                    pass
            amqp_host, amqp_port = listeners["amqp"].rsplit(":", 1)
            with pytest.raises((aio_pika.exceptions.AMQPError, ConnectionError, OSError)):  # AMQP too
                await aio_pika.connect(f"amqp://guest:guest@{amqp_host}:{amqp_port}/", timeout=5)
            rem_host, rem_port = listeners["remoting"].rsplit(":", 1)  # and RocketMQ 4.x remoting
            with socket.create_connection((rem_host, int(rem_port)), timeout=5) as rs:
                assert rs.recv(1) == b"", "a 4.x connection got a descriptor of the reserve"
            # 6 MiB through 2 MiB segments: the store opens new segment files meanwhile
            body = bytes(range(256)) * 256
            for i in range(96):
                await c.publish(f"fd/big/{i}", body, qos=1)
            got = 0
            async for msg in c.messages:
                assert msg.payload == body and str(msg.topic) == f"fd/big/{got}"
                got += 1
                if got == 96:
                    break
            segments = list((tmp_path / "data" / "commitlog").glob("*"))
            assert len(segments) >= 3, segments
            async with httpx.AsyncClient(timeout=5) as http:
                text = (await http.get(f"http://{listeners['http']}/metrics")).text
            refused = r'^gateway_limit_refusals_total\{protocol="mqtt",limit="fd_reserve"\} (\d+)'
            m = re.search(refused, text, re.M)
            assert m and int(m.group(1)) >= 2, text
            for protocol in ("amqp", "remoting"):
                refused = (
                    rf'^gateway_limit_refusals_total\{{protocol="{protocol}",limit="fd_reserve"\}} ([1-9])'
                )
                assert re.search(refused, text, re.M), (protocol, text)
            assert log_path.read_text().count("in the reserve kept for the store") == 1
            for s in devices[: len(devices) // 2]:  # devices leave: new ones are taken again
                s.close()
            del devices[: len(devices) // 2]
            # (the gateway frees their descriptors when it sees them go: until then a new device
            # may still land in the reserve and be refused)
            again = None
            deadline = time.monotonic() + 10
            while again is None and time.monotonic() < deadline:
                again = await asyncio.to_thread(connect_raw, mqtt_port, "device-again")
                if again is None:
                    await asyncio.sleep(0.05)
            assert again is not None
            devices.append(again)
    finally:
        for s in devices:
            s.close()
        proc.stop()


async def wait_for_metrics(url: str) -> httpx.Response:
    """GET /metrics once the listener accepts again (it retries accept() every second)."""
    async with httpx.AsyncClient(timeout=5) as client:
        for _ in range(40):
            try:
                return await client.get(url + "/metrics")
            except httpx.TransportError:
                await asyncio.sleep(0.25)
    raise AssertionError("/metrics did not answer")
